#include "ui/validation.h"

#include <QFileInfo>
#include <algorithm>
#include <vector>

namespace dit::ui {

dit::RequestDims requestDims(const GenerationParams& p, int textLen, bool cfg) {
  dit::RequestDims r;
  r.width = p.width;
  r.height = p.height;
  r.text_len = textLen;
  r.true_cfg = cfg;
  r.num_images = p.num_images;
  return r;
}

Validation validate(const dit::Strategy& s, const ModelInfo& model, const GenerationParams& p,
                    int textLen, const QString& hostfile) {
  Validation v;
  auto add = [](QStringList& list, const std::vector<dit::StrategyIssue>& issues,
                const QStringList& skip = {}) {
    for (const auto& i : issues) {
      const QString m = QString::fromStdString(i.message);
      if (!list.contains(m) && !skip.contains(m)) list << m;
    }
  };
  add(v.startIssues, dit::validateDegrees(s));
  if (!hostfile.trimmed().isEmpty() && !QFileInfo::exists(hostfile.trimmed()))
    v.startIssues << QStringLiteral("hostfile %1 does not exist").arg(hostfile.trimmed());
  if (!model.ok) {
    v.startIssues << (model.error.isEmpty() ? QStringLiteral("no model folder chosen")
                                            : model.error);
    return v;
  }
  const dit::ModelDims dims = model.dims();
  add(v.startIssues, dit::validateForModel(s, dims));
  // The family's declared request, resolved as the CLI, the server and the worker resolve it.
  const dit::ResolvedRequest r = model.resolve(p);
  for (const dit::RequestProblem& pr : r.problems) {
    const QString m = QString::fromStdString(pr.message);
    if (!v.requestIssues.contains(m)) v.requestIssues << m;
  }
  dit::RequestDims rd = requestDims(p, textLen, r.cfg);
  if (r.ok()) {
    rd.width = r.values.width;
    rd.height = r.values.height;
    if (textLen <= 0) rd.text_len = r.values.max_sequence_length;
  }
  rd.cfg_requirement = r.cfg_requirement;
  // Reference images join every transformer call (the memory estimate and the context-parallel
  // split count them).
  rd.reference_tokens = r.reference_tokens;
  // The strategy's own size rule says again what the resolve already refused for the size.
  bool sizeRefused = false;
  for (const dit::RequestProblem& pr : r.problems)
    sizeRefused = sizeRefused || pr.field == "width" || pr.field == "height";
  std::vector<dit::StrategyIssue> issues = dit::validateForRequest(s, dims, rd);
  if (sizeRefused)
    issues.erase(
        std::remove_if(issues.begin(), issues.end(),
                       [](const dit::StrategyIssue& i) { return i.rule == "size_multiple"; }),
        issues.end());
  add(v.requestIssues, issues, v.startIssues);
  return v;
}

}  // namespace dit::ui
