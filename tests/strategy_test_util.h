// Helpers shared by the MPI strategy tests of the model families (test_flux2, test_zimage): a
// Strategy from its degrees, a label for traces, and the TransformerParallelism a DeviceMesh
// gives a transformer under it.
#pragma once

#include <memory>
#include <sstream>
#include <string>

#include "backend/models/diffusion_transformer.h"
#include "parallel/context_parallel.h"
#include "parallel/device_mesh.h"
#include "parallel/strategy.h"

namespace dit::test {

/// world = tp x ring x ulysses (no cfg / dp).
inline Strategy makeStrategy(int tp, int ring, int uly, bool ulyAny = false, bool ringAny = false) {
  Strategy s;
  s.tp_degree = tp;
  s.ring_degree = ring;
  s.ulysses_degree = uly;
  s.ulysses_anything = ulyAny;
  s.ring_anything = ringAny;
  s.world = tp * ring * uly;
  return s;
}

/// "tp 2 ring 1 ulysses 2 (anything)".
inline std::string strategyLabel(const Strategy& s) {
  std::ostringstream o;
  o << "tp " << s.tp_degree << " ring " << s.ring_degree << (s.ring_anything ? " (anything)" : "")
    << " ulysses " << s.ulysses_degree << (s.ulysses_anything ? " (anything)" : "");
  return o.str();
}

/// The transformer's groups under `s`: the mesh's tp group (tp > 1) and a ContextParallel over
/// its ring / ulysses / cp groups (cp > 1).
inline TransformerParallelism transformerParallelism(const Strategy& s, const DeviceMesh& mesh) {
  TransformerParallelism par;
  if (s.tp_degree > 1) par.tp = mesh.group("tp");
  if (s.cpDegree() > 1) {
    ContextParallelOptions co{s.ring_degree, s.ulysses_degree, s.ulysses_anything, s.ring_anything};
    par.cp = std::make_shared<ContextParallel>(mesh.group("ring"), mesh.group("ulysses"),
                                               mesh.group("cp"), co);
  }
  return par;
}

}  // namespace dit::test
