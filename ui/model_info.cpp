#include "ui/model_info.h"

#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QMap>
#include <QtEndian>

namespace dit::ui {
namespace {

bool readJson(const QString& path, QJsonObject* out, QString* error) {
  QFile f(path);
  if (!f.open(QIODevice::ReadOnly)) {
    *error = QStringLiteral("cannot read %1: %2").arg(path, f.errorString());
    return false;
  }
  QJsonParseError pe;
  const QJsonDocument doc = QJsonDocument::fromJson(f.readAll(), &pe);
  if (pe.error != QJsonParseError::NoError || !doc.isObject()) {
    *error = QStringLiteral("%1 is not a JSON object: %2").arg(path, pe.errorString());
    return false;
  }
  *out = doc.object();
  return true;
}

int dtypeBytes(const QString& dt) {
  if (dt == "F64" || dt == "I64" || dt == "U64") return 8;
  if (dt == "F32" || dt == "I32" || dt == "U32") return 4;
  if (dt == "F16" || dt == "BF16" || dt == "I16" || dt == "U16") return 2;
  return 1;
}

/// Adds one safetensors file's header to `c`. Returns false with `error` on a broken header.
bool addSafetensors(const QString& path, ComponentSize* c, QMap<QString, qint64>* byDtype,
                    QString* error) {
  QFile f(path);
  if (!f.open(QIODevice::ReadOnly)) {
    *error = QStringLiteral("cannot read %1: %2").arg(path, f.errorString());
    return false;
  }
  c->bytes += f.size();
  const QByteArray head = f.read(8);
  if (head.startsWith("version ")) {
    *error = QStringLiteral("%1 is a git-lfs pointer, not the weights (run git lfs pull)").arg(path);
    return false;
  }
  if (head.size() != 8) {
    *error = QStringLiteral("%1 is truncated").arg(path);
    return false;
  }
  const quint64 n = qFromLittleEndian<quint64>(head.constData());
  if (n == 0 || n > quint64(f.size()) - 8 || n > (100u << 20)) {
    *error = QStringLiteral("%1: header length %2 is past the end of the file").arg(path).arg(n);
    return false;
  }
  QJsonParseError pe;
  const QJsonDocument doc = QJsonDocument::fromJson(f.read(qint64(n)).trimmed(), &pe);
  if (!doc.isObject()) {
    *error = QStringLiteral("%1: unreadable header: %2").arg(path, pe.errorString());
    return false;
  }
  const QJsonObject o = doc.object();
  for (auto it = o.begin(); it != o.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const QJsonObject t = it.value().toObject();
    qint64 count = 1;
    for (const QJsonValue& d : t.value("shape").toArray()) count *= d.toInteger();
    c->parameters += count;
    (*byDtype)[t.value("dtype").toString()] += count;
  }
  return true;
}

ComponentSize readComponent(const QString& dir, const QString& name, QString* error) {
  ComponentSize c;
  c.name = name;
  QMap<QString, qint64> byDtype;
  const QDir d(QDir(dir).filePath(name));
  const QStringList files = d.entryList({"*.safetensors"}, QDir::Files, QDir::Name);
  for (const QString& f : files) {
    if (!addSafetensors(d.filePath(f), &c, &byDtype, error)) break;
  }
  qint64 best = -1;
  for (auto it = byDtype.begin(); it != byDtype.end(); ++it) {
    if (it.value() > best) {
      best = it.value();
      c.dtype = it.key();
    }
  }
  if (c.parameters == 0 && c.bytes > 0) c.parameters = c.bytes / dtypeBytes(c.dtype);
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

dit::ModelDims ModelInfo::dims() const {
  dit::ModelDims m;
  m.num_attention_heads = num_attention_heads;
  m.attention_head_dim = attention_head_dim;
  m.mlp_ratio_hidden = innerDim() * 4;  // FLUX.1 mlp_ratio 4.0 (diffusers constructor)
  m.joint_attention_dim = joint_attention_dim;
  m.vae_scale_factor = vae_scale_factor;
  return m;
}

QString ModelInfo::summary() const {
  if (!ok) return error;
  QString s = QStringLiteral("%1 double + %2 single blocks, %3 heads x %4 head dim (inner %5)\n")
                  .arg(num_layers)
                  .arg(num_single_layers)
                  .arg(num_attention_heads)
                  .arg(attention_head_dim)
                  .arg(innerDim());
  for (const auto& c : components) {
    if (c.bytes == 0) continue;
    s += QStringLiteral("%1: %2 params, %3%4\n")
             .arg(c.name, formatCount(c.parameters), formatBytes(c.bytes),
                  c.dtype.isEmpty() ? QString() : QStringLiteral(" %1").arg(c.dtype));
  }
  s += QStringLiteral("total %1 params; sizes step by %2 px (vae scale factor %3)")
           .arg(formatCount(totalParameters()))
           .arg(sizeMultiple())
           .arg(vae_scale_factor);
  return s;
}

ModelInfo readModelInfo(const QString& dirIn) {
  ModelInfo info;
  info.path = QDir::cleanPath(dirIn);
  const QDir dir(info.path);
  if (dirIn.trimmed().isEmpty() || !dir.exists()) {
    info.error = QStringLiteral("model folder %1 does not exist").arg(dirIn);
    return info;
  }
  if (!QFileInfo::exists(dir.filePath("model_index.json"))) {
    info.error = QStringLiteral("%1 is not a diffusers model folder (no model_index.json)").arg(info.path);
    return info;
  }
  QJsonObject tc;
  if (!readJson(dir.filePath("transformer/config.json"), &tc, &info.error)) return info;
  info.num_layers = tc.value("num_layers").toInt(19);
  info.num_single_layers = tc.value("num_single_layers").toInt(38);
  info.num_attention_heads = tc.value("num_attention_heads").toInt(24);
  info.attention_head_dim = tc.value("attention_head_dim").toInt(128);
  info.joint_attention_dim = tc.value("joint_attention_dim").toInt(4096);
  info.in_channels = tc.value("in_channels").toInt(64);
  info.guidance_embeds = tc.value("guidance_embeds").toBool(false);
  QJsonObject vc;
  if (!readJson(dir.filePath("vae/config.json"), &vc, &info.error)) return info;
  const int nBlocks = vc.value("block_out_channels").toArray().size();
  info.vae_scale_factor = nBlocks > 0 ? (1 << (nBlocks - 1)) : 8;
  info.vae_sample_size = vc.value("sample_size").toInt(0);
  QJsonObject t2;
  QString ignored;
  if (readJson(dir.filePath("tokenizer_2/tokenizer_config.json"), &t2, &ignored)) {
    const int len = t2.value("model_max_length").toInt(512);
    if (len > 0 && len < 512) info.max_sequence_length = len;
  }
  for (const char* name : {"transformer", "text_encoder", "text_encoder_2", "vae"}) {
    QString err;
    info.components << readComponent(info.path, name, &err);
    if (!err.isEmpty()) {
      info.error = err;
      return info;
    }
  }
  if (info.component("transformer")->bytes == 0) {
    info.error = QStringLiteral("%1/transformer has no .safetensors weights").arg(info.path);
    return info;
  }
  info.ok = true;
  return info;
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
