// Qt adapters of the protocol's Strategy JSON (dit::protocol::strategyToJson/strategyFromJson in
// app/protocol/protocol.h, the worker's `ready` event and the bench use the same), so presets and
// the worker agree on keys and defaults.
#pragma once

#include <QJsonObject>
#include <QJsonValue>
#include <QString>
#include <optional>

#include "parallel/strategy.h"

namespace dit::ui {

/// Strategy -> JSON object (dit::protocol::strategyToJson).
QJsonObject strategyToJson(const dit::Strategy& s);
/// JSON object -> Strategy (dit::protocol::strategyFromJson): absent keys keep Strategy's
/// defaults; "world" may also be spelled "ranks" or "np"; without any of them world is the
/// product of the degrees. Throws dit::protocol::ProtocolError naming a field of the wrong type.
dit::Strategy strategyFromJson(const QJsonObject& j);
/// Field-by-field equality (dit::Strategy has no operator==).
bool sameStrategy(const dit::Strategy& a, const dit::Strategy& b);
/// Short text, e.g. "2 ranks (cpu): ring 2" or "8 ranks (cuda): cfg 2 x ulysses 4".
QString strategyText(const dit::Strategy& s);
/// The strategy an image was made with, from its parameters' "strategy": the JSON object (the
/// GUI's history) or the worker's PNG text, dit::Strategy::describe() ("4 ranks: tp 2 x ulysses
/// 2 on cuda", "1 rank: no parallelism"). nullopt when absent or unreadable.
std::optional<dit::Strategy> strategyFromParams(const QJsonValue& v);

}  // namespace dit::ui
