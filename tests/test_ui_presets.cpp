// PresetStore (ui/preset_store.h): built-in presets from the Qt resource, save/rename/delete,
// JSON round trip, import/export, atomic writes; HistoryStore persistence.
#include <QDir>
#include <QFile>
#include <QJsonDocument>
#include <QTemporaryDir>
#include <QtTest>

#include "ui/history_store.h"
#include "ui/json_io.h"
#include "ui/preset_store.h"
#include "ui/strategy_json.h"

using namespace dit::ui;

namespace {

Preset makePreset(const QString& name) {
  Preset p;
  p.name = name;
  p.description = "four ranks";
  p.strategy.world = 4;
  p.strategy.device = "cuda";
  p.strategy.ring_degree = 2;
  p.strategy.ulysses_degree = 2;
  p.hostfile = "/etc/hosts.mpi";
  p.hosts.networkInterface = "10.0.0.0/24";
  p.hosts.portRange = "50000-50100";
  p.hosts.sshOptions = "-i ~/.ssh/cluster -o 'ProxyJump=gw'";
  p.hosts.mpirunArgs = "--display-map";
  p.hasGeneration = true;
  p.generation.prompt = "a lighthouse, \"quoted\" and ünïcode";
  p.generation.negative_prompt = "blurry";
  p.generation.options["true_cfg_scale"] = 4.0;
  p.generation.width = 768;
  p.generation.height = 512;
  p.generation.steps = 20;
  p.generation.guidance = 2.5;
  p.generation.seed = 1234567890123LL;
  p.generation.num_images = 3;
  return p;
}

void comparePresets(const Preset& a, const Preset& b) {
  QCOMPARE(a.name, b.name);
  QCOMPARE(a.description, b.description);
  QVERIFY(sameStrategy(a.strategy, b.strategy));
  QCOMPARE(a.hostfile, b.hostfile);
  QCOMPARE(a.hosts.networkInterface, b.hosts.networkInterface);
  QCOMPARE(a.hosts.portRange, b.hosts.portRange);
  QCOMPARE(a.hosts.sshOptions, b.hosts.sshOptions);
  QCOMPARE(a.hosts.mpirunArgs, b.hosts.mpirunArgs);
  QCOMPARE(a.hasGeneration, b.hasGeneration);
  QVERIFY(a.generation == b.generation);
}

QStringList leftovers(const QString& dir) {
  // Anything QSaveFile could leave behind (temporary files next to the target).
  QStringList all = QDir(dir).entryList(QDir::Files | QDir::Hidden);
  all.removeAll("presets.json");
  all.removeAll("history.json");
  all.removeAll("export.json");
  return all;
}

}  // namespace

class TestPresets : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void builtinsFromResource() {
    QTemporaryDir dir;
    PresetStore store(dir.path());
    QString err;
    QVERIFY2(store.load(&err), qPrintable(err));
    const QList<Preset> ps = store.presets();
    QCOMPARE(ps.size(), 6);
    for (const Preset& p : ps) {
      QVERIFY(p.builtin);
      QVERIFY(p.hasGeneration);
      const auto issues = dit::validateDegrees(p.strategy);
      QVERIFY2(issues.empty(),
               qPrintable(p.name + ": " + QString::fromStdString(dit::joinIssues(issues))));
    }
    auto demo = store.find("CPU demo (2 ranks)");
    QVERIFY(demo);
    QCOMPARE(demo->strategy.world, 2);
    QCOMPARE(demo->strategy.device, std::string("cpu"));
    QVERIFY(store.find("1 GPU"));
    QCOMPARE(store.find("2 GPUs, tp over NVLink")->strategy.tp_degree, 2);
    QCOMPARE(store.find("4 GPUs, Ulysses")->strategy.ulysses_degree, 4);
    const auto unified = store.find("8 GPUs, unified (ring 2 x Ulysses 4)");
    QVERIFY(unified);
    QCOMPARE(unified->strategy.ring_degree * unified->strategy.ulysses_degree, 8);
    QCOMPARE(store.find("PCIe rig (4 GPUs, ring)")->strategy.ring_degree, 4);
    // Built-ins are read-only.
    QVERIFY(!store.save(makePreset("1 GPU"), &err));
    QVERIFY(err.contains("built-in"));
    QVERIFY(!store.remove("1 GPU", &err));
    QVERIFY(!store.rename("1 GPU", "x", &err));
  }

  void saveLoadRoundTrip() {
    QTemporaryDir dir;
    {
      PresetStore store(dir.path());
      store.load();
      QString err;
      QVERIFY2(store.save(makePreset("mine"), &err), qPrintable(err));
      Preset b = makePreset("second");
      b.hasGeneration = false;
      b.strategy = dit::Strategy{};
      b.strategy.ulysses_anything = true;
      QVERIFY(store.save(b, &err));
    }
    PresetStore again(dir.path());
    QVERIFY(again.load());
    QCOMPARE(again.presets().size(), 8);
    comparePresets(*again.find("mine"), makePreset("mine"));
    QVERIFY(!again.find("second")->hasGeneration);
    QVERIFY(again.find("second")->strategy.ulysses_anything);
    QVERIFY(!again.find("mine")->builtin);
    // Replace in place keeps the order.
    Preset changed = makePreset("mine");
    changed.strategy.tp_degree = 4;
    QVERIFY(again.save(changed));
    QCOMPARE(again.names().at(6), QString("mine"));
    QCOMPARE(again.find("mine")->strategy.tp_degree, 4);
    QVERIFY(leftovers(dir.path()).isEmpty());
  }

  void renameAndDelete() {
    QTemporaryDir dir;
    PresetStore store(dir.path());
    store.load();
    QString err;
    QVERIFY(store.save(makePreset("a"), &err));
    QVERIFY(store.save(makePreset("b"), &err));
    QVERIFY(!store.rename("a", "b", &err));
    QVERIFY(err.contains("already exists"));
    QVERIFY(!store.rename("a", "4 GPUs, Ulysses", &err));
    QVERIFY(!store.rename("a", "  ", &err));
    QVERIFY(!store.rename("missing", "c", &err));
    QVERIFY2(store.rename("a", "c", &err), qPrintable(err));
    QVERIFY(!store.find("a"));
    QVERIFY(store.find("c"));
    QVERIFY(store.remove("b", &err));
    QVERIFY(!store.remove("b", &err));
    PresetStore reread(dir.path());
    reread.load();
    QCOMPARE(reread.presets().size(), 7);
    QVERIFY(reread.find("c"));
    QCOMPARE(reread.uniqueName("c"), QString("c (2)"));
    QCOMPARE(reread.uniqueName("new"), QString("new"));
  }

  void importExport() {
    QTemporaryDir src, dst;
    PresetStore a(src.path());
    a.load();
    QVERIFY(a.save(makePreset("shared")));
    const QString file = QDir(src.path()).filePath("export.json");
    QString err;
    QVERIFY2(a.exportTo(file, {"shared", "1 GPU"}, &err), qPrintable(err));
    QJsonDocument doc;
    QVERIFY(readJsonFile(file, &doc));
    QCOMPARE(doc.object().value("format").toString(), QString("ditstudio-presets"));
    QCOMPARE(doc.object().value("presets").toArray().size(), 2);
    QVERIFY(!a.exportTo(file, {"nope"}, &err));

    PresetStore b(dst.path());
    b.load();
    QVERIFY(b.save(makePreset("shared")));
    const QStringList added = b.importFrom(file, &err);
    QCOMPARE(added, QStringList({"shared (2)", "1 GPU (2)"}));  // clashes renamed
    Preset expect = makePreset("shared (2)");
    comparePresets(*b.find("shared (2)"), expect);
    QVERIFY(!b.find("1 GPU (2)")->builtin);
    // Persisted.
    PresetStore c(dst.path());
    c.load();
    QVERIFY(c.find("shared (2)"));

    // A single preset object imports too.
    const QString one = QDir(dst.path()).filePath("one.json");
    QVERIFY(writeJsonAtomic(one, QJsonDocument(makePreset("solo").toJson())));
    QCOMPARE(b.importFrom(one, &err), QStringList{"solo"});
    // Garbage does not.
    QFile bad(QDir(dst.path()).filePath("bad.json"));
    QVERIFY(bad.open(QIODevice::WriteOnly));
    bad.write("{not json");
    bad.close();
    QVERIFY(b.importFrom(bad.fileName(), &err).isEmpty());
    QVERIFY(err.contains("not valid JSON"));
    QVERIFY(writeJsonAtomic(bad.fileName(), QJsonDocument(QJsonObject{{"hello", 1}})));
    QVERIFY(b.importFrom(bad.fileName(), &err).isEmpty());
    QVERIFY(b.importFrom(QDir(dst.path()).filePath("missing.json"), &err).isEmpty());
  }

  void atomicWrite() {
    QTemporaryDir dir;
    const QString target = QDir(dir.path()).filePath("presets.json");
    QVERIFY(writeJsonAtomic(target, QJsonDocument(QJsonObject{{"v", 1}})));
    QVERIFY(writeJsonAtomic(target, QJsonDocument(QJsonObject{{"v", 2}})));
    QJsonDocument doc;
    QVERIFY(readJsonFile(target, &doc));
    QCOMPARE(doc.object().value("v").toInt(), 2);
    QVERIFY(leftovers(dir.path()).isEmpty());
    // A path whose parent is a file cannot be written: error, nothing else touched.
    QString err;
    QVERIFY(!writeJsonAtomic(QDir(dir.path()).filePath("presets.json/child.json"), doc, &err));
    QVERIFY(!err.isEmpty());
    QVERIFY(readJsonFile(target, &doc));
    QCOMPARE(doc.object().value("v").toInt(), 2);
    // The store keeps its in-memory state unchanged when saving fails.
    QFile blocker(QDir(dir.path()).filePath("blocked"));
    QVERIFY(blocker.open(QIODevice::WriteOnly));
    blocker.close();
    PresetStore store(blocker.fileName());  // data dir is a file
    store.load();
    QVERIFY(!store.save(makePreset("x"), &err));
    QVERIFY(!store.find("x"));
  }

  void unreadableUserFileIsReported() {
    QTemporaryDir dir;
    QFile f(QDir(dir.path()).filePath("presets.json"));
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write("[1, 2");
    f.close();
    PresetStore store(dir.path());
    QString err;
    QVERIFY(!store.load(&err));
    QVERIFY(err.contains("presets.json"));
    QCOMPARE(store.presets().size(), 6);  // built-ins still there
  }

  void historyPersists() {
    QTemporaryDir dir;
    HistoryStore h(dir.path(), 3);
    QVERIFY(h.load());
    QVERIFY(h.entries().isEmpty());
    for (int i = 0; i < 5; ++i) {
      HistoryEntry e;
      e.path = QStringLiteral("/tmp/img%1.png").arg(i);
      e.seed = 100 + i;
      e.hasSeed = true;
      e.requestId = QStringLiteral("r%1").arg(i);
      e.params = QJsonObject{{"prompt", "p"}, {"width", 64}, {"seed", -1}};
      e.seconds = 1.5;
      QVERIFY(h.add(e));
    }
    QCOMPARE(h.entries().size(), 3);  // capped, newest first
    QCOMPARE(h.entries().first().path, QString("/tmp/img4.png"));
    HistoryStore again(dir.path());
    QVERIFY(again.load());
    QCOMPARE(again.entries().size(), 3);
    QCOMPARE(again.entries().first().seed, std::uint64_t(104));
    QVERIFY(again.entries().first().created.isValid());
    const GenerationParams g = again.entries().first().generation();
    QCOMPARE(g.seed, std::uint64_t(104));  // the used seed, not "random"
    QVERIFY(!g.random_seed);
    QCOMPARE(g.width, 64);
    QVERIFY(again.remove("/tmp/img3.png"));
    QVERIFY(!again.remove("/tmp/img3.png"));
    QCOMPARE(again.entries().size(), 2);
    QVERIFY(again.clear());
    HistoryStore cleared(dir.path());
    cleared.load();
    QVERIFY(cleared.entries().isEmpty());
    QVERIFY(leftovers(dir.path()).isEmpty());
  }
};

QTEST_GUILESS_MAIN(TestPresets)
#include "test_ui_presets.moc"
