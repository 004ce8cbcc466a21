// Generation parameters edited in the generation panel, sent in `generate` requests, stored in
// presets and history, and read back from a PNG's "parameters" text chunk. The type and its
// defaults are the protocol's (app/protocol/protocol.h); this header adds the Qt adapters.
#pragma once

#include <QJsonObject>
#include <QString>

#include "app/protocol/protocol.h"

namespace dit::ui {

/// The one request-parameter type (prompt, negative_prompt, width, height, steps, guidance, the
/// family's knobs in options, seed (uint64), random_seed, num_images, max_sequence_length) with
/// its one set of defaults.
using GenerationParams = dit::protocol::GenerationParams;

/// protocol::toJson(p) as a Qt object (seed is -1 when random; integers stay integers; a seed
/// above 2^63-1 is its decimal text, see toQJsonObject).
QJsonObject paramsToQJson(const GenerationParams& p);
/// protocol::paramsFromJson of a Qt object: the keys present in `j` over `defaults`; a "seed"
/// given as decimal text is read exactly (0 .. 2^64-1); a family knob's name at the top level is
/// read into options (dit::liftKnobKeys). Throws dit::protocol::ProtocolError
/// naming a field of the wrong type or a seed out of range.
GenerationParams paramsFromQJson(const QJsonObject& j, const GenerationParams& defaults = {});

/// A model's recommended settings (ModelInfo::default_settings: any of the protocol's keys, e.g.
/// steps, width, height, negative_prompt, a family knob) over `current`: the keys present
/// replace, everything else (prompt, seed, ...) is kept. When a setting has the wrong type the
/// result is `current` unchanged and `*problem` (when given) is the error's text, else it is
/// cleared; never throws. What the generation panel does when a model is chosen and the headless
/// run does before it starts.
GenerationParams withModelDefaults(const QJsonObject& settings, const GenerationParams& current,
                                   QString* problem = nullptr);

/// What the panel starts with (and the headless run generates): the protocol defaults with a
/// size and step count that take seconds on the embedded tiny model on a CPU (64 x 64 px, 8
/// steps), the values of the "CPU demo" built-in preset.
GenerationParams startingParams();

/// Default prompt of the GUI and of the headless run (protocol::kDefaultPrompt).
QString defaultPrompt();

}  // namespace dit::ui
