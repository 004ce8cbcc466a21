#include "ui/worker_command.h"

#include <QCoreApplication>
#include <QDir>
#include <QRegularExpression>

namespace dit::ui {

QString LaunchCommand::display() const {
  static const QRegularExpression safe(QStringLiteral("^[A-Za-z0-9_./=:,+@%-]+$"));
  QStringList parts;
  for (const QString& a : QStringList{program} + arguments) {
    if (!a.isEmpty() && safe.match(a).hasMatch()) parts << a;
    else parts << "'" + QString(a).replace("'", "'\\''") + "'";
  }
  return parts.join(' ');
}

LaunchCommand buildLaunchCommand(const LaunchConfig& c) {
  const dit::Strategy& s = c.strategy;
  LaunchCommand cmd;
  cmd.program = c.mpirunPath.isEmpty() ? defaultMpirun() : c.mpirunPath;
  QStringList& a = cmd.arguments;
  a << "--allow-run-as-root" << "--oversubscribe" << "-np" << QString::number(s.world);
  if (!c.hostfile.trimmed().isEmpty()) a << "--hostfile" << c.hostfile.trimmed();
  a << "-x" << "OMP_NUM_THREADS=1";
  a << (c.workerPath.isEmpty() ? defaultWorkerPath() : c.workerPath);
  a << "--model" << c.modelDir;
  a << "--tp-degree" << QString::number(s.tp_degree);
  a << "--ring-degree" << QString::number(s.ring_degree);
  a << "--ulysses-degree" << QString::number(s.ulysses_degree);
  if (s.ulysses_anything) a << "--ulysses-anything";
  if (s.ring_anything) a << "--ring-anything";
  a << "--cfg-degree" << QString::number(s.cfg_degree);
  a << "--dp-degree" << QString::number(s.dp_degree);
  a << "--device" << QString::fromStdString(s.device.empty() ? std::string("cpu") : s.device);
  a << c.extraWorkerArgs;
  return cmd;
}

QString defaultMpirun() {
  const QString env = qEnvironmentVariable("DITSTUDIO_MPIRUN");
  return env.isEmpty() ? QStringLiteral("mpirun") : env;
}

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
  return QDir::cleanPath(QDir(exeDir).filePath(QStringLiteral("../share/ditstudio/models/tiny-flux")));
}

QString defaultModelDir() { return defaultModelDirFor(QCoreApplication::applicationDirPath()); }

}  // namespace dit::ui
