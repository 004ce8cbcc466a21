#include "backend/family_runtime.h"

#include <nlohmann/json.hpp>

#include "backend/io/model_folder.h"  // UnsupportedModelError
#include "backend/models/family_registry.h"
#include "backend/models/flux/flux_runtime.h"
#include "backend/models/flux2/flux2_runtime.h"
#include "backend/models/qwenimage/qwenimage_runtime.h"
#include "backend/models/zimage/zimage_runtime.h"

namespace dit {
namespace {

// One line per family.
const std::vector<FamilyRuntime>& runtimes() {
  static const std::vector<FamilyRuntime> r{
      fluxRuntime(),
      flux2KleinRuntime(),
      qwenImageRuntime(),
      zimageRuntime(),
  };
  return r;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

const FamilyRuntime& familyRuntime(const std::string& pipeline_class, const std::string& file) {
  // Unknown class: refused with the supported list; a variant (FluxKontextPipeline) runs on its
  // family's runtime, whose pipeline reads the folder's class.
  const FamilySpec& family = pipelineFamily(pipeline_class, file);
  for (const auto& r : runtimes())
    if (r.pipeline_class == family.pipeline_class) return r;
  throw UnsupportedModelError(
      file, "pipeline class \"" + pipeline_class +
                "\" has a config reader but no Torch implementation in this build; "
                "implemented pipeline classes: " +
                joined(loadablePipelineClasses()));
}

std::unique_ptr<DiffusionPipeline> loadPipeline(const ModelFolder& model,
                                                const PipelineOptions& opts) {
  return familyRuntime(model.pipeline_class, model.path + "/model_index.json")
      .loadPipeline(model, opts);
}

std::unique_ptr<DiffusionTransformer> loadTransformer(const std::string& transformer_class,
                                                      const nlohmann::json& config,
                                                      const std::string& file, WeightSource& w,
                                                      const TransformerParallelism& par) {
  const FamilySpec& f = transformerFamily(transformer_class, file);
  return familyRuntime(f.pipeline_class, file).loadTransformer(config, file, w, par);
}

std::vector<std::string> loadablePipelineClasses() {
  std::vector<std::string> v;
  // A named argument: GCC 14 (-Wdangling-reference) warns when the returned reference was bound
  // in a call that took a temporary string.
  const std::string noFile;
  for (const auto& r : runtimes()) {
    // A family's runtime serves its pipeline variants too (their pipeline reads the class).
    v.push_back(r.pipeline_class);
    const FamilySpec& f = pipelineFamily(r.pipeline_class, noFile);
    v.insert(v.end(), f.pipeline_variants.begin(), f.pipeline_variants.end());
  }
  return v;
}

std::vector<std::string> loadableTransformerClasses() {
  std::vector<std::string> v;
  for (const auto& r : runtimes())
    v.push_back(pipelineFamily(r.pipeline_class, "").transformer_class);
  return v;
}

}  // namespace dit

#include "parallel/context_parallel.h"  // tensorSplitSizes

namespace dit {

CollectiveTraffic dualStreamTraffic(const DualStreamTrafficShape& m, const Strategy& s, int rank,
                                    const BenchShape& shape, uint64_t es) {
  CollectiveTraffic t;
  const int64_t B = shape.batch, simg = shape.imageTokens(), stxt = shape.text_tokens;
  const auto co = meshCoords(s, rank);  // {dp, cfg, ring, ulysses, tp}
  const int R = s.ring_degree, U = s.ulysses_degree, tp = s.tp_degree, cp = R * U;
  const int ri = co[2], ui = co[3], cpr = ri * U + ui;
  const int64_t C = m.heads * m.head_dim, D = m.head_dim, Hl = m.heads / tp;
  const auto txt = tensorSplitSizes(stxt, cp), img = tensorSplitSizes(simg, cp);
  std::vector<int64_t> sl(static_cast<size_t>(cp));
  for (int k = 0; k < cp; ++k) sl[k] = txt[k] + img[k];
  const int64_t attnCalls = m.num_layers + m.num_single_layers;
  if (tp > 1) {
    auto ar = [&](int64_t tokens) {
      const uint64_t n = static_cast<uint64_t>(B * tokens * C) * es;
      return static_cast<uint64_t>(2 * (tp - 1)) * n / static_cast<uint64_t>(tp);
    };
    t.tp_allreduce =
        static_cast<uint64_t>(m.num_layers * m.rowwise_per_stream) * (ar(img[cpr]) + ar(txt[cpr])) +
        static_cast<uint64_t>(m.num_single_layers * m.rowwise_per_single) * ar(sl[cpr]);
    const int64_t gathered =
        m.num_layers * m.gathered_per_double + m.num_single_layers * m.gathered_per_single;
    t.tp_allgather =
        static_cast<uint64_t>(B * (gathered / tp)) * es * static_cast<uint64_t>(tp - 1);
  }
  std::vector<int64_t> heads{Hl};
  if (U > 1) {
    heads = tensorSplitSizes(Hl, U);
    uint64_t per = 0;
    for (int j = 0; j < U; ++j) {
      if (j == ui) continue;
      per += static_cast<uint64_t>(3 * B * heads[j] * sl[cpr] * D) * es;      // q, k, v
      per += static_cast<uint64_t>(B * heads[ui] * sl[ri * U + j] * D) * es;  // output back
    }
    t.ulysses_all_to_all = static_cast<uint64_t>(attnCalls) * per;
  }
  if (R > 1) {
    const int64_t hAtt = U > 1 ? heads[ui] : Hl;
    std::vector<int64_t> blk(static_cast<size_t>(R), 0);
    for (int j = 0; j < R; ++j)
      for (int u = 0; u < U; ++u) blk[j] += sl[j * U + u];
    uint64_t per = 0;
    for (int st = 0; st + 1 < R; ++st) {
      const int owner = ((ri - st) % R + R) % R;  // block held (and sent on) at step st
      per += static_cast<uint64_t>(2 * B * hAtt * blk[owner] * D) * es;
    }
    t.ring_kv = static_cast<uint64_t>(attnCalls) * per;
  }
  if (cp > 1)
    t.cp_gather =
        static_cast<uint64_t>(B * img[cpr] * m.out_channels) * es * static_cast<uint64_t>(cp - 1);
  if (s.cfg_degree == 2) t.cfg_gather = static_cast<uint64_t>(B * simg * m.out_channels) * es;
  return t;
}

}  // namespace dit
