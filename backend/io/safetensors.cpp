#include "backend/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/io/file_guard.h"
#include "backend/io/gguf.h"
#include "backend/io/gguf_types.h"
#include "backend/io/safe_write.h"

namespace dit {
namespace fs = std::filesystem;
using nlohmann::json;

size_t dtypeSize(DType t) {
  switch (t) {
    case DType::BOOL:
    case DType::U8:
    case DType::I8:
    case DType::F8_E4M3:
    case DType::F8_E5M2:
      return 1;
    case DType::U16:
    case DType::I16:
    case DType::F16:
    case DType::BF16:
      return 2;
    case DType::U32:
    case DType::I32:
    case DType::F32:
      return 4;
    case DType::U64:
    case DType::I64:
    case DType::F64:
      return 8;
    default:  // ggml block types: see dtypeBlockBytes
      return 0;
  }
}

namespace {
// The block types and their ggml counterparts.
constexpr std::pair<DType, GgmlType> kBlockTypes[] = {
    {DType::Q4_0, GgmlType::Q4_0}, {DType::Q4_1, GgmlType::Q4_1}, {DType::Q5_0, GgmlType::Q5_0},
    {DType::Q5_1, GgmlType::Q5_1}, {DType::Q8_0, GgmlType::Q8_0}, {DType::Q2_K, GgmlType::Q2_K},
    {DType::Q3_K, GgmlType::Q3_K}, {DType::Q4_K, GgmlType::Q4_K}, {DType::Q5_K, GgmlType::Q5_K},
    {DType::Q6_K, GgmlType::Q6_K}};
const GgmlType* ggmlOf(DType t) {
  for (const auto& [d, g] : kBlockTypes)
    if (d == t) return &g;
  return nullptr;
}
}  // namespace

bool dtypeIsBlockQuantized(DType t) { return ggmlOf(t) != nullptr; }
int64_t dtypeBlockSize(DType t) {
  const GgmlType* g = ggmlOf(t);
  return g ? ggmlBlockSize(*g) : 1;
}
int64_t dtypeBlockBytes(DType t) {
  const GgmlType* g = ggmlOf(t);
  return g ? ggmlBlockBytes(*g) : static_cast<int64_t>(dtypeSize(t));
}

static const std::pair<DType, const char*> kNames[] = {
    {DType::BOOL, "BOOL"}, {DType::U8, "U8"},           {DType::I8, "I8"},
    {DType::U16, "U16"},   {DType::I16, "I16"},         {DType::F16, "F16"},
    {DType::BF16, "BF16"}, {DType::U32, "U32"},         {DType::I32, "I32"},
    {DType::F32, "F32"},   {DType::U64, "U64"},         {DType::I64, "I64"},
    {DType::F64, "F64"},   {DType::F8_E4M3, "F8_E4M3"}, {DType::F8_E5M2, "F8_E5M2"}};

const char* dtypeName(DType t) {
  for (auto& [d, n] : kNames)
    if (d == t) return n;
  static const std::pair<DType, const char*> kBlockNames[] = {
      {DType::Q4_0, "Q4_0"}, {DType::Q4_1, "Q4_1"}, {DType::Q5_0, "Q5_0"}, {DType::Q5_1, "Q5_1"},
      {DType::Q8_0, "Q8_0"}, {DType::Q2_K, "Q2_K"}, {DType::Q3_K, "Q3_K"}, {DType::Q4_K, "Q4_K"},
      {DType::Q5_K, "Q5_K"}, {DType::Q6_K, "Q6_K"}};
  for (auto& [d, n] : kBlockNames)
    if (d == t) return n;
  return "?";
}

DType parseDType(const std::string& s) {
  for (auto& [d, n] : kNames)
    if (s == n) return d;
  throw std::invalid_argument("unknown dtype '" + s + "'");
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  // Regular files only: a FIFO or device at the path is refused before it is opened.
  int fd = openRegularFile(path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw ModelFileError(path, std::string("cannot stat file: ") + std::strerror(e));
  }
  size_ = static_cast<uint64_t>(st.st_size);
  if (size_ >= 4 && size_ < 8) {
    // Too short for a safetensors header length; a GGUF file this short is refused below.
    char magic[4] = {};
    if (::pread(fd, magic, 4, 0) == 4 && std::memcmp(magic, "GGUF", 4) == 0) {
      ::close(fd);
      throw ModelFileError(path, "truncated GGUF file: " + std::to_string(size_) +
                                     " bytes, shorter than the GGUF header");
    }
  }
  if (size_ < 8) {
    ::close(fd);
    throw ModelFileError(path, "truncated safetensors file: " + std::to_string(size_) +
                                   " bytes, shorter than the 8-byte header length");
  }
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED)
    throw ModelFileError(path, std::string("mmap failed: ") + std::strerror(errno));
  base_ = static_cast<const uint8_t*>(p);

  try {
    static const char kLfs[] = "version https://git-lfs";
    if (size_ >= sizeof(kLfs) - 1 && std::memcmp(base_, kLfs, sizeof(kLfs) - 1) == 0)
      throw ModelFileError(path,
                           "this is a git-lfs pointer file, not the weights (run `git lfs pull` "
                           "in the model repository or download the real file)");
    if (dit::isGguf(base_, size_)) {
      openGguf();
      return;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | base_[i];
    // The reference implementation's limits (safetensors/src/tensor.rs: MAX_HEADER_SIZE,
    // InvalidHeaderStart, InvalidHeaderDeserialization, MetadataIncompleteBuffer).
    if (n > kMaxSafetensorsHeaderBytes)
      // The value itself is not shown: it is the file's first 8 bytes (text of a file that is
      // not a safetensors file, e.g. one an index points to).
      throw ModelFileError(path, "header length field exceeds the limit of " +
                                     std::to_string(kMaxSafetensorsHeaderBytes) +
                                     " bytes (as the reference safetensors reader): corrupt or "
                                     "not a safetensors file");
    if (n > size_ - 8)
      throw ModelFileError(path, "header length " + std::to_string(n) +
                                     " runs past the end of the file (" + std::to_string(size_) +
                                     " bytes): truncated or not a safetensors file");
    const uint64_t dataStart = 8 + n;
    const std::string_view headerText(reinterpret_cast<const char*>(base_ + 8), n);
    if (n == 0 || headerText[0] != '{')
      throw ModelFileError(path, "header does not start with '{': not a safetensors file");
    // The parser's message quotes the bytes it read: not passed on (parseModelJson).
    const json h = parseModelJson(headerText, path, "header");
    if (!h.is_object()) throw ModelFileError(path, "header is not a JSON object");
    std::vector<const TensorInfo*> order;
    for (auto it = h.begin(); it != h.end(); ++it) {
      const std::string& name = it.key();
      if (name == "__metadata__") {
        if (!it->is_object()) throw ModelFileError(path, "__metadata__ is not an object");
        for (auto m = it->begin(); m != it->end(); ++m)
          metadata_[m.key()] = m->is_string() ? m->get<std::string>() : m->dump();
        continue;
      }
      const json& e = *it;
      auto bad = [&](const std::string& why) {
        return ModelFileError(path, "tensor '" + name + "': " + why);
      };
      if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") ||
          !e.contains("data_offsets") || !e["dtype"].is_string())
        throw bad("entry must be an object with dtype, shape and data_offsets");
      TensorInfo t;
      t.name = name;
      try {
        t.dtype = parseDType(e["dtype"].get<std::string>());
      } catch (const std::exception& ex) {
        throw bad(ex.what());
      }
      const json& sh = e["shape"];
      const json& off = e["data_offsets"];
      if (!sh.is_array()) throw bad("shape is not an array");
      uint64_t expect = dtypeSize(t.dtype);
      for (auto& d : sh) {
        if (!d.is_number_unsigned()) throw bad("shape has a non-integer or negative dimension");
        uint64_t v = d.get<uint64_t>();
        if (v != 0 && expect > (uint64_t(1) << 62) / v) throw bad("shape overflows");
        expect *= v;
        t.shape.push_back(static_cast<int64_t>(v));
      }
      if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
          !off[1].is_number_unsigned())
        throw bad("data_offsets must be two non-negative integers");
      uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
      if (en < b) throw bad("data_offsets are reversed");
      if (en > size_ - dataStart)
        throw bad("data_offsets [" + std::to_string(b) + ", " + std::to_string(en) +
                  ") lie outside the data section (" + std::to_string(size_ - dataStart) +
                  " bytes): file truncated or corrupt");
      if (en - b != expect)
        throw bad("shape and dtype need " + std::to_string(expect) +
                  " bytes but data_offsets span " + std::to_string(en - b));
      t.begin = dataStart + b;
      t.end = dataStart + en;
      auto [pos, ok] = tensors_.emplace(name, std::move(t));
      if (!ok) throw bad("listed twice");
      order.push_back(&pos->second);
    }
    std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
    // Sorted by start: a tensor overlaps an earlier one iff it starts before the furthest end so
    // far (empty tensors occupy nothing and are skipped).
    const TensorInfo* furthest = nullptr;
    for (const TensorInfo* t : order) {
      if (t->nbytes() == 0) continue;
      if (furthest && t->begin < furthest->end)
        throw ModelFileError(path, "tensors '" + furthest->name + "' and '" + t->name +
                                       "' overlap in the data section");
      if (!furthest || t->end > furthest->end) furthest = t;
    }
    // As the reference: the tensors cover the data section exactly, with no gap (bytes no
    // tensor claims) and nothing after the last one.
    uint64_t at = dataStart;
    for (const TensorInfo* t : order) {
      if (t->nbytes() == 0) continue;
      if (t->begin != at)
        throw ModelFileError(path, "tensor '" + t->name + "' starts at data offset " +
                                       std::to_string(t->begin - dataStart) +
                                       " but the data before it ends at " +
                                       std::to_string(at - dataStart) +
                                       ": the data section has a gap (corrupt file)");
      at = t->end;
    }
    if (at != size_)
      throw ModelFileError(path, "the tensors cover " + std::to_string(at - dataStart) +
                                     " bytes of the " + std::to_string(size_ - dataStart) +
                                     "-byte data section: trailing bytes (corrupt file)");
  } catch (...) {
    ::munmap(const_cast<uint8_t*>(base_), size_);
    base_ = nullptr;
    throw;
  }
}

void SafetensorsReader::openGguf() {
  auto h = std::make_shared<GgufHeader>(parseGguf(base_, size_, path_));
  for (const auto& t : h->tensors) {
    TensorInfo i;
    i.name = t.name;
    switch (static_cast<GgmlType>(t.type)) {
      case GgmlType::F32:
        i.dtype = DType::F32;
        break;
      case GgmlType::F16:
        i.dtype = DType::F16;
        break;
      case GgmlType::BF16:
        i.dtype = DType::BF16;
        break;
      default:
        for (const auto& [d, g] : kBlockTypes)
          if (static_cast<uint32_t>(g) == t.type) i.dtype = d;
    }
    i.shape.assign(t.ne.rbegin(), t.ne.rend());
    // ComfyUI-GGUF: `comfy.gguf.orig_shape.<name>` gives the torch shape of a tensor stored
    // reshaped (never for FLUX); honoured when its element count agrees.
    if (const GgufValue* o = h->find("comfy.gguf.orig_shape." + t.name)) {
      int64_t n = 1, m = 1;
      for (int64_t v : o->integers) n = v > 0 && n <= (int64_t(1) << 62) / v ? n * v : -1;
      for (int64_t v : t.ne) m *= v;
      if (o->type != GgufValueType::ARRAY || o->integers.empty() ||
          o->integers.size() != o->count || n != m)
        throw ModelFileError(path_, "comfy.gguf.orig_shape." + t.name +
                                        " is not an integer shape with the tensor's " +
                                        std::to_string(m) + " elements");
      if (dtypeIsBlockQuantized(i.dtype) && o->integers.back() != t.ne[0])
        throw ModelFileError(path_, "tensor '" + t.name + "' is stored as " + dtypeName(i.dtype) +
                                        " reshaped (comfy.gguf.orig_shape): quantized tensors "
                                        "are read only in their stored row layout");
      i.shape = o->integers;
    }
    i.begin = h->dataOffset + t.offset;
    i.end = i.begin + t.nbytes;
    tensors_.emplace(t.name, std::move(i));
  }
  for (const auto& [k, v] : h->metadata) metadata_[k] = v.text;
  gguf_ = std::move(h);
}

SafetensorsReader::~SafetensorsReader() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
}

uint64_t SafetensorsReader::releaseGranularity() {
  static const uint64_t g = [] {
    const long v = ::sysconf(_SC_PAGESIZE);
    const uint64_t page = v > 0 ? static_cast<uint64_t>(v) : uint64_t(4096);
    return std::max<uint64_t>(page, uint64_t(2) << 20);
  }();
  return g;
}

void SafetensorsReader::releaseRange(uint64_t begin, uint64_t end) const {
  if (!base_) return;
  const long pv = ::sysconf(_SC_PAGESIZE);
  const uint64_t page = pv > 0 ? static_cast<uint64_t>(pv) : uint64_t(4096);
  const uint64_t mapped = (size_ + page - 1) / page * page;  // the mapping's length
  const uint64_t g = releaseGranularity();
  const uint64_t b = begin / g * g;
  const uint64_t e = std::min((std::min(end, size_) + g - 1) / g * g, mapped);
  if (b >= e) return;
  // Read-only MAP_PRIVATE file mapping that is never written: MADV_DONTNEED only drops the page
  // table entries (no private copies exist), so the contents stay those of the file. A failure
  // (which would only mean the pages stay resident) is deliberately ignored.
  (void)::madvise(const_cast<uint8_t*>(base_) + b, static_cast<size_t>(e - b), MADV_DONTNEED);
}

const TensorInfo& SafetensorsReader::info(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw ModelFileError(path_, "has no tensor named '" + name + "'");
  return it->second;
}

std::vector<std::string> SafetensorsReader::names() const {
  std::vector<std::string> v;
  for (auto& [k, _] : tensors_) v.push_back(k);
  return v;
}

SafetensorsCollection SafetensorsCollection::openFolder(const std::string& dir,
                                                        const std::string& stem) {
  fs::path d(dir);
  if (!fs::is_directory(d)) throw ModelFileError(dir, "folder does not exist");
  if (fs::exists(d / (stem + ".safetensors.index.json")))
    return SafetensorsCollection((d / (stem + ".safetensors.index.json")).string());
  if (fs::exists(d / (stem + ".safetensors")))
    return SafetensorsCollection((d / (stem + ".safetensors")).string());
  std::vector<fs::path> found;
  for (auto& e : fs::directory_iterator(d))
    if (e.path().extension() == ".safetensors") found.push_back(e.path());
  if (found.size() == 1) return SafetensorsCollection(found[0].string());
  if (found.empty())
    throw ModelFileError(dir,
                         "no " + stem + ".safetensors (or .safetensors.index.json) weights file");
  throw ModelFileError(dir, "several .safetensors files and no " + stem +
                                ".safetensors.index.json to say which to use");
}

SafetensorsCollection::SafetensorsCollection(const std::string& path) : path_(path) {
  fs::path p(path);
  if (p.extension() != ".json") {
    shards_.push_back(std::make_shared<SafetensorsReader>(path));
    for (auto& n : shards_[0]->names()) where_[n] = 0;
    return;
  }
  const json j = parseModelJson(readRegularFile(path), path, "index");
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw ModelFileError(path, "index has no \"weight_map\" object");
  std::map<std::string, size_t> shardIdx;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it->is_string())
      throw ModelFileError(path, "weight_map entry '" + it.key() + "' is not a file name");
    std::string f = it->get<std::string>();
    auto s = shardIdx.find(f);
    if (s == shardIdx.end()) {
      // Inside the model folder only (no absolute path, no '..'), and nothing of a file that
      // fails to open is echoed (SafetensorsReader's messages name causes, not bytes).
      fs::path sp = resolveInside(p.parent_path().string(), f, path,
                                  "weight_map entry '" + it.key() + "' (shard '" + f + "')");
      if (!fs::exists(sp))
        throw ModelFileError(
            path, "names shard '" + f + "' (for tensor '" + it.key() + "') which does not exist");
      shards_.push_back(std::make_shared<SafetensorsReader>(sp.string()));
      s = shardIdx.emplace(f, shards_.size() - 1).first;
    }
    if (!shards_[s->second]->contains(it.key()))
      throw ModelFileError(path, "names tensor '" + it.key() + "' in shard '" + f +
                                     "' but that shard does not contain it");
    where_[it.key()] = s->second;
  }
}

const TensorInfo& SafetensorsCollection::info(const std::string& name) const {
  return reader(name).info(name);
}

const SafetensorsReader& SafetensorsCollection::reader(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw ModelFileError(path_, "missing tensor '" + name + "'");
  return *shards_[it->second];
}

std::vector<std::string> SafetensorsCollection::names() const {
  std::vector<std::string> v;
  for (auto& [k, _] : where_) v.push_back(k);
  return v;
}

uint64_t SafetensorsCollection::totalBytes() const {
  uint64_t s = 0;
  for (auto& [k, i] : where_) s += shards_[i]->info(k).nbytes();
  return s;
}

void writeSafetensors(const std::string& path, const std::map<std::string, RawTensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  json h = json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t off = 0;
  for (auto& [name, t] : tensors) {
    uint64_t need = dtypeSize(t.dtype);
    for (auto d : t.shape) need *= static_cast<uint64_t>(d);
    if (need != t.bytes.size())
      throw std::runtime_error("writeSafetensors: tensor '" + name + "' has " +
                               std::to_string(t.bytes.size()) + " bytes, shape needs " +
                               std::to_string(need));
    h[name] = {
        {"dtype", dtypeName(t.dtype)}, {"shape", t.shape}, {"data_offsets", {off, off + need}}};
    off += need;
  }
  std::string hs = h.dump();
  while ((hs.size() + 8) % 8) hs.push_back(' ');
  // Temporary file in the same folder, fsync, rename onto a regular file or nothing (issue 16).
  AtomicFile o(path);
  const uint64_t n = hs.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>((n >> (8 * i)) & 0xff);
  o.write(len, 8);
  o.write(hs.data(), hs.size());
  for (auto& [name, t] : tensors) o.write(t.bytes.data(), t.bytes.size());
  o.commit();
}

}  // namespace dit
