#include "backend/tokenizers/spm_loader.h"

#include <dlfcn.h>

#include <filesystem>
#include <mutex>
#include <stdexcept>

namespace dit {
namespace {

struct Api {
  void* (*load)(const char*, size_t, char*, size_t) = nullptr;
  void (*unload)(void*) = nullptr;
  int (*encode)(void*, const char*, size_t, int**, size_t*, char*, size_t) = nullptr;
  void (*release)(void*) = nullptr;
  int (*pieceSize)(void*) = nullptr;
  int (*pieceToId)(void*, const char*) = nullptr;
  int (*idToPiece)(void*, int, char*, size_t) = nullptr;
};

const Api& api() {
  static Api a;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    namespace fs = std::filesystem;
    std::vector<std::string> candidates;
    if (const char* e = std::getenv("DITSTUDIO_SPM_MODULE"); e && *e) candidates.push_back(e);
    std::error_code ec;
    fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) {
      candidates.push_back(
          (exe.parent_path().parent_path() / "lib/ditstudio/libdit_spm.so").string());
      candidates.push_back((exe.parent_path() / "libdit_spm.so").string());
    }
#ifdef DITSTUDIO_SPM_BUILD_PATH
    candidates.push_back(DITSTUDIO_SPM_BUILD_PATH);
#endif
    void* h = nullptr;
    for (const auto& c : candidates) {
      if (!fs::exists(c, ec)) continue;
#if defined(__SANITIZE_ADDRESS__)
      // AddressSanitizer aborts on RTLD_DEEPBIND (google/sanitizers#611): the same isolation
      // from LibTorch's libprotobuf comes from a link-map namespace of the module's own.
      h = dlmopen(LM_ID_NEWLM, c.c_str(), RTLD_NOW | RTLD_LOCAL);
#else
      h = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
#endif
      if (h) break;
      error += std::string(" ") + dlerror() + ";";
    }
    if (!h) {
      error = "cannot load the SentencePiece module libdit_spm.so (looked in";
      for (auto& c : candidates) error += " " + c;
      error += ")";
      return;
    }
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
    };
    sym(a.load, "dit_spm_load");
    sym(a.unload, "dit_spm_unload");
    sym(a.encode, "dit_spm_encode");
    sym(a.release, "dit_spm_free");
    sym(a.pieceSize, "dit_spm_piece_size");
    sym(a.pieceToId, "dit_spm_piece_to_id");
    sym(a.idToPiece, "dit_spm_id_to_piece");
    if (!a.load || !a.encode || !a.idToPiece) error = "libdit_spm.so lacks the expected symbols";
  });
  if (!a.load || !a.encode || !a.idToPiece) throw std::runtime_error(error);
  return a;
}

}  // namespace

SentencePieceModel::SentencePieceModel(const std::string& proto) {
  char err[512] = {0};
  h_ = api().load(proto.data(), proto.size(), err, sizeof err);
  if (!h_) throw std::runtime_error(err);
}

SentencePieceModel::~SentencePieceModel() {
  if (h_) api().unload(h_);
}

std::vector<int> SentencePieceModel::encode(std::string_view text) const {
  int* ids = nullptr;
  size_t n = 0;
  char err[512] = {0};
  if (api().encode(h_, text.data(), text.size(), &ids, &n, err, sizeof err) != 0)
    throw std::runtime_error(std::string("SentencePiece encode failed: ") + err);
  std::vector<int> out(ids, ids + n);
  api().release(ids);
  return out;
}

int SentencePieceModel::pieceSize() const { return api().pieceSize(h_); }
int SentencePieceModel::pieceToId(const std::string& piece) const {
  return api().pieceToId(h_, piece.c_str());
}
std::string SentencePieceModel::idToPiece(int id) const {
  char buf[1024];
  const int n = api().idToPiece(h_, id, buf, sizeof buf);
  return n < 0 ? std::string() : std::string(buf, n);
}

}  // namespace dit
