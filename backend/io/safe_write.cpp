#include "backend/io/safe_write.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_NOREPLACE (glibc 2.28)
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace dit {
namespace fs = std::filesystem;

namespace {

const char* kindOf(mode_t m) {
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISLNK(m)) return "a symbolic link";
  return "something else";
}

}  // namespace

void requireRegularOrAbsent(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    throw std::runtime_error("cannot write " + path + ": " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode))
    throw std::runtime_error("cannot write " + path + ": it is " + kindOf(st.st_mode) +
                             ", not a regular file; refusing to replace it");
}

AtomicFile::AtomicFile(const std::string& path) : path_(path) {
  requireRegularOrAbsent(path_);
  const fs::path p(path_);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  // Built piecewise: `"." + name + ".XXXXXX"` trips GCC 12's -Wrestrict false positive.
  std::string base(".");
  base.append(p.filename().string()).append(".XXXXXX");
  const std::string tmpl = (dir / base).string();
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  fd_ = ::mkostemp(buf.data(), O_CLOEXEC);
  if (fd_ < 0)
    throw std::runtime_error("cannot write " + path_ + ": cannot create a temporary file in " +
                             dir.string() + ": " + std::strerror(errno));
  tmp_ = buf.data();
  const mode_t mask = ::umask(0);
  ::umask(mask);
  (void)::fchmod(fd_, 0666 & ~mask);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !tmp_.empty()) ::unlink(tmp_.c_str());
}

void AtomicFile::fail(const std::string& cause) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
  tmp_.clear();
  throw std::runtime_error("cannot write " + path_ + ": " + cause);
}

void AtomicFile::write(const void* data, std::size_t n) {
  if (fd_ < 0) fail("the file is already closed");
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail(std::strerror(errno));
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

void AtomicFile::commit() {
  if (fd_ < 0) fail("the file is already closed");
  if (::fsync(fd_) != 0) fail(std::string("fsync: ") + std::strerror(errno));
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    fd_ = -1;
    fail(std::string("close: ") + std::strerror(errno));
  }
  // Checked again just before the rename (something may have appeared meanwhile).
  try {
    requireRegularOrAbsent(path_);
  } catch (const std::runtime_error& e) {
    ::unlink(tmp_.c_str());
    tmp_.clear();
    throw;
  }
  const OutputReplacePolicy* policy = OutputReplacePolicy::current();
  if (policy && !policy->mayReplace(path_)) {
    // No replacing: renameat2(RENAME_NOREPLACE) fails with EEXIST when a file appeared at the
    // destination after the request was accepted; where the file system lacks it, link() (which
    // never replaces either) and unlink the temporary name.
    if (::renameat2(AT_FDCWD, tmp_.c_str(), AT_FDCWD, path_.c_str(), RENAME_NOREPLACE) != 0) {
      int e = errno;
      if (e == EINVAL || e == ENOSYS || e == ENOTSUP) {
        if (::link(tmp_.c_str(), path_.c_str()) == 0) {
          ::unlink(tmp_.c_str());
          e = 0;
        } else {
          e = errno;
        }
      }
      if (e == EEXIST)
        fail(
            "a file appeared there while the image was computed (it did not exist when the "
            "request was accepted); it is left alone. Remove it, or allow overwriting");
      if (e != 0) fail(std::string("rename: ") + std::strerror(e));
    }
  } else if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    fail(std::string("rename: ") + std::strerror(errno));
  }
  committed_ = true;
  const fs::path p(path_);
  const std::string dir = p.has_parent_path() ? p.parent_path().string() : std::string(".");
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);  // the rename itself on the disk; best effort
    ::close(dfd);
  }
}

namespace {
thread_local const OutputReplacePolicy* g_policy = nullptr;

std::string canonicalOutput(const std::string& path) {
  std::error_code ec;
  const fs::path a = fs::absolute(path, ec);
  return (ec ? fs::path(path) : a).lexically_normal().string();
}
}  // namespace

OutputReplacePolicy::OutputReplacePolicy(const std::vector<std::string>& replaceable)
    : previous_(g_policy) {
  for (const auto& p : replaceable) replaceable_.insert(canonicalOutput(p));
  g_policy = this;
}

OutputReplacePolicy::~OutputReplacePolicy() { g_policy = previous_; }

const OutputReplacePolicy* OutputReplacePolicy::current() { return g_policy; }

bool OutputReplacePolicy::mayReplace(const std::string& path) const {
  return replaceable_.count(canonicalOutput(path)) != 0;
}

void writeFileAtomically(const std::string& path, const void* data, std::size_t n) {
  AtomicFile f(path);
  f.write(data, n);
  f.commit();
}

}  // namespace dit
