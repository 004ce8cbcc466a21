// LoRA under tensor parallelism at the transformer level (mpirun -np 2 or 4, tp_degree = world,
// tiny-flux-A float32): with the kohya file at 1.0 plus the diffusers file at 0.6 (fused q/k/v and
// q/k/v/mlp splits, colwise, rowwise, packed rowwise and replicated layers), the tp forward equals
// the one-rank forward with the same LoRAs within 1e-5 on the lora goldens' inputs; each rank
// holds only its slices (colwise: B rows / tp and A whole; rowwise: A columns / tp and B whole),
// and the per-rank LoRA bytes are about half of tp 1 (asserted against the closed form).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <map>
#include <memory>
#include <set>
#include <string>

#include "backend/io/model_folder.h"
#include "backend/io/weight_source.h"
#include "backend/models/flux/transformer_flux.h"
#include "backend/nn/lora_loader.h"
#include "backend/pipelines/flux/flux_pipeline_config.h"
#include "parallel/device_mesh.h"
#include "parallel/strategy.h"
#include "tp_test_util.h"

using namespace dit;
using tensor_parallel::PreparedLora;

namespace {

const SafetensorsCollection& loraGoldens() {
  static SafetensorsCollection g(test::fixtureDir() + "/lora/lora_golden.safetensors");
  return g;
}

at::Tensor runCase(const FluxTransformer2DModel& m, int i) {
  at::NoGradGuard ng;
  const std::string p = "dit." + std::to_string(i) + ".in.";
  auto g = [&](const std::string& n) { return loadTensor(loraGoldens(), p + n, at::kFloat); };
  return m.forward(g("hidden_states"), g("encoder_hidden_states"), g("pooled_projections"),
                   g("timestep"), g("img_ids"), g("txt_ids"), g("guidance"));
}

// The two fixture LoRAs prepared for `m`: kohya at 1.0, diffusers at 0.6.
std::vector<std::pair<std::shared_ptr<const PreparedLora>, double>> loras(
    FluxTransformer2DModel& m) {
  const std::string d = test::fixtureDir() + "/lora/";
  return {
      {m.loraTargets().prepare(loadLoraAdapter(d + "lora-kohya.safetensors", m.kohyaLoraMapping())),
       1.0},
      {m.loraTargets().prepare(
           loadLoraAdapter(d + "lora-diffusers.safetensors", m.kohyaLoraMapping())),
       0.6}};
}

}  // namespace

TEST(LoraTensorParallel, EqualsOneRankAndHoldsOnlySlices) {
  const int tp = test::worldSize();
  ASSERT_GE(tp, 2) << "run under mpirun -np 2 or 4";
  auto w1 = test::fixtureTransformerWeights();
  FluxTransformer2DModel dense(test::fixtureTransformerConfig(), *w1);
  const auto denseLoras = loras(dense);
  dense.loraTargets().apply(denseLoras);

  const test::TpOverWorld group;
  const FluxParallelism& par = group.par;
  auto w = test::fixtureTransformerWeights();
  FluxTransformer2DModel model(test::fixtureTransformerConfig(), *w, par);
  const auto tpLoras = loras(model);
  model.loraTargets().apply(tpLoras);

  for (int i = 0; i < 3; ++i) {
    const double d = test::maxOverRanks(test::maxAbsDiff(runCase(model, i), runCase(dense, i)));
    const at::Tensor base =
        loadTensor(loraGoldens(), "dit." + std::to_string(i) + ".out", at::kFloat);
    std::printf("  tp %d dit.%d with LoRAs: max |tp - tp1| %.3g (LoRA effect %.3g)\n", tp, i, d,
                test::maxAbsDiff(runCase(dense, i), base));
    EXPECT_LT(d, 1e-5) << i;
  }

  // Slices: each entry equals its tp 1 counterpart cut as the layer's weight is cut.
  uint64_t expected = 0;
  std::set<const void*> countedA;
  for (size_t k = 0; k < tpLoras.size(); ++k) {
    const auto& dl = *denseLoras[k].first;
    const auto& tl = *tpLoras[k].first;
    ASSERT_EQ(dl.entries.size(), tl.entries.size());
    for (size_t e = 0; e < dl.entries.size(); ++e) {
      const auto& de = dl.entries[e];
      const auto& te = tl.entries[e];
      ASSERT_EQ(de.module, te.module);
      const auto& layer = *model.loraTargets().layers()[te.layer];
      const at::Tensor& A = te.delta.A;
      const at::Tensor& B = te.delta.B;
      // The part's (or layer's) spec decides: rows of B (colwise) or columns of A (rowwise).
      const bool colwise = B.size(0) * tp == de.delta.B.size(0) && A.size(1) == de.delta.A.size(1);
      const bool rowwise = A.size(1) * tp == de.delta.A.size(1) && B.size(0) == de.delta.B.size(0);
      const bool replicated = A.sizes() == de.delta.A.sizes() && B.sizes() == de.delta.B.sizes();
      EXPECT_TRUE(colwise || rowwise || replicated) << te.module;
      if (layer.spec().replicated()) {
        EXPECT_TRUE(replicated) << te.module;
        EXPECT_TRUE(at::equal(A, de.delta.A) && at::equal(B, de.delta.B)) << te.module;
      } else if (layer.spec().dim == 0) {
        EXPECT_TRUE(colwise) << te.module;
        EXPECT_TRUE(at::equal(A, de.delta.A)) << te.module;  // A whole
      } else {
        EXPECT_TRUE(rowwise) << te.module;
        EXPECT_TRUE(at::equal(B, de.delta.B)) << te.module;  // B whole
      }
      // A shared by the parts of a fused layer (kohya lora_down) is held once.
      if (countedA.insert(A.data_ptr()).second) expected += static_cast<uint64_t>(A.numel()) * 4;
      expected += static_cast<uint64_t>(B.numel()) * 4;
    }
  }
  const uint64_t bytesTp = model.loraTargets().appliedBytes();
  const uint64_t bytes1 = dense.loraTargets().appliedBytes();
  const double ratio = static_cast<double>(bytesTp) / static_cast<double>(bytes1);
  std::printf("  LoRA bytes per rank: tp 1 %llu, tp %d %llu (ratio %.3f)\n",
              static_cast<unsigned long long>(bytes1), tp, static_cast<unsigned long long>(bytesTp),
              ratio);
  EXPECT_EQ(bytesTp, expected);
  // Rank-4 factors of a 64-wide model: the unsplit factor (A of a colwise layer, B of a rowwise
  // one) is as large as the split one, so "about half" here is 1/2 + 1/(2 tp) at most.
  EXPECT_LT(ratio, 0.5 + 0.5 / tp + 0.02);
  EXPECT_GT(ratio, 1.0 / tp);
}

int main(int argc, char** argv) { return test::mpiTestMain(argc, argv); }
