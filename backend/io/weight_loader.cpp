#include "backend/io/weight_loader.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <vector>

#include "backend/io/gguf_types.h"
#include "backend/io/tensor_io.h"
#include "parallel/process_group.h"

namespace dit {

using tensor_parallel::ColumnParallelLinear;
using tensor_parallel::FusedColumnParallelLinear;
using tensor_parallel::ReplicatedLinear;
using tensor_parallel::RowParallelLinear;

WeightLoader::WeightLoader(WeightSource& source, std::shared_ptr<const ShardingPlan> plan,
                           std::shared_ptr<ProcessGroup> tp)
    : src_(source), plan_(std::move(plan)), tp_(std::move(tp)) {}

int WeightLoader::tpRank() const { return tp_ ? tp_->rank() : 0; }
int WeightLoader::tpSize() const { return tp_ ? tp_->size() : 1; }

ShardSpec WeightLoader::specFor(const std::string& paramName,
                                const std::vector<int64_t>& shape) const {
  if (!plan_ || tpSize() == 1) return {};
  return plan_->shardSpec(paramName, shape, tpRank(), tpSize());
}

void WeightLoader::record(const std::string& name, const std::vector<int64_t>& shape,
                          const ShardSpec& spec) {
  LoadedParameter p;
  p.info.name = name;
  p.info.shape = shape;
  std::tie(p.info.dtype, p.info.elementBytes) = src_.storage(name);
  p.spec = spec;
  loaded_.push_back(std::move(p));
}

at::Tensor WeightLoader::read(const std::string& name, const std::vector<int64_t>& shape,
                              const ShardSpec& spec) {
  at::Tensor t;
  if (spec.replicated())
    t = src_.get(name, shape);
  else if (spec.blocks.empty())
    t = src_.shard(name, shape, spec.dim, spec.part, spec.parts);
  else
    t = src_.packedShard(name, shape, spec.dim, spec.blocks, spec.part, spec.parts);
  record(name, shape, spec);
  return t;
}

std::shared_ptr<const tensor_parallel::WeightStorage> WeightLoader::readFloat8(
    const std::string& name, const std::vector<int64_t>& shape, const ShardSpec& spec,
    at::Tensor& codes) {
  const std::string format = src_.float8Format(name);
  if (format.empty()) return nullptr;
  src_.setKeepFloat8(true);
  try {
    codes = read(name, shape, spec);
  } catch (...) {
    src_.setKeepFloat8(false);
    throw;
  }
  src_.setKeepFloat8(false);
  const at::Tensor table = float8Table(parseDType(format));
  const float scale = src_.float8Scale(name);
  if (!allowNonFiniteWeights()) checkFloat8(name, format, codes, table, scale);
  auto s = std::make_shared<tensor_parallel::WeightStorage>();
  s->format = format;
  s->table = table.to(codes.device());
  s->rowScale = at::full({codes.size(0)}, scale,
                         at::TensorOptions().dtype(at::kFloat).device(codes.device()));
  return s;
}

void WeightLoader::checkFloat8(const std::string& name, const std::string& format,
                               const at::Tensor& codes, const at::Tensor& table,
                               float scale) const {
  // The codes stay 8-bit (the decoded weights are never materialised at load): the codes whose
  // value is NaN or Inf (F8_E4M3: 0x7f, 0xff; F8_E5M2: exponent all ones) are looked for one by
  // one, and the scale is checked so that the largest code times it stays a float32.
  const float* tv = table.data_ptr<float>();
  float largest = 0;
  for (int c = 0; c < 256; ++c) {
    if (std::isfinite(tv[c])) {
      largest = std::max(largest, std::fabs(tv[c]));
      continue;
    }
    const at::Tensor hit = codes.reshape({-1}).eq(c);
    const int64_t n = hit.sum().item<int64_t>();
    if (n == 0) continue;
    const int64_t first = hit.nonzero()[0][0].item<int64_t>();
    char code[8];
    std::snprintf(code, sizeof code, "0x%02x", c);
    throw ModelFileError(src_.where(),
                         "tensor '" + name + "' (" + format + ") holds " + std::to_string(n) +
                             " code" + (n == 1 ? "" : "s") + " " + code + ", which is " +
                             (std::isnan(tv[c]) ? "NaN" : "Inf") + " (first at flat index " +
                             std::to_string(first) +
                             " of this rank's part); refusing weights that would make NaN "
                             "images. Pass --allow-nonfinite-weights (or set "
                             "DITSTUDIO_ALLOW_NONFINITE_WEIGHTS=1) to load them anyway");
  }
  if (!std::isfinite(scale) || !std::isfinite(largest * scale))
    throw ModelFileError(
        src_.where(),
        "the scale of tensor '" + name + "' (" + format + ") is " + std::to_string(scale) +
            (std::isfinite(scale) ? ", which times the largest " + format + " value (" +
                                        std::to_string(largest) + ") overflows float32"
                                  : std::string()) +
            "; refusing weights that would make NaN images. Pass "
            "--allow-nonfinite-weights (or set "
            "DITSTUDIO_ALLOW_NONFINITE_WEIGHTS=1) to load them anyway");
}

void WeightLoader::checkBlocks(const std::string& name, const std::string& format,
                               const at::Tensor& codes,
                               const tensor_parallel::WeightStorage& storage) const {
  // Weights kept in ggml blocks are decoded at use only: each row is decoded once here (float32
  // values, as at use) and checked, so a block whose scale is NaN/Inf (or whose values overflow)
  // is refused at load like any other weight.
  const int64_t rows = codes.size(0), rowBytes = codes.size(1);
  const uint8_t* base = codes.data_ptr<uint8_t>();
  std::atomic<int64_t> firstBad{-1};
  at::parallel_for(0, rows, 16, [&](int64_t b, int64_t e) {
    std::vector<float> row(static_cast<size_t>(storage.inFeatures));
    for (int64_t r = b; r < e && firstBad.load() < 0; ++r) {
      storage.decodeRow(base + r * rowBytes, row.data());
      for (float v : row)
        if (!std::isfinite(v)) {
          int64_t expected = -1;
          firstBad.compare_exchange_strong(expected, r);
          break;
        }
    }
  });
  if (firstBad.load() < 0) return;
  throw ModelFileError(src_.where(),
                       "tensor '" + name + "' (" + format + ", kept quantized) decodes to " +
                           "non-finite values (first in row " + std::to_string(firstBad.load()) +
                           " of this rank's part: a block scale is NaN/Inf or overflows); "
                           "refusing weights that would make NaN images. Pass "
                           "--allow-nonfinite-weights (or set "
                           "DITSTUDIO_ALLOW_NONFINITE_WEIGHTS=1) to load them anyway");
}

std::shared_ptr<const tensor_parallel::WeightStorage> WeightLoader::readBlocks(
    const std::string& name, const std::vector<int64_t>& shape, const ShardSpec& spec,
    at::Tensor& codes) {
  const std::string format = src_.blockFormat(name);
  GgmlType type{};
  if (format.empty() || !parseGgmlType(format, type) || shape.size() != 2) return nullptr;
  if (!src_.device().is_cpu()) {
    const std::string note = format +
                             " weight dequantized to the compute dtype at load: "
                             "quantized weights are kept quantized on CPU devices only for now";
    at::Tensor w = read(name, shape, spec);
    loaded_.back().note = note;
    codes = w;
    return nullptr;
  }
  struct Piece {
    int64_t byteOffset, elements, skip, take;  // covering blocks and the columns kept of them
  };
  std::vector<Piece> pieces;
  const int64_t bs = ggmlBlockSize(type), in = shape[1];
  std::string note;
  src_.setKeepBlocks(true);
  try {
    if (spec.replicated() || spec.dim == 0) {
      codes = read(name, shape, spec);
      pieces.push_back({0, in, 0, in});
    } else {
      std::vector<at::Tensor> parts;
      int64_t bytes = 0;
      for (const auto& [start, len] : spec.ranges(shape)) {
        const int64_t cb = start / bs * bs, ce = std::min(in, (start + len + bs - 1) / bs * bs);
        if (cb != start || ce != start + len)
          note += std::string(note.empty() ? "" : "; ") + "columns [" + std::to_string(start) +
                  ", " + std::to_string(start + len) + ") do not fall on " + format +
                  " block boundaries (" + std::to_string(bs) + " values): this rank keeps the " +
                  "whole blocks [" + std::to_string(cb) + ", " + std::to_string(ce) +
                  ") and drops the other columns when it dequantizes";
        parts.push_back(src_.slice(name, shape, 1, cb, ce - cb));
        pieces.push_back({bytes, ce - cb, start - cb, len});
        bytes += parts.back().size(1);
      }
      codes = parts.size() == 1 ? parts[0] : at::cat(parts, 1).contiguous();
      record(name, shape, spec);
    }
  } catch (...) {
    src_.setKeepBlocks(false);
    throw;
  }
  src_.setKeepBlocks(false);
  loaded_.back().heldBytes = codes.numel();
  loaded_.back().note = note;
  if (!note.empty()) std::cerr << "[tp rank " << tpRank() << "] " << name << ": " << note << "\n";
  auto s = std::make_shared<tensor_parallel::WeightStorage>();
  s->format = format;
  int64_t width = 0;
  for (const auto& p : pieces) width += p.take;
  s->inFeatures = width;
  const bool whole = pieces.size() == 1 && pieces[0].skip == 0 && pieces[0].take == in;
  if (whole) {
    s->decodeRow = [type, in](const uint8_t* row, float* out) {
      dequantizeGgml(type, row, out, in);
    };
  } else {
    s->decodeRow = [type, pieces](const uint8_t* row, float* out) {
      std::vector<float> tmp;
      for (const auto& p : pieces) {
        if (p.skip == 0 && p.take == p.elements) {
          dequantizeGgml(type, row + p.byteOffset, out, p.elements);
        } else {
          tmp.resize(static_cast<size_t>(p.elements));
          dequantizeGgml(type, row + p.byteOffset, tmp.data(), p.elements);
          std::copy(tmp.begin() + p.skip, tmp.begin() + p.skip + p.take, out);
        }
        out += p.take;
      }
    };
  }
  if (!allowNonFiniteWeights()) checkBlocks(name, format, codes, *s);
  return s;
}

std::shared_ptr<tensor_parallel::Linear> WeightLoader::linear(const std::string& path, int64_t in,
                                                              int64_t out, bool bias) {
  const std::vector<int64_t> wShape{out, in}, bShape{out};
  const ShardSpec ws = specFor(path + ".weight", wShape);
  const ShardSpec bs = bias ? specFor(path + ".bias", bShape) : ShardSpec{};
  at::Tensor w;
  auto storage = readFloat8(path + ".weight", wShape, ws, w);
  if (!storage && !w.defined()) storage = readBlocks(path + ".weight", wShape, ws, w);
  if (!storage && !w.defined()) w = read(path + ".weight", wShape, ws);
  at::Tensor b = bias ? read(path + ".bias", bShape, bs) : at::Tensor();
  std::shared_ptr<tensor_parallel::Linear> layer;
  if (ws.replicated())
    layer = std::make_shared<ReplicatedLinear>(path, w, b);
  else if (ws.dim == 0) {
    const ShardRule* rule = plan_ ? plan_->match(path) : nullptr;
    layer = std::make_shared<ColumnParallelLinear>(path, w, b, ws, tp_,
                                                   /*gatherOutput=*/rule && rule->gatherOutput);
  } else
    layer = std::make_shared<RowParallelLinear>(path, w, b, ws, tp_);
  if (storage) layer->setWeightStorage(storage);
  layers_.push_back(layer);
  return layer;
}

std::shared_ptr<FusedColumnParallelLinear> WeightLoader::fusedColumn(
    const std::string& name, const std::vector<std::pair<std::string, int64_t>>& parts, int64_t in,
    bool bias) {
  std::vector<FusedColumnParallelLinear::Part> ps;
  std::vector<std::shared_ptr<const tensor_parallel::WeightStorage>> storages;
  bool sameBlockFormat = true;
  for (const auto& part : parts)
    sameBlockFormat = sameBlockFormat && src_.blockFormat(part.first + ".weight") ==
                                             src_.blockFormat(parts.front().first + ".weight");
  for (const auto& [path, out] : parts) {
    const std::vector<int64_t> wShape{out, in}, bShape{out};
    const ShardSpec ws = specFor(path + ".weight", wShape);
    if (tpSize() > 1 && (ws.replicated() || ws.dim != 0)) {
      const ShardRule* r = plan_ ? plan_->match(path) : nullptr;
      throw std::invalid_argument("cannot fuse " + path + " into " + name +
                                  ": under tensor parallelism every part " +
                                  "must be ColwiseParallel, but the plan gives it " +
                                  (r ? parallelStyleName(r->style) : "no rule (replicated)"));
    }
    FusedColumnParallelLinear::Part p;
    p.name = path;
    p.spec = ws;
    auto st = readFloat8(path + ".weight", wShape, ws, p.weight);
    // GGUF: one block-row storage over the concatenated parts needs one type for all of them
    // (a fused qkv / linear1 tensor has one); parts of different types are dequantized at load.
    if (!st && !p.weight.defined() && sameBlockFormat)
      st = readBlocks(path + ".weight", wShape, ws, p.weight);
    if (!st && !p.weight.defined()) p.weight = read(path + ".weight", wShape, ws);
    if (!ps.empty() && static_cast<bool>(st) != static_cast<bool>(storages.back()))
      throw ModelFileError(src_.where(), "cannot fuse " + path + " into " + name +
                                             ": its weight is stored as " +
                                             src_.storage(path + ".weight").first +
                                             ", the other parts' are not (or the reverse)");
    storages.push_back(st);
    if (bias) p.bias = read(path + ".bias", bShape, specFor(path + ".bias", bShape));
    ps.push_back(std::move(p));
  }
  auto fused = std::make_shared<FusedColumnParallelLinear>(name, std::move(ps), tp_);
  if (storages.front() && storages.front()->blockRows()) {
    // Colwise / replicated parts of one type hold whole rows: one decoder serves them all.
    fused->setWeightStorage(storages.front());
  } else if (storages.front()) {  // one storage over the concatenated codes: the parts' scales
    auto merged = std::make_shared<tensor_parallel::WeightStorage>(*storages.front());
    std::vector<at::Tensor> scales;
    for (const auto& st : storages) scales.push_back(st->rowScale);
    merged->rowScale = scales.size() == 1 ? scales[0] : at::cat(scales, 0);
    fused->setWeightStorage(std::move(merged));
  }
  layers_.push_back(fused);
  return fused;
}

at::Tensor WeightLoader::param(const std::string& name, const std::vector<int64_t>& shape) {
  return read(name, shape, ShardSpec{});
}

std::map<std::string, int64_t> heldBytesByStorage(const std::vector<LoadedParameter>& params,
                                                  int64_t computeBytes,
                                                  const std::string& computeName) {
  std::map<std::string, int64_t> out;
  for (const auto& p : params) {
    int64_t n = 1;
    for (int64_t v : p.info.shape) n *= v;
    if (!p.spec.replicated() && p.spec.parts > 0) n /= p.spec.parts;
    if (p.heldBytes > 0) {  // kept quantized (GGUF blocks)
      out[p.info.dtype] += p.heldBytes;
      continue;
    }
    const bool f8 = p.info.dtype == "F8_E4M3" || p.info.dtype == "F8_E5M2";
    out[f8 ? p.info.dtype : computeName] += n * (f8 ? 1 : computeBytes);
  }
  return out;
}

ParameterTable WeightLoader::parameterTable() const {
  ParameterTable t;
  for (const auto& p : loaded_) t.add(p.info);
  return t;
}

}  // namespace dit
