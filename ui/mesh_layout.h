// Layout of the device mesh for the strategy editor's picture: one box per rank; one row per
// (dp, cfg, ring) group, its ulysses x tp ranks left to right in mesh order (tp innermost), so a
// Ulysses/tp group reads as a row and the ring runs down the rows of a replica. Coordinates come
// from dit::meshCoords, the worker's own mapping.
#pragma once

#include <QList>
#include <QString>
#include <QStringList>
#include <array>

#include "parallel/strategy.h"

namespace dit::ui {

/// One rank's box.
struct MeshCell {
  int rank = 0;
  std::array<int, 5> coords{};  ///< {dp, cfg, ring, ulysses, tp}
  int row = 0;                  ///< (dp_i * cfg + cfg_i) * ring + ring_i
  int col = 0;                  ///< ulysses_i * tp + tp_i
  QString label;                ///< "rank 3" + the coordinates of the dimensions > 1
};

/// The whole grid. `valid` is false (and cells empty) when the degrees' product is not world.
struct MeshLayout {
  bool valid = false;
  int rows = 0;
  int cols = 0;
  QList<MeshCell> cells;  ///< in rank order
  QStringList rowLabels;  ///< "dp 0 / cfg 1 / ring 0" per row (dimensions > 1 only)
  QString dims;           ///< "dp 1 x cfg 2 x ring 1 x ulysses 2 x tp 1"
};

/// Computes the layout (up to 1024 ranks).
MeshLayout computeMeshLayout(const dit::Strategy& s);

}  // namespace dit::ui
