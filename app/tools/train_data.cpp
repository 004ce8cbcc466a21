// ditstudio-train's data: see train_data.h.
#include "app/tools/train_data.h"

#include <fstream>

#include "app/demo/shapes_draw.h"

namespace dit::train {

namespace fs = std::filesystem;
using nlohmann::json;

json readJson(const fs::path& p) {
  std::ifstream in(p);
  if (!in) throw std::runtime_error("cannot read " + p.string());
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw std::runtime_error(p.string() + ": not valid JSON (" + e.what() + ")");
  }
}
void writeJson(const fs::path& p, const json& j) {
  std::ofstream o(p);
  o << j.dump(2) << "\n";
  if (!o) throw std::runtime_error("cannot write " + p.string());
}

at::Tensor edgeWeights(const at::Tensor& x, double edgeWeight) {
  at::NoGradGuard ng;
  const at::Tensor hi = at::max_pool2d(x, {3, 3}, {1, 1}, {1, 1});
  const at::Tensor lo = -at::max_pool2d(-x, {3, 3}, {1, 1}, {1, 1});
  const at::Tensor edge = ((hi - lo).abs().sum(1, true) > 0.1).to(at::kFloat);
  const at::Tensor w = 1.0 + (edgeWeight - 1.0) * edge;
  return w / w.mean({1, 2, 3}, true);  // per image: the same loss whichever ranks split the batch
}

at::Tensor drawBatch(const std::vector<demo::ShapeScene>& scenes, int size) {
  std::vector<at::Tensor> xs;
  for (const auto& s : scenes) {
    auto rgb = demo::drawScene(s, size, size);
    at::Tensor t = at::from_blob(rgb.data(), {size, size, 3}, at::kByte).clone();
    xs.push_back(t.permute({2, 0, 1}).to(at::kFloat) / 127.5 - 1.0);
  }
  return at::stack(xs);
}

at::Tensor packLatents(const at::Tensor& z) {
  const int64_t B = z.size(0), C = z.size(1), h = z.size(2), w = z.size(3);
  return z.view({B, C, h / 2, 2, w / 2, 2})
      .permute({0, 2, 4, 1, 3, 5})
      .reshape({B, (h / 2) * (w / 2), C * 4});
}

}  // namespace dit::train
