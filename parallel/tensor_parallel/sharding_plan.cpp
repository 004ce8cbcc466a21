// Tensor-parallel sharding plans (see sharding_plan.h). No Torch, no MPI.
#include "parallel/tensor_parallel/sharding_plan.h"

#include <numeric>
#include <sstream>
#include <stdexcept>
#include <tuple>

namespace dit {

namespace {

std::string str(long long v) { return std::to_string(v); }

std::string shapeStr(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + str(s[i]);
  return o + "]";
}

bool isPacked(ParallelStyle s) {
  return s == ParallelStyle::PackedColwise || s == ParallelStyle::PackedRowwise;
}
bool isColwise(ParallelStyle s) {
  return s == ParallelStyle::Colwise || s == ParallelStyle::PackedColwise;
}

std::vector<std::string_view> segments(std::string_view s) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    const size_t dot = s.find('.', start);
    if (dot == std::string_view::npos) {
      out.push_back(s.substr(start));
      return out;
    }
    out.push_back(s.substr(start, dot - start));
    start = dot + 1;
  }
}

// "P.weight" -> {"P", "weight"}; a name without a dot is a leaf of the root module "".
std::pair<std::string, std::string> splitParam(const std::string& name) {
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos) return {"", name};
  return {name.substr(0, dot), name.substr(dot + 1)};
}

// The dimension `rule` shards for leaf `leaf` of a parameter with `rank` dimensions; -1 =
// replicated.
int64_t shardedDim(const ShardRule& rule, const std::string& leaf) {
  if (leaf == "weight") return isColwise(rule.style) ? 0 : 1;
  if (leaf == "bias") return isColwise(rule.style) ? 0 : -1;
  return -1;
}

}  // namespace

const char* parallelStyleName(ParallelStyle s) {
  switch (s) {
    case ParallelStyle::Colwise:
      return "ColwiseParallel";
    case ParallelStyle::Rowwise:
      return "RowwiseParallel";
    case ParallelStyle::PackedColwise:
      return "PackedColwiseParallel";
    case ParallelStyle::PackedRowwise:
      return "PackedRowwiseParallel";
  }
  return "?";
}

int64_t ParameterInfo::numel() const {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
}

void ParameterTable::add(ParameterInfo p) {
  if (p.name.empty()) throw std::invalid_argument("ParameterTable: a parameter needs a name");
  if (index_.count(p.name))
    throw std::invalid_argument("ParameterTable: parameter '" + p.name + "' declared twice");
  for (auto d : p.shape)
    if (d < 0)
      throw std::invalid_argument("ParameterTable: parameter '" + p.name +
                                  "' has a negative dimension in " + shapeStr(p.shape));
  if (p.elementBytes < 1)
    throw std::invalid_argument("ParameterTable: parameter '" + p.name + "' has element size " +
                                str(p.elementBytes) + " bytes (must be at least 1)");
  index_.emplace(p.name, params_.size());
  params_.push_back(std::move(p));
}

const ParameterInfo* ParameterTable::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &params_[it->second];
}

std::vector<std::pair<int64_t, int64_t>> ShardSpec::ranges(
    const std::vector<int64_t>& global) const {
  if (replicated()) return {};
  if (dim >= static_cast<int64_t>(global.size()))
    throw std::invalid_argument("ShardSpec: dimension " + str(dim) + " does not exist in shape " +
                                shapeStr(global));
  if (part < 0 || part >= parts)
    throw std::invalid_argument("ShardSpec: part " + str(part) + " outside [0, " + str(parts) +
                                ")");
  const int64_t size = global[dim];
  std::vector<int64_t> bl = blocks.empty() ? std::vector<int64_t>{size} : blocks;
  const int64_t sum = std::accumulate(bl.begin(), bl.end(), int64_t{0});
  if (sum != size)
    throw std::invalid_argument("ShardSpec: blocks " + shapeStr(bl) + " add up to " + str(sum) +
                                ", not to dimension " + str(dim) + " of shape " + shapeStr(global));
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t start = 0;
  for (size_t b = 0; b < bl.size(); ++b) {
    if (bl[b] % parts != 0)
      throw std::invalid_argument("ShardSpec: " + str(parts) + " parts do not divide " +
                                  (blocks.empty()
                                       ? std::string("dimension ") + str(dim)
                                       : "block " + str(b) + " of dimension " + str(dim)) +
                                  " of size " + str(bl[b]) + " (shape " + shapeStr(global) + ")");
    const int64_t len = bl[b] / parts;
    out.emplace_back(start + part * len, len);
    start += bl[b];
  }
  return out;
}

std::vector<int64_t> ShardSpec::localShape(const std::vector<int64_t>& global) const {
  if (replicated()) return global;
  const auto r = ranges(global);
  std::vector<int64_t> out = global;
  out[dim] = 0;
  for (const auto& [s, l] : r) out[dim] += l;
  return out;
}

ShardingPlan::ShardingPlan(std::vector<ShardRule> rules) {
  for (auto& r : rules) add(std::move(r));
}

ShardingPlan& ShardingPlan::add(ShardRule rule) {
  if (rule.pattern.empty()) throw std::invalid_argument("ShardingPlan: empty rule pattern");
  for (auto seg : segments(rule.pattern))
    if (seg.empty())
      throw std::invalid_argument("ShardingPlan: rule pattern '" + rule.pattern +
                                  "' has an empty segment");
  if (isPacked(rule.style)) {
    if (rule.blocks.empty())
      throw std::invalid_argument("ShardingPlan: rule '" + rule.pattern + "' (" +
                                  parallelStyleName(rule.style) + ") needs its blocks");
    for (auto b : rule.blocks)
      if (b < 1)
        throw std::invalid_argument("ShardingPlan: rule '" + rule.pattern +
                                    "' has a block of size " + str(b));
  } else if (!rule.blocks.empty()) {
    throw std::invalid_argument("ShardingPlan: rule '" + rule.pattern + "' (" +
                                parallelStyleName(rule.style) +
                                ") is not packed and takes no blocks");
  }
  if (rule.gatherOutput && !isColwise(rule.style))
    throw std::invalid_argument("ShardingPlan: rule '" + rule.pattern + "' (" +
                                parallelStyleName(rule.style) +
                                ") cannot gather its output (only colwise styles split outputs)");
  rules_.push_back(std::move(rule));
  return *this;
}

ShardingPlan& ShardingPlan::requireDivisible(std::string name, int64_t value, std::string why,
                                             std::string rule) {
  requirements_.push_back({std::move(name), value, std::move(why), std::move(rule)});
  return *this;
}

bool ShardingPlan::globMatch(std::string_view pattern, std::string_view modulePath) {
  const auto p = segments(pattern), m = segments(modulePath);
  if (p.size() != m.size()) return false;
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] != "*" && p[i] != m[i]) return false;
  return true;
}

const ShardRule* ShardingPlan::match(std::string_view modulePath) const {
  for (const auto& r : rules_)
    if (globMatch(r.pattern, modulePath)) return &r;
  return nullptr;
}

ShardSpec ShardingPlan::shardSpec(const std::string& paramName, const std::vector<int64_t>& shape,
                                  int tpRank, int tpSize) const {
  if (tpSize < 1 || tpRank < 0 || tpRank >= tpSize)
    throw std::invalid_argument("ShardingPlan::shardSpec: tensor-parallel rank " + str(tpRank) +
                                " outside [0, " + str(tpSize) + ")");
  ShardSpec spec;
  if (tpSize == 1) return spec;
  const auto [module, leaf] = splitParam(paramName);
  const ShardRule* rule = match(module);
  if (!rule || !rule->activeAt(tpSize)) return spec;
  const int64_t dim = shardedDim(*rule, leaf);
  if (dim < 0) return spec;
  if (dim >= static_cast<int64_t>(shape.size()))
    throw std::invalid_argument("ShardingPlan: rule '" + rule->pattern + "' (" +
                                parallelStyleName(rule->style) + ") shards dimension " + str(dim) +
                                " of " + paramName + ", which has shape " + shapeStr(shape));
  spec.dim = dim;
  spec.part = tpRank;
  spec.parts = tpSize;
  spec.blocks = rule->blocks;
  try {
    spec.ranges(shape);  // divisibility and block sums
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument("ShardingPlan: " + paramName + " under rule '" + rule->pattern +
                                "' (" + parallelStyleName(rule->style) + ") at tp_degree " +
                                str(tpSize) + ": " + e.what());
  }
  return spec;
}

ShardingPlan& ShardingPlan::replicateWhenNotDivisible(bool on) {
  replicateWhenNotDivisible_ = on;
  return *this;
}

std::vector<StrategyIssue> ShardingPlan::validate(const ParameterTable& params, int tp) const {
  auto issues = validateStrict(params, tp);
  if (!replicateWhenNotDivisible_) return issues;
  std::vector<StrategyIssue> out;
  for (auto& i : issues)
    if (i.rule == "tp_plan_stale" || i.rule == "tp_plan_shape") out.push_back(std::move(i));
  return out;
}

ShardingPlan ShardingPlan::resolve(const ParameterTable& params, int tp,
                                   std::string* reason) const {
  if (reason) reason->clear();
  if (!replicateWhenNotDivisible_ || tp <= 1) return *this;
  std::string why;
  for (const auto& i : validateStrict(params, tp))
    if (i.rule != "tp_plan_stale" && i.rule != "tp_plan_shape")
      why += (why.empty() ? "" : "; ") + i.message;
  if (why.empty()) return *this;
  if (reason)
    *reason = why + "; the component is replicated on every rank of the tensor-parallel group";
  return ShardingPlan();
}

std::vector<StrategyIssue> ShardingPlan::validateStrict(const ParameterTable& params,
                                                        int tp) const {
  std::vector<StrategyIssue> out;
  // Which rules match something, and the grouped divisibility failures:
  // (size, dim, block index or -1, style) -> patterns in rule order (no duplicates).
  std::vector<bool> used(rules_.size(), false);
  using Key = std::tuple<int64_t, int64_t, int64_t, int,
                         std::string>;  // size, dim, block, style, blocks text
  std::vector<std::pair<Key, std::vector<std::string>>> groups;
  auto addFailure = [&](const Key& k, const std::string& pattern) {
    for (auto& [key, pats] : groups)
      if (key == k) {
        for (const auto& p : pats)
          if (p == pattern) return;
        pats.push_back(pattern);
        return;
      }
    groups.push_back({k, {pattern}});
  };
  for (const auto& p : params) {
    const auto [module, leaf] = splitParam(p.name);
    const ShardRule* rule = nullptr;
    size_t ri = 0;
    for (; ri < rules_.size(); ++ri)
      if (globMatch(rules_[ri].pattern, module)) {
        rule = &rules_[ri];
        break;
      }
    if (!rule) continue;
    used[ri] = true;
    const int64_t dim = shardedDim(*rule, leaf);
    if (dim < 0) continue;
    if (dim >= static_cast<int64_t>(p.shape.size())) {
      out.push_back({"tp_plan_shape", "rule '" + rule->pattern + "' (" +
                                          parallelStyleName(rule->style) + ") shards dimension " +
                                          str(dim) + " of " + p.name + ", which has shape " +
                                          shapeStr(p.shape)});
      continue;
    }
    const int64_t size = p.shape[dim];
    if (!rule->blocks.empty()) {
      const int64_t sum = std::accumulate(rule->blocks.begin(), rule->blocks.end(), int64_t{0});
      if (sum != size) {
        out.push_back({"tp_plan_shape", "rule '" + rule->pattern + "' (" +
                                            parallelStyleName(rule->style) + ") declares blocks " +
                                            shapeStr(rule->blocks) + " adding up to " + str(sum) +
                                            ", but dimension " + str(dim) + " of " + p.name +
                                            " has size " + str(size)});
        continue;
      }
    }
    if (tp <= 1 || !rule->activeAt(tp)) continue;
    if (rule->blocks.empty()) {
      if (size % tp != 0)
        addFailure({size, dim, -1, static_cast<int>(rule->style), ""}, rule->pattern);
    } else {
      for (size_t b = 0; b < rule->blocks.size(); ++b)
        if (rule->blocks[b] % tp != 0)
          addFailure({rule->blocks[b], dim, static_cast<int64_t>(b), static_cast<int>(rule->style),
                      shapeStr(rule->blocks)},
                     rule->pattern);
    }
  }
  if (tp > 1)
    for (const auto& r : requirements_)
      if (r.value % tp != 0)
        out.push_back({r.rule, "tp_degree " + str(tp) + " does not divide " + r.name + " " +
                                   str(r.value) +
                                   (r.why.empty() ? std::string() : " (" + r.why + ")")});
  for (const auto& [key, pats] : groups) {
    const auto& [size, dim, block, style, blocksText] = key;
    std::string where =
        block < 0 ? "dimension " + str(dim)
                  : "block " + str(block) + " of " + blocksText + " on dimension " + str(dim);
    std::string msg = "tp_degree " + str(tp) + " does not divide " + str(size) + ", the size of " +
                      where + " (" + parallelStyleName(static_cast<ParallelStyle>(style)) + ") of ";
    for (size_t i = 0; i < pats.size(); ++i) msg += (i ? ", " : "") + pats[i];
    out.push_back({"tp_shard", msg});
  }
  std::vector<std::string> stale;
  for (size_t i = 0; i < rules_.size(); ++i)
    if (!used[i]) stale.push_back(rules_[i].pattern);
  if (!stale.empty()) {
    std::string msg = "the tensor-parallel plan has " + str(static_cast<long long>(stale.size())) +
                      (stale.size() == 1 ? " rule" : " rules") +
                      " matching no parameter of the model (" +
                      str(static_cast<long long>(params.size())) + " parameters): ";
    for (size_t i = 0; i < stale.size(); ++i) msg += (i ? ", " : "") + stale[i];
    msg += "; the plan is stale or the parameter names changed";
    out.push_back({"tp_plan_stale", msg});
  }
  return out;
}

uint64_t ShardingPlan::bytesPerRank(const ParameterTable& params, int tp,
                                    int64_t computeElementBytes) const {
  if (tp < 1)
    throw std::invalid_argument("ShardingPlan::bytesPerRank: tp_degree " + str(tp) +
                                " must be at least 1");
  if (replicateWhenNotDivisible_ && tp > 1) {
    std::string reason;
    resolve(params, tp, &reason);
    if (!reason.empty()) return bytesPerRank(params, 1, computeElementBytes);
  }
  uint64_t total = 0;
  for (const auto& p : params) {
    const int64_t eb = computeElementBytes > 0 ? computeElementBytes : p.elementBytes;
    int64_t numel = p.numel();
    if (tp > 1) {
      const auto [module, leaf] = splitParam(p.name);
      const ShardRule* rule = match(module);
      if (rule && rule->activeAt(tp)) {
        const int64_t dim = shardedDim(*rule, leaf);
        if (dim >= 0 && dim < static_cast<int64_t>(p.shape.size()) && p.shape[dim] > 0) {
          const int64_t size = p.shape[dim];
          int64_t local = 0;
          if (rule->blocks.empty())
            local = (size + tp - 1) / tp;
          else
            for (auto b : rule->blocks) local += (b + tp - 1) / tp;
          numel = numel / size * local;
        }
      }
    }
    total += static_cast<uint64_t>(numel) * static_cast<uint64_t>(eb);
  }
  return total;
}

std::string ShardingPlan::describe() const {
  std::ostringstream o;
  o << "tensor-parallel plan: " << rules_.size() << (rules_.size() == 1 ? " rule" : " rules");
  for (const auto& r : rules_) {
    o << "\n  " << r.pattern << ": " << parallelStyleName(r.style);
    if (!r.blocks.empty()) o << " blocks " << shapeStr(r.blocks);
    if (r.gatherOutput) o << " (output gathered)";
    if (r.shardWhenDivides > 0)
      o << " (when tp_degree divides " << r.shardWhenDivides << ", else replicated)";
  }
  for (const auto& r : requirements_)
    o << "\n  tp_degree divides " << r.name << " " << r.value
      << (r.why.empty() ? "" : " (" + r.why + ")");
  if (replicateWhenNotDivisible_)
    o << "\n  otherwise (not divisible): the whole component is replicated";
  return o.str();
}

}  // namespace dit
