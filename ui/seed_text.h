// Seeds in the GUI: unsigned 64-bit as in PyTorch (torch.Generator.manual_seed), never through a
// floating-point type. Qt's JSON keeps integers as qint64 (and anything larger as a double), so
// the GUI's Qt JSON objects carry seeds above 2^63-1 as decimal text (see toQJsonObject) and its
// own files (history) carry every seed as decimal text; these helpers read either form exactly.
#pragma once

#include <QJsonValue>
#include <QString>
#include <cstdint>
#include <optional>

namespace dit::ui {

/// The allowed range as users read it: "0 .. 18446744073709551615 (2^64 - 1)".
QString seedRangeText();
/// Decimal text of a seed.
QString seedText(std::uint64_t seed);
/// Parses a seed typed by a user or read from a file: optional surrounding blanks, then 1 to 20
/// decimal digits whose value is at most 2^64-1. Returns nullopt and sets `error` (naming the
/// range) for empty, signed, fractional, non-decimal or out-of-range text; never silently 0.
std::optional<std::uint64_t> parseSeedText(const QString& text, QString* error = nullptr);
/// A seed from a Qt JSON value: decimal text (parseSeedText), a non-negative integer held
/// exactly, or a legacy double that is an integer below 2^53. nullopt for anything else (absent,
/// -1 = random, a fraction, a double that lost precision).
std::optional<std::uint64_t> seedFromQJson(const QJsonValue& value);
/// A seed as a Qt JSON value: decimal text (exact for the whole uint64 range).
QJsonValue seedToQJson(std::uint64_t seed);

}  // namespace dit::ui
