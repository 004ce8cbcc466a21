// Draws a ShapeScene (shapes_dataset.h) with Qt Gui's QPainter on a QImage (no display needed).
#pragma once

#include <cstdint>
#include <vector>

#include "app/demo/shapes_dataset.h"

namespace dit::demo {

/// The scene as RGB bytes (height * width * 3, row-major), antialiased.
std::vector<uint8_t> drawScene(const ShapeScene& s, int width, int height);

}  // namespace dit::demo
