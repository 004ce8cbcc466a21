// One broken strategy rule (shared by strategy.h and tensor_parallel/sharding_plan.h). Torch-free.
#pragma once

#include <string>

namespace dit {

/// One broken rule: `rule` is a short id ("world", "tp_heads", "tp_shard", ...), `message` the
/// sentence shown to the user naming the sizes and degrees.
struct StrategyIssue {
  std::string rule;
  std::string message;
};

}  // namespace dit
