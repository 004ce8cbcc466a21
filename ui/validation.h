// Live validation for the editor: the worker's own rules (dit::validateDegrees,
// dit::validateForModel, dit::validateForRequest from parallel/strategy.h) plus the GUI's checks
// (model folder readable, hostfile exists). Split into what blocks starting the group and what
// blocks a request.
#pragma once

#include <QString>
#include <QStringList>

#include "parallel/strategy.h"
#include "ui/generation_params.h"
#include "ui/model_info.h"

namespace dit::ui {

/// Result of validate(): messages are the worker's sentences, verbatim.
struct Validation {
  QStringList startIssues;    ///< strategy/model problems: Start is disabled
  QStringList requestIssues;  ///< problems of this request only: Generate is disabled
  bool canStart() const { return startIssues.isEmpty(); }
  bool canGenerate() const { return startIssues.isEmpty() && requestIssues.isEmpty(); }
  QStringList all() const { return startIssues + requestIssues; }
};

/// Validates `s` against `model` (skipped when !model.ok, which is then an issue itself) and the
/// request `p` with `textLen` T5 tokens. `hostfile` may be empty.
Validation validate(const dit::Strategy& s, const ModelInfo& model, const GenerationParams& p,
                    int textLen, const QString& hostfile = QString());

/// dit::RequestDims of a request; `cfg`: whether it runs the CFG branch (ModelInfo::resolve).
dit::RequestDims requestDims(const GenerationParams& p, int textLen, bool cfg);

}  // namespace dit::ui
