// A ProcessGroup of one rank: every collective is a local copy, nothing is sent.
#include <ATen/ATen.h>

#include <sstream>
#include <stdexcept>

#include "parallel/process_group.h"

namespace dit {

namespace {

std::string shapeStr(at::IntArrayRef s) {
  std::ostringstream o;
  o << '[';
  for (size_t i = 0; i < s.size(); ++i) o << (i ? "," : "") << s[i];
  o << ']';
  return o.str();
}

class LocalProcessGroup final : public ProcessGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "local"; }

  std::shared_ptr<Work> allreduce(at::Tensor& t, ReduceOp) override {
    checkDefined(t, "allreduce");
    return Work::completed({t});
  }

  std::shared_ptr<Work> allgather(const at::Tensor& t, int64_t dim,
                                  const std::vector<int64_t>& sizes) override {
    checkDefined(t, "allgather");
    const int64_t d = normDim(t, dim, "allgather");
    if (!sizes.empty() && (sizes.size() != 1 || sizes[0] != t.size(d)))
      throw CollectiveMismatchError("allgather on the local group: sizes has " +
                                    std::to_string(sizes.size()) + " entries (first " +
                                    (sizes.empty() ? std::string("-") : std::to_string(sizes[0])) +
                                    ") but the group has 1 rank contributing " +
                                    std::to_string(t.size(d)) + " along dim " + std::to_string(d));
    return Work::completed({t.clone(at::MemoryFormat::Contiguous)});
  }

  std::shared_ptr<Work> reduceScatter(const at::Tensor& t, ReduceOp) override {
    checkDefined(t, "reduceScatter");
    if (t.dim() < 1)
      throw std::invalid_argument("reduceScatter needs a tensor with at least 1 dimension");
    return Work::completed({t.clone(at::MemoryFormat::Contiguous)});
  }

  std::shared_ptr<Work> allToAll(const std::vector<at::Tensor>& inputs,
                                 const std::vector<std::vector<int64_t>>& outputShapes) override {
    if (inputs.size() != 1 || outputShapes.size() != 1)
      throw std::invalid_argument(
          "allToAll on the local group needs exactly 1 input and 1 output shape, got " +
          std::to_string(inputs.size()) + " and " + std::to_string(outputShapes.size()));
    checkDefined(inputs[0], "allToAll");
    int64_t n = 1;
    for (int64_t s : outputShapes[0]) n *= s;
    if (n != inputs[0].numel())
      throw CollectiveMismatchError("allToAll on the local group: rank 0 sends " +
                                    std::to_string(inputs[0].numel()) + " elements " +
                                    shapeStr(inputs[0].sizes()) + " to itself but expects " +
                                    shapeStr(outputShapes[0]));
    return Work::completed({inputs[0].contiguous().view(outputShapes[0]).clone()});
  }

  std::shared_ptr<Work> broadcast(at::Tensor& t, int root) override {
    checkDefined(t, "broadcast");
    if (root != 0)
      throw std::invalid_argument("broadcast root " + std::to_string(root) +
                                  " outside the local group of 1 rank");
    return Work::completed({t});
  }

  std::shared_ptr<Work> sendRecv(const at::Tensor& send, int dst,
                                 const std::vector<int64_t>& recvShape, int src) override {
    checkDefined(send, "sendRecv");
    if (dst != 0 || src != 0)
      throw std::invalid_argument("sendRecv on the local group: dst " + std::to_string(dst) +
                                  " / src " + std::to_string(src) + " must be 0");
    int64_t n = 1;
    for (int64_t s : recvShape) n *= s;
    if (n != send.numel())
      throw CollectiveMismatchError("sendRecv on the local group: rank 0 sends " +
                                    shapeStr(send.sizes()) + " to itself but expects " +
                                    shapeStr(recvShape));
    return Work::completed({send.contiguous().view(recvShape).clone()});
  }

  std::shared_ptr<Work> send(const at::Tensor&, int dst, int) override {
    throw std::invalid_argument("send to rank " + std::to_string(dst) +
                                " on the local group of 1 rank (a rank cannot send to itself)");
  }
  std::shared_ptr<Work> recv(at::Tensor&, int src, int) override {
    throw std::invalid_argument(
        "recv from rank " + std::to_string(src) +
        " on the local group of 1 rank (a rank cannot receive from itself)");
  }

  std::shared_ptr<Work> barrier() override { return Work::completed(); }
  uint64_t bytesSent() const override { return 0; }

 private:
  static void checkDefined(const at::Tensor& t, const char* op) {
    if (!t.defined()) throw std::invalid_argument(std::string(op) + ": undefined tensor");
  }
  static int64_t normDim(const at::Tensor& t, int64_t dim, const char* op) {
    const int64_t nd = t.dim();
    const int64_t d = dim < 0 ? dim + nd : dim;
    if (d < 0 || d >= nd)
      throw std::invalid_argument(std::string(op) + ": dim " + std::to_string(dim) +
                                  " out of range for a " + std::to_string(nd) + "-d tensor");
    return d;
  }
};

}  // namespace

std::shared_ptr<ProcessGroup> makeLocalProcessGroup() {
  return std::make_shared<LocalProcessGroup>();
}

}  // namespace dit
