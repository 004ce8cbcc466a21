// Qt JSON conversion of dit::Strategy with the keys of the CLI flags (tp_degree, ring_degree,
// ulysses_degree, cfg_degree, dp_degree, ulysses_anything, ring_anything, device, world), the
// same keys as dit::to_json in parallel/strategy.h, so presets and the worker's `ready` event agree.
#pragma once

#include <QJsonObject>
#include <QString>

#include "parallel/strategy.h"

namespace dit::ui {

/// Strategy -> JSON object.
QJsonObject strategyToJson(const dit::Strategy& s);
/// JSON object -> Strategy; absent keys keep Strategy's defaults. "world" may also be spelled
/// "ranks" or "np"; without any of them world is the product of the degrees.
dit::Strategy strategyFromJson(const QJsonObject& j);
/// Field-by-field equality (dit::Strategy has no operator==).
bool sameStrategy(const dit::Strategy& a, const dit::Strategy& b);
/// Short text, e.g. "2 ranks (cpu): ring 2" or "8 ranks (cuda): cfg 2 x ulysses 4".
QString strategyText(const dit::Strategy& s);

}  // namespace dit::ui
