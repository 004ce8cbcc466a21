#include "ui/mesh_layout.h"

namespace dit::ui {

MeshLayout computeMeshLayout(const dit::Strategy& s) {
  MeshLayout L;
  L.dims = QStringLiteral("dp %1 x cfg %2 x ring %3 x ulysses %4 x tp %5")
               .arg(s.dp_degree)
               .arg(s.cfg_degree)
               .arg(s.ring_degree)
               .arg(s.ulysses_degree)
               .arg(s.tp_degree);
  const long long product =
      1LL * s.dp_degree * s.cfg_degree * s.ring_degree * s.ulysses_degree * s.tp_degree;
  if (s.world < 1 || s.world > 1024 || s.dp_degree < 1 || s.cfg_degree < 1 || s.ring_degree < 1 ||
      s.ulysses_degree < 1 || s.tp_degree < 1 || product != s.world)
    return L;
  L.valid = true;
  L.rows = s.dp_degree * s.cfg_degree * s.ring_degree;
  L.cols = s.ulysses_degree * s.tp_degree;
  static const char* names[5] = {"dp", "cfg", "ring", "uly", "tp"};
  const int degrees[5] = {s.dp_degree, s.cfg_degree, s.ring_degree, s.ulysses_degree, s.tp_degree};
  for (int rank = 0; rank < s.world; ++rank) {
    MeshCell c;
    c.rank = rank;
    c.coords = dit::meshCoords(s, rank);
    c.row = (c.coords[0] * s.cfg_degree + c.coords[1]) * s.ring_degree + c.coords[2];
    c.col = c.coords[3] * s.tp_degree + c.coords[4];
    QStringList parts;
    for (int d = 0; d < 5; ++d)
      if (degrees[d] > 1) parts << QStringLiteral("%1 %2").arg(names[d]).arg(c.coords[d]);
    c.label = QStringLiteral("rank %1").arg(rank);
    if (!parts.isEmpty()) c.label += "\n" + parts.join(' ');
    L.cells.append(c);
  }
  for (int row = 0; row < L.rows; ++row) {
    const int ring = row % s.ring_degree;
    const int replica = row / s.ring_degree;
    QStringList parts;
    if (s.dp_degree > 1) parts << QStringLiteral("dp %1").arg(replica / s.cfg_degree);
    if (s.cfg_degree > 1) parts << QStringLiteral("cfg %1").arg(replica % s.cfg_degree);
    if (s.ring_degree > 1) parts << QStringLiteral("ring %1").arg(ring);
    L.rowLabels << (parts.isEmpty() ? QStringLiteral("replica") : parts.join(" / "));
  }
  return L;
}

}  // namespace dit::ui
