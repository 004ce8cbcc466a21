// Presets that record a placement plan (issue 47): the Advisor's "Plan for me" saves the plan it
// applied (the planner's JSON: strategy, components and their placement, memory per rank,
// reasons, rejected alternatives) in a preset; loading that preset on a machine with less memory
// (or fewer GPUs) says what no longer fits: which component, on which ranks, how much it needs
// against what a rank has here. Torch-free (the plan comes from backend/models/placement_planner).
#pragma once

#include <QJsonObject>
#include <QString>
#include <QStringList>
#include <cstdint>

#include "backend/models/placement_planner.h"
#include "ui/capabilities.h"
#include "ui/preset_store.h"

namespace dit::ui {

/// What this machine offers the ranks of a recorded plan.
struct MachineMemory {
  int ranks = 0;                 ///< GPUs here (CUDA plans); 0: not limited / not known
  uint64_t memory_per_rank = 0;  ///< bytes one rank may use here; 0: not known (nothing checked)
  QString what;                  ///< where the figure comes from, e.g. "GPU memory (nvidia-smi)"
};

/// The plan as a preset records it: planJson(plan) as a Qt object (bytes as numbers).
QJsonObject planRecord(const dit::Plan& plan);

/// A preset from an applied plan: `current`'s generation settings and model, the plan's
/// strategy, the plan recorded (Preset::plan) and a description with its message and reasons.
Preset presetFromPlan(const dit::Plan& plan, const Preset& current, const QString& name);

/// What no longer fits of a recorded plan (Preset::plan) on a machine offering `here`, one
/// sentence each: fewer GPUs than the plan's ranks; the peak per rank above this machine's usable
/// memory per rank (the plan's usable fraction of here.memory_per_rank), with the plan's
/// breakdown (weights per component, activations, attention, VAE decode), the shortfall and the
/// memory a rank would need (peak / usable fraction); every component whose weights alone exceed
/// a rank's usable memory here, else the largest one. Empty when it fits, when there is no plan,
/// or when here.memory_per_rank is 0 (unknown).
QStringList planShortfalls(const QJsonObject& plan, const MachineMemory& here);

/// This machine's memory for the plan's device: "cpu": MemAvailable (/proc/meminfo) divided by
/// the plan's ranks per host; "cuda": the GPU count of `caps` and each GPU's memory from
/// $DITSTUDIO_CUDA_MEMORY (a size such as "24G", for tests and remote launches) or else the
/// smallest memory.total nvidia-smi reports (0, unknown, when neither is there).
MachineMemory machineMemoryFor(const QJsonObject& plan, const Capabilities& caps);

}  // namespace dit::ui
