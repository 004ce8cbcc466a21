#include "app/demo/shapes_dataset.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace dit::demo {

namespace {

const char* const kShapeNames[kShapes] = {"circle", "square", "triangle", "star"};
const char* const kColourNames[kColours] = {"red",    "green",  "blue",  "yellow",
                                            "orange", "purple", "white", "black"};
const std::array<int, 3> kRgb[kColours] = {{220, 40, 40},   {40, 170, 60},  {40, 70, 220},
                                           {240, 220, 40},  {245, 140, 20}, {140, 50, 180},
                                           {245, 245, 245}, {20, 20, 20}};
const char* const kPositionNames[kPositions] = {"top left",    "top",    "top right",
                                                "left",        "centre", "right",
                                                "bottom left", "bottom", "bottom right"};
const char* const kCountWords[kMaxCount + 1] = {"", "a", "two", "three"};

// splitmix64: a fixed, portable stream (the data set must not depend on the standard library).
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  int below(int n) { return static_cast<int>(next() % static_cast<uint64_t>(n)); }
  float uniform(float a, float b) {
    return a + (b - a) * static_cast<float>((next() >> 40) * (1.0 / 16777216.0));
  }
};

int nearestColour(double r, double g, double b) {
  int best = 0;
  double bestD = 1e30;
  for (int c = 0; c < kColours; ++c) {
    const double d = (r - kRgb[c][0]) * (r - kRgb[c][0]) + (g - kRgb[c][1]) * (g - kRgb[c][1]) +
                     (b - kRgb[c][2]) * (b - kRgb[c][2]);
    if (d < bestD) bestD = d, best = c;
  }
  return best;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

}  // namespace

const char* shapeName(int s) { return kShapeNames[s]; }
const char* colourName(int c) { return kColourNames[c]; }
std::array<int, 3> colourRgb(int c) { return kRgb[c]; }
const char* positionName(int p) { return kPositionNames[p]; }
const char* sizeName(int s) { return s == 0 ? "small" : "large"; }

std::string caption(const ShapeScene& s) {
  std::string t = std::string(kCountWords[s.count]) + " " + sizeName(s.size) + " " +
                  colourName(s.colour) + " " + shapeName(s.shape);
  if (s.count > 1) t += "s";
  return t + " on a " + colourName(s.background) + " background, " + positionName(s.position);
}

bool heldOut(const ShapeScene& s) {
  return (s.shape * 3 + s.colour * 5 + s.background * 7 + s.position * 11) % 10 == 3;
}

ShapeScene trainingScene(uint64_t seed, uint64_t index, float jitter) {
  if (!(jitter >= 0))
    throw std::invalid_argument("trainingScene: jitter must be >= 0 px, got " +
                                std::to_string(jitter));
  Rng rng{seed * 0x100000001B3ull ^ (index + 1) * 0xD6E8FEB86659FD93ull};
  ShapeScene s;
  do {
    s.shape = rng.below(kShapes);
    s.colour = rng.below(kColours);
    s.background = rng.below(kColours);
    s.position = rng.below(kPositions);
  } while (s.background == s.colour || heldOut(s));
  s.size = rng.below(kSizes);
  s.count = 1 + rng.below(kMaxCount);
  s.jitter_x = rng.uniform(-jitter, jitter);
  s.jitter_y = rng.uniform(-jitter, jitter);
  return s;
}

std::vector<ShapeScene> heldOutScenes(int n) {
  std::vector<ShapeScene> all;
  for (int sh = 0; sh < kShapes; ++sh)
    for (int c = 0; c < kColours; ++c)
      for (int b = 0; b < kColours; ++b)
        for (int p = 0; p < kPositions; ++p) {
          ShapeScene s;
          s.shape = sh, s.colour = c, s.background = b, s.position = p;
          if (b != c && heldOut(s)) all.push_back(s);
        }
  std::vector<ShapeScene> out;
  for (int i = 0; i < n; ++i) {
    ShapeScene s = all[(static_cast<size_t>(i) * 37) % all.size()];
    s.size = i % kSizes;
    s.count = 1 + (i / kSizes) % kMaxCount;
    out.push_back(s);
  }
  return out;
}

ShapeLayout layout(const ShapeScene& s, int width, int height) {
  const float sx = width / 64.0f, sy = height / 64.0f, sc = std::min(sx, sy);
  ShapeLayout l;
  l.radius = (s.size == 0 ? 4.5f : 7.0f) * sc;
  const float d = 2.6f * l.radius;  // a gap of 0.6 r: antialiased edges never join objects
  const float cell[3] = {0.22f, 0.5f, 0.78f};
  float cx = cell[s.position % 3] * width + s.jitter_x * sx;
  float cy = cell[s.position / 3] * height + s.jitter_y * sy;
  const float ex = (s.count > 1 ? d / 2 : 0) + l.radius + 1;
  const float ey = (s.count == 3 ? 0.45f * d : 0) + l.radius + 1;
  cx = std::clamp(cx, ex, width - ex);
  cy = std::clamp(cy, ey, height - ey);
  if (s.count == 1) l.centres = {{cx, cy}};
  if (s.count == 2) l.centres = {{cx - d / 2, cy}, {cx + d / 2, cy}};
  if (s.count == 3)
    l.centres = {{cx - d / 2, cy + 0.45f * d}, {cx + d / 2, cy + 0.45f * d}, {cx, cy - 0.45f * d}};
  return l;
}

SceneReading analyse(const std::vector<uint8_t>& rgb, int W, int H) {
  if (W < 8 || H < 8 || rgb.size() != static_cast<size_t>(W) * H * 3)
    throw std::invalid_argument("analyse: expected " + std::to_string(W) + "x" + std::to_string(H) +
                                " RGB bytes, got " + std::to_string(rgb.size()));
  SceneReading r;
  auto px = [&](int x, int y, int c) { return static_cast<double>(rgb[(y * W + x) * 3 + c]); };
  std::vector<double> border[3];
  for (int x = 0; x < W; ++x)
    for (int y : {0, H - 1})
      for (int c = 0; c < 3; ++c) border[c].push_back(px(x, y, c));
  for (int y = 1; y < H - 1; ++y)
    for (int x : {0, W - 1})
      for (int c = 0; c < 3; ++c) border[c].push_back(px(x, y, c));
  const double br = median(border[0]), bg = median(border[1]), bb = median(border[2]);
  r.background = nearestColour(br, bg, bb);
  std::vector<uint8_t> mask(static_cast<size_t>(W) * H, 0);
  std::vector<double> fg[3];
  double sumX = 0, sumY = 0;
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x) {
      const double dr = px(x, y, 0) - br, dg = px(x, y, 1) - bg, db = px(x, y, 2) - bb;
      if (std::sqrt(dr * dr + dg * dg + db * db) > 70) {
        mask[y * W + x] = 1;
        for (int c = 0; c < 3; ++c) fg[c].push_back(px(x, y, c));
        sumX += x + 0.5, sumY += y + 0.5;
      }
    }
  const size_t n = fg[0].size();
  const double minArea = 4.0 * W * H / 4096.0;
  if (n < minArea) return r;
  r.colour = nearestColour(median(fg[0]), median(fg[1]), median(fg[2]));
  const double cx = sumX / n / W, cy = sumY / n / H;
  const int col = cx < 0.38 ? 0 : cx > 0.62 ? 2 : 1, row = cy < 0.38 ? 0 : cy > 0.62 ? 2 : 1;
  r.position = 3 * row + col;
  // 4-connected components.
  std::vector<int> label(mask.size(), 0), stack;
  int bestArea = 0, x0b = 0, x1b = 0, y0b = 0, y1b = 0;
  double bestSy = 0;
  for (int start = 0; start < W * H; ++start) {
    if (!mask[start] || label[start]) continue;
    label[start] = 1;
    stack.assign(1, start);
    int area = 0, x0 = W, x1 = -1, y0 = H, y1 = -1;
    double sy = 0;
    while (!stack.empty()) {
      const int i = stack.back();
      stack.pop_back();
      const int x = i % W, y = i / W;
      ++area, sy += y + 0.5;
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
      const int nb[4][2] = {{x - 1, y}, {x + 1, y}, {x, y - 1}, {x, y + 1}};
      for (const auto& q : nb) {
        if (q[0] < 0 || q[0] >= W || q[1] < 0 || q[1] >= H) continue;
        const int j = q[1] * W + q[0];
        if (mask[j] && !label[j]) label[j] = 1, stack.push_back(j);
      }
    }
    if (area >= minArea) ++r.count;
    if (area > bestArea) bestArea = area, x0b = x0, x1b = x1, y0b = y0, y1b = y1, bestSy = sy;
  }
  const double bw = x1b - x0b + 1, bh = y1b - y0b + 1;
  const double fill = bestArea / (bw * bh);
  const double oy = (bestSy / bestArea - (y0b + bh / 2)) / bh;
  // A triangle's centroid lies a sixth of its height below its bounding box's centre (apex
  // up); a star's, a circle's and a square's within a few hundredths. The rest by the fill ratio
  // of the box: square 1, circle pi/4, star about 0.4.
  if (oy > 0.11)
    r.shape = 2;  // triangle
  else if (fill > 0.88)
    r.shape = 1;  // square
  else if (fill > 0.62)
    r.shape = 0;  // circle
  else
    r.shape = 3;  // star
  return r;
}

}  // namespace dit::demo
