#include "backend/io/file_guard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

namespace dit {

namespace {

const char* kindOf(mode_t m) {
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

[[noreturn]] void notRegular(const std::string& path, mode_t m) {
  const std::string k = kindOf(m);
  throw ModelFileError(path, (k == "not a regular file" ? k : "is " + k + ", not a regular file") +
                                 "; model files must be regular files");
}

}  // namespace

int openRegularFile(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int e = errno;
    if (e == ENOENT)
      throw ModelFileError(
          path, std::string("file is missing (cannot open file: ") + std::strerror(e) + ")");
    throw ModelFileError(path, std::string("cannot open file: ") + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) notRegular(path, st.st_mode);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) throw ModelFileError(path, std::string("cannot open file: ") + std::strerror(errno));
  struct stat st2 {};
  if (::fstat(fd, &st2) != 0 || !S_ISREG(st2.st_mode)) {
    ::close(fd);
    notRegular(path, st2.st_mode);
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

std::string readRegularFile(const std::string& path, std::uint64_t maxBytes) {
  const int fd = openRegularFile(path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw ModelFileError(path, std::string("cannot stat file: ") + std::strerror(e));
  }
  if (static_cast<std::uint64_t>(st.st_size) > maxBytes) {
    ::close(fd);
    throw ModelFileError(path, "is " + std::to_string(st.st_size) +
                                   " bytes; files of this kind are limited to " +
                                   std::to_string(maxBytes) + " bytes");
  }
  std::string out;
  out.resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      throw ModelFileError(path, std::string("read error: ") + std::strerror(e));
    }
    if (n == 0) break;  // shrank while read
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  out.resize(got);
  return out;
}

bool jsonDepthExceeds(std::string_view s, int maxDepth) {
  int depth = 0;
  bool inString = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (inString) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        inString = false;
    } else if (c == '"') {
      inString = true;
    } else if (c == '{' || c == '[') {
      if (++depth > maxDepth) return true;
    } else if ((c == '}' || c == ']') && depth > 0) {
      --depth;
    }
  }
  return false;
}

nlohmann::json parseModelJson(std::string_view text, const std::string& file,
                              const std::string& what) {
  if (jsonDepthExceeds(text, kMaxModelJsonDepth))
    throw ModelFileError(file, what + " nests JSON more than " +
                                   std::to_string(kMaxModelJsonDepth) + " levels deep");
  // A key listed twice in one object is refused (the parser would keep the last silently: a
  // safetensors header naming a tensor twice would then read as a gap in the data section).
  std::vector<std::set<std::string>> keys;  // the keys of each open object
  std::string duplicate;
  bool nestedDuplicate = false;
  const nlohmann::json::parser_callback_t check = [&](int, nlohmann::json::parse_event_t event,
                                                      nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start) {
      keys.emplace_back();
    } else if (event == E::object_end) {
      if (!keys.empty()) keys.pop_back();
    } else if (event == E::key && !keys.empty() && duplicate.empty()) {
      const std::string k = parsed.get<std::string>();
      if (!keys.back().insert(k).second) {
        duplicate = k;
        nestedDuplicate = keys.size() > 1;
      }
    }
    return true;
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.begin(), text.end(), check);
  } catch (const nlohmann::json::parse_error& e) {
    throw ModelFileError(
        file, what + " is not valid JSON: syntax error at byte " + std::to_string(e.byte));
  } catch (const nlohmann::json::exception&) {
    throw ModelFileError(file, what + " is not valid JSON");
  }
  if (!duplicate.empty())
    throw ModelFileError(
        file, what + " lists the key '" +
                  (duplicate.size() > 200 ? duplicate.substr(0, 200) + "..." : duplicate) +
                  "' twice" + (nestedDuplicate ? " in one nested object" : "") +
                  " (a JSON object's keys must be distinct)");
  return j;
}

nlohmann::json readModelJson(const std::string& file, const std::string& what) {
  return parseModelJson(readRegularFile(file), file, what);
}

std::string resolveInside(const std::string& dir, const std::string& name,
                          const std::string& indexFile, const std::string& entry) {
  namespace fs = std::filesystem;
  auto refuse = [&](const std::string& why) {
    throw ModelFileError(indexFile, entry + " names a file " + why +
                                        "; index files may only name files inside their folder");
  };
  if (name.empty()) refuse("with an empty name");
  if (name.find('\0') != std::string::npos) refuse("with a NUL byte in its name");
  const fs::path p(name);
  if (p.is_absolute() || p.has_root_name() || p.has_root_directory()) refuse("by an absolute path");
  for (const auto& part : p)
    if (part == "..") refuse("outside the folder (a '..' part)");
  return (fs::path(dir) / p).lexically_normal().string();
}

}  // namespace dit
