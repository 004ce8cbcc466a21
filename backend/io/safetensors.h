// SafetensorsReader: memory-mapped, validated reader for the safetensors format
// (https://github.com/huggingface/safetensors, format spec in its README), plus the sharded
// `*.safetensors.index.json` layout written by diffusers/transformers `save_pretrained`.
//
// No Torch here: this header is included by the GUI and the tokenizer code too. Conversion to
// at::Tensor lives in backend/tensor_io.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace dit {

struct GgufHeader;  // gguf.h

/// Element types the safetensors format defines (names as in the file header), followed by the
/// ggml block types of GGUF tensors (gguf_types.h; never accepted in a safetensors header): a
/// GGUF tensor of ggml type F32 / F16 / BF16 has that DType, a quantized one Q4_0 ... Q6_K.
enum class DType {
  BOOL,
  U8,
  I8,
  U16,
  I16,
  F16,
  BF16,
  U32,
  I32,
  F32,
  U64,
  I64,
  F64,
  F8_E4M3,
  F8_E5M2,
  Q4_0,
  Q4_1,
  Q5_0,
  Q5_1,
  Q8_0,
  Q2_K,
  Q3_K,
  Q4_K,
  Q5_K,
  Q6_K
};

/// Largest safetensors header accepted: 100 MB, the reference implementation's MAX_HEADER_SIZE.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

/// Bytes per element of `t`; 0 for the ggml block types (see dtypeBlockBytes).
size_t dtypeSize(DType t);
/// Header spelling ("F32", "BF16", ...); ggml's name for the block types ("Q4_K").
const char* dtypeName(DType t);
/// Parses a safetensors header spelling (block types are not accepted); throws
/// std::invalid_argument naming the unknown dtype.
DType parseDType(const std::string& s);
/// True for the ggml block types Q4_0 ... Q6_K.
bool dtypeIsBlockQuantized(DType t);
/// Elements per block: 1 for the safetensors dtypes, 32 or 256 for the block types.
int64_t dtypeBlockSize(DType t);
/// Bytes per block: dtypeSize for the safetensors dtypes, ggml's block size for the others.
int64_t dtypeBlockBytes(DType t);

/// Error in a model file. what() always names the file and the cause.
class ModelFileError : public std::runtime_error {
 public:
  ModelFileError(const std::string& file, const std::string& cause)
      : std::runtime_error(file + ": " + cause), file_(file), cause_(cause) {}
  const std::string& file() const { return file_; }
  const std::string& cause() const { return cause_; }

 private:
  std::string file_, cause_;
};

/// One tensor entry of a safetensors header. Offsets are absolute byte offsets in the file.
struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  ///< absolute file offset of the first byte
  uint64_t end = 0;    ///< absolute file offset one past the last byte
  int64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
};

/// Read-only, memory-mapped safetensors file — or GGUF file (gguf.h), detected by its magic
/// "GGUF": its tensors appear as TensorInfo in torch order (shape = ggml's ne reversed) with their
/// ggml type as a DType and absolute offsets, its scalar metadata in metadata() (as text), and
/// ggufHeader() gives the parsed header. The GGUF checks are parseGguf's.
///
/// Validation done in the constructor (each failure throws ModelFileError naming the file):
/// missing/unreadable file, not a regular file (a FIFO or device is refused before it is opened),
/// file shorter than 8 bytes, git-lfs pointer file, header length above 100 MB
/// (kMaxSafetensorsHeaderBytes) or past the end of the file, header not starting with '{', not
/// JSON (no file bytes quoted), nested deeper than 64 or not an object, unknown dtype,
/// data_offsets out of range, reversed, overlapping, or disagreeing with dtype x shape, a gap
/// or trailing bytes in the data section (as the reference implementation). No accessor reads
/// outside the mapping.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  /// Throws ModelFileError if `name` is absent.
  const TensorInfo& info(const std::string& name) const;
  std::vector<std::string> names() const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// Pointer to the first byte of the tensor inside the mapping (valid while the reader lives).
  const uint8_t* data(const TensorInfo& t) const { return base_ + t.begin; }
  uint64_t fileSize() const { return size_; }
  /// True when the file is a GGUF file.
  bool isGguf() const { return gguf_ != nullptr; }
  /// The parsed GGUF header (null for a safetensors file).
  const GgufHeader* ggufHeader() const { return gguf_.get(); }

  /// Returns to the kernel this process's pages of the mapping around `t` (madvise MADV_DONTNEED
  /// on the range rounded outward to releaseGranularity()). Call it after copying a tensor (or a
  /// slice of it) out of the mapping: file pages touched through the mapping count in this
  /// process's VmRSS/VmHWM for as long as they stay mapped, so without it loading a model costs
  /// its copies *plus* every page read — and a rowwise (dim 1) shard touches nearly every page of
  /// the full tensor, which would defeat shard-on-load. The mapping is read-only and file-backed,
  /// so nothing is lost: data() stays valid and a later access faults the page back in from the
  /// page cache (shared by every rank on the host and reclaimable; not this process's memory).
  /// Pages of neighbouring tensors inside the rounded range are dropped too and simply re-faulted
  /// if read later. Cheap (one syscall); never throws.
  void releasePages(const TensorInfo& t) const { releaseRange(t.begin, t.end); }
  /// Same for the absolute file byte range [begin, end), rounded outward to
  /// releaseGranularity() and clamped to the mapping.
  void releaseRange(uint64_t begin, uint64_t end) const;
  /// Alignment of released ranges: 2 MiB (at least one page). Not just the page: a read fault
  /// maps the already-cached neighbours of the faulting page too ("fault-around", up to
  /// /sys/kernel/mm/.../fault_around_bytes = 64 KiB by default, never beyond the 2 MiB page-table
  /// block), so pages *outside* the bytes copied — other ranks' slices — get mapped and would
  /// stay resident if only the copied pages were released.
  static uint64_t releaseGranularity();

 private:
  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
  std::shared_ptr<const GgufHeader> gguf_;
  void openGguf();
};

/// A set of safetensors files viewed as one: either a single file or a sharded checkpoint with
/// `<name>.safetensors.index.json` ({"weight_map": {tensor: shard-file}}).
///
/// Errors (ModelFileError): index that is not a regular file, not JSON or lacks weight_map, a
/// shard name outside the index's folder (absolute or with '..'), a shard file the index names
/// that is missing or corrupt, a tensor the index names that its shard does not contain.
class SafetensorsCollection {
 public:
  /// Opens `dir/<stem>.safetensors.index.json` if present, else `dir/<stem>.safetensors`, else the
  /// only `*.safetensors` file in `dir`. Throws ModelFileError when none exists.
  static SafetensorsCollection openFolder(const std::string& dir, const std::string& stem);
  /// Opens a single file or an index file (by extension `.json`).
  explicit SafetensorsCollection(const std::string& path);

  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  /// Throws ModelFileError naming the component folder and the missing tensor.
  const TensorInfo& info(const std::string& name) const;
  const SafetensorsReader& reader(const std::string& name) const;
  std::vector<std::string> names() const;
  const std::string& path() const { return path_; }
  /// Total bytes of all tensors.
  uint64_t totalBytes() const;

 private:
  SafetensorsCollection() = default;
  std::string path_;
  std::vector<std::shared_ptr<SafetensorsReader>> shards_;
  std::map<std::string, size_t> where_;
};

/// Writes a safetensors file. `tensors` maps name -> (dtype, shape, raw little-endian bytes).
/// Writes through AtomicFile (safe_write.h: a temporary file in the same folder, fsync, rename
/// onto a regular file or nothing). Throws std::runtime_error naming the path and the system's
/// cause; nothing is left behind on failure.
struct RawTensor {
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
void writeSafetensors(const std::string& path, const std::map<std::string, RawTensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace dit
