// Mesh layout of the strategy editor (ui/mesh_layout.h): rows = dp x cfg x ring groups, columns =
// ulysses x tp, coordinates identical to the worker's dit::meshCoords.
#include <QSet>
#include <QtTest>

#include "ui/mesh_layout.h"
#include "ui/strategy_json.h"

using namespace dit::ui;

namespace {
dit::Strategy make(int dp, int cfg, int ring, int uly, int tp) {
  dit::Strategy s;
  s.dp_degree = dp;
  s.cfg_degree = cfg;
  s.ring_degree = ring;
  s.ulysses_degree = uly;
  s.tp_degree = tp;
  s.world = dp * cfg * ring * uly * tp;
  return s;
}
}  // namespace

class TestMesh : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void single() {
    const MeshLayout L = computeMeshLayout(make(1, 1, 1, 1, 1));
    QVERIFY(L.valid);
    QCOMPARE(L.rows, 1);
    QCOMPARE(L.cols, 1);
    QCOMPARE(L.cells.size(), 1);
    QCOMPARE(L.cells[0].label, QString("rank 0"));
    QCOMPARE(L.rowLabels, QStringList{"replica"});
  }

  void full5d() {
    const dit::Strategy s = make(2, 2, 2, 2, 2);
    const MeshLayout L = computeMeshLayout(s);
    QVERIFY(L.valid);
    QCOMPARE(L.rows, 8);
    QCOMPARE(L.cols, 4);
    QCOMPARE(L.cells.size(), 32);
    QSet<QPair<int, int>> positions;
    for (const MeshCell& c : L.cells) {
      // Formula of parallel/strategy.h: rank = ((((dp*cfg + c)*ring + r)*uly + u)*tp + t).
      const auto& k = c.coords;
      QCOMPARE(c.rank, (((k[0] * 2 + k[1]) * 2 + k[2]) * 2 + k[3]) * 2 + k[4]);
      QVERIFY(k == dit::meshCoords(s, c.rank));
      QCOMPARE(c.row, (k[0] * 2 + k[1]) * 2 + k[2]);
      QCOMPARE(c.row, c.rank / 4);
      QCOMPARE(c.col, c.rank % 4);
      positions.insert({c.row, c.col});
    }
    QCOMPARE(positions.size(), 32);     // one box per cell
    const MeshCell& r13 = L.cells[13];  // 13 = 0b01101: dp0 cfg1 ring1 uly0 tp1
    QCOMPARE(r13.label, QString("rank 13\ndp 0 cfg 1 ring 1 uly 0 tp 1"));
    QCOMPARE(L.rowLabels.size(), 8);
    QCOMPARE(L.rowLabels.first(), QString("dp 0 / cfg 0 / ring 0"));
    QCOMPARE(L.rowLabels.at(3), QString("dp 0 / cfg 1 / ring 1"));
    QCOMPARE(L.rowLabels.last(), QString("dp 1 / cfg 1 / ring 1"));
  }

  void tpInnermost() {
    const dit::Strategy s = make(1, 1, 1, 2, 2);
    const MeshLayout L = computeMeshLayout(s);
    QCOMPARE(L.rows, 1);
    QCOMPARE(L.cols, 4);
    QCOMPARE(L.cells[1].coords[4], 1);  // rank 1: tp 1
    QCOMPARE(L.cells[1].coords[3], 0);
    QCOMPARE(L.cells[2].coords[3], 1);  // rank 2: ulysses 1, tp 0
    QCOMPARE(L.cells[2].label, QString("rank 2\nuly 1 tp 0"));
  }

  void cfgRows() {
    const MeshLayout L = computeMeshLayout(make(1, 2, 1, 2, 1));
    QCOMPARE(L.rows, 2);
    QCOMPARE(L.cols, 2);
    QCOMPARE(L.cells[2].row, 1);  // rank 2: cfg 1, ulysses 0
    QCOMPARE(L.cells[2].col, 0);
    QCOMPARE(L.rowLabels, (QStringList{"cfg 0", "cfg 1"}));
  }

  void ringRunsDown() {
    const MeshLayout L = computeMeshLayout(make(1, 1, 2, 4, 1));  // unified, 8 ranks
    QCOMPARE(L.rows, 2);
    QCOMPARE(L.cols, 4);
    QCOMPARE(L.cells[5].row, 1);
    QCOMPARE(L.cells[5].col, 1);
    QCOMPARE(L.cells[5].label, QString("rank 5\nring 1 uly 1"));
    QCOMPARE(L.rowLabels, (QStringList{"ring 0", "ring 1"}));
  }

  void invalid() {
    dit::Strategy s = make(1, 1, 2, 1, 1);
    s.world = 3;
    QVERIFY(!computeMeshLayout(s).valid);
    QVERIFY(computeMeshLayout(s).cells.isEmpty());
    s = make(1, 1, 1, 1, 1);
    s.tp_degree = 0;
    s.world = 0;
    QVERIFY(!computeMeshLayout(s).valid);
  }

  void strategyTextAndJson() {
    dit::Strategy s = make(2, 2, 1, 2, 1);
    s.device = "cuda";
    s.ulysses_anything = true;
    QCOMPARE(strategyText(s), QString("8 ranks (cuda): dp 2 x cfg 2 x ulysses 2 (anything)"));
    QVERIFY(sameStrategy(strategyFromJson(strategyToJson(s)), s));
    // "np" instead of "world", and world defaulting to the product.
    QCOMPARE(strategyFromJson(QJsonObject{{"np", 4}, {"ring_degree", 4}}).world, 4);
    QCOMPARE(strategyFromJson(QJsonObject{{"tp_degree", 2}, {"dp_degree", 3}}).world, 6);
  }
};

QTEST_GUILESS_MAIN(TestMesh)
#include "test_ui_mesh.moc"
