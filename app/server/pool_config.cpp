// The pool's configuration: --pool entries and pool files parsed into GroupSpecs, and the model
// id clients use for a model path. Part of dit_server (pool.h).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "app/common/group_plan.h"
#include "app/common/model_source_options.h"
#include "app/server/pool.h"

namespace dit::server {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

int toInt(const std::string& what, const std::string& v) {
  try {
    size_t used = 0;
    const long x = std::stol(v, &used);
    if (used != v.size() || x < 0 || x > 4096) throw std::invalid_argument(v);
    return static_cast<int>(x);
  } catch (const std::logic_error&) {
    throw std::invalid_argument(what + " must be an integer in 0 .. 4096, got '" + v + "'");
  }
}

// A run option's integer (any int; runOptionsIssue checks its range, as the CLI's flags do).
int toRunInt(const std::string& what, const std::string& v) {
  try {
    size_t used = 0;
    const long x = std::stol(v, &used);
    if (used != v.size() || x < -(1L << 30) || x > (1L << 30)) throw std::invalid_argument(v);
    return static_cast<int>(x);
  } catch (const std::logic_error&) {
    throw std::invalid_argument(what + " must be an integer, got '" + v + "'");
  }
}

void setKey(GroupSpec& g, const std::string& key, const std::string& value,
            const std::string& where) {
  const std::string what = where + ": " + key;
  if (key == "name")
    g.name = value;
  else if (key == "model")
    g.model = value;
  else if (key == "np")
    g.np = toInt(what, value);
  else if (key == "tp" || key == "tp_degree")
    g.strategy.tp_degree = toInt(what, value);
  else if (key == "ring" || key == "ring_degree")
    g.strategy.ring_degree = toInt(what, value);
  else if (key == "ulysses" || key == "ulysses_degree")
    g.strategy.ulysses_degree = toInt(what, value);
  else if (key == "cfg" || key == "cfg_degree")
    g.strategy.cfg_degree = toInt(what, value);
  else if (key == "dp" || key == "dp_degree")
    g.strategy.dp_degree = toInt(what, value);
  else if (key == "threads" || key == "omp_threads")
    g.omp_threads = std::max(1, toInt(what, value));
  else if (key == "device")
    g.device = value;
  else if (key == "dtype")
    g.dtype = value;
  else if (key == "devices") {
    g.devices = value;
    std::replace(g.devices.begin(), g.devices.end(), ':', ',');
    std::replace(g.devices.begin(), g.devices.end(), '+', ',');
  } else if (key == "cpus") {
    g.cpus = value;
    std::replace(g.cpus.begin(), g.cpus.end(), ':', ',');
    std::replace(g.cpus.begin(), g.cpus.end(), '+', ',');
    if (g.cpus.empty() || g.cpus.find_first_not_of("0123456789,-") != std::string::npos)
      throw std::invalid_argument(what + " must list CPU numbers and ranges, got '" + value + "'");
  } else if (key == "hostfile")
    g.hostfile = value;
  else if (key == "network_interface")
    g.network_interface = value;
  else if (key == "ssh_options")
    g.ssh_options = value;
  else if (key == "port_range")
    g.port_range = value;
  else if (key == "preflight") {
    if (value != "0" && value != "1")
      throw std::invalid_argument(what + " must be 0 or 1, got '" + value + "'");
    g.preflight = value == "1";
  } else if (key == "vae_tiling") {
    g.run.vae_tiling = value == "off" ? -1 : toRunInt(what, value);
  } else if (key == "text_encoder_placement") {
    g.run.text_encoder_placement = value;
  } else if (key == "prompt_cache") {
    g.run.prompt_cache = toRunInt(what, value);
  } else {
    throw std::invalid_argument(where + ": unknown key '" + key +
                                "' (name, model, np, tp, ring, ulysses, cfg, dp, threads, device, "
                                "dtype, devices, cpus, hostfile, network_interface, ssh_options, "
                                "port_range, preflight, vae_tiling, text_encoder_placement, "
                                "prompt_cache)");
  }
  if (const std::string issue = protocol::runOptionsIssue(g.run); !issue.empty())
    throw std::invalid_argument(what + ": " + issue);
}

}  // namespace

GroupSpec parseGroupSpec(const std::string& spec, const GroupSpec& defaults) {
  GroupSpec g = defaults;
  std::stringstream in(spec);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      throw std::invalid_argument("--pool '" + spec + "': '" + item + "' is not key=value");
    setKey(g, item.substr(0, eq), item.substr(eq + 1), "--pool '" + spec + "'");
  }
  return g;
}

std::vector<GroupSpec> parsePoolFile(const std::string& path, const GroupSpec& defaults) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("pool file " + path + " cannot be read");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    throw std::invalid_argument("pool file " + path + " is not valid JSON: " + e.what());
  }
  if (j.is_object() && j.contains("groups")) j = j["groups"];
  if (!j.is_array() || j.empty())
    throw std::invalid_argument("pool file " + path +
                                ": expected {\"groups\": [ {...}, ... ]} with at least one group");
  std::vector<GroupSpec> out;
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string where = "pool file " + path + ", groups[" + std::to_string(i) + "]";
    if (!j[i].is_object()) throw std::invalid_argument(where + " is not an object");
    GroupSpec g = defaults;
    for (const auto& [k, v] : j[i].items()) {
      if (v.is_string())
        setKey(g, k, v.get<std::string>(), where);
      else if (v.is_number_integer())
        setKey(g, k, std::to_string(v.get<long long>()), where);
      else
        throw std::invalid_argument(where + ": field '" + k + "' must be a string or an integer");
    }
    out.push_back(std::move(g));
  }
  return out;
}

std::string planGroup(GroupSpec& g, const GroupPlanSettings& p) {
  const std::string who = "group " + (g.name.empty() ? std::string("g0") : g.name) + ": ";
  const Strategy& d = g.strategy;
  if (d.tp_degree != 1 || d.ring_degree != 1 || d.ulysses_degree != 1 || d.cfg_degree != 1 ||
      d.dp_degree != 1 || d.ulysses_anything || d.ring_anything)
    throw std::invalid_argument(who + "--plan chooses the degrees: give the ranks (np) only");
  if (!g.hostfile.empty())
    throw std::invalid_argument(who + "--plan does not plan hostfile groups: give the degrees");
  GroupPlanInput in;
  // The model as the ranks open it: the folder or file and the component flags, read back with
  // the flags' one definition (model_source_options.h; CLI11 takes the arguments reversed).
  in.sources.model = g.model;
  try {
    CLI::App flags;
    addModelSourceOptions(flags, in.sources);
    std::vector<std::string> args(g.model_args.rbegin(), g.model_args.rend());
    flags.parse(args);
  } catch (const CLI::ParseError& e) {
    throw std::invalid_argument(who + "--plan: the model's component flags: " + e.what());
  }
  in.ranks = std::max(1, g.np);
  in.device = g.device;
  in.dtype = g.dtype;
  in.memory = p.memory;
  in.host_ranks = p.host_ranks;
  in.usable = p.usable;
  in.width = p.width;
  in.height = p.height;
  in.text_len = p.text_len;
  // A placement the group gives is kept; otherwise the first that fits.
  if (g.run.text_encoder_placement != "sharded")
    in.text_encoder_placement = g.run.text_encoder_placement;
  GroupPlanResult r;
  try {
    r = planGroupPlacement(in);
  } catch (const std::exception& e) {
    throw std::invalid_argument(who + "--plan: " + e.what());
  }
  g.strategy = r.strategy;
  g.np = r.strategy.world;
  g.run.text_encoder_placement = r.text_encoder_placement;
  return r.text;
}

std::string modelId(const std::string& modelPath) {
  fs::path p(modelPath);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();
  std::string id = p.filename().string();
  return id.empty() ? std::string("model") : id;
}

}  // namespace dit::server
