#include "ui/model_info.h"

#include <QDir>
#include <QJsonDocument>
#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>

#include "app/common/request_values.h"
#include "backend/io/model_folder.h"
#include "backend/io/safetensors.h"
#include "backend/io/stored_weight_bytes.h"
#include "backend/models/checkpoint_layouts.h"
#include "backend/models/family_registry.h"

namespace dit::ui {
namespace {

// One component's size from its safetensors headers, read and validated by the same
// SafetensorsCollection the worker loads with (so a file the worker would refuse is refused here,
// with the same message). Throws dit::ModelFileError.
ComponentSize readComponent(const ModelFolder& m, const char* name, const char* stem) {
  ComponentSize c;
  c.name = QString::fromLatin1(name);
  auto src = m.components.find(name);
  if (src != m.components.end() && src->second.single_file) {
    const CheckpointInfo info = inspectCheckpoint(src->second.path);
    const CheckpointComponent* cc = info.find(name);
    if (!cc) throw ModelFileError(src->second.path, std::string("no ") + name + " in this file");
    c.parameters = static_cast<qint64>(m.componentParameterCount(name, stem));
    c.bytes = static_cast<qint64>(cc->bytes);
    qint64 best = -1;
    for (const auto& [dt, n] : cc->dtypes) {
      c.storage +=
          QStringLiteral("%1%2 x%3")
              .arg(c.storage.isEmpty() ? "" : ", ", QString::fromStdString(dt), QString::number(n));
      if (n > best) best = n, c.dtype = QString::fromStdString(dt);
    }
    c.source =
        QStringLiteral("%1 (%2 layout%3) [%4]")
            .arg(QString::fromStdString(src->second.path), QString::fromStdString(cc->layout),
                 cc->prefix.empty()
                     ? QString()
                     : QStringLiteral(", prefix %1").arg(QString::fromStdString(cc->prefix)),
                 QString::fromStdString(src->second.flag));
    return c;
  }
  c.source = QStringLiteral("folder %1").arg(QString::fromStdString(m.component(name)));
  const auto st = SafetensorsCollection::openFolder(m.component(name), stem);
  std::map<std::string, qint64> byDtype;
  for (const auto& t : st.names()) {
    const auto& info = st.info(t);
    c.parameters += info.numel();
    byDtype[dtypeName(info.dtype)] += info.numel();
  }
  namespace fs = std::filesystem;
  for (const auto& e : fs::directory_iterator(m.component(name)))
    if (e.path().extension() == ".safetensors")
      c.bytes += static_cast<qint64>(fs::file_size(e.path()));
  qint64 best = -1;
  for (const auto& [dt, n] : byDtype) {
    if (n > best) best = n, c.dtype = QString::fromStdString(dt);
    c.storage +=
        QStringLiteral("%1%2").arg(c.storage.isEmpty() ? "" : ", ", QString::fromStdString(dt));
  }
  return c;
}

}  // namespace

qint64 ModelInfo::totalParameters() const {
  qint64 n = 0;
  for (const auto& c : components) n += c.parameters;
  return n;
}

qint64 ModelInfo::totalBytes() const {
  qint64 n = 0;
  for (const auto& c : components) n += c.bytes;
  return n;
}

const ComponentSize* ModelInfo::component(const QString& name) const {
  for (const auto& c : components)
    if (c.name == name) return &c;
  return nullptr;
}

QString ModelInfo::summary() const {
  if (!ok) return error;
  QString s;
  if (!detected.isEmpty()) s += QStringLiteral("detected: %1\n").arg(detected);
  for (const auto& f : facts)
    if (f.key != "family") s += QStringLiteral("%1: %2\n").arg(f.label, f.value);
  for (const auto& c : components) {
    if (c.bytes == 0) continue;
    s += QStringLiteral("%1: %2 params, %3%4\n")
             .arg(c.name, formatCount(c.parameters), formatBytes(c.bytes),
                  c.storage.isEmpty() ? QString() : QStringLiteral(" %1").arg(c.storage));
    if (!detected.isEmpty()) s += QStringLiteral("  from %1\n").arg(c.source);
  }
  for (const auto& n : notes) s += n + QStringLiteral("\n");
  s += QStringLiteral("total %1 params; sizes step by %2 px (vae scale factor %3)")
           .arg(formatCount(totalParameters()))
           .arg(sizeMultiple())
           .arg(vae_scale_factor);
  return s;
}

ModelInfo readModelInfo(const QString& dirIn, const QString& configDir) {
  ModelSources src;
  src.model = dirIn.toStdString();
  src.config = configDir.toStdString();
  return readModelInfo(src);
}

ModelInfo readModelInfo(const ModelSources& sourcesIn) {
  ModelInfo info;
  const QString dirIn = QString::fromStdString(sourcesIn.model);
  info.path = QDir::cleanPath(dirIn);
  if (dirIn.trimmed().isEmpty()) {
    info.error = QStringLiteral("model folder %1 does not exist").arg(dirIn);
    return info;
  }
  try {
    // The worker's own reader: same checks, same messages (configs and headers only).
    ModelSources src = sourcesIn;
    src.model = info.path.toStdString();
    const ModelFolder m = ModelFolder::open(src);
    if (!m.components.empty() && m.components.at("transformer").single_file) {
      const CheckpointInfo ci = inspectCheckpoint(m.path);
      info.detected =
          QStringLiteral("%1 / %2%3")
              .arg(QString::fromStdString(ci.family), QString::fromStdString(ci.variant),
                   ci.scaled_fp8 ? QStringLiteral(" (scaled fp8)") : QString());
      for (const auto& n : m.notes) info.notes << QString::fromStdString(n);
    }
    // Everything family-specific comes from the family's record: its facts, its capabilities.
    const FamilySpec& family = familyOf(m);
    info.family = QString::fromStdString(family.display_name);
    info.capabilities = family.caps;
    for (const ModelFact& f : family.facts(m)) {
      info.facts << ModelInfo::Fact{QString::fromStdString(f.key), QString::fromStdString(f.label),
                                    QString::fromStdString(f.value)};
      // A diffusers folder's family (e.g. "FLUX.2 [klein], distilled") is what was detected.
      if (f.key == "family" && info.detected.isEmpty())
        info.detected = QString::fromStdString(f.value);
    }
    info.model_dims = m.dims();  // the family's declaration: sizes, plans, parameter table
    info.num_attention_heads = info.model_dims.num_attention_heads;
    info.attention_head_dim = info.model_dims.attention_head_dim;
    if (info.model_dims.parameters) {
      // A GGUF transformer keeps its weights in their stored types (Q4_K, ...): the advisor's
      // bytes per rank come from them (storedWeightBytesPerRank).
      bool gguf = false;
      const ParameterTable stored = withStoredTypes(m, *info.model_dims.parameters, &gguf);
      if (gguf) info.model_dims.parameters = std::make_shared<const ParameterTable>(stored);
    }
    info.vae_scale_factor = info.model_dims.vae_scale_factor;
    info.max_sequence_length = m.config->max_sequence_length;
    info.request = dit::requestSpecOf(m);
    if (!m.default_settings.empty()) {
      info.default_settings =
          QJsonDocument::fromJson(QByteArray::fromStdString(m.default_settings)).object();
      info.notes << QStringLiteral("model's default settings: %1")
                        .arg(QString::fromUtf8(
                            QJsonDocument(info.default_settings).toJson(QJsonDocument::Compact)));
    }
    // The components with weights, in the family's order: diffusers names a transformers-library
    // component's weights "model", a diffusers one's "diffusion_pytorch_model".
    for (const std::string& c : family.components) {
      if (c.rfind("tokenizer", 0) == 0 || c == "scheduler") continue;
      info.components << readComponent(
          m, c.c_str(), c.rfind("text_encoder", 0) == 0 ? "model" : "diffusion_pytorch_model");
    }
  } catch (const std::exception& e) {
    info.model_dims = {};
    info.error = QString::fromStdString(e.what());
    return info;
  }
  info.ok = true;
  return info;
}

dit::RequestSpec ModelInfo::anyModelRequest() {
  dit::RequestSpec s = dit::baseRequestSpec("this model", "the model's pipeline");
  for (const char* f : {"guidance", "negative_prompt"}) s.at(f).read = true;
  s.guider.requirement = "a model whose request runs CFG (none is read yet)";
  s.inputs = {true, true, true};
  return s;
}

dit::ResolvedRequest ModelInfo::resolve(const dit::protocol::GenerationParams& p) const {
  return dit::resolveRequest(request, dit::requestValues(p));
}

QString formatCount(qint64 n) {
  if (n >= 1000000000LL) return QString::number(n / 1e9, 'f', 2) + " B";
  if (n >= 1000000LL) return QString::number(n / 1e6, 'f', 2) + " M";
  if (n >= 1000LL) return QString::number(n / 1e3, 'f', 1) + " K";
  return QString::number(n);
}

QString formatBytes(qint64 b) {
  const double d = static_cast<double>(b);
  if (b >= (1LL << 30)) return QString::number(d / (1LL << 30), 'f', 2) + " GiB";
  if (b >= (1LL << 20)) return QString::number(d / (1LL << 20), 'f', 1) + " MiB";
  if (b >= (1LL << 10)) return QString::number(d / (1LL << 10), 'f', 1) + " KiB";
  return QString::number(b) + " B";
}

}  // namespace dit::ui
