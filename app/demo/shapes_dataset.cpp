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

namespace {

// Shape of one object from its coverage c (0 = background colour, 1 = the objects' colour) over
// its pixels and those next to them: area A = sum of c; width and height = the sums of the column
// and row maxima of c (sub-pixel extents, which hold under antialiasing and blur); fill = A /
// (width x height); oy = how far the area's centroid lies below the centre of the row profile, in
// heights. Triangle (apex up): oy = 1/6; star, circle, square: oy under 0.05 (the star is drawn
// 0.1 r low), fill about 0.35 (0.45-0.55 as drawn at these sizes), pi/4 and 1.
int classifyShape(double fill, double oy) {
  if (oy > 0.09) return 2;    // triangle
  if (fill > 0.89) return 1;  // square
  if (fill > 0.60) return 0;  // circle
  return 3;                   // star
}

}  // namespace

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
  const double B[3] = {median(border[0]), median(border[1]), median(border[2])};
  r.background = nearestColour(B[0], B[1], B[2]);
  // Candidates: pixels farther than 70 from the background colour.
  auto dist = [&](int i) {
    double d2 = 0;
    for (int c = 0; c < 3; ++c) d2 += (rgb[i * 3 + c] - B[c]) * (rgb[i * 3 + c] - B[c]);
    return std::sqrt(d2);
  };
  std::vector<int> cand;
  std::vector<double> candD;
  for (int i = 0; i < W * H; ++i)
    if (const double d = dist(i); d > 70) cand.push_back(i), candD.push_back(d);
  const double minArea = 4.0 * W * H / 4096.0;
  if (cand.size() < minArea) return r;
  // The objects' colour: the median of the candidates' farther half (their interiors; the
  // nearer half is mostly edge pixels blended with the background).
  const double dMid = median(candD);
  std::vector<double> fg[3];
  for (size_t k = 0; k < cand.size(); ++k)
    if (candD[k] >= dMid)
      for (int c = 0; c < 3; ++c) fg[c].push_back(rgb[cand[k] * 3 + c]);
  const double F[3] = {median(fg[0]), median(fg[1]), median(fg[2])};
  r.colour = nearestColour(F[0], F[1], F[2]);
  // The objects: pixels past the 50% contour between the background and the objects' colour
  // (projection on the line from B to F), where an edge blended by antialiasing or a soft decoder
  // lies, whatever the two colours' contrast.
  // Coverage: that projection, 0 at B and 1 at F, clamped (also the shape features' input).
  const double e[3] = {F[0] - B[0], F[1] - B[1], F[2] - B[2]};
  const double ee = e[0] * e[0] + e[1] * e[1] + e[2] * e[2];
  std::vector<double> cov(static_cast<size_t>(W) * H, 0.0);
  std::vector<uint8_t> mask(static_cast<size_t>(W) * H, 0);
  double sumX = 0, sumY = 0;
  size_t n = 0;
  for (int i = 0; ee > 0 && i < W * H; ++i) {
    double t = 0;
    for (int c = 0; c < 3; ++c) t += (rgb[i * 3 + c] - B[c]) * e[c];
    cov[i] = std::clamp(t / ee, 0.0, 1.0);
    if (cov[i] > 0.5) mask[i] = 1, sumX += i % W + 0.5, sumY += i / W + 0.5, ++n;
  }
  if (n < minArea) return r;
  const double cx = sumX / n / W, cy = sumY / n / H;
  const int col = cx < 0.38 ? 0 : cx > 0.62 ? 2 : 1, row = cy < 0.38 ? 0 : cy > 0.62 ? 2 : 1;
  r.position = 3 * row + col;
  // 4-connected components; each one of at least minArea pixels is an object and votes for a
  // shape; among equally voted shapes the largest object's wins, else the first in shape order.
  std::vector<int> label(mask.size(), 0), stack, pixels;
  std::vector<double> colMax(W), rowMax(H);
  int votes[kShapes] = {0, 0, 0, 0}, next = 0, largestShape = -1;
  double bestArea = 0;
  for (int start = 0; start < W * H; ++start) {
    if (!mask[start] || label[start]) continue;
    const int id = ++next;
    label[start] = id;
    stack.assign(1, start);
    pixels.clear();
    while (!stack.empty()) {
      const int i = stack.back();
      stack.pop_back();
      pixels.push_back(i);
      const int x = i % W, y = i / W;
      const int nb[4][2] = {{x - 1, y}, {x + 1, y}, {x, y - 1}, {x, y + 1}};
      for (const auto& q : nb) {
        if (q[0] < 0 || q[0] >= W || q[1] < 0 || q[1] >= H) continue;
        const int j = q[1] * W + q[0];
        if (mask[j] && !label[j]) label[j] = id, stack.push_back(j);
      }
    }
    if (static_cast<double>(pixels.size()) < minArea) continue;
    ++r.count;
    // The object's pixels and the unclaimed pixels within one of them (its blended edge).
    std::vector<int> region = pixels;
    for (const int i : pixels)
      for (int dy = -1; dy <= 1; ++dy)
        for (int dx = -1; dx <= 1; ++dx) {
          const int x = i % W + dx, y = i / W + dy;
          if (x < 0 || x >= W || y < 0 || y >= H) continue;
          const int j = y * W + x;
          if (!label[j] && !mask[j]) label[j] = -id, region.push_back(j);
        }
    std::fill(colMax.begin(), colMax.end(), 0.0);
    std::fill(rowMax.begin(), rowMax.end(), 0.0);
    double A = 0, sy = 0;
    for (const int i : region) {
      const int x = i % W, y = i / W;
      A += cov[i], sy += cov[i] * (y + 0.5);
      colMax[x] = std::max(colMax[x], cov[i]), rowMax[y] = std::max(rowMax[y], cov[i]);
      if (label[i] < 0) label[i] = 0;  // an edge pixel may border the next object too
    }
    double w = 0, h = 0, my = 0;
    for (int x = 0; x < W; ++x) w += colMax[x];
    for (int y = 0; y < H; ++y) h += rowMax[y], my += rowMax[y] * (y + 0.5);
    const double fill = A / (w * h), oy = (sy / A - my / h) / h;
    const int shape = classifyShape(fill, oy);
    ++votes[shape];
    if (A > bestArea) bestArea = A, largestShape = shape;
  }
  if (r.count == 0) return r;
  r.shape = largestShape;
  for (int k = 0; k < kShapes; ++k)
    if (votes[k] > votes[r.shape]) r.shape = k;
  return r;
}

}  // namespace dit::demo
