// The model of a request and where each of its components comes from, as the window records
// them: the CLI's --model, --config, --vae, --text-encoder, --text-encoder-2, --tokenizer and
// --tokenizer-2 (dit::ModelSources). Presets, history entries and the PNG's parameters hold them as
//   "model": "<path>", "components": {"config": ..., "vae": ..., "text_encoder": ...,
//                                     "text_encoder_2": ..., "tokenizer": ..., "tokenizer_2": ...}
// (only the components given; no "components" key when none is).
#pragma once

#include <QJsonObject>
#include <QString>
#include <QStringList>
#include <vector>

#include "backend/io/model_folder.h"

namespace dit::ui {

/// The component flags other than --model: each a path, empty when not given (the model's own
/// component, or a tokenizer from the config folder, is used then).
struct ModelComponents {
  QString config;        ///< --config: a diffusers folder completing a single file's configs
  QString vae;           ///< --vae: component folder or single file
  QString textEncoder;   ///< --text-encoder
  QString textEncoder2;  ///< --text-encoder-2
  QString tokenizer;     ///< --tokenizer (folder)
  QString tokenizer2;    ///< --tokenizer-2 (folder)

  bool operator==(const ModelComponents&) const = default;
  bool isEmpty() const { return *this == ModelComponents{}; }

  /// One component field: its JSON key ("vae"), the worker's flag ("--vae"), a label for the
  /// window ("VAE") and whether it names a folder only (the config and tokenizers).
  struct Field {
    const char* key;
    const char* flag;
    const char* label;
    bool folderOnly;
    QString ModelComponents::*member;
  };
  /// Every component field in the CLI's order.
  static const std::vector<Field>& fields();
  /// The field whose flag is `flag` ("--vae"); nullptr for another flag.
  static const Field* fieldForFlag(const QString& flag);

  /// The worker's arguments for the components given: "--config", dir, "--vae", path, ...
  QStringList workerArgs() const;
  /// {"config": ..., "vae": ...}: only the components given.
  QJsonObject toJson() const;
  /// The object toJson writes; keys it does not know, and values that are not strings, are
  /// ignored.
  static ModelComponents fromJson(const QJsonObject& j);
};

/// A request's model: the --model path (a diffusers folder, a single transformer file, a GGUF
/// file or an all-in-one checkpoint) and its components.
struct ModelSourcePaths {
  QString model;
  ModelComponents components;

  bool operator==(const ModelSourcePaths&) const = default;
  /// The reader's form (dit::ModelFolder::open(ModelSources)).
  dit::ModelSources toSources() const;
  /// Writes "model" (when set) and "components" (when any is given) into `j`; removes a stale
  /// "components" key when none is.
  void writeTo(QJsonObject& j) const;
  /// Reads what writeTo wrote (a missing or non-string "model" is empty).
  static ModelSourcePaths readFrom(const QJsonObject& j);
  /// The recorded paths that do not exist on this machine, one line each: "model (--model):
  /// /a/b.gguf", "VAE (--vae): /a/vae". Empty when every path given exists.
  QStringList missingHere() const;
};

/// The flag a model reader's error asks for ("... (give one with --vae) ..." -> "--vae"); empty
/// when the error names none.
QString flagAskedFor(const QString& error);

}  // namespace dit::ui
