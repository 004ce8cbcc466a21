#include "app/launcher/fingerprint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace dit::launcher {
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

std::vector<FileFingerprint> modelFileFingerprints(const std::vector<std::string>& paths) {
  std::vector<FileFingerprint> out;
  for (const std::string& p : paths) {
    if (p.empty()) continue;
    std::error_code ec;
    const fs::path root(p);
    if (!fs::exists(root, ec)) throw std::runtime_error("model fingerprint: " + p + " not found");
    if (!fs::is_directory(root, ec)) {
      out.push_back(hashFile(root, p, root.filename().string()));
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
      out.push_back(hashFile(file, (fs::path(p) / rel).string(), rel));
    }
  }
  return out;
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
  std::string out;
  for (size_t i = 0; i < found.size() && static_cast<int>(i) < max; ++i)
    out += (out.empty() ? "" : "; ") + found[i];
  if (static_cast<int>(found.size()) > max)
    out += "; and " + std::to_string(found.size() - static_cast<size_t>(max)) + " more";
  return out;
}

}  // namespace dit::launcher
