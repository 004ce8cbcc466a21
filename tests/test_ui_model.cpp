// Model folder reading (ui/model_info.h), live validation identical to the worker's
// (ui/validation.h vs dit::validate*), generation parameters JSON and PNG "parameters" chunks.
#include <QComboBox>
#include <QDir>
#include <QFile>
#include <QImage>
#include <QJsonDocument>
#include <QPushButton>
#include <QSlider>
#include <QTemporaryDir>
#include <QtTest>

#include "backend/io/model_folder.h"
#include "backend/io/safetensors.h"
#include "ui/history_store.h"
#include "ui/model_info.h"
#include "ui/validation.h"

using namespace dit::ui;

namespace {

QString fixture() { return qEnvironmentVariable("DITSTUDIO_TEST_FIXTURE"); }

bool copyTree(const QString& from, const QString& to) {
  QDir().mkpath(to);
  const QDir src(from);
  for (const QFileInfo& fi : src.entryInfoList(QDir::Files | QDir::Dirs | QDir::NoDotAndDotDot)) {
    const QString dest = QDir(to).filePath(fi.fileName());
    if (fi.isDir()) {
      if (!copyTree(fi.filePath(), dest)) return false;
    } else if (!QFile::copy(fi.filePath(), dest)) {
      return false;
    }
  }
  return true;
}

QStringList toList(const std::vector<dit::StrategyIssue>& v) {
  QStringList l;
  for (const auto& i : v) l << QString::fromStdString(i.message);
  return l;
}

}  // namespace

class TestModel : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void initTestCase() {
    if (fixture().isEmpty() || !QFileInfo::exists(fixture() + "/model_index.json"))
      QSKIP("DITSTUDIO_TEST_FIXTURE does not point at tests/data/tiny-flux-A");
  }

  void readsFixture() {
    const ModelInfo m = readModelInfo(fixture());
    QVERIFY2(m.ok, qPrintable(m.error));
    // The family's own facts (FamilySpec::facts), not FLUX-shaped fields.
    QCOMPARE(m.family, QStringLiteral("FLUX.1"));
    QCOMPARE(m.fact("blocks"), QStringLiteral("2 double + 2 single"));
    QCOMPARE(m.fact("heads"), QStringLiteral("4 heads x 16 head dim (inner 64)"));
    QVERIFY2(m.fact("text_encoders").endsWith("joint_attention_dim 32"),
             qPrintable(m.fact("text_encoders")));
    QVERIFY2(m.fact("guidance").startsWith("distilled guidance embedding"),
             qPrintable(m.fact("guidance")));
    QVERIFY(m.capabilities.img2img && m.capabilities.inpaint && m.capabilities.single_file);
    QVERIFY2(m.summary().contains("blocks: 2 double + 2 single"), qPrintable(m.summary()));
    QCOMPARE(m.num_attention_heads, 4);
    QCOMPARE(m.attention_head_dim, 16);
    QCOMPARE(m.innerDim(), 64);
    QCOMPARE(m.vae_scale_factor, 2);  // block_out_channels [8, 16]
    QCOMPARE(m.sizeMultiple(), 4);
    // Parameter count equals the sum over the safetensors header (SafetensorsReader).
    const dit::SafetensorsReader r(
        (fixture() + "/transformer/diffusion_pytorch_model.safetensors").toStdString());
    qint64 expect = 0;
    for (const auto& n : r.names()) expect += r.info(n).numel();
    QCOMPARE(m.component("transformer")->parameters, expect);
    QCOMPARE(m.component("transformer")->dtype, QString("F32"));
    QVERIFY(m.component("transformer")->bytes > expect * 4);
    QVERIFY(m.totalParameters() > expect);
    QVERIFY(m.summary().contains("4 heads x 16 head dim"));
    const dit::ModelDims d = m.dims();
    QCOMPARE(d.num_attention_heads, 4);
    // The FLUX.1 plan and parameter table come with it: proj_out of a single block is packed
    // over [inner_dim 64, mlp hidden 256].
    QVERIFY(d.tensor_parallel_plan && d.parameters);
    const auto* po = d.parameters->find("single_transformer_blocks.1.proj_out.weight");
    QVERIFY(po != nullptr);
    QVERIFY(po->shape == (std::vector<int64_t>{64, 320}));
    QVERIFY(d.tensor_parallel_plan->validate(*d.parameters, 4).empty());
    QCOMPARE(d.vae_scale_factor, 2);
    // One truth: the GUI's dims are the folder's declared ones (ModelFolder::dims()), with the
    // context-parallel plan and the pipeline's default text length.
    const dit::ModelFolder f = dit::ModelFolder::open(fixture().toStdString());
    QCOMPARE(d.parameters->size(), f.dims().parameters->size());
    QCOMPARE(d.tensor_parallel_plan->rules().size(), f.dims().tensor_parallel_plan->rules().size());
    QVERIFY(d.context_parallel_plan);
    QVERIFY(d.context_parallel_plan->joint_sequence ==
            f.dims().context_parallel_plan->joint_sequence);
    QCOMPARE(m.max_sequence_length, f.config->max_sequence_length);
  }

  // The model chooser takes single files too and shows what was detected (issue 12).
  // The family's capability record reaches the GUI: FLUX.1 runs img2img, inpainting and step
  // caching; FLUX.2 [klein] too (img2img and inpainting from the shared loop, step caching from
  // the DiT driver) but no single files (test_ui_flux2 checks the image panel follows it).
  void capabilitiesFromTheFamily() {
    const ModelInfo f1 = readModelInfo(fixture());
    QVERIFY2(f1.ok, qPrintable(f1.error));
    QCOMPARE(f1.family, QString("FLUX.1"));
    QVERIFY(f1.capabilities.img2img && f1.capabilities.inpaint && f1.capabilities.step_cache);
    const ModelInfo f2 = readModelInfo(fixture() + "/../tiny-flux2-A");
    QVERIFY2(f2.ok, qPrintable(f2.error));
    QCOMPARE(f2.family, QString("FLUX.2 [klein]"));
    QVERIFY(f2.capabilities.img2img && f2.capabilities.inpaint && f2.capabilities.step_cache);
    QVERIFY(!f2.capabilities.single_file);
  }

  void readsSingleFiles() {
    const QString dir = qEnvironmentVariable("DITSTUDIO_TEST_FORMATS");
    QVERIFY2(QFileInfo::exists(dir + "/transformer-bfl.safetensors"),
             "DITSTUDIO_TEST_FORMATS must point at ../shared/fixtures/tiny-flux-A/formats");
    // Transformer-only file: the VAE is missing, named with the flag that supplies it.
    ModelInfo m = readModelInfo(dir + "/transformer-bfl.safetensors", fixture());
    QVERIFY(!m.ok);
    QVERIFY2(m.error.contains("give one with --vae"), qPrintable(m.error));
    // All-in-one checkpoint: every component from the one file.
    m = readModelInfo(dir + "/checkpoint-comfy-aio.safetensors", fixture());
    QVERIFY2(m.ok, qPrintable(m.error));
    QCOMPARE(m.detected, QStringLiteral("flux / flux-dev"));
    QCOMPARE(m.num_attention_heads, 4);
    QCOMPARE(m.fact("blocks"), QStringLiteral("2 double + 2 single"));
    QVERIFY(m.component("vae"));
    QVERIFY2(m.component("vae")->source.contains("ldm layout, prefix vae."),
             qPrintable(m.component("vae")->source));
    QVERIFY2(m.component("text_encoder_2")->source.contains("text_encoders.t5xxl.transformer."),
             qPrintable(m.component("text_encoder_2")->source));
    QCOMPARE(m.component("transformer")->storage, QStringLiteral("F32 x84"));
    QVERIFY2(m.summary().contains("detected: flux / flux-dev"), qPrintable(m.summary()));
    QVERIFY2(m.summary().contains("tokenizer"), qPrintable(m.summary()));
    // Without a config folder, head dim 16 (not FLUX.1's 128) cannot give the RoPE axes.
    m = readModelInfo(dir + "/checkpoint-comfy-aio.safetensors");
    QVERIFY(!m.ok);
    QVERIFY2(m.error.contains("--config"), qPrintable(m.error));
    // A VAE file as the model.
    m = readModelInfo(dir + "/ae.safetensors", fixture());
    QVERIFY(!m.ok);
    QVERIFY2(m.error.contains("holds a VAE"), qPrintable(m.error));
  }

  void brokenFolders() {
    QCOMPARE(readModelInfo("/nonexistent/model").ok, false);
    QVERIFY(readModelInfo("/nonexistent/model").error.contains("does not exist"));
    QVERIFY(!readModelInfo("").ok);
    QTemporaryDir dir;
    ModelInfo m = readModelInfo(dir.path());
    QVERIFY(!m.ok);
    QVERIFY(m.error.contains("model_index.json"));
    QVERIFY(copyTree(fixture(), dir.path()));
    QVERIFY(readModelInfo(dir.path()).ok);
    // A git-lfs pointer in place of the weights.
    QFile w(dir.path() + "/transformer/diffusion_pytorch_model.safetensors");
    QVERIFY(w.open(QIODevice::WriteOnly | QIODevice::Truncate));
    w.write("version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n");
    w.close();
    m = readModelInfo(dir.path());
    QVERIFY(!m.ok);
    QVERIFY(m.error.contains("git-lfs"));
    // Broken config.
    QFile c(dir.path() + "/transformer/config.json");
    QVERIFY(c.open(QIODevice::WriteOnly | QIODevice::Truncate));
    c.write("{broken");
    c.close();
    m = readModelInfo(dir.path());
    QVERIFY(!m.ok);
    QVERIFY(m.error.contains("config.json"));
  }

  void validationMatchesWorker() {
    const ModelInfo m = readModelInfo(fixture());
    GenerationParams p;
    p.width = 64;
    p.height = 64;
    dit::Strategy s;
    s.world = 2;
    s.ring_degree = 2;
    Validation v = validate(s, m, p, 512);
    QVERIFY2(v.canGenerate(), qPrintable(v.all().join("; ")));

    // tp 3 on 4 heads: the worker's messages, verbatim, block Start.
    s = dit::Strategy{};
    s.world = 3;
    s.tp_degree = 3;
    v = validate(s, m, p, 512);
    QVERIFY(!v.canStart());
    QCOMPARE(v.startIssues, toList(dit::validateForModel(s, m.dims())));
    QVERIFY(v.startIssues.join(' ').contains("num_attention_heads 4"));

    // Product != world.
    s = dit::Strategy{};
    s.world = 2;
    s.tp_degree = 1;
    s.ulysses_degree = 4;
    v = validate(s, m, p, 512);
    QVERIFY(!v.canStart());
    QCOMPARE(v.startIssues.first(), toList(dit::validateDegrees(s)).first());

    // Request-only problems (cfg 2 without true CFG, size not a multiple) leave Start enabled:
    // the size as the worker's resolve words it (the family's declared request), then the
    // strategy's cfg rule (its own size rule would say the size again).
    s = dit::Strategy{};
    s.world = 2;
    s.cfg_degree = 2;
    p.width = 66;
    v = validate(s, m, p, 512);
    QVERIFY(v.canStart());
    QVERIFY(!v.canGenerate());
    const dit::ResolvedRequest resolved = m.resolve(p);
    QCOMPARE(resolved.problems.size(), size_t(1));
    QCOMPARE(resolved.problems[0].field, std::string("width"));
    dit::RequestDims rd = requestDims(p, 512, resolved.cfg);
    rd.cfg_requirement = resolved.cfg_requirement;
    QStringList all{QString::fromStdString(resolved.problems[0].message)};
    for (const auto& i : dit::validateForRequest(s, m.dims(), rd))
      if (i.rule != "size_multiple") all << QString::fromStdString(i.message);
    QCOMPARE(all.size(), 2);
    QCOMPARE(v.requestIssues, all);
    p.width = 64;
    p.negative_prompt = "ugly";
    p.options["true_cfg_scale"] = 4;
    QVERIFY(validate(s, m, p, 512).canGenerate());

    // Strict ring on an odd token count: 36x36 px -> 9x9 = 81 image tokens.
    s = dit::Strategy{};
    s.world = 2;
    s.ring_degree = 2;
    p = GenerationParams{};
    p.width = p.height = 36;
    v = validate(s, m, p, 512);
    QVERIFY(v.canStart());
    QVERIFY(!v.canGenerate());
    s.ring_anything = true;
    QVERIFY(validate(s, m, p, 512).canGenerate());

    // Missing model and hostfile block Start.
    v = validate(dit::Strategy{}, readModelInfo("/nope"), p, 512, "/no/such/hostfile");
    QVERIFY(!v.canStart());
    QCOMPARE(v.startIssues.size(), 2);
    QVERIFY(v.startIssues.join(' ').contains("hostfile"));
  }

  void paramsJson() {
    GenerationParams p;
    p.prompt = "x";
    p.random_seed = true;
    QJsonObject j = paramsToQJson(p);
    QCOMPARE(j.value("seed").toInteger(), -1);
    GenerationParams q = paramsFromQJson(j);
    QVERIFY(q.random_seed);
    QVERIFY(q == p);
    p.random_seed = false;
    p.seed = 9007199254740991LL;  // 2^53 - 1 survives JSON
    QCOMPARE(paramsFromQJson(paramsToQJson(p)).seed, p.seed);
    p.seed = 9007199254740993ULL;  // 2^53 + 1 and 2^63 - 1: integers, never a double
    QCOMPARE(paramsFromQJson(paramsToQJson(p)).seed, p.seed);
    p.seed = 9223372036854775807ULL;
    QCOMPARE(paramsFromQJson(paramsToQJson(p)).seed, p.seed);
    // Partial objects keep defaults.
    GenerationParams base;
    base.steps = 33;
    q = paramsFromQJson(QJsonObject{{"prompt", "only"}}, base);
    QCOMPARE(QString::fromStdString(q.prompt), QString("only"));
    QCOMPARE(q.steps, 33);
    QVERIFY(q.options.empty());
    // A family knob at the top level (written before FluxPipeline's true CFG scale was a knob)
    // is read as the option it is; an explicit options entry wins.
    q = paramsFromQJson(QJsonObject{{"prompt", "old"}, {"true_cfg_scale", 3.0}});
    QCOMPARE(q.options.at("true_cfg_scale"), 3.0);
    q = paramsFromQJson(
        QJsonObject{{"true_cfg_scale", 3.0}, {"options", QJsonObject{{"true_cfg_scale", 2.0}}}});
    QCOMPARE(q.options.at("true_cfg_scale"), 2.0);
    // Whether CFG runs is the family's guider: FLUX.1 true CFG needs the negative prompt and a
    // scale above 1.
    const ModelInfo m = readModelInfo(fixture());
    QVERIFY(m.ok);
    q.negative_prompt =
        std::string(1, 'n');  // not = "n": GCC 12 -Wrestrict false positive (PR105329)
    q.options["true_cfg_scale"] = 1.0;
    QVERIFY(!m.resolve(q).cfg);
    q.options["true_cfg_scale"] = 1.5;
    QVERIFY(m.resolve(q).cfg);
  }

  void modelDefaultsOverCurrent() {
    // A model's declared settings replace only their keys; a wrong type changes nothing and
    // says which field.
    GenerationParams cur;
    cur.prompt = "kept";
    cur.seed = 77, cur.random_seed = false;
    cur.steps = 8;
    QString problem;
    GenerationParams p = withModelDefaults(
        QJsonObject{{"steps", 28}, {"true_cfg_scale", 5.0}, {"negative_prompt", ""}}, cur,
        &problem);
    QVERIFY(problem.isEmpty());
    QCOMPARE(p.steps, 28);
    QCOMPARE(p.options.at("true_cfg_scale"), 5.0);
    QVERIFY(p.hasNegativePrompt());  // an empty negative prompt given: true CFG against it
    QCOMPARE(QString::fromStdString(p.prompt), QString("kept"));
    QCOMPARE(p.seed, uint64_t{77});
    p = withModelDefaults(QJsonObject{{"steps", "many"}, {"width", 128}}, cur, &problem);
    QVERIFY(p == cur);
    QVERIFY2(problem.contains("steps"), qPrintable(problem));
    QVERIFY(withModelDefaults(QJsonObject{}, cur) == cur);
  }

  void pngParameters() {
    QTemporaryDir dir;
    const QString path = dir.filePath("img.png");
    QImage img(8, 8, QImage::Format_RGB888);
    img.fill(Qt::blue);
    const QJsonObject params{
        {"prompt", "a red fox"}, {"negative_prompt", ""},
        {"true_cfg_scale", 1.0}, {"width", 8},
        {"height", 8},           {"steps", 4},
        {"guidance", 3.5},       {"seed", 1234},
        {"model", "/m"},         {"strategy", QJsonObject{{"ring_degree", 2}}}};
    img.setText("parameters",
                QString::fromUtf8(QJsonDocument(params).toJson(QJsonDocument::Compact)));
    QVERIFY(img.save(path));
    QString err;
    const QJsonObject back = readPngParameters(path, &err);
    QCOMPARE(back, params);
    HistoryEntry e;
    e.params = back;
    const GenerationParams g = e.generation();
    QCOMPARE(QString::fromStdString(g.prompt), QString("a red fox"));
    QCOMPARE(g.seed, std::uint64_t(1234));
    QCOMPARE(g.steps, 4);
    // No chunk / not an image.
    QImage plain(4, 4, QImage::Format_RGB888);
    plain.fill(Qt::black);
    QVERIFY(plain.save(dir.filePath("plain.png")));
    QVERIFY(readPngParameters(dir.filePath("plain.png"), &err).isEmpty());
    QVERIFY(err.contains("parameters"));
    QVERIFY(readPngParameters(dir.filePath("missing.png"), &err).isEmpty());
  }
};

QTEST_GUILESS_MAIN(TestModel)
#include "test_ui_model.moc"
