// ditstudio-server's connections: its own accept loop in front of cpp-httplib, so that no client
// can hold the server by being slow, idle or numerous.
//  - every connection gets a thread of its own (an open /v1/events stream or a long generation
//    does not take a thread from anyone else); at most `max_connections` at once and
//    `max_client_connections` from one address: beyond them a request is answered 503 and the
//    connection closed (never left unanswered in a queue);
//  - a request must arrive whole (request line, headers and body) within `request_timeout_s` of
//    its first byte, and its head (request line and headers) within `max_head_bytes`: a watchdog
//    closes a connection past either (cpp-httplib itself only bounds each read, and reads a
//    request line of any length);
//  - the listen backlog is raised from cpp-httplib's 5, so a burst of connections is accepted.
// cpp-httplib serves each accepted socket exactly as in its own loop (its per-connection
// function, reached through its vtable). Linux only (TCP_INFO). Part of dit_server.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace httplib {
class Server;
}

namespace dit::server {

struct ListenerOptions {
  std::size_t max_connections = 512;         ///< open connections at most
  std::size_t max_client_connections = 256;  ///< from one client address at most
  int request_timeout_s = 60;                ///< whole request: first byte to last body byte
  std::size_t max_head_bytes = 64 << 10;     ///< request line + headers
  std::size_t max_body_bytes = std::size_t(32) << 20;
};

class Listener {
 public:
  Listener(httplib::Server& svr, ListenerOptions options);
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  /// The listening socket cpp-httplib created (from its socket-options callback, which this
  /// replaces: SO_REUSEADDR only, so a port in use by another server is refused); -1 after a
  /// failed bind (the socket is cpp-httplib's to close then).
  void adoptListenSocket(int fd);
  /// After cpp-httplib's bind: raises the listen backlog.
  void afterBind();
  /// Accepts and serves until stop(); returns then (connections may still be finishing; the
  /// destructor waits for them).
  void run();
  /// Stops accepting and shuts every connection down (their threads end at their next read or
  /// write). Safe from any thread and from a signal-handling thread.
  void stop();

  // --- called by the HTTP handlers on the connection's own thread ----------------------------
  /// The request's head has been read (pre-routing); `expectsBody`: its body is still to come.
  static void headRead(bool expectsBody);
  /// The body has been read: the request is being handled (no read deadline while it runs).
  static void bodyRead();
  /// The response has been written: the connection waits for its next request, or (after
  /// closeAfterResponse) is closed: what the client still sends is read and dropped for up to 2
  /// s first, so that the close does not reset the connection before the client reads the answer.
  static void responseWritten();
  /// Close this connection once the response is written (a refusal with a body left unread).
  static void closeAfterResponse();
  /// This connection was accepted over a connection limit: answer 503 and close it.
  static bool overLimit();
  /// Seconds left before this request's read deadline (a large number outside a connection).
  static double secondsLeft();

  std::size_t open() const;  ///< connections open now

  struct Conn;  ///< one accepted connection (defined in http_listener.cpp)

 private:
  void serve(std::shared_ptr<Conn> c);
  void watchdog();

  httplib::Server& svr_;
  ListenerOptions opt_;
  int listenFd_ = -1;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::uint64_t nextId_ = 0;
  std::map<std::uint64_t, std::shared_ptr<Conn>> conns_;
  std::map<std::string, std::size_t> perClient_;
  std::size_t refusing_ = 0;
  std::thread watchdog_;
};

}  // namespace dit::server
