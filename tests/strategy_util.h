// Test helper shared by the strategy, protocol, collectives and GUI tests: a Strategy
// (parallel/strategy.h) written as its degrees.
#pragma once

#include "parallel/strategy.h"

namespace dit::test {

/// A Strategy of `world` ranks with these degrees (tensor parallel, ring, Ulysses, CFG, data
/// parallel) and every other field at its default. Not validated: validateDegrees() does that.
inline Strategy strat(int world, int tp = 1, int ring = 1, int uly = 1, int cfg = 1, int dp = 1) {
  Strategy s;
  s.world = world;
  s.tp_degree = tp;
  s.ring_degree = ring;
  s.ulysses_degree = uly;
  s.cfg_degree = cfg;
  s.dp_degree = dp;
  return s;
}

}  // namespace dit::test
