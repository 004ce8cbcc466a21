#include "parallel/collective_call.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <sstream>

namespace dit {

namespace {

int64_t elemSize(int64_t dtype) {
  if (dtype < 0) return 0;
  return static_cast<int64_t>(c10::elementSize(static_cast<at::ScalarType>(dtype)));
}

std::vector<int64_t> toVec(at::IntArrayRef s) { return std::vector<int64_t>(s.begin(), s.end()); }

CallInfo tensorCall(CallOp op, const at::Tensor& t) {
  CallInfo c;
  c.op = op;
  c.dtype = static_cast<int64_t>(t.scalar_type());
  c.shape = toVec(t.sizes());
  return c;
}

}  // namespace

int64_t numelOf(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t v : s) n *= v;
  return n;
}

std::string shapeString(const std::vector<int64_t>& s, int64_t ndim) {
  std::ostringstream o;
  o << '[';
  for (size_t i = 0; i < s.size(); ++i) o << (i ? "," : "") << s[i];
  if (ndim > static_cast<int64_t>(s.size())) o << ",...";
  o << ']';
  return o.str();
}

std::string dtypeName(int64_t d) {
  if (d < 0) return "none";
  switch (static_cast<at::ScalarType>(d)) {
    case at::kFloat:
      return "float32";
    case at::kHalf:
      return "float16";
    case at::kBFloat16:
      return "bfloat16";
    case at::kDouble:
      return "float64";
    case at::kLong:
      return "int64";
    case at::kInt:
      return "int32";
    case at::kShort:
      return "int16";
    case at::kChar:
      return "int8";
    case at::kByte:
      return "uint8";
    case at::kBool:
      return "bool";
    default:
      return at::toString(static_cast<at::ScalarType>(d));
  }
}

std::string rankList(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s;
}

std::string secondsStr(double s) {
  std::ostringstream o;
  o << s;
  return o.str();
}

std::string bytesString(int64_t numel, int64_t dtype) {
  return std::to_string(numel * elemSize(dtype)) + " B";
}

const char* reduceOpName(int64_t op) {
  switch (static_cast<ReduceOp>(op)) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
  }
  return "?";
}

const char* callOpName(CallOp op) {
  switch (op) {
    case CallOp::AllReduce:
      return "allreduce";
    case CallOp::AllGather:
      return "allgather";
    case CallOp::ReduceScatter:
      return "reduceScatter";
    case CallOp::AllToAll:
      return "allToAll";
    case CallOp::Broadcast:
      return "broadcast";
    case CallOp::SendRecv:
      return "sendRecv";
    case CallOp::Barrier:
      return "barrier";
    case CallOp::Send:
      return "send";
    case CallOp::Recv:
      return "recv";
  }
  return "unknown-op";
}

std::string describeCall(const CallInfo& c) {
  std::ostringstream o;
  const int64_t n = numelOf(c.shape);
  const std::string ts = dtypeName(c.dtype) + " " + shapeString(c.shape);
  o << callOpName(c.op) << '(';
  switch (c.op) {
    case CallOp::AllReduce:
    case CallOp::ReduceScatter:
      o << reduceOpName(c.a) << ", " << ts << ", " << bytesString(n, c.dtype);
      break;
    case CallOp::AllGather: {
      o << ts << ", " << bytesString(n, c.dtype) << ", dim " << c.a;
      if (c.b > 0) {
        std::vector<int64_t> s(
            c.perRank.begin(),
            c.perRank.begin() + std::min<int64_t>(c.b, static_cast<int64_t>(c.perRank.size())));
        o << ", sizes " << shapeString(s);
      }
      break;
    }
    case CallOp::AllToAll: {
      const int64_t half = static_cast<int64_t>(c.perRank.size() / 2);
      std::vector<int64_t> snd(c.perRank.begin(), c.perRank.begin() + std::min<int64_t>(c.b, half));
      std::vector<int64_t> rcv(c.perRank.begin() + half,
                               c.perRank.begin() + half + std::min<int64_t>(c.c, half));
      o << dtypeName(c.dtype) << ", sends " << shapeString(snd) << " elements, expects "
        << shapeString(rcv) << " elements";
      break;
    }
    case CallOp::Broadcast:
      o << ts << ", " << bytesString(n, c.dtype) << ", root " << c.a;
      break;
    case CallOp::SendRecv:
      o << ts << " to rank " << c.a << ", " << shapeString(c.shape2) << " from rank " << c.b;
      break;
    case CallOp::Barrier:
      break;
    case CallOp::Send:
      o << ts << ", " << bytesString(n, c.dtype) << " to rank " << c.a << ", tag " << c.b;
      break;
    case CallOp::Recv:
      o << ts << ", " << bytesString(n, c.dtype) << " from rank " << c.a << ", tag " << c.b;
      break;
  }
  o << ')';
  return o.str();
}

CallInfo allreduceCall(const at::Tensor& t, ReduceOp op) {
  CallInfo c = tensorCall(CallOp::AllReduce, t);
  c.a = static_cast<int64_t>(op);
  return c;
}

CallInfo allgatherCall(const at::Tensor& t, int64_t dim, const std::vector<int64_t>& sizes) {
  CallInfo c = tensorCall(CallOp::AllGather, t);
  c.a = dim;
  c.b = static_cast<int64_t>(sizes.size());
  c.perRank = sizes;
  return c;
}

CallInfo reduceScatterCall(const at::Tensor& t, ReduceOp op) {
  CallInfo c = tensorCall(CallOp::ReduceScatter, t);
  c.a = static_cast<int64_t>(op);
  return c;
}

CallInfo allToAllCall(const std::vector<at::Tensor>& inputs,
                      const std::vector<std::vector<int64_t>>& outputShapes, int groupSize) {
  CallInfo c;
  c.op = CallOp::AllToAll;
  c.dtype = inputs.empty() ? -1 : static_cast<int64_t>(inputs[0].scalar_type());
  c.b = static_cast<int64_t>(inputs.size());
  c.c = static_cast<int64_t>(outputShapes.size());
  const size_t n = static_cast<size_t>(groupSize);
  c.perRank.assign(2 * n, -1);
  for (size_t j = 0; j < inputs.size() && j < n; ++j) c.perRank[j] = inputs[j].numel();
  for (size_t j = 0; j < outputShapes.size() && j < n; ++j)
    c.perRank[n + j] = numelOf(outputShapes[j]);
  return c;
}

CallInfo broadcastCall(const at::Tensor& t, int root) {
  CallInfo c = tensorCall(CallOp::Broadcast, t);
  c.a = root;
  return c;
}

CallInfo sendRecvCall(const at::Tensor& send, int dst, const std::vector<int64_t>& recvShape,
                      int src) {
  CallInfo c = tensorCall(CallOp::SendRecv, send);
  c.a = dst;
  c.b = src;
  c.shape2 = recvShape;
  return c;
}

CallInfo sendCall(const at::Tensor& t, int dst, int tag) {
  CallInfo c = tensorCall(CallOp::Send, t);
  c.a = dst;
  c.b = tag;
  return c;
}

CallInfo recvCall(const at::Tensor& t, int src, int tag) {
  CallInfo c = tensorCall(CallOp::Recv, t);
  c.a = src;
  c.b = tag;
  return c;
}

CallInfo barrierCall() { return CallInfo{}; }

}  // namespace dit
