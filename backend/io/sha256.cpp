#include "backend/io/sha256.h"

#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "backend/io/file_guard.h"

namespace dit {

namespace {

// OpenSSL's libcrypto does the hashing (a well-kept library, not our own SHA-256).
struct Digest {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx{EVP_MD_CTX_new(), &EVP_MD_CTX_free};
  Digest() {
    if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1)
      throw std::runtime_error("SHA-256: OpenSSL could not initialise a digest");
  }
  void update(const void* p, size_t n) {
    if (n && EVP_DigestUpdate(ctx.get(), p, n) != 1)
      throw std::runtime_error("SHA-256: OpenSSL digest update failed");
  }
  std::string hex() {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (EVP_DigestFinal_ex(ctx.get(), md, &len) != 1)
      throw std::runtime_error("SHA-256: OpenSSL digest final failed");
    static const char* kHex = "0123456789abcdef";
    std::string out;
    out.reserve(2 * len);
    for (unsigned int i = 0; i < len; ++i) {
      out += kHex[md[i] >> 4];
      out += kHex[md[i] & 15];
    }
    return out;
  }
};

}  // namespace

std::string sha256Hex(std::string_view bytes) {
  Digest d;
  d.update(bytes.data(), bytes.size());
  return d.hex();
}

std::string sha256File(const std::string& path) {
  // Regular files only (a FIFO or device never blocks the hash): file_guard.h.
  const int fd = openRegularFile(path);
  Digest d;
  std::vector<char> buf(size_t{1} << 20);
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      throw std::runtime_error(path + ": read error while hashing: " + std::strerror(err));
    }
    d.update(buf.data(), static_cast<size_t>(n));
  }
  ::close(fd);
  return d.hex();
}

}  // namespace dit
