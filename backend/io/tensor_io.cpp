#include "backend/io/tensor_io.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "backend/io/gguf_types.h"

namespace dit {

at::ScalarType scalarTypeFor(DType t) {
  switch (t) {
    case DType::BOOL:
      return at::kBool;
    case DType::U8:
      return at::kByte;
    case DType::I8:
      return at::kChar;
    case DType::I16:
      return at::kShort;
    case DType::I32:
      return at::kInt;
    case DType::I64:
      return at::kLong;
    case DType::F16:
      return at::kHalf;
    case DType::BF16:
      return at::kBFloat16;
    case DType::F32:
      return at::kFloat;
    case DType::F64:
      return at::kDouble;
    case DType::F8_E4M3:
    case DType::F8_E5M2:
      return at::kFloat;
    default:
      break;
  }
  throw std::invalid_argument(std::string("dtype ") + dtypeName(t) +
                              " is not supported by LibTorch");
}

// Decodes one 8-bit float. E4M3 is the "fn" variant (no infinities, 0x7f/0xff are NaN) as in
// torch.float8_e4m3fn; E5M2 follows IEEE conventions (torch.float8_e5m2).
static float decodeF8(uint8_t v, bool e4m3) {
  const int sign = v >> 7;
  int exp, man;
  float r;
  if (e4m3) {
    exp = (v >> 3) & 0xf;
    man = v & 0x7;
    if (exp == 0xf && man == 0x7) return std::nanf("");
    r = exp == 0 ? std::ldexp(man / 8.0f, -6) : std::ldexp(1.0f + man / 8.0f, exp - 7);
  } else {
    exp = (v >> 2) & 0x1f;
    man = v & 0x3;
    if (exp == 0x1f) return man ? std::nanf("") : (sign ? -INFINITY : INFINITY);
    r = exp == 0 ? std::ldexp(man / 4.0f, -14) : std::ldexp(1.0f + man / 4.0f, exp - 15);
  }
  return sign ? -r : r;
}

at::Tensor float8Table(DType t) {
  if (t != DType::F8_E4M3 && t != DType::F8_E5M2)
    throw std::invalid_argument(std::string("float8Table: ") + dtypeName(t) +
                                " is not an 8-bit float type");
  at::Tensor out = at::empty({256}, at::kFloat);
  float* o = out.data_ptr<float>();
  for (int v = 0; v < 256; ++v) o[v] = decodeF8(static_cast<uint8_t>(v), t == DType::F8_E4M3);
  return out;
}

// Converts `count` raw elements at `src` into a new CPU tensor of `shape` in `dtype`.
static at::Tensor fromRaw(const uint8_t* src, DType dt, const std::vector<int64_t>& shape,
                          at::ScalarType dtype) {
  if ((dt == DType::F8_E4M3 || dt == DType::F8_E5M2) && dtype == at::kByte) {
    at::Tensor codes = at::empty(shape, at::kByte);  // raw codes, decoded at use (float8Table)
    std::memcpy(codes.data_ptr(), src, static_cast<size_t>(codes.numel()));
    return codes;
  }
  if (dt == DType::F8_E4M3 || dt == DType::F8_E5M2) {
    at::Tensor out = at::empty(shape, at::kFloat);
    float* o = out.data_ptr<float>();
    const int64_t n = out.numel();
    for (int64_t i = 0; i < n; ++i) o[i] = decodeF8(src[i], dt == DType::F8_E4M3);
    return out.to(dtype);
  }
  at::ScalarType st = scalarTypeFor(dt);
  at::Tensor raw = at::empty(shape, st);
  std::memcpy(raw.data_ptr(), src, raw.numel() * raw.element_size());
  return st == dtype ? raw : raw.to(dtype);
}

// Shard-on-load memory. Reads go through the reader's read-only mapping, and every page copied
// out of it is handed back right after the copy (SafetensorsReader::releasePages/releaseRange:
// madvise MADV_DONTNEED). Mapped file pages count in VmRSS/VmHWM while they stay mapped, so
// without the release a rank would peak at its copies *plus* every page it read: ~2x its shard
// for colwise/replicated tensors, and the *full* tensor for rowwise (dim 1) slices, whose row
// segments touch nearly every page. We release rather than switch to pread(2) because the
// mapping remains the single read path (whole tensors, dim 0 and dim 1 slices, FP8 decoding),
// the reader needs no file descriptor or bounce buffer, and a rowwise slice stays one memcpy per
// row instead of one syscall per row; the release costs one madvise per tensor (per chunk for
// rowwise slices) and the pages stay in the shared, reclaimable page cache. What remains
// transient per rank is at most one tensor's slice of mapped pages (kReleaseChunk for rowwise
// slices), widened to SafetensorsReader::releaseGranularity() blocks (the kernel's fault-around
// maps cached neighbours of each faulting page), plus the conversion copy of one tensor.
namespace {
// Rowwise slices walk the whole tensor: release the pages already passed every this many bytes,
// so at most this much of the mapping is resident at once.
constexpr uint64_t kReleaseChunk = uint64_t(8) << 20;
}  // namespace

namespace {
GgmlType ggmlOf(DType d) {
  GgmlType t{};
  parseGgmlType(dtypeName(d), t);
  return t;
}

// Rows [row0, row0 + rows) of a ggml block tensor (2-D [rows, width], or 1-D): kByte
// [rows, rowBytes] blocks when `dtype` is kByte, else dequantized (ggml's values, float32) and
// cast to `dtype`; columns [c0, c0 + cols) of each row (c0 and cols in elements; for kByte
// multiples of the block size).
at::Tensor loadBlockRows(const SafetensorsReader& r, const TensorInfo& i, int64_t row0,
                         int64_t rows, int64_t c0, int64_t cols, at::ScalarType dtype) {
  const GgmlType t = ggmlOf(i.dtype);
  const int64_t width = i.shape.back(), bs = ggmlBlockSize(t);
  const int64_t rowBytes = ggmlRowBytes(t, width);
  const uint8_t* base = r.data(i);
  if (dtype == at::kByte) {
    if (c0 % bs != 0 || cols % bs != 0)
      throw std::invalid_argument("columns [" + std::to_string(c0) + ", " +
                                  std::to_string(c0 + cols) + ") of '" + i.name +
                                  "' do not start and end at " + dtypeName(i.dtype) +
                                  " block boundaries (" + std::to_string(bs) + ")");
    const int64_t b0 = c0 / bs * ggmlBlockBytes(t), nb = ggmlRowBytes(t, cols);
    at::Tensor out = at::empty({rows, nb}, at::kByte);
    uint8_t* o = out.data_ptr<uint8_t>();
    for (int64_t k = 0; k < rows; ++k)
      std::memcpy(o + k * nb, base + (row0 + k) * rowBytes + b0, static_cast<size_t>(nb));
    r.releaseRange(i.begin + static_cast<uint64_t>(row0 * rowBytes),
                   i.begin + static_cast<uint64_t>((row0 + rows) * rowBytes));
    return out;
  }
  // Dequantize the covering blocks of each row, keep the columns asked for.
  const int64_t cb = c0 / bs * bs, ce = (c0 + cols + bs - 1) / bs * bs;
  at::Tensor out = at::empty({rows, cols}, at::kFloat);
  std::vector<float> tmp(static_cast<size_t>(ce - cb));
  float* o = out.data_ptr<float>();
  for (int64_t k = 0; k < rows; ++k) {
    dequantizeGgml(t, base + (row0 + k) * rowBytes + ggmlRowBytes(t, cb), tmp.data(), ce - cb);
    std::memcpy(o + k * cols, tmp.data() + (c0 - cb), static_cast<size_t>(cols) * 4);
  }
  r.releaseRange(i.begin + static_cast<uint64_t>(row0 * rowBytes),
                 i.begin + static_cast<uint64_t>((row0 + rows) * rowBytes));
  return dtype == at::kFloat ? out : out.to(dtype);
}
// Block rows: ggml block types always; 16-bit floats when their raw bytes are asked for.
bool keptAsBlocks(DType d, at::ScalarType dtype) {
  return dtypeIsBlockQuantized(d) || (dtype == at::kByte && (d == DType::F16 || d == DType::BF16));
}
}  // namespace

at::Tensor loadTensor(const SafetensorsCollection& st, const std::string& name,
                      at::ScalarType dtype) {
  const auto& r = st.reader(name);
  const auto& i = r.info(name);
  if (keptAsBlocks(i.dtype, dtype)) {
    const int64_t rows = i.shape.size() > 1 ? i.numel() / i.shape.back() : 1;
    at::Tensor t = loadBlockRows(r, i, 0, rows, 0, i.shape.back(), dtype);
    if (dtype == at::kByte) return t;
    return t.reshape(i.shape);
  }
  at::Tensor t = fromRaw(r.data(i), i.dtype, i.shape, dtype);
  r.releasePages(i);
  return t;
}

at::Tensor loadSlice(const SafetensorsCollection& st, const std::string& name, int64_t dim,
                     int64_t start, int64_t length, at::ScalarType dtype) {
  const auto& r = st.reader(name);
  const auto& i = r.info(name);
  const int64_t nd = static_cast<int64_t>(i.shape.size());
  if (dim < 0 || dim >= nd || (dim == 1 && nd != 2) || dim > 1 || start < 0 || length < 0 ||
      start + length > i.shape[dim])
    throw ModelFileError(r.path(), "tensor '" + name + "': slice [" + std::to_string(start) + ", " +
                                       std::to_string(start + length) + ") of dim " +
                                       std::to_string(dim) + " does not fit its shape");
  std::vector<int64_t> shape = i.shape;
  shape[dim] = length;
  if (keptAsBlocks(i.dtype, dtype)) {
    if (nd > 2)
      throw ModelFileError(r.path(), "tensor '" + name + "' (" + dtypeName(i.dtype) + ", " +
                                         std::to_string(nd) +
                                         "-D): slices of quantized tensors "
                                         "of more than 2 dimensions are not supported");
    if (nd == 1) {  // elements of the one row
      at::Tensor t = loadBlockRows(r, i, 0, 1, start, length, dtype);
      return dtype == at::kByte ? t.reshape({-1}) : t.reshape({length});
    }
    return dim == 0 ? loadBlockRows(r, i, start, length, 0, i.shape[1], dtype)
                    : loadBlockRows(r, i, 0, i.shape[0], start, length, dtype);
  }
  const size_t es = dtypeSize(i.dtype);
  if (dim == 0) {
    int64_t inner = 1;
    for (int64_t d = 1; d < nd; ++d) inner *= i.shape[d];
    const uint64_t off = static_cast<uint64_t>(start * inner) * es;
    const uint64_t n = static_cast<uint64_t>(length * inner) * es;
    at::Tensor t = fromRaw(r.data(i) + off, i.dtype, shape, dtype);
    r.releaseRange(i.begin + off, i.begin + off + n);
    return t;
  }
  // dim == 1 on a 2-D tensor: gather the row segments (only the slice's bytes are copied, but
  // their pages span the whole tensor: release them as we go, see above).
  const int64_t rows = i.shape[0], cols = i.shape[1];
  const bool f8 = i.dtype == DType::F8_E4M3 || i.dtype == DType::F8_E5M2;
  std::vector<uint8_t> f8buf;
  at::Tensor raw;
  uint8_t* dst;
  if (f8) {
    f8buf.resize(static_cast<size_t>(rows * length) * es);
    dst = f8buf.data();
  } else {
    raw = at::empty(shape, scalarTypeFor(i.dtype));
    dst = static_cast<uint8_t*>(raw.data_ptr());
  }
  const uint8_t* base = r.data(i);
  const uint64_t g = SafetensorsReader::releaseGranularity();
  uint64_t released = i.begin;  // absolute file offset up to which pages were released
  for (int64_t row = 0; row < rows; ++row) {
    std::memcpy(dst + row * length * es, base + (row * cols + start) * es, length * es);
    // Whole release blocks before the next row's segment are done with (aligned down, so the
    // outward rounding of releaseRange does not drop the pages still to be read).
    const uint64_t nextAbs = i.begin + static_cast<uint64_t>(((row + 1) * cols + start) * es);
    const uint64_t doneUpTo = nextAbs / g * g;
    if (doneUpTo > released && doneUpTo - released >= kReleaseChunk) {
      r.releaseRange(released, doneUpTo);
      released = doneUpTo;
    }
  }
  r.releaseRange(released, i.end);
  if (f8) return fromRaw(f8buf.data(), i.dtype, shape, dtype);
  return raw.scalar_type() == dtype ? raw : raw.to(dtype);
}

at::Tensor loadPackedSlice(const SafetensorsCollection& st, const std::string& name, int64_t dim,
                           const std::vector<int64_t>& blocks, int64_t part, int64_t parts,
                           at::ScalarType dtype) {
  return catPackedParts(name, dim, blocks, part, parts, [&](int64_t start, int64_t len) {
    return loadSlice(st, name, dim, start, len, dtype);
  });
}

static DType dtypeFor(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return DType::F32;
    case at::kHalf:
      return DType::F16;
    case at::kBFloat16:
      return DType::BF16;
    case at::kLong:
      return DType::I64;
    case at::kInt:
      return DType::I32;
    case at::kByte:
      return DType::U8;
    case at::kDouble:
      return DType::F64;
    default:
      break;
  }
  throw std::invalid_argument("saveTensors: unsupported dtype");
}

void saveTensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                 const std::map<std::string, std::string>& metadata) {
  std::map<std::string, RawTensor> raw;
  for (auto& [name, t0] : tensors) {
    at::Tensor t = t0.to(at::kCPU).contiguous();
    RawTensor r{dtypeFor(t.scalar_type()), t.sizes().vec(), {}};
    r.bytes.resize(t.numel() * t.element_size());
    std::memcpy(r.bytes.data(), t.data_ptr(), r.bytes.size());
    raw.emplace(name, std::move(r));
  }
  writeSafetensors(path, raw, metadata);
}

at::ScalarType parseComputeDType(const std::string& s) {
  if (s == "float32" || s == "fp32") return at::kFloat;
  if (s == "bfloat16" || s == "bf16") return at::kBFloat16;
  if (s == "float16" || s == "fp16") return at::kHalf;
  throw std::invalid_argument("unknown dtype '" + s + "' (use float32, bfloat16 or float16)");
}

bool cpuHasNativeBFloat16() {
  static const bool has = [] {
    std::ifstream in("/proc/cpuinfo");
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("flags", 0) != 0) continue;
      std::istringstream w(line.substr(line.find(':') + 1));
      for (std::string f; w >> f;)
        if (f == "avx512_bf16" || f == "amx_bf16") return true;
      return false;
    }
    return false;
  }();
  return has;
}

ComputeDType resolveComputeDType(const std::string& requested, const std::string& device) {
  ComputeDType r;
  r.dtype = parseComputeDType(requested);
  if (r.dtype != at::kBFloat16 || device.rfind("cpu", 0) != 0 || cpuHasNativeBFloat16()) return r;
  const char* env = std::getenv("DITSTUDIO_CPU_BF16");
  if (env && std::string(env) == "native") {
    r.note =
        "bfloat16 on a CPU without bf16 hardware (no avx512_bf16 / amx_bf16), as "
        "DITSTUDIO_CPU_BF16=native asks: every GEMM is emulated, expect it to be many times "
        "slower than float32";
    return r;
  }
  r.dtype = at::kFloat;
  r.note =
      "bfloat16 requested, computing in float32: this CPU has no bf16 hardware (no "
      "avx512_bf16 / amx_bf16), where bf16 GEMMs are emulated and run tens of times slower; "
      "the weights are held in float32 (twice the memory). DITSTUDIO_CPU_BF16=native keeps "
      "bfloat16";
  return r;
}

const char* computeDTypeName(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "float32";
    case at::kBFloat16:
      return "bfloat16";
    case at::kHalf:
      return "float16";
    default:
      return "other";
  }
}

}  // namespace dit
