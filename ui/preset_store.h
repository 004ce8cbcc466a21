// Strategy + generation presets: built-in ones shipped as a Qt resource
// (:/ditstudio/presets/builtin-presets.json, from resources/presets/), user ones in
// <AppDataLocation>/presets.json written atomically. Import/export use the same file format:
//   {"format": "ditstudio-presets", "version": 1, "presets": [ {preset}, ... ]}
// where a preset is {"name", "description", "strategy": {tp_degree, ...}, "hostfile",
// "hosts": {network_interface, port_range, ssh_options, mpirun_args}, "generation": {prompt,
// width, ...}, "model": path, "components": {config, vae, text_encoder, ...}} ("hosts" only when
// one of its fields is set; "model" and "components" only when recorded, see model_sources.h;
// "plan" only for a preset saved from the Advisor's "Plan for me", see preset_plan.h).
#pragma once

#include <QJsonObject>
#include <QList>
#include <QString>
#include <QStringList>
#include <optional>

#include "app/protocol/run_options.h"
#include "parallel/strategy.h"
#include "ui/generation_params.h"
#include "ui/model_sources.h"
#include "ui/worker_command.h"

namespace dit::ui {

/// One preset. Built-in presets are read-only.
struct Preset {
  QString name;
  QString description;
  dit::Strategy strategy;
  QString hostfile;
  HostSettings hosts;  ///< network/ssh settings of a hostfile group
  /// The group's run options ("run": {"vae_tiling", "text_encoder_placement", "prompt_cache"},
  /// those not at their default); a preset from a plan carries the plan's placement. A value no
  /// worker takes falls back to its default when the preset is read.
  dit::protocol::RunOptions run;
  bool hasGeneration = false;  ///< whether `generation` holds values
  GenerationParams generation;
  /// The model and its components ("model", "components"); empty model: none recorded (the
  /// built-in presets), loading the preset keeps the window's model.
  ModelSourcePaths model;
  /// The placement plan the preset was made from ("Plan for me": the planner's JSON, with its
  /// memory per rank, components, reasons and alternatives; ui/preset_plan.h); empty: none.
  QJsonObject plan;
  bool builtin = false;

  QJsonObject toJson() const;
  /// Parses one preset; nullopt with `error` set when the name or strategy is missing.
  static std::optional<Preset> fromJson(const QJsonObject& j, QString* error = nullptr);
};

/// Loads, edits and persists presets. Not thread-safe; used from the GUI thread.
class PresetStore {
 public:
  /// `dataDir`: folder of presets.json (appDataDir() by default). `builtinFile`: JSON with the
  /// built-in presets (the Qt resource by default).
  explicit PresetStore(QString dataDir = QString(), QString builtinFile = QString());

  /// Reads built-in and user presets. Returns false with `error` if a file is unreadable (what
  /// could be read stays loaded; a missing user file is not an error).
  bool load(QString* error = nullptr);
  /// Built-in presets first, then user presets, in file order.
  QList<Preset> presets() const;
  QStringList names() const;
  std::optional<Preset> find(const QString& name) const;
  bool isBuiltin(const QString& name) const;

  /// Adds or replaces a user preset (refuses built-in names and empty names); saves the file.
  bool save(const Preset& preset, QString* error = nullptr);
  /// Renames a user preset; refuses clashes and built-ins; saves the file.
  bool rename(const QString& from, const QString& to, QString* error = nullptr);
  /// Deletes a user preset; saves the file.
  bool remove(const QString& name, QString* error = nullptr);
  /// Writes the named presets (all user presets when `names` is empty) to `path`.
  bool exportTo(const QString& path, const QStringList& names, QString* error = nullptr) const;
  /// Reads presets from `path` (the file format above, or a single preset object) and adds them
  /// as user presets; a clashing name gets " (2)", " (3)", ... Returns the names added.
  QStringList importFrom(const QString& path, QString* error = nullptr);

  QString userFile() const;
  QString builtinFile() const { return builtinFile_; }
  /// Name not used by any preset: `base`, `base (2)`, ...
  QString uniqueName(const QString& base) const;

  /// Serialises presets to the file format.
  static QJsonObject toDocument(const QList<Preset>& presets);
  /// Parses the file format (or one preset object, or a bare array).
  static QList<Preset> fromDocument(const QJsonValue& doc, QString* error = nullptr);

 private:
  bool persist(QString* error);
  int userIndex(const QString& name) const;

  QString dataDir_;
  QString builtinFile_;
  QList<Preset> builtin_;
  QList<Preset> user_;
};

}  // namespace dit::ui
