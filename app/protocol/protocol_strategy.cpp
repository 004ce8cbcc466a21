// Strategy <-> JSON with the keys of the CLI flags, and nlohmann's ADL hooks for dit::Strategy.
#include <limits>

#include "app/protocol/protocol.h"
#include "app/protocol/protocol_detail.h"

namespace dit::protocol {

using nlohmann::json;
using namespace detail;

json strategyToJson(const Strategy& s) {
  return json{{"world", s.world},
              {"tp_degree", s.tp_degree},
              {"ring_degree", s.ring_degree},
              {"ulysses_degree", s.ulysses_degree},
              {"cfg_degree", s.cfg_degree},
              {"dp_degree", s.dp_degree},
              {"ulysses_anything", s.ulysses_anything},
              {"ring_anything", s.ring_anything},
              {"device", s.device}};
}

Strategy strategyFromJson(const json& j) {
  if (!j.is_object()) throw ProtocolError("strategy must be a JSON object, got " + dumpSafe(j));
  Reader r{j, "strategy", std::nullopt};
  Strategy s;  // absent keys keep the defaults
  r.integer("tp_degree", s.tp_degree);
  r.integer("ring_degree", s.ring_degree);
  r.integer("ulysses_degree", s.ulysses_degree);
  r.integer("cfg_degree", s.cfg_degree);
  r.integer("dp_degree", s.dp_degree);
  r.boolean("ulysses_anything", s.ulysses_anything);
  r.boolean("ring_anything", s.ring_anything);
  r.str("device", s.device);
  const long long product =
      1LL * s.tp_degree * s.ring_degree * s.ulysses_degree * s.cfg_degree * s.dp_degree;
  s.world = product > std::numeric_limits<int>::max() || product < std::numeric_limits<int>::min()
                ? 0  // refused by validateDegrees ("world size 0 must be at least 1 rank")
                : static_cast<int>(product);
  for (const char* key : {"world", "ranks", "np"})
    if (r.find(key)) {
      r.integer(key, s.world);
      break;
    }
  return s;
}

}  // namespace dit::protocol

namespace dit {
void to_json(nlohmann::json& j, const Strategy& s) { j = protocol::strategyToJson(s); }
void from_json(const nlohmann::json& j, Strategy& s) { s = protocol::strategyFromJson(j); }
}  // namespace dit
