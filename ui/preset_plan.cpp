#include "ui/preset_plan.h"

#include <QJsonArray>
#include <QJsonDocument>
#include <QProcess>
#include <algorithm>
#include <cmath>
#include <exception>
#include <nlohmann/json.hpp>
#include <string>

#include "backend/models/memory_estimate.h"
#include "backend/models/text_encoder_placement.h"

namespace dit::ui {

namespace {

uint64_t bytesOf(const QJsonObject& o, const char* key) {
  const double v = o.value(QLatin1String(key)).toDouble(0);
  return v > 0 ? static_cast<uint64_t>(std::llround(v)) : 0;
}

QString fmt(uint64_t b) { return QString::fromStdString(dit::formatBytes(b)); }

QString rankRange(int n) {
  return n <= 1 ? QStringLiteral("the rank") : QStringLiteral("each of ranks 0-%1").arg(n - 1);
}

// nvidia-smi's smallest memory.total in bytes (0 when it is not there or says nothing).
uint64_t nvidiaSmiMemory() {
  QProcess p;
  p.start(QStringLiteral("nvidia-smi"), {QStringLiteral("--query-gpu=memory.total"),
                                         QStringLiteral("--format=csv,noheader,nounits")});
  if (!p.waitForFinished(3000) || p.exitStatus() != QProcess::NormalExit || p.exitCode() != 0)
    return 0;
  uint64_t least = 0;
  for (const QString& line : QString::fromUtf8(p.readAllStandardOutput()).split('\n')) {
    bool ok = false;
    const double mib = line.trimmed().toDouble(&ok);
    if (ok && mib > 0) {
      const uint64_t b = static_cast<uint64_t>(mib * 1024.0 * 1024.0);
      least = least == 0 ? b : std::min(least, b);
    }
  }
  return least;
}

}  // namespace

QJsonObject planRecord(const dit::Plan& plan) {
  return QJsonDocument::fromJson(QByteArray::fromStdString(dit::planJson(plan).dump())).object();
}

Preset presetFromPlan(const dit::Plan& plan, const Preset& current, const QString& name) {
  Preset p = current;
  p.name = name;
  p.builtin = false;
  p.strategy = plan.strategy;
  // The group runs the text encoder where the plan placed it.
  p.run.text_encoder_placement = dit::textEncoderPlacementName(plan.text_encoder);
  p.plan = planRecord(plan);
  QStringList lines{QString::fromStdString(plan.message)};
  for (const std::string& r : plan.reasons) lines << QString::fromStdString(r);
  for (const dit::ComponentPlacement& c : plan.components)
    lines << QString::fromStdString(c.component + ": " + c.reason);
  p.description = lines.join('\n');
  return p;
}

QStringList planShortfalls(const QJsonObject& plan, const MachineMemory& here) {
  QStringList out;
  if (plan.isEmpty() || !plan.value("fits").toBool()) return out;
  const QJsonObject ranks = plan.value("ranks").toObject();
  const QJsonObject mem = plan.value("memory_per_rank").toObject();
  const int count = ranks.value("count").toInt(1);
  const QString device = ranks.value("device").toString();
  const QString model = plan.value("model").toString();
  if (device == QLatin1String("cuda") && here.ranks > 0 && here.ranks < count)
    out << QStringLiteral("the plan for %1 places %2 ranks, one per GPU; this machine has %3 GPU%4")
               .arg(model)
               .arg(count)
               .arg(here.ranks)
               .arg(here.ranks == 1 ? "" : "s");
  if (here.memory_per_rank == 0) return out;
  const double fraction = ranks.value("usable_fraction").toDouble(0.9);
  const uint64_t usable =
      static_cast<uint64_t>(static_cast<double>(here.memory_per_rank) * fraction);
  const uint64_t peak = bytesOf(mem, "peak");
  if (peak <= usable) return out;
  const QString usableText = QStringLiteral("%1 usable (%2% of %3 %4)")
                                 .arg(fmt(usable))
                                 .arg(std::lround(fraction * 100))
                                 .arg(fmt(here.memory_per_rank), here.what);
  const uint64_t needs =
      static_cast<uint64_t>(std::ceil(static_cast<double>(peak) / std::max(fraction, 0.01)));
  out << QStringLiteral(
             "%1 of the plan (%2, recorded on ranks of %3) needs a peak of %4: weights %5 + "
             "max(activations %6 + attention %7, VAE decode %8 at %9x%10); this machine gives a "
             "rank %11: %12 short (a rank needs at least %13)")
             .arg(rankRange(count), plan.value("strategy").toObject().value("describe").toString(),
                  fmt(bytesOf(ranks, "memory_per_rank")), fmt(peak), fmt(bytesOf(mem, "weights")),
                  fmt(bytesOf(mem, "activations")), fmt(bytesOf(mem, "attention")),
                  fmt(bytesOf(mem, "vae_decode")))
             .arg(plan.value("request").toObject().value("width").toInt())
             .arg(plan.value("request").toObject().value("height").toInt())
             .arg(usableText, fmt(peak - usable), fmt(needs));
  // Which component no longer fits: every one whose weights alone exceed a rank's usable
  // memory here; otherwise the largest, which the rest no longer fits beside.
  const QJsonArray comps = plan.value("components").toArray();
  bool alone = false;
  QJsonObject largest;
  for (const QJsonValue& v : comps) {
    const QJsonObject c = v.toObject();
    const uint64_t w = bytesOf(c, "weights_per_rank");
    if (w > usable) {
      alone = true;
      out << QStringLiteral("the %1 alone (%2 per rank, %3) no longer fits a rank's %4")
                 .arg(c.value("component").toString(), fmt(w), c.value("placement").toString(),
                      fmt(usable));
    }
    if (largest.isEmpty() || w > bytesOf(largest, "weights_per_rank")) largest = c;
  }
  if (!alone && !largest.isEmpty()) {
    const uint64_t w = bytesOf(largest, "weights_per_rank");
    const uint64_t weights = bytesOf(mem, "weights");
    out << (weights > usable
                ? QStringLiteral("the weights together (%1) exceed a rank's %2; the largest is "
                                 "the %3 (%4 per rank, %5)")
                      .arg(fmt(weights), fmt(usable), largest.value("component").toString(), fmt(w),
                           largest.value("placement").toString())
                : QStringLiteral("the weights (%1; the largest the %2, %3 per rank) fit a "
                                 "rank's %4, but not with the request's working memory (%5 more)")
                      .arg(fmt(weights), largest.value("component").toString(), fmt(w), fmt(usable),
                           fmt(peak - weights)));
  }
  return out;
}

MachineMemory machineMemoryFor(const QJsonObject& plan, const Capabilities& caps) {
  MachineMemory m;
  const QJsonObject ranks = plan.value("ranks").toObject();
  if (ranks.value("device").toString() == QLatin1String("cpu")) {
    const int perHost = std::max(1, ranks.value("ranks_per_host").toInt(1));
    if (const auto avail = dit::hostMemoryAvailable()) {
      m.memory_per_rank = *avail / static_cast<uint64_t>(perHost);
      m.what = perHost > 1 ? QStringLiteral("host memory (MemAvailable / %1 ranks)").arg(perHost)
                           : QStringLiteral("host memory (MemAvailable)");
    }
    return m;
  }
  m.ranks = caps.cudaDevices;
  const QString env = qEnvironmentVariable("DITSTUDIO_CUDA_MEMORY");
  if (!env.isEmpty()) {
    try {
      m.memory_per_rank = dit::parseMemorySize(env.toStdString());
      m.what = QStringLiteral("GPU memory ($DITSTUDIO_CUDA_MEMORY)");
    } catch (const std::exception&) {
      m.memory_per_rank = 0;
    }
    return m;
  }
  if (caps.cudaDevices > 0) {
    static const uint64_t smi = nvidiaSmiMemory();  // asked once: the preset list asks often
    m.memory_per_rank = smi;
    m.what = QStringLiteral("GPU memory (nvidia-smi)");
  }
  return m;
}

}  // namespace dit::ui
