#include "ui/generation_params.h"

namespace dit::ui {

QString defaultPrompt() { return GenerationParams{}.prompt; }

QJsonObject GenerationParams::toJson() const {
  QJsonObject j;
  j["prompt"] = prompt;
  j["negative_prompt"] = negative_prompt;
  j["true_cfg_scale"] = true_cfg_scale;
  j["width"] = width;
  j["height"] = height;
  j["steps"] = steps;
  j["guidance"] = guidance;
  j["seed"] = static_cast<double>(requestSeed());
  j["num_images"] = num_images;
  return j;
}

GenerationParams GenerationParams::fromJson(const QJsonObject& j) { return fromJson(j, GenerationParams{}); }

GenerationParams GenerationParams::fromJson(const QJsonObject& j, const GenerationParams& d) {
  GenerationParams p = d;
  if (j.contains("prompt")) p.prompt = j.value("prompt").toString();
  if (j.contains("negative_prompt")) p.negative_prompt = j.value("negative_prompt").toString();
  if (j.contains("true_cfg_scale")) p.true_cfg_scale = j.value("true_cfg_scale").toDouble(p.true_cfg_scale);
  if (j.contains("width")) p.width = j.value("width").toInt(p.width);
  if (j.contains("height")) p.height = j.value("height").toInt(p.height);
  if (j.contains("steps")) p.steps = j.value("steps").toInt(p.steps);
  if (j.contains("guidance")) p.guidance = j.value("guidance").toDouble(p.guidance);
  if (j.contains("num_images")) p.num_images = j.value("num_images").toInt(p.num_images);
  if (j.contains("seed")) {
    const qint64 s = static_cast<qint64>(j.value("seed").toDouble(-1));
    p.random_seed = s < 0;
    if (s >= 0) p.seed = s;
  }
  return p;
}

}  // namespace dit::ui
