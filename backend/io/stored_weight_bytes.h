// Weight bytes per rank when a transformer's weights are kept in their stored types (issue 33):
// GGUF block types (Q8_0, Q4_K, ...) and 8-bit floats as stored, a GGUF file's 16-bit weights as
// stored too, everything else in the compute dtype. Torch-free. A separate function (not inside
// estimateRequestMemory) so the memory estimate, the model summary and the advisor can share it.
#pragma once

#include <cstdint>
#include <string>

#include "parallel/tensor_parallel/sharding_plan.h"

namespace dit {

struct ModelFolder;

/// One rank's bytes of `params` at tensor-parallel degree `tp` under `plan` (its rank-0 slice of
/// each parameter: sharded ones 1/tp, replicated whole): a 2-D parameter whose ParameterInfo::dtype
/// is a ggml block type or F8_E4M3 / F8_E5M2 (and, when `keep16Bit`, F16 / BF16) counts
/// storageBytesPerParameter(dtype) (gguf_types.h) per element — Q4_K 144 / 256 = 0.5625 —, every
/// other parameter `computeElementBytes`. The plan's rowwise slices are assumed to fall on block
/// boundaries (true for FLUX.1-size widths; the loader keeps the covering blocks otherwise).
/// Throws std::invalid_argument as ShardingPlan::shardSpec.
uint64_t storedWeightBytesPerRank(const ShardingPlan& plan, const ParameterTable& params, int tp,
                                  int64_t computeElementBytes, bool keep16Bit);

/// `params` (diffusers names) with each dtype replaced by the stored type of the tensor it comes
/// from in the single-file transformer of `m` (e.g. "Q4_K", "F16", "F32"), and whether that file
/// is a GGUF file (`isGguf`). Unchanged (isGguf false) when the transformer is a folder. Throws
/// ModelFileError as the checkpoint reader and key layouts do.
ParameterTable withStoredTypes(const ModelFolder& m, const ParameterTable& params, bool* isGguf);

}  // namespace dit
