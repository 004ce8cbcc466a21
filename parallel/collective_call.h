// CollectiveCall: what one rank is about to do in a collective (op, dtype, shapes, root/dim/peers,
// per-rank sizes), built in one place from the arguments of a ProcessGroup call. Used by
// ProcessGroupChecked for its agreement exchange and by every backend for its messages
// ("allreduce(sum, float32 [4,4], 64 B)"). Local, no communication.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/process_group.h"

namespace dit {

/// Kinds of call.
enum class CallOp : int64_t {
  AllReduce = 1,
  AllGather = 2,
  ReduceScatter = 3,
  AllToAll = 4,
  Broadcast = 5,
  SendRecv = 6,
  Barrier = 7,
  Send = 8,
  Recv = 9,
};

/// What one rank is about to do. Shapes of up to 8 dimensions are shown in messages; longer
/// shapes are still compared exactly (by hash) by ProcessGroupChecked.
struct CallInfo {
  CallOp op = CallOp::Barrier;
  int64_t dtype = -1;          ///< at::ScalarType as an integer, -1: none
  std::vector<int64_t> shape;  ///< the tensor this rank contributes / sends
  int64_t a = 0;  ///< allreduce/reduceScatter: ReduceOp; allgather: dim; broadcast: root;
                  ///< sendRecv/send: dst; recv: src
  int64_t b = 0;  ///< allgather: number of per-rank sizes given; allToAll: inputs.size();
                  ///< sendRecv: src; send/recv: tag
  int64_t c = 0;  ///< allToAll: outputShapes.size()
  std::vector<int64_t> shape2;  ///< sendRecv: recvShape
  std::vector<int64_t>
      perRank;  ///< allgather: sizes (size() entries); allToAll: numel sent to each
                ///< rank, then numel expected from each rank (2 x groupSize entries)
};

/// Human-readable form of one call, e.g. "allreduce(sum, float32 [4,4], 64 B)".
std::string describeCall(const CallInfo& c);
/// "allreduce", "allgather", ... for `op`.
const char* callOpName(CallOp op);
/// "float32", "bfloat16", ... for an at::ScalarType given as an integer ("none" for -1).
std::string dtypeName(int64_t dtype);
/// "sum", "max", "min" for a ReduceOp given as an integer.
const char* reduceOpName(int64_t op);
/// "[2,3]"; with ndim > shape.size() (a shape cut at 8 dims) "[2,3,...]".
std::string shapeString(const std::vector<int64_t>& shape, int64_t ndim = -1);
/// "<numel x element size> B".
std::string bytesString(int64_t numel, int64_t dtype);
/// "0,2,3": ranks for messages.
std::string rankList(const std::vector<int>& ranks);
/// A duration in seconds as the shortest text ("300", "0.5") for messages.
std::string secondsStr(double seconds);
/// Product of the sizes (1 for a scalar shape).
int64_t numelOf(const std::vector<int64_t>& shape);

/// The CallInfo of each ProcessGroup call, from its arguments (tensors must be defined).
/// `dim` of allgather must already be normalised (0 <= dim < t.dim()).
CallInfo allreduceCall(const at::Tensor& t, ReduceOp op);
CallInfo allgatherCall(const at::Tensor& t, int64_t dim, const std::vector<int64_t>& sizes);
CallInfo reduceScatterCall(const at::Tensor& t, ReduceOp op);
/// perRank holds 2 x groupSize entries: numel sent to each rank, then numel expected from each
/// (-1 where inputs/outputShapes have fewer entries than the group has ranks).
CallInfo allToAllCall(const std::vector<at::Tensor>& inputs,
                      const std::vector<std::vector<int64_t>>& outputShapes, int groupSize);
CallInfo broadcastCall(const at::Tensor& t, int root);
CallInfo sendRecvCall(const at::Tensor& send, int dst, const std::vector<int64_t>& recvShape,
                      int src);
CallInfo sendCall(const at::Tensor& t, int dst, int tag);
CallInfo recvCall(const at::Tensor& t, int src, int tag);
CallInfo barrierCall();

}  // namespace dit
