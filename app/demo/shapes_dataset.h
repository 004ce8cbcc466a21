// The synthetic captioned data set the embedded default model is trained on (ditstudio-train)
// and judged by (ditstudio-cli eval-demo): flat-coloured shapes on a flat background, described
// by captions such as "two small red circles on a blue background, top left".
//
// Attributes: shape (4), foreground colour (8), background colour (8, never the foreground's),
// position (9: the corners, the edge midpoints and the centre), size (2), count (1-3). A fixed
// set of (shape, colour, background, position) combinations, about one in ten, is held out:
// training never draws it; eval-demo generates only from it. Every value of every attribute
// still occurs in training (in other combinations), so the held-out set measures composition.
//
// This header and shapes_dataset.cpp are plain C++ (no Qt, no Torch): captions, the held-out
// split and the image analyser. Drawing is in shapes_draw.h (Qt Gui's QPainter).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace dit::demo {

inline constexpr int kShapes = 4, kColours = 8, kPositions = 9, kSizes = 2, kMaxCount = 3;
/// How far (+- px at 64x64) a training scene moves from its cell's centre unless told otherwise:
/// what the VAE phases of ditstudio-train always use.
inline constexpr float kDefaultPositionJitter = 3.0f;

/// "circle", "square", "triangle", "star".
const char* shapeName(int shape);
/// "red", "green", "blue", "yellow", "orange", "purple", "white", "black".
const char* colourName(int colour);
/// The colour's sRGB value (0-255 per channel).
std::array<int, 3> colourRgb(int colour);
/// "top left", "top", "top right", "left", "centre", "right", "bottom left", "bottom",
/// "bottom right" (index = 3 * row + column).
const char* positionName(int position);
/// "small", "large".
const char* sizeName(int size);

/// One image's attributes.
struct ShapeScene {
  int shape = 0, colour = 0, background = 1, position = 4, size = 0, count = 1;
  /// Per-image jitter of the group's centre in pixels at 64x64 (scaled with the image size).
  float jitter_x = 0, jitter_y = 0;
};

/// "two small red circles on a blue background, top left" ("a large ..." for one object).
std::string caption(const ShapeScene& s);

/// Whether (shape, colour, background, position) belongs to the held-out set (a fixed rule on
/// the attribute indices, about 1 in 10 combinations).
bool heldOut(const ShapeScene& s);

/// A training scene drawn from a generator seeded with (seed, index): uniform over the
/// attributes, rejecting held-out combinations and background == colour, the group's centre
/// jittered uniformly within +-`jitter` px (at 64x64; 0: every scene at its cell's centre, as
/// heldOutScenes draws them). The same draws are made for every `jitter`, so the attributes of
/// scene `index` do not depend on it. Deterministic (own integer arithmetic, no std::
/// distributions). Throws std::invalid_argument when `jitter` is negative.
ShapeScene trainingScene(uint64_t seed, uint64_t index, float jitter = kDefaultPositionJitter);

/// The fixed evaluation list: `n` held-out scenes (no jitter), spread over the attributes
/// deterministically (same list on every machine).
std::vector<ShapeScene> heldOutScenes(int n);

/// Centres (x, y) and radius, in pixels, of the scene's objects in a width x height image.
struct ShapeLayout {
  std::vector<std::pair<float, float>> centres;
  float radius = 0;
};
ShapeLayout layout(const ShapeScene& s, int width, int height);

/// What the analyser reads back from an image (-1 = could not tell).
struct SceneReading {
  int shape = -1, colour = -1, background = -1, position = -1, count = 0;
};

/// Analyses an RGB image (rgb: height * width * 3 bytes, row-major):
///  - background = nearest palette colour to the median of the border pixels (B);
///  - candidates = pixels farther than 70 (RGB distance) from B; the objects' colour F = the
///    median of the candidates' farther half (their interiors); colour = nearest palette colour;
///  - objects = pixels past the 50% contour between B and F (projection on the line B -> F), where
///    an antialiased or softly decoded edge lies whatever the contrast of the two colours;
///  - position = the objects' centroid's cell in a 3x3 grid with boundaries at 38% and 62%;
///  - count = 4-connected objects of at least 4 pixels (per 64x64);
///  - shape = the majority vote of the objects, each classified by
///    sub-pixel coverage features (coverage = the projection clamped to [0, 1], over the object and
///    the pixels next to it): fill = area / (width x height), width and height being the sums of
///    the column and row maxima, and how far the area's centroid lies below the centre of the
///    row profile (a triangle, apex up: 1/6 of its height; the others under 0.05); then square
///    (fill about 1), circle (pi/4) or star (0.35 for the ideal polygon; 0.45-0.55 as drawn at
///    these sizes). With more than one most-voted shape the largest object's wins if it is among
///    them, else the first in shape order.
/// Reads every held-out clean drawing right, and most of them blurred by a Gaussian of 1 px
/// (DemoData tests). Throws std::invalid_argument when the buffer size does not match.
SceneReading analyse(const std::vector<uint8_t>& rgb, int width, int height);

}  // namespace dit::demo
