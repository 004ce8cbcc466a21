#include "parallel/work.h"

#include <stdexcept>
#include <utility>

#include "parallel/profile_scope.h"

namespace dit {

namespace {

// The Work of a call that needed no communication.
class CompletedWork final : public Work {
 public:
  explicit CompletedWork(std::vector<at::Tensor> outputs) { setOutputs(std::move(outputs)); }

 protected:
  bool test() override { return true; }
  void block() override {}
  void finish() override {}
};

}  // namespace

void Work::complete(std::exception_ptr e) {
  done_ = true;
  error_ = std::move(e);
}

bool Work::isCompleted() {
  if (done_) return true;
  bool finished = false;
  try {
    finished = test();
    if (finished) finish();
  } catch (...) {
    complete(std::current_exception());
    return true;
  }
  if (finished) complete(nullptr);
  return finished;
}

bool Work::isSuccess() { return isCompleted() && !error_; }

void Work::wait() {
  DIT_PROFILE_SCOPE("dit::collective::wait");
  if (!done_) {
    try {
      block();
      finish();
      complete(nullptr);
    } catch (...) {
      complete(std::current_exception());
    }
  }
  if (error_) std::rethrow_exception(error_);
}

void Work::waitQuietly() noexcept {
  try {
    wait();
  } catch (...) {
  }
}

const at::Tensor& Work::result() {
  wait();
  if (outputs_.size() != 1)
    throw std::logic_error("Work::result(): this collective has " +
                           std::to_string(outputs_.size()) + " outputs (use results())");
  return outputs_[0];
}

const std::vector<at::Tensor>& Work::results() {
  wait();
  return outputs_;
}

std::shared_ptr<Work> Work::completed(std::vector<at::Tensor> outputs) {
  return std::make_shared<CompletedWork>(std::move(outputs));
}

}  // namespace dit
