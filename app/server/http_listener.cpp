#include "app/server/http_listener.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>

namespace dit::server {

std::optional<std::uint64_t> tcpBytesReceived(int fd);  // tcp_bytes.cpp

namespace {

// cpp-httplib serves one accepted socket in Server::process_and_close_socket (its own accept loop
// calls it from a worker thread). It is private; an explicit instantiation may name a private
// member ([temp.spec.general]/6), which gives the pointer its own loop uses. Called on a plain
// httplib::Server object, so the virtual call runs cpp-httplib's own function.
struct ProcessTag {
  using type = bool (httplib::Server::*)(socket_t);
  friend type processFn(ProcessTag);
};
template <typename Tag, typename Tag::type M>
struct Expose {
  friend typename Tag::type processFn(Tag) { return M; }
};
template struct Expose<ProcessTag, &httplib::Server::process_and_close_socket>;

enum class Phase { Waiting, Body, Handling };

std::string peerAddress(const sockaddr_storage& a) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (a.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, buf, sizeof buf);
  } else if (a.ss_family == AF_INET6) {
    const auto& a6 = reinterpret_cast<const sockaddr_in6&>(a);
    if (IN6_IS_ADDR_V4MAPPED(&a6.sin6_addr)) {
      in_addr v4;
      std::memcpy(&v4, a6.sin6_addr.s6_addr + 12, 4);
      inet_ntop(AF_INET, &v4, buf, sizeof buf);
    } else {
      inet_ntop(AF_INET6, &a6.sin6_addr, buf, sizeof buf);
    }
  }
  return buf;
}

std::optional<std::uint64_t> bytesReceived(int fd) { return tcpBytesReceived(fd); }

// A fixed answer for a connection that cannot get a thread at all (far over the limits).
void refuseNow(int fd) {
  static const std::string body =
      R"({"error":{"message":"too many open connections; try again later","type":"server_error","param":null,"code":"too_many_connections"}})";
  const std::string r =
      "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
      "Connection: close\r\nRetry-After: 1\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  [[maybe_unused]] const ssize_t n = ::send(fd, r.data(), r.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  ::shutdown(fd, SHUT_WR);
}

// Ends a TCP connection at once, from another thread than the one serving it: connect() with
// AF_UNSPEC dissolves it (Linux's tcp_disconnect: a reset, both queues dropped), so the serving
// thread's next read ends. shutdown() alone leaves the data already queued to be read (cpp-httplib
// reads a request line byte by byte, of any length) and lets the client keep sending.
void abortConnection(int fd) {
  sockaddr sa{};
  sa.sa_family = AF_UNSPEC;
  ::connect(fd, &sa, sizeof sa);
  ::shutdown(fd, SHUT_RDWR);
}

}  // namespace

struct Listener::Conn {
  std::uint64_t id = 0;
  int fd = -1;      ///< ours: a duplicate numbered from 1024 up, closed after cpp-httplib returns
  int served = -1;  ///< the accepted number, which cpp-httplib serves and closes
  std::string peer;
  bool overLimit = false;
  Listener* owner = nullptr;
  // Under owner->mu_:
  Phase phase = Phase::Waiting;
  std::uint64_t bytesAtPhase = 0;
  std::optional<std::chrono::steady_clock::time_point> headStart;
  bool killed = false;
  bool closeAfter = false;  ///< only its own thread touches it
};

namespace {
thread_local Listener::Conn* tlConn = nullptr;  // the connection this thread serves
}

Listener::Listener(httplib::Server& svr, ListenerOptions options)
    : svr_(svr), opt_(std::move(options)) {
  svr_.set_socket_options([this](socket_t fd) { adoptListenSocket(fd); });
}

Listener::~Listener() {
  stop();
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return conns_.empty(); });
  lock.unlock();
  if (watchdog_.joinable()) watchdog_.join();
  if (listenFd_ >= 0) ::close(listenFd_);
}

void Listener::adoptListenSocket(int fd) {
  listenFd_ = fd;
  if (fd < 0) return;  // the bind failed: cpp-httplib closed what it tried
  int yes = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
}

void Listener::afterBind() {
  if (listenFd_ >= 0) ::listen(listenFd_, 1024);  // the kernel caps it at somaxconn
}

std::size_t Listener::open() const {
  std::lock_guard lock(mu_);
  return conns_.size();
}

void Listener::run() {
  // Two descriptors per connection: raise the soft limit towards the hard one (1024 is a common
  // soft default) so that max_connections can be reached.
  if (rlimit rl{}; getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    const rlim_t want = static_cast<rlim_t>(1024 + 2 * opt_.max_connections + 256);
    if (rl.rlim_cur < want) {
      rl.rlim_cur = rl.rlim_max == RLIM_INFINITY ? want : std::min(want, rl.rlim_max);
      setrlimit(RLIMIT_NOFILE, &rl);
    }
  }
  {
    std::lock_guard lock(mu_);
    if (stopping_ || listenFd_ < 0) return;
    if (!watchdog_.joinable()) watchdog_ = std::thread([this] { watchdog(); });
  }
  while (true) {
    pollfd p{listenFd_, POLLIN, 0};
    const int r = ::poll(&p, 1, 200);
    {
      std::lock_guard lock(mu_);
      if (stopping_) break;
    }
    if (r <= 0) continue;
    sockaddr_storage addr{};
    socklen_t alen = sizeof addr;
    const int fd = ::accept4(listenFd_, reinterpret_cast<sockaddr*>(&addr), &alen, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    // cpp-httplib 0.11 uses select(): it serves the accepted (low) number, and answers 500 to a
    // socket numbered FD_SETSIZE or more. The watchdog's own duplicate goes above 1024.
    int watch = ::fcntl(fd, F_DUPFD_CLOEXEC, 1024);
    if (watch < 0) watch = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (watch < 0) {  // out of file descriptors: answered, not dropped
      refuseNow(fd);
      ::close(fd);
      continue;
    }
    auto c = std::make_shared<Conn>();
    c->fd = watch;
    c->served = fd;
    c->peer = peerAddress(addr);
    c->owner = this;
    c->bytesAtPhase = bytesReceived(fd).value_or(0);
    {
      std::lock_guard lock(mu_);
      const bool over = conns_.size() >= opt_.max_connections ||
                        perClient_[c->peer] >= opt_.max_client_connections;
      if (over && refusing_ >= 64) {  // even the refusals are many: answer without a thread
        refuseNow(fd);
        ::close(fd);
        ::close(watch);
        continue;
      }
      c->overLimit = over;
      if (over) ++refusing_;
      c->id = ++nextId_;
      conns_[c->id] = c;
      ++perClient_[c->peer];
    }
    try {
      std::thread([this, c] { serve(c); }).detach();
    } catch (const std::system_error&) {  // no thread to be had: refuse and forget it
      refuseNow(fd);
      std::lock_guard lock(mu_);
      conns_.erase(c->id);
      if (--perClient_[c->peer] == 0) perClient_.erase(c->peer);
      if (c->overLimit) --refusing_;
      ::close(fd);
      ::close(watch);
      cv_.notify_all();
    }
  }
}

void Listener::serve(std::shared_ptr<Conn> c) {
  tlConn = c.get();
  // cpp-httplib sets these on the sockets of its own loop (its per-read limits).
  timeval tv{30, 0};
  setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  try {
    (svr_.*processFn(ProcessTag{}))(c->served);  // serves the connection and closes `served`
  } catch (...) {                                // nothing may escape a detached thread
  }
  tlConn = nullptr;
  std::lock_guard lock(mu_);
  conns_.erase(c->id);
  if (--perClient_[c->peer] == 0) perClient_.erase(c->peer);
  if (c->overLimit) --refusing_;
  ::close(c->fd);  // after its entry is gone: the watchdog never sees a reused number
  cv_.notify_all();
}

void Listener::stop() {
  std::lock_guard lock(mu_);
  if (stopping_) return;
  stopping_ = true;
  if (listenFd_ >= 0) ::shutdown(listenFd_, SHUT_RDWR);
  for (auto& [id, c] : conns_) ::shutdown(c->fd, SHUT_RDWR);
  cv_.notify_all();
}

void Listener::watchdog() {
  using clock = std::chrono::steady_clock;
  const auto deadline = std::chrono::seconds(opt_.request_timeout_s);
  std::unique_lock lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, std::chrono::milliseconds(100));
    if (stopping_) break;
    const auto now = clock::now();
    for (auto& [id, c] : conns_) {
      if (c->killed || c->phase == Phase::Handling) continue;
      const auto got = bytesReceived(c->fd);
      const std::uint64_t bytes = got.value_or(c->bytesAtPhase);
      if (!c->headStart && bytes > c->bytesAtPhase) c->headStart = now;
      // A body still arriving gets its 408 from the reader (at its next bytes): the watchdog ends
      // a stalled one 2 s later; a head cannot be answered, it ends at the deadline.
      const auto limit = c->phase == Phase::Body ? deadline + std::chrono::seconds(2) : deadline;
      bool kill = c->headStart && now - *c->headStart > limit;
      if (c->phase == Phase::Waiting &&
          bytes - c->bytesAtPhase > opt_.max_head_bytes + opt_.max_body_bytes)
        kill = true;  // a head that never ends (cpp-httplib reads a line of any length)
      if (kill) {
        c->killed = true;
        abortConnection(c->fd);
      }
    }
  }
}

void Listener::headRead(bool expectsBody) {
  Conn* c = tlConn;
  if (!c) return;
  std::lock_guard lock(c->owner->mu_);
  if (!c->headStart) c->headStart = std::chrono::steady_clock::now();
  c->phase = expectsBody ? Phase::Body : Phase::Handling;
}

void Listener::bodyRead() {
  Conn* c = tlConn;
  if (!c) return;
  std::lock_guard lock(c->owner->mu_);
  c->phase = Phase::Handling;
}

void Listener::closeAfterResponse() {
  if (tlConn) tlConn->closeAfter = true;
}

void Listener::responseWritten() {
  Conn* c = tlConn;
  if (!c) return;
  if (c->closeAfter) {  // a lingering close, as nginx's lingering_close
    ::shutdown(c->fd, SHUT_WR);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    std::size_t dropped = 0;
    char buf[16384];
    while (dropped < c->owner->opt_.max_body_bytes + (1 << 20)) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd p{c->fd, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
      const ssize_t n = ::recv(c->fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n <= 0) break;
      dropped += static_cast<std::size_t>(n);
    }
    ::shutdown(c->fd, SHUT_RDWR);  // cpp-httplib's next read ends the connection
    return;
  }
  const std::uint64_t bytes = bytesReceived(c->fd).value_or(0);
  std::lock_guard lock(c->owner->mu_);
  c->phase = Phase::Waiting;
  c->headStart.reset();
  c->bytesAtPhase = bytes;
}

bool Listener::overLimit() { return tlConn && tlConn->overLimit; }

double Listener::secondsLeft() {
  Conn* c = tlConn;
  if (!c) return std::numeric_limits<double>::max();
  std::lock_guard lock(c->owner->mu_);
  if (!c->headStart) return c->owner->opt_.request_timeout_s;
  const std::chrono::duration<double> used = std::chrono::steady_clock::now() - *c->headStart;
  return c->owner->opt_.request_timeout_s - used.count();
}

}  // namespace dit::server
