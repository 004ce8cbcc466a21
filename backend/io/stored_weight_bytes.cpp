#include "backend/io/stored_weight_bytes.h"

#include <algorithm>

#include "backend/io/gguf_types.h"
#include "backend/io/key_layout.h"
#include "backend/io/model_folder.h"
#include "backend/io/safetensors.h"

namespace dit {

uint64_t storedWeightBytesPerRank(const ShardingPlan& plan, const ParameterTable& params, int tp,
                                  int64_t computeElementBytes, bool keep16Bit) {
  double bytes = 0;
  for (const ParameterInfo& p : params) {
    const ShardSpec spec = plan.shardSpec(p.name, p.shape, 0, std::max(1, tp));
    double local = static_cast<double>(p.numel());
    if (!spec.replicated()) local /= static_cast<double>(spec.parts);
    GgmlType g;
    const bool block = parseGgmlType(p.dtype, g) && ggmlIsQuantized(g);
    const bool f8 = p.dtype == "F8_E4M3" || p.dtype == "F8_E5M2";
    const bool half = keep16Bit && (p.dtype == "F16" || p.dtype == "BF16");
    const bool kept = p.shape.size() == 2 && (block || f8 || half);
    bytes += local *
             (kept ? storageBytesPerParameter(p.dtype) : static_cast<double>(computeElementBytes));
  }
  return static_cast<uint64_t>(bytes + 0.5);
}

ParameterTable withStoredTypes(const ModelFolder& m, const ParameterTable& params, bool* isGguf) {
  if (isGguf) *isGguf = false;
  auto it = m.components.find("transformer");
  if (it == m.components.end() || !it->second.single_file) return params;
  if (!m.singleFileLayout) return params;
  SafetensorsReader r(it->second.path);
  const auto layout = m.singleFileLayout("transformer");
  if (isGguf) *isGguf = r.isGguf();
  ParameterTable out;
  for (ParameterInfo p : params) {
    auto t = layout->tensors.find(p.name);
    if (t != layout->tensors.end()) {
      const DType d = r.info(t->second.segments.front().key).dtype;
      p.dtype = dtypeName(d);
      p.elementBytes = std::max<int64_t>(1, static_cast<int64_t>(dtypeSize(d)));
    }
    out.add(p);
  }
  return out;
}

}  // namespace dit
