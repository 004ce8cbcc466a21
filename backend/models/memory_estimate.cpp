#include "backend/models/memory_estimate.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "backend/io/safetensors.h"
#include "backend/io/stored_weight_bytes.h"
#include "backend/models/family.h"
#include "backend/models/family_registry.h"
#include "backend/models/vae_decode_memory.h"
#include "parallel/tensor_parallel/sharding_plan.h"

namespace dit {

namespace {

uint64_t ceilDiv(uint64_t a, uint64_t b) { return b == 0 ? a : (a + b - 1) / b; }

// Elements of every tensor in a component's safetensors (headers only) times the compute size.
uint64_t componentBytes(const ModelFolder& m, const std::string& component, const std::string& stem,
                        int64_t elementBytes) {
  return m.componentParameterCount(component, stem) * static_cast<uint64_t>(elementBytes);
}

// Saturating arithmetic: impossible sizes must give a huge figure, never a wrapped small one.
uint64_t mul(uint64_t a, uint64_t b) {
  if (a != 0 && b > UINT64_MAX / a) return UINT64_MAX;
  return a * b;
}
uint64_t add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

// The score block the CPU's attention (cpuMathAttention, parallel/cpu_attention.cpp) holds at a
// time for q queries and k keys per head: float32 works head by head in blocks of about 1 MiB
// (at least 32 query rows), bfloat16 all heads of a query block at once within 16 MiB (at least
// one row); never more than the whole scores.
uint64_t cpuScoreBlockBytes(uint64_t heads, uint64_t q, uint64_t k, uint64_t eb) {
  if (eb >= 4) return std::min(mul(mul(q, k), 4), std::max(uint64_t{1} << 20, mul(32 * 4, k)));
  return std::min(mul(mul(heads, mul(q, k)), 2), std::max(uint64_t{16} << 20, mul(heads * 2, k)));
}

}  // namespace

uint64_t MemoryEstimate::peak() const {
  return add(weights, std::max({add(activations, attention), vae_decode, text_encode}));
}

std::string MemoryEstimate::describe() const {
  return "weights " + formatBytes(weights) + " + transformer activations " +
         formatBytes(activations) + " + attention " + formatBytes(attention) + " (VAE decode " +
         formatBytes(vae_decode) + ") = " + formatBytes(peak()) + (note.empty() ? "" : "; " + note);
}

uint64_t textEncoderBytesPerRank(const ModelFolder& m, int tp, int64_t elementBytes,
                                 std::string* note) {
  const FamilyMemoryFacts f =
      familyOf(m).memory(m, std::max(1, tp), std::max<int64_t>(1, elementBytes));
  if (note && !f.note.empty()) *note = f.note;
  return f.text_encoder_bytes;
}

MemoryEstimate estimateTransformerMemory(const ModelDims& dims, const Strategy& s,
                                         const RequestDims& r, int64_t elementBytes,
                                         bool scoresMaterialized, int vaeDecoderChannels,
                                         const VaeDecoderShape* vaeShape) {
  const uint64_t eb = static_cast<uint64_t>(std::max<int64_t>(1, elementBytes));
  MemoryEstimate e;
  const int tp = std::max(1, s.tp_degree);
  // Transformer: tokens and heads of this rank.
  const int vsf = std::max(1, dims.vae_scale_factor);
  // The image stream: the output's tokens plus the reference images' (editing) in every call.
  const uint64_t imageTokens = add(mul(static_cast<uint64_t>(std::max(0, r.height / (2 * vsf))),
                                       static_cast<uint64_t>(std::max(0, r.width / (2 * vsf)))),
                                   static_cast<uint64_t>(std::max(0, r.reference_tokens)));
  const uint64_t tokens = add(imageTokens, static_cast<uint64_t>(std::max(0, r.text_len)));
  const uint64_t ring = static_cast<uint64_t>(std::max(1, s.ring_degree));
  const uint64_t ulysses = static_cast<uint64_t>(std::max(1, s.ulysses_degree));
  const uint64_t localTokens = ceilDiv(tokens, ring * ulysses);
  const uint64_t inner = static_cast<uint64_t>(dims.num_attention_heads) *
                         static_cast<uint64_t>(dims.attention_head_dim);
  const uint64_t heads =
      ceilDiv(static_cast<uint64_t>(dims.num_attention_heads), static_cast<uint64_t>(tp) * ulysses);
  // Live tensors of a single block at its peak: input and residual, q/k/v (sharded by tp),
  // the attention output, the MLP hidden (4 x inner / tp) and cat(attn, mlp): about 16 x inner
  // per token (float32 intermediates for norms and the scheduler step counted in).
  e.activations = mul(mul(localTokens, inner), mul(16, eb));
  // Attention: after the Ulysses all-to-all a rank holds tokens / ring queries for its heads and
  // attends to one ring block (tokens / ring keys) at a time.
  // The output and log-sum-exp of every kernel; the CPU's math path adds one block of scores,
  // never the whole [heads, q, q] (it works through the queries in blocks).
  const uint64_t q = ceilDiv(tokens, ring);
  e.attention =
      mul(mul(heads, q), mul(static_cast<uint64_t>(dims.attention_head_dim) + 1, mul(2, eb)));
  if (scoresMaterialized) e.attention = add(e.attention, cpuScoreBlockBytes(heads, q, q, eb));
  // VAE decoder: followed op by op (vae_decode_memory.h), with LibTorch's CPU convolution
  // buffers on the math path's device (the CPU).
  e.vae_decode = vaeDecodePeakBytes(
      vaeShape && !vaeShape->channels.empty() ? *vaeShape
                                              : standardVaeDecoderShape(vaeDecoderChannels),
      r.height, r.width, static_cast<int64_t>(eb), scoresMaterialized);
  return e;
}

MemoryEstimate estimateRequestMemory(const ModelFolder& m, const Strategy& s, const RequestDims& r,
                                     int64_t elementBytes, bool scoresMaterialized) {
  const ModelDims& dims = m.dims();
  const int tp = std::max(1, s.tp_degree);
  const FamilyMemoryFacts facts = familyOf(m).memory(m, tp, std::max<int64_t>(1, elementBytes));
  MemoryEstimate e = estimateTransformerMemory(dims, s, r, elementBytes, scoresMaterialized,
                                               facts.vae_decoder_channels, &facts.vae_decoder);
  const uint64_t eb = static_cast<uint64_t>(std::max<int64_t>(1, elementBytes));
  // Weights: the transformer's share from its declared plan (a GGUF transformer keeps its
  // weights in their stored types), the rest whole on every rank.
  bool gguf = false;
  const ParameterTable stored =
      dims.parameters ? withStoredTypes(m, *dims.parameters, &gguf) : ParameterTable{};
  if (dims.tensor_parallel_plan && dims.parameters && gguf)
    e.transformer_weights = storedWeightBytesPerRank(*dims.tensor_parallel_plan, stored, tp,
                                                     static_cast<int64_t>(eb), true);
  else if (dims.tensor_parallel_plan && dims.parameters)
    e.transformer_weights =
        dims.tensor_parallel_plan->bytesPerRank(*dims.parameters, tp, static_cast<int64_t>(eb));
  else
    e.transformer_weights = mul(m.transformerParameterCount(), eb);
  e.text_encoder_weights = facts.text_encoder_bytes;
  e.note = facts.note;
  e.vae_weights = componentBytes(m, "vae", "diffusion_pytorch_model", elementBytes);
  e.weights = add(add(e.transformer_weights, e.text_encoder_weights), e.vae_weights);
  return e;
}

std::optional<MemoryEstimate> placeTextEncoder(const MemoryEstimate& e, TextEncoderPlacement pl,
                                               uint64_t wholeEncoderBytes, uint64_t layerBytesAtTp,
                                               bool cpuRanks, std::string* why) {
  if (pl == TextEncoderPlacement::Sharded) return e;
  MemoryEstimate r = e;
  const uint64_t te = e.text_encoder_weights;
  r.weights -= te;
  r.text_encoder_weights = 0;
  switch (pl) {
    case TextEncoderPlacement::OwnRank:
      r.text_encoder_weights = wholeEncoderBytes;
      break;
    case TextEncoderPlacement::HostStreamed:
      if (layerBytesAtTp == 0) {
        if (why)
          *why =
              "not available for this model's text encoders (streaming is implemented for the "
              "Qwen3 / Mistral / Qwen2.5-VL decoders; FLUX.1's CLIP and T5 are not streamed)";
        return std::nullopt;
      }
      r.text_encoder_weights = add(layerBytesAtTp, cpuRanks ? te : 0);
      break;
    case TextEncoderPlacement::Once:
      r.text_encode = te;
      break;
    case TextEncoderPlacement::Sharded:
      break;
  }
  r.weights = add(r.weights, r.text_encoder_weights);
  return r;
}

MemoryEstimate estimateRequestMemory(const ModelFolder& m, const Strategy& s, const RequestDims& r,
                                     int64_t elementBytes, bool scoresMaterialized,
                                     TextEncoderPlacement pl) {
  const MemoryEstimate e = estimateRequestMemory(m, s, r, elementBytes, scoresMaterialized);
  if (pl == TextEncoderPlacement::Sharded) return e;
  const int64_t eb = std::max<int64_t>(1, elementBytes);
  const uint64_t whole =
      pl == TextEncoderPlacement::OwnRank ? familyOf(m).memory(m, 1, eb).text_encoder_bytes : 0;
  const uint64_t layer =
      pl == TextEncoderPlacement::HostStreamed
          ? familyOf(m).memory(m, std::max(1, s.tp_degree), eb).text_encoder_layer_bytes
          : 0;
  std::string why;
  if (auto placed = placeTextEncoder(e, pl, whole, layer, scoresMaterialized, &why)) return *placed;
  throw std::invalid_argument(std::string("text-encoder placement ") +
                              textEncoderPlacementName(pl) + ": " + why);
}

MemoryEstimate estimateKnownModelMemory(const KnownModel& k, const Strategy& s,
                                        const RequestDims& r, int64_t elementBytes,
                                        bool scoresMaterialized) {
  const int tp = std::max(1, s.tp_degree);
  const int64_t eb = std::max<int64_t>(1, elementBytes);
  FamilyMemoryFacts facts;
  if (k.memory) facts = k.memory(tp, eb);
  MemoryEstimate e = estimateTransformerMemory(k.dims, s, r, eb, scoresMaterialized,
                                               facts.vae_decoder_channels, &facts.vae_decoder);
  const uint64_t ueb = static_cast<uint64_t>(eb);
  if (k.dims.tensor_parallel_plan && k.dims.parameters)
    e.transformer_weights = k.dims.tensor_parallel_plan->bytesPerRank(*k.dims.parameters, tp, eb);
  else if (k.dims.parameters)
    for (const ParameterInfo& p : *k.dims.parameters)
      e.transformer_weights =
          add(e.transformer_weights, mul(static_cast<uint64_t>(p.numel()), ueb));
  if (k.memory) {
    e.text_encoder_weights = facts.text_encoder_bytes;
    e.vae_weights = mul(static_cast<uint64_t>(k.vae_parameters), ueb);
    e.note = facts.note;
  } else {
    e.text_encoder_weights = mul(static_cast<uint64_t>(k.other_parameters), ueb);
    e.note = "text encoders and VAE counted whole on every rank (" + k.name +
             " declares no per-rank figure for them)";
  }
  e.weights = add(add(e.transformer_weights, e.text_encoder_weights), e.vae_weights);
  return e;
}

std::optional<uint64_t> hostMemoryAvailable() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kb * 1024;
  }
  return std::nullopt;
}

std::string formatBytes(uint64_t bytes) {
  if (bytes == UINT64_MAX) return "more than 16 EiB";
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 6) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else
    std::snprintf(buf, sizeof buf,
                  v >= 100  ? "%.0f %s"
                  : v >= 10 ? "%.1f %s"
                            : "%.2f %s",
                  v, units[u]);
  return buf;
}

std::string memoryRefusal(const MemoryEstimate& e, uint64_t perRank, int ranksOnHost,
                          uint64_t available, const RequestDims& r, const std::string& what) {
  const uint64_t need = mul(perRank, static_cast<uint64_t>(std::max(1, ranksOnHost)));
  if (need <= available) return "";
  std::ostringstream o;
  o << "not enough memory for " << r.width << "x" << r.height << ": ";
  if (ranksOnHost > 1)
    o << "each of the " << ranksOnHost << " ranks on this host needs about ";
  else
    o << "the rank needs about ";
  o << formatBytes(perRank) << " (estimate per rank: " << e.describe() << ")";
  if (ranksOnHost > 1) o << ", " << formatBytes(need) << " in all,";
  o << " but only " << formatBytes(available) << " of " << what
    << " is available; use a smaller size, more context-parallel ranks (ring/ulysses) or tensor "
       "parallelism, or a machine with more memory";
  return o.str();
}

}  // namespace dit
