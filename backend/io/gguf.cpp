// GGUF header parser (see gguf.h). Follows the layout of gguf.md and the checks of ggml's
// gguf.cpp (gguf_init_from_file_impl), written for untrusted files: nothing is read, allocated or
// indexed before its size has been checked against what is left of the file.
#include "backend/io/gguf.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "backend/io/gguf_types.h"
#include "backend/io/safetensors.h"  // ModelFileError

namespace dit {

const GgufValue* GgufHeader::find(const std::string& key) const {
  for (const auto& [k, v] : metadata)
    if (k == key) return &v;
  return nullptr;
}

bool isGguf(const uint8_t* base, uint64_t size) {
  return size >= 4 && std::memcmp(base, "GGUF", 4) == 0;
}

namespace {

const char* valueTypeName(uint32_t t) {
  static const char* const n[] = {"UINT8",  "INT8",    "UINT16", "INT16",  "UINT32",
                                  "INT32",  "FLOAT32", "BOOL",   "STRING", "ARRAY",
                                  "UINT64", "INT64",   "FLOAT64"};
  return t < 13 ? n[t] : "unknown";
}

// Bytes of one scalar of type `t` (0 for STRING / ARRAY / unknown).
uint64_t scalarBytes(uint32_t t) {
  switch (static_cast<GgufValueType>(t)) {
    case GgufValueType::UINT8:
    case GgufValueType::INT8:
    case GgufValueType::BOOL:
      return 1;
    case GgufValueType::UINT16:
    case GgufValueType::INT16:
      return 2;
    case GgufValueType::UINT32:
    case GgufValueType::INT32:
    case GgufValueType::FLOAT32:
      return 4;
    case GgufValueType::UINT64:
    case GgufValueType::INT64:
    case GgufValueType::FLOAT64:
      return 8;
    default:
      return 0;
  }
}

class Cursor {
 public:
  Cursor(const uint8_t* b, uint64_t n, const std::string& path) : b_(b), n_(n), path_(path) {}
  uint64_t pos() const { return p_; }
  uint64_t left() const { return n_ - p_; }
  [[noreturn]] void fail(const std::string& cause) const { throw ModelFileError(path_, cause); }
  void need(uint64_t k, const std::string& what) const {
    if (k > left())
      fail("truncated GGUF file: " + what + " at byte " + std::to_string(p_) + " needs " +
           std::to_string(k) + " bytes but the file has " + std::to_string(left()) + " left");
  }
  template <class T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, b_ + p_, sizeof(T));  // little-endian host (x86-64, aarch64), as ggml
    p_ += sizeof(T);
    return v;
  }
  std::string str(const std::string& what) {
    const uint64_t len = read<uint64_t>(what + " length");
    if (len > kMaxGgufStringBytes)
      fail(what + " at byte " + std::to_string(p_ - 8) + " claims " + std::to_string(len) +
           " bytes (limit " + std::to_string(kMaxGgufStringBytes) + "): corrupt file");
    need(len, what);
    std::string s(reinterpret_cast<const char*>(b_ + p_), static_cast<size_t>(len));
    p_ += len;
    return s;
  }
  void skip(uint64_t k, const std::string& what) {
    need(k, what);
    p_ += k;
  }

 private:
  const uint8_t* b_;
  uint64_t n_, p_ = 0;
  const std::string& path_;
};

// Scalar of type `t` at the cursor: its rendering and (integers, bool) its value.
void readScalar(Cursor& c, uint32_t t, const std::string& what, std::string& text, int64_t& i) {
  switch (static_cast<GgufValueType>(t)) {
    case GgufValueType::UINT8:
      i = c.read<uint8_t>(what);
      break;
    case GgufValueType::INT8:
      i = c.read<int8_t>(what);
      break;
    case GgufValueType::UINT16:
      i = c.read<uint16_t>(what);
      break;
    case GgufValueType::INT16:
      i = c.read<int16_t>(what);
      break;
    case GgufValueType::UINT32:
      i = c.read<uint32_t>(what);
      break;
    case GgufValueType::INT32:
      i = c.read<int32_t>(what);
      break;
    case GgufValueType::UINT64: {
      const uint64_t u = c.read<uint64_t>(what);
      text = std::to_string(u);
      i = u > uint64_t(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(u);
      return;
    }
    case GgufValueType::INT64:
      i = c.read<int64_t>(what);
      break;
    case GgufValueType::BOOL: {
      const uint8_t v = c.read<uint8_t>(what);
      if (v > 1) c.fail(what + " is a BOOL of value " + std::to_string(v) + " (must be 0 or 1)");
      i = v;
      text = v ? "true" : "false";
      return;
    }
    case GgufValueType::FLOAT32:
      text = std::to_string(c.read<float>(what));
      return;
    case GgufValueType::FLOAT64:
      text = std::to_string(c.read<double>(what));
      return;
    case GgufValueType::STRING:
      text = c.str(what);
      return;
    default:
      c.fail(what + " has unknown value type " + std::to_string(t));
  }
  text = std::to_string(i);
}

}  // namespace

GgufHeader parseGguf(const uint8_t* base, uint64_t size, const std::string& path) {
  Cursor c(base, size, path);
  if (size < 4 || std::memcmp(base, "GGUF", 4) != 0) c.fail("not a GGUF file (bad magic)");
  c.skip(4, "magic");
  GgufHeader h;
  h.version = c.read<uint32_t>("version");
  if (h.version == 1)
    c.fail("GGUF version 1 (32-bit counts, pre-2023 llama.cpp) is not supported: versions 2 and 3");
  if (h.version == 0 || h.version > 3) {
    uint32_t swapped = ((h.version & 0xFF) << 24) | ((h.version & 0xFF00) << 8) |
                       ((h.version >> 8) & 0xFF00) | (h.version >> 24);
    if (swapped >= 1 && swapped <= 3)
      c.fail("big-endian GGUF file (version " + std::to_string(swapped) +
             " byte-swapped): only little-endian GGUF files are supported");
    c.fail("GGUF version " + std::to_string(h.version) + " is not supported (versions 2 and 3)");
  }
  const uint64_t nTensors = c.read<uint64_t>("tensor count");
  const uint64_t nKv = c.read<uint64_t>("metadata key count");
  // A tensor info takes at least 8 (name length) + 4 (n_dims) + 8 (ne[0]) + 4 (type) + 8
  // (offset) bytes, a key/value pair at least 8 + 4 + 1.
  if (nKv > kMaxGgufKeys || nKv > c.left() / 13)
    c.fail("metadata key count " + std::to_string(nKv) + " is impossible for a " +
           std::to_string(size) + "-byte file: corrupt file");
  if (nTensors > kMaxGgufTensors || nTensors > c.left() / 32)
    c.fail("tensor count " + std::to_string(nTensors) + " is impossible for a " +
           std::to_string(size) + "-byte file: corrupt file");

  std::set<std::string> keys;
  for (uint64_t k = 0; k < nKv; ++k) {
    const std::string key = c.str("metadata key " + std::to_string(k));
    const std::string what = "metadata '" + key + "'";
    if (!keys.insert(key).second) c.fail(what + " is listed twice");
    GgufValue v;
    const uint32_t t = c.read<uint32_t>(what + " type");
    if (t > static_cast<uint32_t>(GgufValueType::FLOAT64))
      c.fail(what + " has unknown value type " + std::to_string(t));
    v.type = static_cast<GgufValueType>(t);
    if (v.type == GgufValueType::ARRAY) {
      const uint32_t et = c.read<uint32_t>(what + " array element type");
      if (et == static_cast<uint32_t>(GgufValueType::ARRAY))
        c.fail(what + " is an array of arrays (not allowed)");
      if (et > static_cast<uint32_t>(GgufValueType::FLOAT64))
        c.fail(what + " is an array of unknown value type " + std::to_string(et));
      v.elementType = static_cast<GgufValueType>(et);
      v.count = c.read<uint64_t>(what + " array length");
      const uint64_t minBytes =
          et == static_cast<uint32_t>(GgufValueType::STRING) ? 8 : scalarBytes(et);
      if (v.count > c.left() / minBytes)
        c.fail(what + " claims " + std::to_string(v.count) + " " + valueTypeName(et) +
               " elements, more than the " + std::to_string(c.left()) +
               " bytes left in the file: truncated or corrupt");
      const bool integer = et != static_cast<uint32_t>(GgufValueType::STRING) &&
                           et != static_cast<uint32_t>(GgufValueType::FLOAT32) &&
                           et != static_cast<uint32_t>(GgufValueType::FLOAT64);
      if (et == static_cast<uint32_t>(GgufValueType::STRING) || (integer && v.count <= 64)) {
        for (uint64_t i = 0; i < v.count; ++i) {
          std::string s;
          int64_t iv = 0;
          readScalar(c, et, what + " element " + std::to_string(i), s, iv);
          if (integer) v.integers.push_back(iv);
        }
      } else {
        c.skip(v.count * minBytes, what + " array data");
      }
      v.text = std::string("[") + valueTypeName(et) + " x " + std::to_string(v.count) + "]";
    } else {
      readScalar(c, t, what, v.text, v.integer);
    }
    h.metadata.emplace_back(key, std::move(v));
  }
  if (const GgufValue* a = h.find("general.alignment")) {
    if (a->type != GgufValueType::UINT32)
      c.fail(std::string("general.alignment must be a UINT32, it is a ") +
             valueTypeName(static_cast<uint32_t>(a->type)));
    const uint64_t al = static_cast<uint64_t>(a->integer);
    if (al == 0 || (al & (al - 1)) != 0)
      c.fail("general.alignment " + std::to_string(al) + " is not a power of two");
    h.alignment = al;
  }

  std::set<std::string> names;
  for (uint64_t k = 0; k < nTensors; ++k) {
    GgufTensorInfo t;
    t.name = c.str("tensor info " + std::to_string(k) + " name");
    const std::string what = "tensor '" + t.name + "'";
    if (!names.insert(t.name).second) c.fail(what + " is listed twice");
    const uint32_t nd = c.read<uint32_t>(what + " dimension count");
    if (nd == 0 || nd > kMaxGgufDims)
      c.fail(what + " has " + std::to_string(nd) + " dimensions (ggml allows 1 to 4)");
    uint64_t numel = 1;
    for (uint32_t d = 0; d < nd; ++d) {
      const uint64_t ne = c.read<uint64_t>(what + " ne[" + std::to_string(d) + "]");
      if (ne > (uint64_t(1) << 62))
        c.fail(what + " has dimension ne[" + std::to_string(d) + "] = " + std::to_string(ne) +
               " (negative or absurd): corrupt file");
      if (ne != 0 && numel > (uint64_t(1) << 62) / ne)
        c.fail(what + " has more than 2^62 elements: corrupt file");
      numel *= ne;
      t.ne.push_back(static_cast<int64_t>(ne));
    }
    t.type = c.read<uint32_t>(what + " type");
    t.offset = c.read<uint64_t>(what + " offset");
    if (!ggmlTypeSupported(t.type))
      c.fail(what + " has ggml type " + ggmlTypeName(t.type) +
             ", which DiT Studio does not read (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, "
             "Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)");
    const GgmlType gt = static_cast<GgmlType>(t.type);
    const int64_t bs = ggmlBlockSize(gt);
    if (t.ne[0] % bs != 0)
      c.fail(what + " has rows of " + std::to_string(t.ne[0]) + " elements, not a multiple of " +
             ggmlTypeName(t.type) + "'s block of " + std::to_string(bs));
    // numel <= 2^62 and bytes per block <= 210 per >= 1 element: no overflow below.
    t.nbytes = numel / static_cast<uint64_t>(bs) * static_cast<uint64_t>(ggmlBlockBytes(gt));
    if (t.offset % h.alignment != 0)
      c.fail(what + " has data offset " + std::to_string(t.offset) +
             ", not a multiple of the alignment " + std::to_string(h.alignment) +
             ": misaligned (corrupt file)");
    h.tensors.push_back(std::move(t));
  }
  // The data section starts at the end of the tensor infos rounded up to the alignment.
  const uint64_t end = c.pos();
  const uint64_t pad = (h.alignment - end % h.alignment) % h.alignment;
  if (pad > size - end && !h.tensors.empty())
    c.fail("the data section (at byte " + std::to_string(end) + " + " + std::to_string(pad) +
           " alignment) starts past the end of the file: truncated");
  h.dataOffset = end + pad;
  const uint64_t dataBytes = h.dataOffset <= size ? size - h.dataOffset : 0;
  std::vector<const GgufTensorInfo*> order;
  for (const auto& t : h.tensors) {
    if (t.offset > dataBytes || t.nbytes > dataBytes - t.offset)
      c.fail("tensor '" + t.name + "' data [" + std::to_string(t.offset) + ", " +
             std::to_string(t.offset + std::min<uint64_t>(t.nbytes, UINT64_MAX - t.offset)) +
             ") lies outside the " + std::to_string(dataBytes) +
             "-byte data section: file truncated or corrupt");
    order.push_back(&t);
  }
  std::sort(order.begin(), order.end(),
            [](const auto* a, const auto* b) { return a->offset < b->offset; });
  const GgufTensorInfo* furthest = nullptr;
  for (const GgufTensorInfo* t : order) {
    if (t->nbytes == 0) continue;
    if (furthest && t->offset < furthest->offset + furthest->nbytes)
      c.fail("tensors '" + furthest->name + "' and '" + t->name +
             "' overlap in the data section (corrupt file)");
    if (!furthest || t->offset + t->nbytes > furthest->offset + furthest->nbytes) furthest = t;
  }
  return h;
}

}  // namespace dit
