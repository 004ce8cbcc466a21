// The main window: left = generation panel / strategy editor / presets (tabs), center = why
// Generate is disabled + error banner + gallery (current image or live preview, progress,
// history, compare), right = memory chart / log / queue tabs, the per-rank monitor below; a menu
// bar listing every action with its shortcut, the toolbar with Start/Stop/Restart/Generate/
// Cancel; status bar with the group state; progress in the window title. It opens sized to the
// screen it is on and restores its geometry, splitters and last settings. All work runs in the
// worker process group; the window never blocks.
#pragma once

#include <QMainWindow>
#include <QPointer>
#include <QSet>
#include <memory>

#include "ui/api_serve.h"
#include "ui/capabilities.h"
#include "ui/gallery.h"
#include "ui/generation_panel.h"
#include "ui/history_store.h"
#include "ui/log_panel.h"
#include "ui/model_sources.h"
#include "ui/preset_panel.h"
#include "ui/preset_store.h"
#include "ui/prompt_history.h"
#include "ui/queue_model.h"
#include "ui/rank_monitor.h"
#include "ui/rank_monitor_model.h"
#include "ui/strategy_editor.h"
#include "ui/taskbar_progress.h"
#include "ui/validation.h"
#include "ui/worker_controller.h"

class QAction;
class QFrame;
class QLabel;
class QListView;
class QMenu;
class QPushButton;
class QScrollArea;
class QSplitter;
class QTabWidget;

namespace dit {
struct Plan;
}  // namespace dit

namespace dit::ui {

class AdvisorDialog;
class ElidedLabel;

/// Construction options (tests point them at temporary folders and the built worker).
struct MainWindowOptions {
  QString dataDir;   ///< presets, history, session and images; empty: appDataDir()
  QString modelDir;  ///< overrides the session's model; empty: session, else defaultModelDir()
  /// With modelDir: its components (the program's --config, --vae, --text-encoder, ...).
  ModelComponents components;
  QString workerPath;          ///< empty: defaultWorkerPath()
  QString mpirunPath;          ///< empty: defaultMpirun()
  QString builtinPresets;      ///< empty: the Qt resource
  bool restoreSession = true;  ///< read/write <dataDir>/session.json
};

/// DiT Studio's main window.
class MainWindow : public QMainWindow {
  Q_OBJECT
 public:
  explicit MainWindow(const MainWindowOptions& options = {}, QWidget* parent = nullptr);
  ~MainWindow() override;

  WorkerController* controller() const { return controller_; }
  GenerationPanel* generationPanel() const { return genPanel_; }
  StrategyEditor* strategyEditor() const { return editor_; }
  PresetPanel* presetPanel() const { return presetPanel_; }
  PresetStore* presetStore() { return &presets_; }
  HistoryStore* historyStore() { return &history_; }
  Gallery* gallery() const { return gallery_; }
  RankMonitorModel* rankModel() const { return rankModel_; }
  RankMonitor* rankMonitor() const { return rankMonitor_; }
  LogPanel* logPanel() const { return log_; }
  QAction* startAction() const { return startAct_; }
  QAction* stopAction() const { return stopAct_; }
  QAction* restartAction() const { return restartAct_; }
  QAction* generateAction() const { return generateAct_; }
  QAction* cancelAction() const { return cancelAct_; }
  /// File > Quit (Ctrl+Q): asks first while requests run or wait.
  QAction* quitAction() const { return quitAct_; }
  /// Every menu action with a shortcut, one "Menu > Action: Shortcut" line each (Help >
  /// Keyboard shortcuts shows them).
  QStringList shortcutList() const;
  /// The label beside the work area saying why Generate is disabled (elided to its width, the
  /// whole reason in its tooltip).
  ElidedLabel* generateReasonLabel() const { return generateReason_; }
  /// The main splitters: left tabs | work, gallery row | monitor, gallery | chart/log/queue tabs.
  QSplitter* mainSplitter() const { return mainSplit_; }
  QSplitter* workSplitter() const { return workSplit_; }
  QSplitter* topSplitter() const { return topSplit_; }
  QTabWidget* leftTabs() const { return leftTabs_; }
  QScrollArea* generateScroll() const { return genScroll_; }
  PromptHistory* promptHistory() { return &prompts_; }
  /// The progress on the taskbar / dock (Unity LauncherEntry over D-Bus where offered).
  TaskbarProgress* taskbar() const { return taskbar_; }
  /// Moves a waiting request `delta` places in the queue (negative: earlier). The requests it
  /// passes are re-sent in the new order (the worker runs its queue in arrival order), so they
  /// get new ids; returns the moved request's id now, empty when it cannot move (running, not
  /// queued).
  QString moveQueued(const QString& id, int delta);
  /// The ids Generate queued last ("Repeat" > 1 queues several).
  QStringList lastGenerated() const { return lastGenerated_; }
  /// "Serve API": ditstudio-server's HTTP front end in this process, serving through this
  /// window's group (its requests join the queue; the group is started from launchConfig() when
  /// none runs), on 127.0.0.1 ($DITSTUDIO_SERVE_PORT, default 8000). Checkable.
  QAction* serveAction() const { return serveAct_; }
  /// The running server (null when the switch is off).
  const ApiServe* apiServe() const { return serve_.get(); }
  /// The queue (a model updated in place: the selection survives progress events).
  QListView* queueView() const { return queueView_; }
  QueueModel* queueModel() const { return queueModel_; }
  /// Cancels the request selected in the queue view ("Cancel selected"). Returns its id, empty
  /// when nothing is selected.
  QString cancelSelected();
  /// Why Generate is disabled (also its tooltip and the label beside the toolbar), empty when
  /// it is enabled.
  QString generateBlockedReason() const;
  bool bannerVisible() const;
  QString bannerText() const;
  QString statusText() const;
  /// Current validation of editor + panel.
  Validation validation() const { return validation_; }
  /// The group configuration the editor and panel describe.
  LaunchConfig launchConfig() const;
  /// Loads a preset's strategy (and hostfile); its model with its components, prompt and
  /// generation parameters only when `withGeneration` (the preset panel's "Also load ..." box;
  /// the saved session does). A recorded model or component missing here is named in the banner
  /// and the model stays as it is.
  void applyPreset(const Preset& preset, bool withGeneration = false);
  /// Chooses the model and components a request recorded (a history image, a preset): false,
  /// with the banner naming each path missing on this machine and the model unchanged, when one
  /// does not exist here. `what` names the record in the banner ("the image", "preset X").
  bool restoreModel(const ModelSourcePaths& sources, const QString& what);
  /// What this build/machine says against `s` (device cuda on a CPU-only build, ...).
  QStringList capabilityIssuesOf(const dit::Strategy& s, const QString& hostfile = {}) const;
  /// "\nN request(s) stay queued: ..." for a banner when requests wait in the queue, else "".
  QString queuedStayNote() const;
  /// Everything that would refuse `s` with the current model and generation parameters
  /// (Start and request issues, this build/machine): what the Advisor's Apply is checked with.
  QStringList strategyIssues(const dit::Strategy& s) const;
  /// The preset "save current" stores.
  Preset currentPreset() const;
  /// What no longer fits of preset p's recorded plan on this machine (planShortfalls against
  /// machineMemoryFor: MemAvailable for CPU ranks, the GPUs' count and memory for CUDA); empty
  /// without a plan or when it fits.
  QStringList planShortfallsOf(const Preset& p) const;
  /// Saves the plan the Advisor applied as a user preset ("Plan: <model> on <N> x <memory>",
  /// made unique) with the window's generation settings and model, and selects it in the preset
  /// panel. Returns its name (empty, with the panel's error shown, when it could not be saved).
  QString savePlanPreset(const dit::Plan& plan);
  /// The Advisor dialog (null until opened).
  AdvisorDialog* advisor() const;
  /// Opens (or raises) the Advisor dialog with the current model, strategy and request.
  void openAdvisor();

 public Q_SLOTS:
  /// Starts the group if the strategy is valid; otherwise shows why. Returns whether it started.
  bool startGroup();
  void stopGroup();
  /// Restarts with the editor's strategy (also recovers from a failed group).
  bool restartGroup();
  /// Queues a request with the panel's parameters, starting or restarting the group first when
  /// needed. Returns the request id, empty when refused (the banner says why).
  QString generate();
  void cancelCurrent();
  void cancelAll();
  /// Starts the group, generates once, grabs the window to `screenshotFile` (if not empty) and
  /// emits autoGenerateFinished. Gives up after `timeoutSeconds`.
  void autoGenerate(const QString& screenshotFile, int timeoutSeconds = 900);

 Q_SIGNALS:
  void autoGenerateFinished(bool ok, const QString& message);

 protected:
  void closeEvent(QCloseEvent* event) override;

 private:
  /// Asks whether to quit while requests run or wait; true when nothing runs or the user agrees.
  bool confirmQuit();
  /// Sizes the window to the screen it opens on (at most 1500 x 900) and centres it there.
  void fitToScreen();
  void buildMenus();
  void updateTitle();
  /// Shows the field behind the first issue (its tab, scrolled into view).
  void revealIssue();
  void buildUi();
  void connectController();
  void revalidate();
  void updateActions();
  void updateStatus();
  void refreshQueue();
  bool configDiffers() const;
  int textLength() const;
  void showBanner(const QString& text, const QString& detail, bool error, bool offerRestart);
  void hideBanner();
  void onImage(const ImageResult& r);
  void onGroupFailed(const WorkerFailure& f);
  void onProgress(const QString& id, int step, int steps, double stepMs, double eta,
                  int imageIndex);
  void loadSession();
  void saveSession() const;
  void finishAuto(bool ok, const QString& message);
  void setServing(bool on);

  MainWindowOptions options_;
  QString dataDir_;
  PresetStore presets_;
  HistoryStore history_;
  Capabilities caps_;
  WorkerController* controller_;
  RankMonitorModel* rankModel_;
  TaskbarProgress* taskbar_ = nullptr;
  Validation validation_;

  GenerationPanel* genPanel_ = nullptr;
  StrategyEditor* editor_ = nullptr;
  PresetPanel* presetPanel_ = nullptr;
  Gallery* gallery_ = nullptr;
  RankMonitor* rankMonitor_ = nullptr;
  LogPanel* log_ = nullptr;
  QListView* queueView_ = nullptr;
  QueueModel* queueModel_ = nullptr;
  ElidedLabel* generateReason_ = nullptr;
  QTabWidget* leftTabs_ = nullptr;
  QTabWidget* rightTabs_ = nullptr;
  QScrollArea* genScroll_ = nullptr;
  QSplitter* mainSplit_ = nullptr;
  QSplitter* workSplit_ = nullptr;
  QSplitter* topSplit_ = nullptr;
  QPushButton* moveUp_ = nullptr;
  QPushButton* moveDown_ = nullptr;
  QFrame* banner_ = nullptr;
  QLabel* bannerLabel_ = nullptr;
  QLabel* bannerDetail_ = nullptr;
  QPushButton* bannerRestart_ = nullptr;
  QLabel* stateLabel_ = nullptr;
  QLabel* groupLabel_ = nullptr;
  QAction* startAct_ = nullptr;
  QAction* stopAct_ = nullptr;
  QAction* restartAct_ = nullptr;
  QAction* generateAct_ = nullptr;
  QAction* cancelAct_ = nullptr;
  QAction* serveAct_ = nullptr;
  QAction* quitAct_ = nullptr;
  PromptHistory prompts_;
  QStringList lastGenerated_;
  QSet<QString> requeued_;   ///< ids cancelled by moveQueued (re-sent under new ids)
  QString previewId_;        ///< the request whose preview the gallery shows
  QString promptWarningId_;  ///< the request whose truncation warnings the prompt shows
  int progressPercent_ = -1;
  bool quitConfirmed_ = false;
  std::unique_ptr<ApiServe> serve_;
  QPointer<AdvisorDialog> advisor_;
  QMap<QString, GenerationParams> requestParams_;
  bool closing_ = false;
  bool autoActive_ = false;
  QString autoFile_;
};

}  // namespace dit::ui
