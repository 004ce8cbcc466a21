#include "ui/worker_command.h"

#include <QCoreApplication>
#include <QDir>
#include <QFileInfo>

#include "app/launcher/launch.h"

namespace dit::ui {

namespace {
std::vector<std::string> toStd(const QStringList& l) {
  std::vector<std::string> out;
  for (const QString& a : l) out.push_back(a.toStdString());
  return out;
}
}  // namespace

QString LaunchCommand::display() const {
  return QString::fromStdString(
      dit::launcher::shellQuoted(toStd(QStringList{program} + arguments)));
}

dit::launcher::MpirunLaunch mpirunLaunch(const LaunchConfig& c) {
  dit::launcher::MpirunLaunch l;
  l.mpirun = c.mpirunPath.toStdString();
  l.strategy = c.strategy;
  l.hostfile = c.hostfile.toStdString();
  l.worker = (c.workerPath.isEmpty() ? defaultWorkerPath() : c.workerPath).toStdString();
  l.model = c.modelDir.toStdString();
  l.extra_worker_args = toStd(c.components.workerArgs() + c.extraWorkerArgs);
  for (const std::string& a : dit::protocol::runOptionArgs(c.run)) l.extra_worker_args.push_back(a);
  l.network_interface = c.hosts.networkInterface.trimmed().toStdString();
  l.port_range = c.hosts.portRange.trimmed().toStdString();
  l.ssh_options = c.hosts.sshOptions.trimmed().toStdString();
  l.extra_mpirun_args = c.hosts.mpirunArgs.trimmed().toStdString();
  l.isolate = dit::launcher::isolationProgram(
      QFileInfo(QString::fromStdString(l.worker)).absolutePath().toStdString());
  return l;
}

dit::launcher::GroupSpec groupSpec(const LaunchConfig& c) {
  dit::launcher::GroupSpec spec;
  spec.launch = mpirunLaunch(c);
  spec.model_paths =
      dit::launcher::modelSourcePaths(spec.launch.model, spec.launch.extra_worker_args);
  spec.env = {{"OMP_NUM_THREADS", "1"}};
  return spec;
}

LaunchCommand launchCommand(const std::vector<std::string>& argv) {
  LaunchCommand cmd;
  if (argv.empty()) return cmd;
  cmd.program = QString::fromStdString(argv.front());
  for (size_t i = 1; i < argv.size(); ++i) cmd.arguments << QString::fromStdString(argv[i]);
  return cmd;
}

LaunchCommand buildLaunchCommand(const LaunchConfig& c) {
  return launchCommand(dit::launcher::mpirunArgv(mpirunLaunch(c)));
}

QString defaultMpirun() { return QString::fromStdString(dit::launcher::defaultMpirun()); }

QString siblingExecutable(const QString& name) {
  return QDir(QCoreApplication::applicationDirPath()).filePath(name);
}

QString defaultWorkerPath() {
  const QString env = qEnvironmentVariable("DITSTUDIO_WORKER");
  return env.isEmpty() ? siblingExecutable(QStringLiteral("ditstudio-worker")) : env;
}

QString defaultModelDirFor(const QString& exeDir) {
  const QString env = qEnvironmentVariable("DITSTUDIO_MODEL_DIR");
  if (!env.isEmpty()) return env;
  return QDir::cleanPath(
      QDir(exeDir).filePath(QStringLiteral("../share/ditstudio/models/tiny-flux")));
}

QString defaultModelDir() { return defaultModelDirFor(QCoreApplication::applicationDirPath()); }

}  // namespace dit::ui
