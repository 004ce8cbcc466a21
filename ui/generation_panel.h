// Generation panel: model folder chooser with the model's sizes and its components (config
// folder, VAE, text encoders, tokenizers: the CLI's --config, --vae, ...), prompt, negative prompt
// + true CFG scale, width/height (stepping by the model's 2 * vae_scale_factor), steps, guidance,
// seed (fixed or random, with the seed of the last image), images per request; the init image,
// mask, strength and step cache (ImageInputPanel); the reference images of an editing request
// (ReferenceStrip).
#pragma once

#include <QStringList>
#include <QWidget>
#include <cstdint>
#include <utility>
#include <vector>

#include "ui/generation_params.h"
#include "ui/lora_list.h"
#include "ui/model_info.h"
#include "ui/model_sources.h"

class QCheckBox;
class QDoubleSpinBox;
class QFormLayout;
class QLabel;
class QLineEdit;
class QMenu;
class QPlainTextEdit;
class QToolButton;
class QPushButton;
class QSpinBox;

namespace dit::ui {

class ImageInputPanel;
class ReferenceStrip;

/// `text` with a line-break opportunity after each '/' (a zero-width space), so that a word-
/// wrapped label breaks a long path instead of widening its column.
QString breakablePaths(QString text);

/// Edits GenerationParams and the model folder. Emits changed() on every edit.
class GenerationPanel : public QWidget {
  Q_OBJECT
 public:
  explicit GenerationPanel(QWidget* parent = nullptr);

  GenerationParams params() const;
  void setParams(const GenerationParams& p);
  QString modelDir() const;
  /// Sets and reads the model folder (the size step follows its vae_scale_factor).
  void setModelDir(const QString& dir);
  /// The component fields (--config, --vae, --text-encoder, ...), as typed (trimmed).
  ModelComponents components() const;
  /// The model with its components: what the worker group is started with.
  ModelSourcePaths sources() const { return {modelDir(), components()}; }
  /// Sets the model and every component field (empty ones cleared), then reads the model once.
  void setSources(const ModelSourcePaths& sources);
  /// The flag of the component the chosen model lacks and no field gives ("--vae"), from the
  /// reader's error; empty when the model opened or its error names no component.
  QString askedComponent() const { return askedFlag_; }
  const ModelInfo& modelInfo() const { return model_; }
  /// Shows the seed used by the last image ("reuse" copies it into the seed field, exactly).
  void setLastSeed(std::uint64_t seed);
  std::uint64_t lastSeed() const { return lastSeed_; }
  bool hasLastSeed() const { return hasLastSeed_; }
  /// Why the seed field cannot be used (malformed or out of 0 .. 2^64-1, naming the range);
  /// empty when it holds a seed or "Random" is checked. params() is not sent while it is set.
  QString seedError() const;
  /// What the worker would refuse in the panel as it stands, in its words: LoRA files it cannot
  /// apply to this model (LoraList::problems), the init image / mask / cache controls
  /// (ImageInputPanel::issues) and recalled references whose files changed
  /// (ReferenceStrip::issues). Each is also shown at its field.
  QStringList requestIssues() const;
  /// The prompts offered by the "History" button's menu (newest first).
  void setPromptHistory(const QStringList& prompts);
  /// How many requests Generate queues ("Repeat", 1 .. 100).
  int repeatCount() const;
  /// The worker's warnings about the prompt as sent (truncated by an encoder), shown under the
  /// prompt until the prompt or the negative prompt is edited; empty hides them.
  void showPromptWarnings(const QStringList& warnings);
  QStringList promptWarnings() const { return promptWarnings_; }
  QLabel* promptWarningLabel() const { return promptWarning_; }

  // Widgets exposed for tests.
  QPlainTextEdit* promptEdit() const { return prompt_; }
  QSpinBox* widthSpin() const { return width_; }
  QSpinBox* heightSpin() const { return height_; }
  QSpinBox* stepsSpin() const { return steps_; }
  QDoubleSpinBox* guidanceSpin() const { return guidance_; }
  /// The row of a model family's knob `name` (one generated row per knob any registered family
  /// declares, dit::allFamilyKnobs; shown only for a model whose request declares it), or
  /// nullptr for a name no family declares.
  QDoubleSpinBox* knobSpin(const QString& name) const;
  /// The form's label for one of the fields above ("Guidance", "True CFG scale", ...).
  QString fieldLabel(QWidget* field) const;
  /// Whether the form row of `field` is shown.
  bool fieldShown(QWidget* field) const;
  QSpinBox* imagesSpin() const { return images_; }
  QSpinBox* repeatSpin() const { return repeat_; }
  QToolButton* promptHistoryButton() const { return promptHistory_; }
  QMenu* promptHistoryMenu() const { return promptMenu_; }
  QLineEdit* modelEdit() const { return modelEdit_; }
  /// The field of component `key` ("config", "vae", "text_encoder", "text_encoder_2",
  /// "tokenizer", "tokenizer_2"); nullptr for another key.
  QLineEdit* componentEdit(const QString& key) const;
  /// Shows or hides the component fields: offered (shown and opened) when the model lacks a
  /// component, is a single file, or a component is given; hidden for a complete diffusers
  /// folder with none given.
  QToolButton* componentsToggle() const { return componentsToggle_; }
  QWidget* componentsBox() const { return componentsBox_; }
  LoraList* loraList() const { return loras_; }
  QLineEdit* seedEdit() const { return seed_; }
  QPushButton* reuseSeedButton() const { return reuseSeed_; }
  /// Init image, mask, strength and step cache (issue 14).
  ImageInputPanel* imagePanel() const { return imagePanel_; }
  /// Reference images of an editing request (issue 46), in order.
  ReferenceStrip* referenceStrip() const { return refs_; }

 Q_SIGNALS:
  void changed();
  void modelChanged(const QString& dir);

 private:
  void applyModel();
  void snapSize(QSpinBox* box);
  /// Labels, tooltips and rows of the guidance options as the loaded family reads them.
  void applyRequestSpec();

  /// Builds the component rows (one per ModelComponents::fields()) under the model row.
  QWidget* buildComponents(QWidget* parent);
  /// Marks the component field the reader asked for and opens the rows when needed.
  void showComponentState();

  ModelInfo model_;
  ModelComponents appliedComponents_;  ///< what model_ was read with
  QString askedFlag_;
  QToolButton* componentsToggle_;
  QWidget* componentsBox_;
  /// One line edit per component field, in ModelComponents::fields() order.
  std::vector<QLineEdit*> componentEdits_;
  std::uint64_t lastSeed_ = 0;
  bool hasLastSeed_ = false;
  QLineEdit* modelEdit_;
  QLabel* modelSummary_;
  QPlainTextEdit* prompt_;
  QPlainTextEdit* negative_;
  QSpinBox* width_;
  QSpinBox* height_;
  QLabel* sizeHint_;
  QSpinBox* steps_;
  QDoubleSpinBox* guidance_;
  /// One row per family knob (name, spin box), generated from the families' declarations.
  std::vector<std::pair<std::string, QDoubleSpinBox*>> knobs_;
  QFormLayout* form_;
  QLineEdit* seed_;
  QCheckBox* randomSeed_;
  QLabel* lastSeedLabel_;
  QPushButton* reuseSeed_;
  QSpinBox* images_;
  QSpinBox* repeat_;
  QToolButton* promptHistory_;
  QMenu* promptMenu_;
  QLabel* promptWarning_;
  QStringList promptWarnings_;
  ImageInputPanel* imagePanel_;
  ReferenceStrip* refs_;
  LoraList* loras_;
  bool loading_ = false;
};

}  // namespace dit::ui
