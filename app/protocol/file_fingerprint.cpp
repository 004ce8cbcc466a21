#include "app/protocol/file_fingerprint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>

namespace dit::protocol {
namespace {
namespace fs = std::filesystem;

struct Fnv {
  std::uint64_t h = 1469598103934665603ull;
  void add(const void* p, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) {
      h ^= b[i];
      h *= 1099511628211ull;
    }
  }
  void add(const std::string& s) {
    add(s.data(), s.size());
    add("\0", 1);
  }
  void add(std::uint64_t v) { add(&v, sizeof v); }
};

std::string hex16(std::uint64_t h) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

// At most `max` of `found` joined by "; ", then "and N more".
std::string joinAtMost(const std::vector<std::string>& found, int max) {
  std::string out;
  for (size_t i = 0; i < found.size() && static_cast<int>(i) < max; ++i)
    out += (out.empty() ? "" : "; ") + found[i];
  if (static_cast<int>(found.size()) > max)
    out += "; and " + std::to_string(found.size() - static_cast<size_t>(max)) + " more";
  return out;
}

FileFingerprint hashFile(const fs::path& file, const std::string& shown, const std::string& rel) {
  std::error_code ec;
  const std::uint64_t size = fs::file_size(file, ec);
  if (ec) throw std::runtime_error("model fingerprint: cannot read " + file.string());
  std::ifstream in(file, std::ios::binary);
  if (!in) throw std::runtime_error("model fingerprint: cannot open " + file.string());
  Fnv f;
  f.add(rel);
  f.add(size);
  std::vector<char> buf;
  auto block = [&](std::uint64_t off, std::uint64_t n) {
    n = std::min<std::uint64_t>(n, size - std::min(off, size));
    if (n == 0) return;
    buf.resize(n);
    in.seekg(static_cast<std::streamoff>(off));
    if (!in.read(buf.data(), static_cast<std::streamsize>(n)))
      throw std::runtime_error("model fingerprint: cannot read " + file.string());
    f.add(buf.data(), buf.size());
  };
  constexpr std::uint64_t kHead = 1 << 20, kTail = 64 << 10, kBlock = 4 << 10, kBlocks = 64;
  if (size <= kHead + kTail + kBlocks * kBlock) {
    block(0, size);
  } else {
    block(0, kHead);
    const std::uint64_t span = size - kHead - kTail - kBlock;
    for (std::uint64_t i = 0; i < kBlocks; ++i) block(kHead + span * i / (kBlocks - 1), kBlock);
    block(size - kTail, kTail);
  }
  return {shown, size, hex16(f.h)};
}
}  // namespace

namespace {
// The files a model fingerprint covers, in order: (file, shown path, path relative to its root).
struct ListedFile {
  fs::path file;
  std::string shown, rel;
};

std::vector<ListedFile> listModelFiles(const std::vector<std::string>& paths) {
  std::vector<ListedFile> out;
  for (const std::string& p : paths) {
    if (p.empty()) continue;
    std::error_code ec;
    const fs::path root(p);
    if (!fs::exists(root, ec)) throw std::runtime_error("model fingerprint: " + p + " not found");
    if (!fs::is_directory(root, ec)) {
      out.push_back({root, p, root.filename().string()});
      continue;
    }
    std::vector<fs::path> files;
    for (auto it = fs::recursive_directory_iterator(
             root, fs::directory_options::follow_directory_symlink, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (it->path().filename().string().rfind('.', 0) == 0) {
        if (it->is_directory()) it.disable_recursion_pending();
        continue;
      }
      if (it->is_regular_file()) files.push_back(it->path());
    }
    if (ec) throw std::runtime_error("model fingerprint: cannot list " + p + ": " + ec.message());
    if (files.empty()) throw std::runtime_error("model fingerprint: " + p + " holds no files");
    std::sort(files.begin(), files.end());
    for (const fs::path& file : files) {
      const std::string rel = file.lexically_relative(root).string();
      out.push_back({file, (fs::path(p) / rel).string(), rel});
    }
  }
  return out;
}
}  // namespace

std::vector<FileFingerprint> modelFileFingerprints(const std::vector<std::string>& paths) {
  std::vector<FileFingerprint> out;
  for (const ListedFile& f : listModelFiles(paths)) out.push_back(hashFile(f.file, f.shown, f.rel));
  return out;
}

std::vector<FileFingerprint> modelContentHashes(const std::vector<std::string>& paths) {
  std::vector<FileFingerprint> out;
  for (const ListedFile& f : listModelFiles(paths)) {
    std::error_code ec;
    const std::uint64_t size = fs::file_size(f.file, ec);
    if (ec) throw std::runtime_error("content hash: cannot read " + f.file.string());
    out.push_back({f.shown, size, contentHash(f.file.string())});
  }
  return out;
}

// ---- Content hashes (XXH3-128) and their cache ----

std::string contentHashCacheFile() {
  if (const char* e = std::getenv("DITSTUDIO_HASH_CACHE")) {
    const std::string v = e;
    return v == "off" ? "" : v;
  }
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    return (fs::path(x) / "ditstudio" / "content-hashes.tsv").string();
  if (const char* h = std::getenv("HOME"); h && *h)
    return (fs::path(h) / ".cache" / "ditstudio" / "content-hashes.tsv").string();
  return "";
}

namespace {
struct CacheEntry {
  std::uint64_t dev = 0, ino = 0, size = 0;
  std::int64_t mtime_ns = 0;
  std::string hash;
};

constexpr std::size_t kMaxCacheEntries = 20000;

// Key: "DEV INO PATH" (the same path names different files on different hosts sharing a home).
std::string cacheKey(std::uint64_t dev, std::uint64_t ino, const std::string& path) {
  return std::to_string(dev) + ' ' + std::to_string(ino) + ' ' + path;
}

std::map<std::string, CacheEntry> readCache(const std::string& file) {
  std::map<std::string, CacheEntry> m;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line) && m.size() < kMaxCacheEntries;) {
    std::istringstream w(line);
    CacheEntry e;
    std::string path;
    if (!(w >> e.dev >> e.ino >> e.size >> e.mtime_ns >> e.hash)) continue;
    std::getline(w >> std::ws, path);
    if (path.empty() || e.hash.size() != 32) continue;
    m[cacheKey(e.dev, e.ino, path)] = e;
  }
  return m;
}

void writeCache(const std::string& file, const std::map<std::string, CacheEntry>& m) {
  std::error_code ec;
  fs::create_directories(fs::path(file).parent_path(), ec);
  const std::string tmp = file + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) return;
    for (const auto& [key, e] : m) {
      const std::string path = key.substr(key.find(' ', key.find(' ') + 1) + 1);
      out << e.dev << ' ' << e.ino << ' ' << e.size << ' ' << e.mtime_ns << ' ' << e.hash << ' '
          << path << '\n';
    }
    if (!out.flush()) {
      fs::remove(tmp, ec);
      return;
    }
  }
  fs::rename(tmp, file, ec);
  if (ec) fs::remove(tmp, ec);
}

// xxHash's canonical (big-endian) form of a 128-bit hash, as xxh128sum prints it.
std::string canonicalHex(XXH128_hash_t h) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, h);
  std::string hex;
  char two[3];
  for (unsigned char b : c.digest) {
    std::snprintf(two, sizeof two, "%02x", b);
    hex += two;
  }
  return hex;
}

std::string xxh128File(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("content hash: cannot open " + path);
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> st(XXH3_createState(), XXH3_freeState);
  if (!st || XXH3_128bits_reset(st.get()) == XXH_ERROR) {
    ::close(fd);
    throw std::runtime_error("content hash: out of memory");
  }
  std::vector<char> buf(4 << 20);
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      throw std::runtime_error("content hash: cannot read " + path);
    }
    if (n == 0) break;
    XXH3_128bits_update(st.get(), buf.data(), static_cast<size_t>(n));
  }
  ::close(fd);
  return canonicalHex(XXH3_128bits_digest(st.get()));
}
}  // namespace

std::string contentHash(const std::string& path, bool* from_cache) {
  if (from_cache) *from_cache = false;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw std::runtime_error("content hash: cannot open " + path);
  std::error_code ec;
  const fs::path absPath = fs::absolute(path, ec);
  const std::string abs = ec ? path : absPath.lexically_normal().string();
  const auto dev = static_cast<std::uint64_t>(st.st_dev),
             ino = static_cast<std::uint64_t>(st.st_ino),
             size = static_cast<std::uint64_t>(st.st_size);
  const std::int64_t mtime =
      static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  // One process hashes one file at a time; the cache file is shared between processes.
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  const std::string cacheFile = contentHashCacheFile();
  std::map<std::string, CacheEntry> cache;
  if (!cacheFile.empty()) cache = readCache(cacheFile);
  const std::string key = cacheKey(dev, ino, abs);
  if (auto it = cache.find(key);
      it != cache.end() && it->second.size == size && it->second.mtime_ns == mtime) {
    if (from_cache) *from_cache = true;
    return it->second.hash;
  }
  const std::string hash = xxh128File(path);
  if (!cacheFile.empty()) {
    // Re-read: another process may have added entries meanwhile.
    cache = readCache(cacheFile);
    if (cache.size() >= kMaxCacheEntries) cache.erase(cache.begin());
    cache[key] = CacheEntry{dev, ino, size, mtime, hash};
    writeCache(cacheFile, cache);
  }
  return hash;
}

std::string modelFingerprint(const std::vector<std::string>& paths) {
  Fnv f;
  for (const FileFingerprint& e : modelFileFingerprints(paths)) f.add(e.digest);
  return hex16(f.h);
}

std::string describeDifferences(const std::vector<FileFingerprint>& mine,
                                const std::vector<FileFingerprint>& theirs, int max) {
  std::vector<std::string> found;
  auto find = [](const std::vector<FileFingerprint>& l, const std::string& path) {
    return std::find_if(l.begin(), l.end(),
                        [&](const FileFingerprint& e) { return e.path == path; });
  };
  for (const FileFingerprint& m : mine) {
    const auto t = find(theirs, m.path);
    if (t == theirs.end())
      found.push_back(m.path + " missing there");
    else if (t->size != m.size)
      found.push_back(m.path + " differs (size " + std::to_string(m.size) + " here, " +
                      std::to_string(t->size) + " there)");
    else if (t->digest != m.digest)
      found.push_back(m.path + " differs (same size)");
  }
  for (const FileFingerprint& t : theirs)
    if (find(mine, t.path) == mine.end()) found.push_back(t.path + " only there");
  return joinAtMost(found, max);
}

std::string encodeFileList(const std::vector<FileFingerprint>& files) {
  std::string out;
  for (const FileFingerprint& f : files)
    out += std::to_string(f.size) + ' ' + f.digest + ' ' + f.path + '\n';
  return out;
}

std::vector<FileFingerprint> decodeFileList(const std::string& text) {
  std::vector<FileFingerprint> out;
  std::istringstream lines(text);
  for (std::string l; std::getline(lines, l);) {
    std::istringstream w(l);
    FileFingerprint f{};
    if (!(w >> f.size >> f.digest)) continue;
    std::getline(w >> std::ws, f.path);
    if (!f.path.empty()) out.push_back(std::move(f));
  }
  return out;
}

std::string fileListDigest(const std::vector<FileFingerprint>& files) {
  const std::string text = encodeFileList(files);
  return canonicalHex(XXH3_128bits(text.data(), text.size()));
}

std::string describeRankDifferences(const std::vector<RankFiles>& ranks, int max) {
  if (ranks.empty()) return "";
  const RankFiles& ref = ranks.front();
  auto who = [](const RankFiles& r) {
    return "rank " + std::to_string(r.rank) + " (host " + r.host + ")";
  };
  auto find = [](const std::vector<FileFingerprint>& l, const std::string& path) {
    return std::find_if(l.begin(), l.end(),
                        [&](const FileFingerprint& e) { return e.path == path; });
  };
  std::vector<std::string> found;
  for (size_t i = 1; i < ranks.size(); ++i) {
    const RankFiles& o = ranks[i];
    for (const FileFingerprint& m : ref.files) {
      const auto t = find(o.files, m.path);
      if (t == o.files.end())
        found.push_back(m.path + ": missing on " + who(o));
      else if (t->size != m.size || t->digest != m.digest)
        found.push_back(m.path + ": content hash " + m.digest + " on " + who(ref) + ", " +
                        t->digest + " on " + who(o) +
                        (t->size != m.size ? " (size " + std::to_string(m.size) + " vs " +
                                                 std::to_string(t->size) + " bytes)"
                                           : std::string()));
    }
    for (const FileFingerprint& t : o.files)
      if (find(ref.files, t.path) == ref.files.end())
        found.push_back(t.path + ": only on " + who(o));
  }
  return joinAtMost(found, max);
}

}  // namespace dit::protocol
