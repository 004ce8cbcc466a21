#include "backend/models/cache/step_cache_config.h"

#include <cmath>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace dit {

namespace {
const char* kForms =
    "use none, first-block:THRESHOLD (e.g. first-block:0.08) or "
    "taylorseer:ORDER[,INTERVAL,WARMUP][,lite] (e.g. taylorseer:1,5,3)";

[[noreturn]] void bad(const std::string& text, const std::string& why) {
  throw std::invalid_argument("cache mode '" + text + "': " + why + "; " + kForms);
}

double number(const std::string& text, const std::string& s) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    bad(text, "'" + s + "' is not a number");
  }
  if (used != s.size() || !std::isfinite(v)) bad(text, "'" + s + "' is not a finite number");
  return v;
}

int integer(const std::string& text, const std::string& s) {
  const double v = number(text, s);
  if (v != std::floor(v) || std::fabs(v) > 1e6) bad(text, "'" + s + "' is not an integer");
  return static_cast<int>(v);
}
}  // namespace

bool StepCacheConfig::taylorComputes(int i) const {
  const int W = disable_cache_before_step, K = cache_interval;
  if (i < W) return true;
  const int r = ((i - W - 1) % K + K) % K;
  return r == 0;
}

std::string StepCacheConfig::toString() const {
  std::ostringstream o;
  switch (mode) {
    case Mode::None:
      return "none";
    case Mode::FirstBlock:
      o << "first-block:" << threshold;
      return o.str();
    case Mode::TaylorSeer:
      o << "taylorseer:" << max_order << "," << cache_interval << "," << disable_cache_before_step;
      if (use_lite_mode) o << ",lite";
      return o.str();
  }
  return "none";
}

StepCacheConfig parseStepCacheConfig(const std::string& text) {
  StepCacheConfig c;
  if (text.empty() || text == "none") return c;
  const auto colon = text.find(':');
  const std::string mode = text.substr(0, colon);
  const std::string args = colon == std::string::npos ? "" : text.substr(colon + 1);
  if (mode == "first-block") {
    if (args.empty()) bad(text, "first-block needs a threshold");
    c.mode = StepCacheConfig::Mode::FirstBlock;
    c.threshold = number(text, args);
    if (!(c.threshold > 0)) bad(text, "the threshold must be greater than 0");
    return c;
  }
  if (mode == "taylorseer") {
    if (args.empty()) bad(text, "taylorseer needs an order");
    std::vector<std::string> parts;
    std::stringstream ss(args);
    for (std::string p; std::getline(ss, p, ',');) parts.push_back(p);
    if (!args.empty() && args.back() == ',') bad(text, "empty field");
    if (!parts.empty() && parts.back() == "lite") {
      c.use_lite_mode = true;
      parts.pop_back();
    }
    if (parts.size() != 1 && parts.size() != 3)
      bad(text, "taylorseer takes ORDER or ORDER,INTERVAL,WARMUP");
    c.mode = StepCacheConfig::Mode::TaylorSeer;
    c.max_order = integer(text, parts[0]);
    if (c.max_order < 1 || c.max_order > 4) bad(text, "the order must be 1 to 4");
    if (parts.size() == 3) {
      c.cache_interval = integer(text, parts[1]);
      c.disable_cache_before_step = integer(text, parts[2]);
      if (c.cache_interval < 1) bad(text, "the interval must be at least 1");
      if (c.disable_cache_before_step < 0 || c.disable_cache_before_step > 1000)
        bad(text, "the warm-up must be 0 to 1000 steps");
    }
    return c;
  }
  bad(text, "unknown cache mode '" + mode + "'");
}

}  // namespace dit
