#include "app/protocol/strategy_args.h"

#include <CLI/CLI.hpp>

namespace dit::protocol {

void addStrategyOptions(CLI::App& app, Strategy& s) {
  app.add_option("--tp-degree", s.tp_degree, "tensor parallel degree");
  app.add_option("--ring-degree", s.ring_degree, "ring attention degree");
  app.add_option("--ulysses-degree", s.ulysses_degree, "Ulysses attention degree");
  app.add_flag("--ulysses-anything", s.ulysses_anything, "Ulysses with uneven sequence/heads");
  app.add_flag("--ring-anything", s.ring_anything, "ring attention with uneven sequence");
  app.add_option("--cfg-degree", s.cfg_degree, "CFG parallel degree (1 or 2)");
  app.add_option("--dp-degree", s.dp_degree, "data parallel replicas");
}

std::vector<std::string> strategyArgs(const Strategy& s) {
  std::vector<std::string> a{"--tp-degree",      std::to_string(s.tp_degree),
                             "--ring-degree",    std::to_string(s.ring_degree),
                             "--ulysses-degree", std::to_string(s.ulysses_degree)};
  if (s.ulysses_anything) a.push_back("--ulysses-anything");
  if (s.ring_anything) a.push_back("--ring-anything");
  a.insert(a.end(), {"--cfg-degree", std::to_string(s.cfg_degree), "--dp-degree",
                     std::to_string(s.dp_degree), "--device",
                     s.device.empty() ? std::string("cpu") : s.device});
  return a;
}

}  // namespace dit::protocol
