// C ABI around libsentencepiece, built as a separate module (libdit_spm.so) and loaded with
// dlopen(RTLD_LOCAL | RTLD_DEEPBIND) by SentencePieceModel (spm_loader.h).
//
// Why: Debian's libsentencepiece carries its own protobuf-lite 3.14 with exported symbols, while
// LibTorch links libprotobuf 3.21. Linked into one executable, libprotobuf's static
// initialisers bind to sentencepiece's copies and crash. Loaded locally with DEEPBIND, each
// library resolves to its own protobuf and neither leaks into the global symbol scope.
#include <sentencepiece_processor.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {
void setErr(char* err, size_t len, const std::string& msg) {
  if (!err || !len) return;
  std::strncpy(err, msg.c_str(), len - 1);
  err[len - 1] = '\0';
}
}  // namespace

extern "C" {

__attribute__((visibility("default"))) void* dit_spm_load(const char* bytes, size_t n, char* err,
                                                          size_t errlen) {
  auto* sp = new sentencepiece::SentencePieceProcessor();
  auto st = sp->LoadFromSerializedProto(std::string_view(bytes, n));
  if (!st.ok()) {
    setErr(err, errlen, st.ToString());
    delete sp;
    return nullptr;
  }
  return sp;
}

__attribute__((visibility("default"))) void dit_spm_unload(void* h) {
  delete static_cast<sentencepiece::SentencePieceProcessor*>(h);
}

__attribute__((visibility("default"))) int dit_spm_encode(void* h, const char* text, size_t n,
                                                          int** ids, size_t* count, char* err,
                                                          size_t errlen) {
  std::vector<int> v;
  auto st =
      static_cast<sentencepiece::SentencePieceProcessor*>(h)->Encode(std::string_view(text, n), &v);
  if (!st.ok()) {
    setErr(err, errlen, st.ToString());
    return 1;
  }
  *count = v.size();
  *ids = static_cast<int*>(std::malloc(sizeof(int) * (v.size() + 1)));
  std::memcpy(*ids, v.data(), sizeof(int) * v.size());
  return 0;
}

__attribute__((visibility("default"))) void dit_spm_free(void* p) { std::free(p); }

__attribute__((visibility("default"))) int dit_spm_piece_size(void* h) {
  return static_cast<sentencepiece::SentencePieceProcessor*>(h)->GetPieceSize();
}

__attribute__((visibility("default"))) int dit_spm_piece_to_id(void* h, const char* piece) {
  return static_cast<sentencepiece::SentencePieceProcessor*>(h)->PieceToId(piece);
}

// Copies the piece of `id` into buf (NUL-terminated); returns its length, or -1 if it does not fit.
__attribute__((visibility("default"))) int dit_spm_id_to_piece(void* h, int id, char* buf,
                                                               size_t len) {
  const std::string& p = static_cast<sentencepiece::SentencePieceProcessor*>(h)->IdToPiece(id);
  if (p.size() + 1 > len) return -1;
  std::memcpy(buf, p.c_str(), p.size() + 1);
  return static_cast<int>(p.size());
}
}
