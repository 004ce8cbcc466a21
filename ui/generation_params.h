// Generation parameters edited in the generation panel, sent in `generate` requests, stored in
// presets and history, and read back from a PNG's "parameters" text chunk.
#pragma once

#include <QJsonObject>
#include <QString>

namespace dit::ui {

/// One generation request's user-facing parameters. Keys of toJson() are the protocol's
/// (app/PROTOCOL.md `generate` request and the worker's PNG "parameters" chunk): prompt,
/// negative_prompt, true_cfg_scale, width, height (pixels), steps, guidance, seed, num_images.
struct GenerationParams {
  QString prompt = QStringLiteral("a watercolor painting of a red fox in a snowy forest");
  QString negative_prompt;
  double true_cfg_scale = 1.0;  ///< > 1 with a negative prompt enables true CFG
  int width = 64;               ///< pixels, multiple of 2 * vae_scale_factor
  int height = 64;              ///< pixels, multiple of 2 * vae_scale_factor
  int steps = 8;
  double guidance = 3.5;
  qint64 seed = 42;             ///< used when random_seed is false
  bool random_seed = false;     ///< sends seed -1: the worker picks one and reports it
  int num_images = 1;

  /// True CFG is active (DESIGN.md section 5): a negative prompt and true_cfg_scale > 1.
  bool trueCfg() const { return !negative_prompt.trimmed().isEmpty() && true_cfg_scale > 1.0; }
  /// The seed to send: -1 when random.
  qint64 requestSeed() const { return random_seed ? -1 : seed; }

  /// Parameters as JSON (seed is -1 when random).
  QJsonObject toJson() const;
  /// Reads the keys present in `j`, keeping `defaults` for absent ones; seed < 0 means random.
  static GenerationParams fromJson(const QJsonObject& j, const GenerationParams& defaults);
  static GenerationParams fromJson(const QJsonObject& j);

  bool operator==(const GenerationParams&) const = default;
};

/// Default prompt of the GUI and of the headless run.
QString defaultPrompt();

}  // namespace dit::ui
