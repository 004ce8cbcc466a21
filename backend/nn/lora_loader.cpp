#include "backend/nn/lora_loader.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "backend/io/safetensors.h"
#include "backend/io/tensor_io.h"

namespace dit {

namespace {

// Refuses a factor holding NaN or Inf (as stored, or after the conversion to float32), naming
// the file and the tensor: it would make every output of its module NaN (PEFT applies it as is).
void checkFactorFinite(const std::string& path, const std::string& key, const at::Tensor& t) {
  // One reduction in float64 (NaN and Inf propagate; finite float32 values cannot overflow it).
  if (std::isfinite(t.sum(at::kDouble).item<double>())) return;
  const at::Tensor bad = at::logical_not(at::isfinite(t)).reshape({-1});
  const int64_t n = bad.sum().item<int64_t>();
  const int64_t first = bad.nonzero()[0][0].item<int64_t>();
  const double v = t.reshape({-1})[first].item<double>();
  throw ModelFileError(path, "tensor '" + key + "' holds " + std::to_string(n) +
                                 " non-finite value" + (n == 1 ? "" : "s") + " (first: " +
                                 (std::isnan(v) ? "nan"
                                  : v > 0       ? "inf"
                                                : "-inf") +
                                 " at flat index " + std::to_string(first) +
                                 "); refusing a LoRA that would make NaN images");
}

}  // namespace

tensor_parallel::LoraAdapter loadLoraAdapter(const std::string& path,
                                             const KohyaLoraMapping& kohya) {
  const LoraFileInfo info = inspectLoraFile(path);
  SafetensorsCollection st(path);
  tensor_parallel::LoraAdapter a;
  a.file = path;
  a.format = loraFormatName(info.format);
  if (info.format == LoraFormat::Kohya && !kohya)
    throw ModelFileError(path, "this model family takes no kohya LoRA files");
  for (const auto& m : info.modules) {
    at::Tensor A = loadTensor(st, m.keyA, at::kFloat);
    at::Tensor B = loadTensor(st, m.keyB, at::kFloat);
    checkFactorFinite(path, m.keyA, A);
    checkFactorFinite(path, m.keyB, B);
    if (info.format == LoraFormat::Diffusers) {
      a.modules.push_back({m.name, A, B, m.alpha, m.rank, m.scale});
      continue;
    }
    const auto targets = kohya(m.name, m.out, m.in);
    if (targets.empty())
      throw ModelFileError(path, "kohya module 'lora_unet_" + m.name + "' (lora_up [" +
                                     std::to_string(m.out) + ", " + std::to_string(m.rank) +
                                     "], lora_down [" + std::to_string(m.rank) + ", " +
                                     std::to_string(m.in) +
                                     "]) does not exist in this model (a LoRA for another model?)");
    for (const auto& t : targets) {
      if (t.rowStart < 0 || t.rows <= 0 || t.rowStart + t.rows > m.out)
        throw ModelFileError(
            path, "kohya module 'lora_unet_" + m.name + "' cannot be split into " + t.module);
      at::Tensor b = B.narrow(0, t.rowStart, t.rows);
      if (t.swapHalves) {
        auto h = b.chunk(2, 0);
        b = at::cat({h[1], h[0]}, 0);
      }
      a.modules.push_back({t.module, A, b.contiguous(), t.scaleOne ? m.rank : m.alpha, m.rank,
                           t.scaleOne ? 1.0 : m.scale});
    }
  }
  return a;
}

}  // namespace dit
