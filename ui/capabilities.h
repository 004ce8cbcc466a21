// What this build and this machine can run, checked before a preset, the Advisor's advice or the
// editor's strategy shows as valid (a CUDA strategy on a CPU-only build used to fail only after
// mpirun had started).
#pragma once

#include <QString>
#include <QStringList>

#include "parallel/strategy.h"

namespace dit::ui {

/// The build's and the machine's devices.
struct Capabilities {
  bool cudaBuild = false;  ///< the worker's LibTorch has CUDA (known at build time)
  int cudaDevices = 0;     ///< NVIDIA devices on this machine (/dev/nvidia0, /dev/nvidia1, ...)
};

/// This build and machine. $DITSTUDIO_CUDA_BUILD (0/1) and $DITSTUDIO_CUDA_DEVICES (a count)
/// override the detection (tests, and a GUI that launches on other hosts through a hostfile).
Capabilities currentCapabilities();

/// Why `s` cannot run here, in the worker's style of sentence; empty when it can. With a hostfile
/// the ranks run elsewhere: only the build is checked, not this machine's devices.
QStringList capabilityIssues(const dit::Strategy& s, const Capabilities& caps,
                             bool hasHostfile = false);

}  // namespace dit::ui
