// Rank 0's requests: where they come from (RequestSource: stdin today, a server's own source
// later) and the queue the worker serves them from (RequestQueue: ids unique while live, cancel of
// a queued or the running request, `accepted` / `cancelled` / `error` events). Torch-free; the
// events go out through parallel/runtime's emitEvent.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <istream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <streambuf>
#include <string>

#include "app/protocol/protocol.h"

namespace dit {

/// One protocol request line at a time (app/PROTOCOL.md "Requests").
class RequestSource {
 public:
  virtual ~RequestSource() = default;
  /// Blocks for the next line (without its "\n"); at most kMaxRequestLineBytes are kept (TooLong:
  /// the rest was read and dropped). End: no more requests will come.
  virtual protocol::LineRead readLine(std::string& line) = 0;
  /// Why the source ended (the reason of the shutdown it queues), e.g. "stdin closed".
  virtual std::string endReason() const = 0;
};

/// The worker's stdin, as mpirun forwards it to rank 0, read with read(2) on descriptor 0 and
/// never through std::cin: std::cin (synchronised with C stdio) blocks in getc(stdin) holding
/// stdin's FILE lock, and exit() takes every stream's lock since glibc 2.38 (BZ #15142; Debian 13
/// has 2.41, Debian 12 2.36). After `shutdown` from a launcher that keeps stdin open (allowed:
/// mpirun closes the rank's stdin only at its own end of input), rank 0 then hung in exit() after
/// `bye`, and with it mpirun. Blocked in read(2), the reader thread holds no lock and ends with
/// the process. A read error other than EINTR counts as the end of input.
class StdinRequestSource : public RequestSource {
 public:
  StdinRequestSource();
  protocol::LineRead readLine(std::string& line) override;
  std::string endReason() const override { return "stdin closed"; }

 private:
  /// Unbuffered by stdio: fills its own buffer from descriptor `fd` with read(2).
  class FdBuf : public std::streambuf {
   public:
    explicit FdBuf(int fd) : fd_(fd) {}

   protected:
    int_type underflow() override;

   private:
    int fd_;
    char buf_[65536];
  };
  FdBuf buf_{0};
  std::istream in_;
};

/// Rank 0's request queue, filled by a reader thread from a RequestSource.
class RequestQueue {
 public:
  /// Starts the reader thread on `source`. The thread may still be blocked reading when the
  /// worker ends, so the queue and the source live for the whole process (never destroyed).
  void start(std::unique_ptr<RequestSource> source);
  /// Next request as its JSON object, or a heartbeat {"type":"noop"} after `wait`. A generate
  /// request becomes the running one (cancel then applies to it).
  nlohmann::json next(std::chrono::milliseconds wait);
  /// The running request ended: later requests may reuse its id.
  void finished(const std::string& id);
  bool isCancelled(const std::string& id);

 private:
  void readLoop(RequestSource& source);
  // With m_ held.
  bool isLive(const std::string& id) const;
  void cancel(const std::string& id);

  std::mutex m_;
  std::condition_variable cv_;
  std::deque<protocol::Request> q_;
  std::set<std::string> cancelled_;
  std::string running_;
  std::unique_ptr<RequestSource> source_;
};

}  // namespace dit
