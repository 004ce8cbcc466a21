// The mpirun command line that starts the worker process group (built by
// dit::protocol::mpirunArgv, the CLI's builder too), and lookup of the sibling programs and the
// embedded default model. Pure functions (plus environment reads).
#pragma once

#include <QString>
#include <QStringList>
#include <string>
#include <vector>

#include "app/launcher/group_start.h"
#include "app/launcher/launch.h"
#include "app/protocol/run_options.h"
#include "parallel/strategy.h"
#include "ui/model_sources.h"

namespace dit::ui {

/// Network and ssh settings of a hostfile group (docs/multi-host.md); ignored without a
/// hostfile (a single-host group stays on loopback). Saved in presets.
struct HostSettings {
  QString networkInterface;  ///< interfaces or CIDR subnets for MPI traffic, e.g. 10.0.0.0/24
  QString portRange;         ///< "MIN-MAX" TCP ports for the ranks' MPI traffic; empty = any
  QString sshOptions;        ///< extra ssh options, e.g. "-i ~/.ssh/cluster -p 2222"
  QString mpirunArgs;        ///< extra mpirun arguments, whitespace-separated
  bool operator==(const HostSettings&) const = default;
};

/// What the controller needs to start a process group.
struct LaunchConfig {
  dit::Strategy strategy;      ///< world = mpirun -np; degrees become the worker's strategy flags
  QString modelDir;            ///< --model
  ModelComponents components;  ///< --config, --vae, --text-encoder, ... (those given)
  QString hostfile;            ///< optional mpirun --hostfile
  HostSettings hosts;          ///< network/ssh settings, used with a hostfile only
  /// --vae-tiling, --text-encoder-placement, --prompt-cache (app/protocol/run_options.h)
  dit::protocol::RunOptions run;
  QString workerPath;           ///< ditstudio-worker executable (empty: defaultWorkerPath())
  QString mpirunPath;           ///< mpirun executable (empty: defaultMpirun())
  QStringList extraWorkerArgs;  ///< appended after the strategy flags (e.g. "--dtype", "float32")
};

/// A program and its arguments.
struct LaunchCommand {
  QString program;
  QStringList arguments;
  /// Shell-quoted command line for the log.
  QString display() const;
};

/// What dit::launcher::mpirunArgv and the hostfile pre-flight (checkHostGroup) need for
/// `config`: its strategy, hostfile and host settings, the worker (defaultWorkerPath() when
/// empty) and ditstudio-isolate beside it. Never throws.
dit::launcher::MpirunLaunch mpirunLaunch(const LaunchConfig& config);

/// The window's group as dit_launcher's one group start takes it (launcher::prepareGroup, the
/// CLI's and the server's too): mpirunLaunch(config), the model and component paths the
/// pre-flight fingerprints, and OMP_NUM_THREADS=1 for mpirun. Never throws.
dit::launcher::GroupSpec groupSpec(const LaunchConfig& config);

/// A command from an argv (argv[0] the program; an empty argv gives an empty command).
LaunchCommand launchCommand(const std::vector<std::string>& argv);

/// dit::protocol::mpirunArgv with Qt types: `[ditstudio-isolate] mpirun --allow-run-as-root
/// --oversubscribe -np N ... -x OMP_NUM_THREADS=1 <worker> --model DIR <protocol::strategyArgs>
/// [--config DIR --vae PATH ... (the components given)] [extra args]` for one host; with a
/// hostfile, the hostfile form of mpirunArgv with `hosts`' interface, port range, ssh options and
/// mpirun arguments. Throws std::invalid_argument for world < 1 or a malformed port range.
LaunchCommand buildLaunchCommand(const LaunchConfig& config);

/// $DITSTUDIO_MPIRUN if set, else "mpirun" (dit::protocol::defaultMpirun).
QString defaultMpirun();
/// `<directory of the running executable>/<name>`.
QString siblingExecutable(const QString& name);
/// $DITSTUDIO_WORKER if set, else siblingExecutable("ditstudio-worker").
QString defaultWorkerPath();
/// The embedded default model, with the worker/CLI lookup: $DITSTUDIO_MODEL_DIR if set, else
/// `<exe dir>/../share/ditstudio/models/tiny-flux` (the build tree mirrors the install layout).
QString defaultModelDir();
/// Same lookup relative to an explicit executable directory (for tests).
QString defaultModelDirFor(const QString& exeDir);

}  // namespace dit::ui
