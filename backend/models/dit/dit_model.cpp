#include "backend/models/dit/dit_model.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>
#include <utility>

#include "backend/io/weight_source.h"
#include "backend/models/cache/step_cache.h"
#include "parallel/context_parallel.h"
#include "parallel/context_parallel_plan.h"
#include "parallel/strategy.h"  // joinIssues

namespace dit {

at::Tensor positionIds2d(const at::Tensor& t, const std::string& who, const std::string& name) {
  const at::Tensor ids = t.dim() == 3 && t.size(0) == 1 ? t.select(0, 0) : t;
  if (ids.dim() != 2)
    throw std::invalid_argument(who + name + " must be [S, axes] or [1, S, axes]");
  return ids;
}

void DiTState::joinStreams() {
  if (joint()) throw std::logic_error("DiTState::joinStreams: the streams are already joint");
  text_tokens = encoder_hidden_states.size(1);
  hidden_states = at::cat({encoder_hidden_states, hidden_states}, 1);
  encoder_hidden_states = at::Tensor();
}

at::Tensor DiTState::imageStream() const {
  if (!joint()) return hidden_states;
  return hidden_states.narrow(1, text_tokens, hidden_states.size(1) - text_tokens);
}

at::Tensor DiTState::textStream() const {
  if (!joint()) return encoder_hidden_states;
  return hidden_states.narrow(1, 0, text_tokens);
}

nn::AttentionBackend DiTState::attentionOver(const std::vector<std::string>& inputs) const {
  if (!attention.cp) return attention;
  nn::AttentionBackend b = attention;
  b.localLens.clear();
  for (const auto& name : inputs) {
    const auto it = cp_sizes.find(name);
    if (it == cp_sizes.end())
      throw std::invalid_argument(
          "DiTState::attentionOver: the context-parallel plan does not "
          "split '" +
          name + "'");
    if (b.localLens.empty()) b.localLens.assign(it->second.size(), 0);
    for (size_t r = 0; r < it->second.size() && r < b.localLens.size(); ++r)
      b.localLens[r] += it->second[r];
  }
  return b;
}

struct DiTModel::Impl {
  TransformerParallelism par;
  std::shared_ptr<const ShardingPlan> plan;
  ParameterTable declared;
  std::string declaredName;
  std::unique_ptr<WeightLoader> loader;
  at::ScalarType dtype = at::kFloat;
  c10::Device device = c10::Device(at::kCPU);
  DiTSpec spec;
  std::string accepted;  ///< "a, b, c" for messages
  std::vector<LoadedParameter> parameters;
  tensor_parallel::LoraTargets lora;
  TransformerHooks* hooks = nullptr;
  StepCache* cache = nullptr;
};

DiTModel::DiTModel(WeightSource& source, TransformerParallelism par,
                   std::shared_ptr<const ShardingPlan> plan, ParameterTable declared,
                   std::string declaredName)
    : d_(new Impl) {
  auto& D = *d_;
  D.par = std::move(par);
  D.plan = std::move(plan);
  D.declared = std::move(declared);
  D.declaredName = std::move(declaredName);
  // Validate the plan against the declared parameters before reading any weight.
  if (auto issues = D.plan->validate(D.declared, D.par.tpSize()); !issues.empty())
    throw std::invalid_argument(joinIssues(issues));
  D.loader = std::make_unique<WeightLoader>(source, D.plan, D.par.tp);
  D.dtype = source.dtype();
}

DiTModel::~DiTModel() = default;

WeightLoader& DiTModel::loader() {
  if (!d_->loader) throw std::logic_error("DiTModel::loader: loading has finished");
  return *d_->loader;
}

void DiTModel::finishLoading(DiTSpec spec) {
  auto& D = *d_;
  WeightLoader& w = loader();
  if (!spec.embed || !spec.finalize)
    throw std::invalid_argument(spec.class_name + ": the DiTSpec has no embed or finalize");
  for (const auto& s : spec.stages)
    if (!s.run || s.count < 0)
      throw std::invalid_argument(spec.class_name + ": DiTSpec stage " + s.name +
                                  " has no block function or a negative count");
  // The model loaded exactly what it declares (names and global shapes): the plan, the byte
  // counts and the loader talk about the same parameters.
  for (const auto& p : w.parameters()) {
    const ParameterInfo* d = D.declared.find(p.info.name);
    if (!d || d->shape != p.info.shape)
      throw std::logic_error(spec.class_name + " loaded " + p.info.name +
                             (d ? " with a shape other than declared"
                                : ", which " + D.declaredName + " does not declare"));
  }
  if (w.parameters().size() != D.declared.size())
    throw std::logic_error(spec.class_name + " loaded " + std::to_string(w.parameters().size()) +
                           " parameters, " + D.declaredName + " declares " +
                           std::to_string(D.declared.size()));
  D.parameters = w.parameters();
  D.lora = tensor_parallel::LoraTargets(w.layers());
  if (!w.layers().empty()) D.device = w.layers().front()->weight().device();
  D.loader.reset();
  for (const auto& in : spec.inputs) D.accepted += (D.accepted.empty() ? "" : ", ") + in.name;
  D.spec = std::move(spec);
}

const TransformerParallelism& DiTModel::parallelism() const { return d_->par; }
at::ScalarType DiTModel::computeDtype() const { return d_->dtype; }
c10::Device DiTModel::device() const { return d_->device; }
void DiTModel::setHooks(TransformerHooks* hooks) { d_->hooks = hooks; }
void DiTModel::setStepCache(StepCache* cache) { d_->cache = cache; }
const std::vector<LoadedParameter>& DiTModel::parameters() const { return d_->parameters; }
const ShardingPlan& DiTModel::shardingPlan() const { return *d_->plan; }
tensor_parallel::LoraTargets& DiTModel::loraTargets() { return d_->lora; }

double DiTModel::forwardFlops(int64_t imageTokens, int64_t textTokens) const {
  return d_->spec.flops ? d_->spec.flops(imageTokens, textTokens) : 0.0;
}

at::Tensor DiTModel::forward(const TransformerInputs& in) const {
  const auto& D = *d_;
  const DiTSpec& spec = D.spec;
  auto who = [&spec] { return spec.class_name + "::forward: "; };  // only for messages
  for (const auto& [name, t] : in) {
    bool known = false;
    for (const auto& i : spec.inputs) known = known || i.name == name;
    if (!known)
      throw std::invalid_argument(who() + "unknown input '" + name +
                                  "'; accepted inputs: " + D.accepted);
  }
  const auto dt = D.dtype;
  const auto dev = D.device;
  TransformerInputs moved;
  for (const auto& i : spec.inputs) {
    auto it = in.find(i.name);
    if (it == in.end() || !it->second.defined()) {
      if (i.required) throw std::invalid_argument(who() + "input '" + i.name + "' is missing");
      continue;
    }
    const at::Tensor& t = it->second;
    if (i.kind == DiTInput::Kind::PositionIds) {
      moved[i.name] = positionIds2d(t, who(), i.name).to(dev);
    } else if (i.kind == DiTInput::Kind::Float32) {
      moved[i.name] = t.to(dev, at::kFloat);
    } else {
      moved[i.name] = t.to(dev, dt);
    }
  }

  // The family's own preparation of the whole inputs (padding, patchify), then context
  // parallel: the declared plan splits the sequence inputs; this rank keeps its slices.
  TransformerInputs prepared = moved;
  if (spec.prepare) spec.prepare(prepared);
  ContextParallelRunner cp(D.par.cp, spec.cp_plan);
  const TransformerInputs local = cp.split(prepared);
  DiTState s;
  s.attention.cp = D.par.cp;
  if (D.par.cp) {
    s.attention.localLens = cp.localLens();
    for (const auto& in : spec.cp_plan.inputs)
      if (local.count(in.name)) s.cp_sizes[in.name] = cp.sizes(in.name);
  }
  auto result = [&](const at::Tensor& gathered) {
    return spec.output ? spec.output(gathered, moved) : gathered;
  };

  StepCache* const sc = D.cache;
  if (sc) sc->beginForward();
  // TaylorSeer lite, predicted step: every block returns zeros without running and proj_out is
  // the Taylor extrapolation (norm_out's result would be discarded), so only that remains.
  if (sc && sc->lite() && !sc->taylorComputes())
    return result(cp.gather(sc->predict("proj_out").at(0).to(dt)));

  spec.embed(local, s);

  // TaylorSeer (default mode) hooks every block's attention module.
  const bool taylorAttn = sc && sc->taylorSeer() && !sc->lite();
  nn::AttentionCacheSeam seam;
  seam.cache = sc;
  // First Block Cache: the first block of the first stage is the head block.
  const bool fbc = sc && sc->firstBlock() && !spec.stages.empty() && spec.stages[0].count > 0;
  bool skipRemaining = false;
  at::Tensor headImage, headText;
  for (size_t si = 0; si < spec.stages.size() && !skipRemaining; ++si) {
    const DiTStage& stage = spec.stages[si];
    const char* kind = stage.name.c_str();
    if (stage.begin) stage.begin(s);
    for (int i = 0; i < stage.count && !skipRemaining; ++i) {
      if (D.hooks) D.hooks->beforeBlock(kind, i, s.hidden_states, s.encoder_hidden_states);
      const bool head = fbc && si == 0 && i == 0;
      const at::Tensor headIn = head ? s.imageStream() : at::Tensor();
      if (taylorAttn) {
        seam.module = stage.name + "." + std::to_string(i) + ".attn";
        s.attention_cache = &seam;
      }
      stage.run(i, s);
      if (D.hooks) D.hooks->afterBlock(kind, i, s.hidden_states, s.encoder_hidden_states);
      if (!head) continue;
      if (sc->shouldComputeRemaining(s.imageStream() - headIn)) {
        headImage = s.imageStream();
        headText = s.textStream();
      } else {
        // Reuse the remaining blocks' residuals (the text stream's result is unused after).
        if (s.joint()) {
          s.hidden_states = at::cat(
              {s.textStream() + sc->textResidual(), s.imageStream() + sc->imageResidual()}, 1);
        } else {
          s.hidden_states = s.hidden_states + sc->imageResidual();
          s.encoder_hidden_states = s.encoder_hidden_states + sc->textResidual();
        }
        skipRemaining = true;
      }
    }
  }
  s.attention_cache = nullptr;
  if (fbc && !skipRemaining)
    sc->storeTailResiduals(s.imageStream() - headImage, s.textStream() - headText);
  at::Tensor out = spec.finalize(s);
  if (sc && sc->lite()) sc->update("proj_out", {out});
  return result(cp.gather(out));
}

}  // namespace dit
