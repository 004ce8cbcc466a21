// ditstudio: the desktop GUI (Qt 6 Widgets). Never links Torch or MPI: it starts
// `mpirun -np N ditstudio-worker ...` through QProcess (see app/PROTOCOL.md).
//
//   ditstudio [--model DIR|FILE [--vae P ...]]     open the window (the component flags are
//                                                   ditstudio-cli's: --config, --vae, ...)
//   ditstudio --headless [--model DIR|FILE ...]     no window: the default generation via
//                                                   ditstudio-cli, written to ditstudio-output.png
//   ditstudio --screenshot FILE --auto-generate     start the worker, generate once, wait for the
//                                                   image, grab the window to FILE, quit
// Without a display (DISPLAY, WAYLAND_DISPLAY and QT_QPA_PLATFORM all unset) it prints a notice and
// behaves as --headless; with --screenshot it renders offscreen instead.
#include <unistd.h>

#include <QApplication>
#include <QCoreApplication>
#include <QDir>
#include <QFileInfo>
#include <QTimer>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "ui/generation_params.h"
#include "ui/main_window.h"
#include "ui/model_info.h"
#include "ui/model_sources.h"
#include "ui/theme.h"
#include "ui/worker_command.h"

namespace {

struct Args {
  bool headless = false;
  bool autoGenerate = false;
  bool help = false;
  QString model;
  /// --config, --vae, --text-encoder, --text-encoder-2, --tokenizer, --tokenizer-2 (as
  /// ditstudio-cli's): the components the model lacks.
  dit::ui::ModelComponents components;
  QString screenshot;
  QString bad;
};

Args parseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto value = [&](QString* out) {
      if (i + 1 < argc)
        *out = QString::fromLocal8Bit(argv[++i]);
      else
        a.bad = QString::fromStdString(s) + " needs a value";
    };
    if (s == "--headless")
      a.headless = true;
    else if (s == "--auto-generate")
      a.autoGenerate = true;
    else if (s == "--model")
      value(&a.model);
    else if (s.rfind("--model=", 0) == 0)
      a.model = QString::fromLocal8Bit(argv[i] + 8);
    else if (s == "--screenshot")
      value(&a.screenshot);
    else if (s.rfind("--screenshot=", 0) == 0)
      a.screenshot = QString::fromLocal8Bit(argv[i] + 13);
    else if (s == "-h" || s == "--help")
      a.help = true;
    else
      for (const auto& f : dit::ui::ModelComponents::fields()) {
        const std::string flag = f.flag;
        if (s == flag)
          value(&(a.components.*f.member));
        else if (s.rfind(flag + "=", 0) == 0)
          a.components.*f.member = QString::fromLocal8Bit(argv[i] + flag.size() + 1);
      }
    // Anything else (Qt's own -platform, -style, ...) is left to QApplication.
  }
  return a;
}

const char kUsage[] =
    "usage: ditstudio [--model DIR|FILE [--config DIR --vae P --text-encoder P --text-encoder-2 P\n"
    "                 --tokenizer DIR --tokenizer-2 DIR]] [--headless]\n"
    "                 [--screenshot FILE [--auto-generate]]\n"
    "  --model DIR|FILE   diffusers folder, single transformer file or GGUF (default:\n"
    "                     $DITSTUDIO_MODEL_DIR or the embedded model)\n"
    "  --config DIR, --vae P, --text-encoder P, --text-encoder-2 P, --tokenizer DIR,\n"
    "  --tokenizer-2 DIR  the components the model lacks, as ditstudio-cli takes them\n"
    "  --headless         no window: run the default generation with ditstudio-cli into\n"
    "                     ditstudio-output.png, or -2, -3, ... if taken (also without a display)\n"
    "  --screenshot FILE  grab the window to FILE (with --auto-generate: after one image)\n"
    "  --auto-generate    start the worker group and generate once, then quit\n"
    "Environment: DITSTUDIO_MPIRUN (mpirun path), DITSTUDIO_WORKER, DITSTUDIO_MODEL_DIR,\n"
    "             DITSTUDIO_DATA_DIR (presets, history, images).\n";

bool noDisplay() {
  return qEnvironmentVariableIsEmpty("DISPLAY") && qEnvironmentVariableIsEmpty("WAYLAND_DISPLAY") &&
         qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM");
}

/// Replaces this process with ditstudio-cli running the GUI's default generation.
int runHeadless(int argc, char** argv, const Args& args) {
  QCoreApplication app(argc, argv);
  const QString cli = dit::ui::siblingExecutable(QStringLiteral("ditstudio-cli"));
  const QString model = args.model.isEmpty() ? dit::ui::defaultModelDir() : args.model;
  dit::ui::GenerationParams p = dit::ui::startingParams();
  // The model's recommended settings, as the window applies them (GenerationPanel::applyModel).
  const dit::ui::ModelInfo info =
      dit::ui::readModelInfo(dit::ui::ModelSourcePaths{model, args.components}.toSources());
  if (info.ok) {
    QString problem;
    p = dit::ui::withModelDefaults(info.default_settings, p, &problem);
    if (!problem.isEmpty())
      std::fprintf(stderr, "ditstudio: the model's default settings were not applied: %s\n",
                   problem.toUtf8().constData());
  }
  // Never overwrite an earlier image: ditstudio-output.png, else ditstudio-output-2.png, -3, ...
  QString output = QStringLiteral("ditstudio-output.png");
  for (int n = 2; QFileInfo::exists(output); ++n)
    output = QStringLiteral("ditstudio-output-%1.png").arg(n);
  QStringList cliArgs = {cli,
                         QStringLiteral("--model"),
                         model,
                         QStringLiteral("--prompt"),
                         QString::fromStdString(p.prompt),
                         QStringLiteral("--width"),
                         QString::number(p.width),
                         QStringLiteral("--height"),
                         QString::number(p.height),
                         QStringLiteral("--steps"),
                         QString::number(p.steps),
                         QStringLiteral("--guidance"),
                         QString::number(p.guidance),
                         QStringLiteral("--seed"),
                         QString::number(p.seed),
                         QStringLiteral("--output"),
                         output};
  cliArgs << args.components.workerArgs();
  if (p.hasNegativePrompt())
    cliArgs << QStringLiteral("--negative-prompt") << QString::fromStdString(p.negative_prompt);
  for (const auto& [name, value] : p.options)  // the family's knobs (the model's settings)
    cliArgs << QStringLiteral("--set")
            << QString::fromStdString(name) + QLatin1Char('=') + QString::number(value, 'g', 17);
  std::fprintf(stderr, "ditstudio: running headless: %s\n",
               dit::ui::LaunchCommand{cli, cliArgs.mid(1)}.display().toLocal8Bit().constData());
  std::vector<std::string> store;
  for (const QString& s : cliArgs) store.push_back(s.toStdString());
  std::vector<char*> cargv;
  for (std::string& s : store) cargv.push_back(s.data());
  cargv.push_back(nullptr);
  std::fflush(nullptr);
  ::execv(cargv[0], cargv.data());
  std::fprintf(stderr, "ditstudio: cannot run %s: %s\n", cargv[0], std::strerror(errno));
  return 127;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parseArgs(argc, argv);
  if (args.help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (!args.bad.isEmpty()) {
    std::fprintf(stderr, "ditstudio: %s\n%s", args.bad.toLocal8Bit().constData(), kUsage);
    return 2;
  }
  if (args.headless) return runHeadless(argc, argv, args);
  if (noDisplay()) {
    if (args.screenshot.isEmpty()) {
      std::fprintf(
          stderr,
          "ditstudio: no display (DISPLAY, WAYLAND_DISPLAY and QT_QPA_PLATFORM are unset); "
          "running the default generation headless instead (use xvfb-run or "
          "QT_QPA_PLATFORM=offscreen for the window).\n");
      return runHeadless(argc, argv, args);
    }
    std::fprintf(stderr,
                 "ditstudio: no display; rendering the window offscreen for the screenshot.\n");
    qputenv("QT_QPA_PLATFORM", "offscreen");
  }

  QApplication app(argc, argv);
  QApplication::setApplicationName(QStringLiteral("ditstudio"));
  QApplication::setApplicationDisplayName(QStringLiteral("DiT Studio"));
  QApplication::setApplicationVersion(QStringLiteral("0.1.0"));
  QApplication::setDesktopFileName(QStringLiteral("ditstudio"));
  QApplication::setWindowIcon(QIcon(QStringLiteral(":/ditstudio/icons/ditstudio.png")));
  dit::ui::applyDarkTheme(app);

  dit::ui::MainWindowOptions opts;
  opts.modelDir = args.model;
  opts.components = args.components;
  dit::ui::MainWindow window(opts);
  window.show();

  int exitCode = 0;
  if (args.autoGenerate) {
    // Unattended runs: mirror the group's log and state to stderr.
    QObject::connect(
        window.controller(), &dit::ui::WorkerController::logLine, &app,
        [](int rank, const QString& level, const QString& message) {
          std::fprintf(
              stderr, "[%s] %s: %s\n",
              rank < 0 ? "mpirun" : QStringLiteral("rank %1").arg(rank).toLocal8Bit().constData(),
              level.toLocal8Bit().constData(), message.toLocal8Bit().constData());
        });
    QObject::connect(window.controller(), &dit::ui::WorkerController::stateChanged, &app,
                     [](dit::ui::WorkerController::State s) {
                       std::fprintf(
                           stderr, "ditstudio: group %s\n",
                           dit::ui::WorkerController::stateName(s).toLocal8Bit().constData());
                     });
  }
  if (!args.screenshot.isEmpty() && args.autoGenerate) {
    QObject::connect(&window, &dit::ui::MainWindow::autoGenerateFinished, &app,
                     [&](bool ok, const QString& message) {
                       std::fprintf(ok ? stdout : stderr, "ditstudio: %s\n",
                                    message.toLocal8Bit().constData());
                       exitCode = ok ? 0 : 1;
                       window.close();  // stops the worker group, then the last window closes
                     });
    QTimer::singleShot(300, &window, [&] { window.autoGenerate(args.screenshot); });
  } else if (!args.screenshot.isEmpty()) {
    QTimer::singleShot(1000, &window, [&] {
      const bool ok = window.grab().save(args.screenshot);
      std::fprintf(ok ? stdout : stderr, "ditstudio: screenshot %s %s\n",
                   args.screenshot.toLocal8Bit().constData(),
                   ok ? "written" : "could not be written");
      exitCode = ok ? 0 : 1;
      window.close();
    });
  } else if (args.autoGenerate) {
    QTimer::singleShot(300, &window, [&] { window.generate(); });
  }
  const int rc = app.exec();
  return exitCode != 0 ? exitCode : rc;
}
