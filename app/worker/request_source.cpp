#include "app/worker/request_source.h"

#include <unistd.h>

#include <cerrno>
#include <thread>
#include <variant>

#include "app/protocol/events.h"
#include "parallel/runtime.h"

namespace dit {

namespace {
void emitError(std::optional<std::string> id, const std::string& message) {
  emitEvent(protocol::toJson(protocol::ErrorEvent{std::move(id), 0, message, false}));
}
// A request line refused at the door: no `accepted` follows, so the launcher fails the request
// (by id when the line names one, else the oldest it sent that was not accepted).
void emitRefusal(std::optional<std::string> id, const std::string& message) {
  protocol::ErrorEvent e{std::move(id), 0, message, false};
  e.refused = true;
  emitEvent(protocol::toJson(e));
}
}  // namespace

StdinRequestSource::StdinRequestSource() : in_(&buf_) {}

StdinRequestSource::FdBuf::int_type StdinRequestSource::FdBuf::underflow() {
  if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
  ssize_t n;
  do {
    n = ::read(fd_, buf_, sizeof buf_);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) return traits_type::eof();
  setg(buf_, buf_, buf_ + n);
  return traits_type::to_int_type(*gptr());
}

protocol::LineRead StdinRequestSource::readLine(std::string& line) {
  return protocol::readRequestLine(in_, line);
}

void RequestQueue::start(std::unique_ptr<RequestSource> source) {
  source_ = std::move(source);
  RequestSource* src = source_.get();
  std::thread([this, src] {
    try {
      readLoop(*src);
    } catch (...) {
      // Never let the reader take rank 0 down; end the session cleanly instead.
    }
    std::lock_guard<std::mutex> lk(m_);
    q_.push_back(protocol::ShutdownRequest{src->endReason()});
    cv_.notify_one();
  }).detach();
}

void RequestQueue::readLoop(RequestSource& source) {
  std::string line;
  for (;;) {
    const protocol::LineRead got = source.readLine(line);
    if (got == protocol::LineRead::End) break;
    if (got == protocol::LineRead::TooLong) {
      std::string msg = "request line longer than ";
      msg += std::to_string(protocol::kMaxRequestLineBytes);
      msg += " bytes refused unread";
      emitRefusal(protocol::generateIdInPrefix(line), msg);
      continue;
    }
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    // A bad line gets an error event naming the field; the worker keeps serving (nothing here
    // may throw).
    protocol::Request req;
    try {
      req = protocol::parseRequestLine(line);
    } catch (const protocol::ProtocolError& e) {
      // A line refused before its fields were read (not JSON, not UTF-8, too deep) still names
      // its request when the id can be read from the text.
      emitRefusal(e.requestId() ? e.requestId() : protocol::generateIdInPrefix(line), e.what());
      continue;
    }
    std::lock_guard<std::mutex> lk(m_);
    if (const auto* c = std::get_if<protocol::CancelRequest>(&req)) {
      cancel(c->id);
      continue;
    }
    // Live ids are unique: a generate whose id is queued or running is refused (cancel and
    // the events name one request).
    if (const auto* g = std::get_if<protocol::GenerateRequest>(&req); g && isLive(g->id)) {
      // No id in the event: it would name the live request, which goes on.
      emitRefusal(std::nullopt, "request id '" + g->id + "' is already " +
                                    (g->id == running_ ? "running" : "queued") +
                                    "; ids of queued and running requests must be unique");
      continue;
    }
    q_.push_back(req);
    if (const auto* g = std::get_if<protocol::GenerateRequest>(&req))
      emitEvent(protocol::toJson(
          protocol::AcceptedEvent{g->id, static_cast<std::int64_t>(q_.size()) - 1}));
    cv_.notify_one();
  }
}

nlohmann::json RequestQueue::next(std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lk(m_);
  if (!cv_.wait_for(lk, wait, [this] { return !q_.empty(); }))
    return nlohmann::json{{"type", "noop"}};
  protocol::Request r = q_.front();
  q_.pop_front();
  if (const auto* g = std::get_if<protocol::GenerateRequest>(&r)) running_ = g->id;
  return protocol::toJson(r);
}

void RequestQueue::finished(const std::string& id) {
  std::lock_guard<std::mutex> lk(m_);
  cancelled_.erase(id);
  if (running_ == id) running_.clear();
}

bool RequestQueue::isCancelled(const std::string& id) {
  std::lock_guard<std::mutex> lk(m_);
  return cancelled_.count(id) != 0;
}

bool RequestQueue::isLive(const std::string& id) const {
  if (id == running_) return true;
  for (const auto& r : q_)
    if (const auto* g = std::get_if<protocol::GenerateRequest>(&r); g && g->id == id) return true;
  return false;
}

void RequestQueue::cancel(const std::string& id) {
  for (auto it = q_.begin(); it != q_.end(); ++it)
    if (const auto* g = std::get_if<protocol::GenerateRequest>(&*it); g && g->id == id) {
      q_.erase(it);
      emitEvent(protocol::toJson(protocol::CancelledEvent{id, 0}));
      return;
    }
  if (id == running_) {
    cancelled_.insert(id);  // acknowledged by the "cancelled" event at the next step
    return;
  }
  emitError(id, "cancel: no queued or running request with id '" + id + "'");
}

}  // namespace dit
