#include "ui/capabilities.h"

#include <QDir>
#include <QFileInfo>

#ifndef DITSTUDIO_CUDA_BUILD
#define DITSTUDIO_CUDA_BUILD 0
#endif

namespace dit::ui {

Capabilities currentCapabilities() {
  Capabilities c;
  c.cudaBuild = DITSTUDIO_CUDA_BUILD != 0;
  bool ok = false;
  const int build = qEnvironmentVariableIntValue("DITSTUDIO_CUDA_BUILD", &ok);
  if (ok) c.cudaBuild = build != 0;
  const int devices = qEnvironmentVariableIntValue("DITSTUDIO_CUDA_DEVICES", &ok);
  if (ok) {
    c.cudaDevices = std::max(0, devices);
  } else {
    const QStringList nodes =
        QDir(QStringLiteral("/dev")).entryList({QStringLiteral("nvidia[0-9]*")}, QDir::System);
    c.cudaDevices = static_cast<int>(nodes.size());
  }
  return c;
}

QStringList capabilityIssues(const dit::Strategy& s, const Capabilities& caps, bool hasHostfile) {
  QStringList out;
  if (s.device == "cuda") {
    if (!caps.cudaBuild)
      out << QStringLiteral(
          "device cuda: this build of DiT Studio has no CUDA (its LibTorch is CPU-only); use "
          "device cpu, or a build with CUDA LibTorch");
    else if (!hasHostfile && caps.cudaDevices == 0)
      out << QStringLiteral("device cuda: no NVIDIA GPU on this machine (no /dev/nvidia0)");
  }
  return out;
}

}  // namespace dit::ui
