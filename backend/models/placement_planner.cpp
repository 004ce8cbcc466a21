#include "backend/models/placement_planner.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "backend/io/model_folder.h"
#include "backend/models/family_registry.h"

namespace dit {

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// "tp 2 x ulysses 2", "ring 4 (anything)", "tp 1" for one rank.
std::string strategyName(const Strategy& s) {
  std::vector<std::string> parts;
  if (s.tp_degree > 1) parts.push_back("tp " + std::to_string(s.tp_degree));
  if (s.ulysses_degree > 1)
    parts.push_back("ulysses " + std::to_string(s.ulysses_degree) +
                    (s.ulysses_anything ? " (anything)" : ""));
  if (s.ring_degree > 1)
    parts.push_back("ring " + std::to_string(s.ring_degree) +
                    (s.ring_anything ? " (anything)" : ""));
  if (s.cfg_degree > 1) parts.push_back("cfg " + std::to_string(s.cfg_degree));
  if (parts.empty()) return "tp 1 (one rank, whole model)";
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : " x ") + p;
  return out;
}

struct Candidate {
  Strategy s;
  std::vector<StrategyIssue> issues;
  MemoryEstimate sharded;  ///< the memory model's estimate (text encoder sharded / resident)
  MemoryEstimate e;        ///< under the plan's text-encoder placement
  bool fits = false;
};

// `e` (the memory model's estimate for s: text encoder sharded under tp, resident) with the text
// encoder placed as `pl`; nullopt, and `why`, when the model's encoders cannot be placed so.
// own-rank: the encoding rank holds the whole encoder (the largest per-rank figure); the other
// ranks none. host-streamed: the device holds its largest layer at tp; on CPU ranks the host
// store is in the same memory, so it adds the layer's copy instead. once: the encoder is a stage
// of its own (text_encode), freed before the steps.
std::optional<MemoryEstimate> placedEstimate(const PlannerModel& model, const MemoryEstimate& e,
                                             const Strategy& s, TextEncoderPlacement pl, int64_t eb,
                                             bool cpuRanks, std::string* why) {
  if (pl == TextEncoderPlacement::Sharded) return e;
  if (!model.text_encoder) {
    if (why) *why = "the model declares no text-encoder memory facts to size it with";
    return std::nullopt;
  }
  const uint64_t whole =
      pl == TextEncoderPlacement::OwnRank ? model.text_encoder(1, eb).text_encoder_bytes : 0;
  const uint64_t layer =
      pl == TextEncoderPlacement::HostStreamed
          ? model.text_encoder(std::max(1, s.tp_degree), eb).text_encoder_layer_bytes
          : 0;
  return placeTextEncoder(e, pl, whole, layer, cpuRanks, why);
}

// What a placement costs besides memory, in words (the alternatives and the chosen row).
std::string placementCost(TextEncoderPlacement pl, uint64_t te, uint64_t whole, bool cpuRanks) {
  switch (pl) {
    case TextEncoderPlacement::Sharded:
      return "it stays resident with the transformer: every rank of the tp group holds its shard "
             "and the group encodes together";
    case TextEncoderPlacement::OwnRank:
      return "one rank of each tp x cp group holds the whole encoder (" + formatBytes(whole) +
             ") and broadcasts the prompt embeddings; the other ranks hold none, but the "
             "encoding rank's peak is the plan's";
    case TextEncoderPlacement::HostStreamed:
      return "every prompt copies the encoder's " + formatBytes(te) +
             " per rank from host memory, one layer at a time, and host memory keeps it" +
             std::string(cpuRanks ? "; on CPU ranks host and device memory are one, so the "
                                    "device saves nothing"
                                  : "");
    case TextEncoderPlacement::Once:
      return "the encoder (" + formatBytes(te) +
             " per rank) is read from disk again for every request's prompts (a prompt cache "
             "hit skips it)";
  }
  return "";
}

std::string placementLabel(TextEncoderPlacement pl) {
  switch (pl) {
    case TextEncoderPlacement::Sharded:
      return "text encoder sharded under the tp group, resident";
    case TextEncoderPlacement::OwnRank:
      return "text encoder on a rank of its own (own-rank)";
    case TextEncoderPlacement::HostStreamed:
      return "text encoder kept in host memory, streamed layer by layer (host-streamed)";
    case TextEncoderPlacement::Once:
      return "text encoder run once per prompt, then freed (once)";
  }
  return "";
}

// The ranking of a fitting strategy: smaller is faster (see planPlacement's doc).
using RankKey = std::tuple<int, int, int, int, int, int>;

bool tpCrossesHosts(const Strategy& s, int perHost) { return perHost % s.tp_degree != 0; }
bool ulyssesCrossesHosts(const Strategy& s, int perHost) {
  return s.ulysses_degree > 1 && perHost % (s.tp_degree * s.ulysses_degree) != 0;
}
bool anything(const Strategy& s) { return s.ulysses_anything || s.ring_anything; }

RankKey rankKey(const Strategy& s, int perHost) {
  return {tpCrossesHosts(s, perHost) ? 1 : 0,      s.tp_degree,         -s.cfg_degree,
          ulyssesCrossesHosts(s, perHost) ? 1 : 0, anything(s) ? 1 : 0, -s.ulysses_degree};
}

// Why `c` (fits) loses to `best`, from the first element of the ranking where they differ.
std::string slowerBecause(const Strategy& c, const Strategy& best, int perHost) {
  const RankKey a = rankKey(c, perHost), b = rankKey(best, perHost);
  if (std::get<0>(a) != std::get<0>(b))
    return "its tp group of " + std::to_string(c.tp_degree) + " ranks spans hosts (" +
           std::to_string(perHost) +
           " ranks per host): two all-reduces per block would cross the inter-host link";
  if (std::get<1>(a) != std::get<1>(b))
    return "tp " + std::to_string(c.tp_degree) + " all-reduces every block's output over " +
           std::to_string(c.tp_degree) + " ranks where tp " + std::to_string(best.tp_degree) +
           " already fits (context parallel moves only attention inputs)";
  if (std::get<2>(a) != std::get<2>(b))
    return "cfg 1 runs the two CFG branches one after the other where cfg 2 runs them side by side "
           "(one exchange per step)";
  if (std::get<3>(a) != std::get<3>(b))
    return "its Ulysses group spans hosts: the all-to-all before and after every attention would "
           "cross the inter-host link, where ring passes K/V blocks point to point";
  if (std::get<4>(a) != std::get<4>(b))
    return "it needs the anything mode (uneven, padded split) where a strict split is accepted";
  return "ring " + std::to_string(c.ring_degree) + " passes K/V blocks round " +
         std::to_string(c.ring_degree) + " ranks in every attention where Ulysses " +
         std::to_string(best.ulysses_degree) + " (one all-to-all before and one after) is accepted";
}

std::string breakdown(const MemoryEstimate& e) {
  return "weights " + formatBytes(e.weights) + " (transformer " +
         formatBytes(e.transformer_weights) + ", text encoder " +
         formatBytes(e.text_encoder_weights) + ", VAE " + formatBytes(e.vae_weights) +
         ") + max(activations " + formatBytes(e.activations) + " + attention " +
         formatBytes(e.attention) + ", VAE decode " + formatBytes(e.vae_decode) +
         (e.text_encode > 0 ? ", text encoding " + formatBytes(e.text_encode) : std::string()) +
         ")";
}

nlohmann::json strategyJson(const Strategy& s) {
  return {{"world", s.world},
          {"tp_degree", s.tp_degree},
          {"ulysses_degree", s.ulysses_degree},
          {"ring_degree", s.ring_degree},
          {"cfg_degree", s.cfg_degree},
          {"dp_degree", s.dp_degree},
          {"ulysses_anything", s.ulysses_anything},
          {"ring_anything", s.ring_anything},
          {"device", s.device},
          {"describe", strategyName(s)}};
}

}  // namespace

uint64_t PlannerRanks::usableBytes() const {
  return static_cast<uint64_t>(std::floor(static_cast<double>(memory_per_rank) * usable_fraction));
}

RequestDims PlannerRequest::dims() const {
  RequestDims r;
  r.width = width;
  r.height = height;
  r.text_len = text_len;
  r.true_cfg = true_cfg;
  return r;
}

PlannerModel plannerModel(const ModelFolder& m) {
  PlannerModel p;
  p.name = familyOf(m).display_name + " (" + m.path + ")";
  p.dims = m.dims();
  p.estimate = [m](const Strategy& s, const RequestDims& r, int64_t eb, bool scores) {
    return estimateRequestMemory(m, s, r, eb, scores);
  };
  p.text_encoder = [m](int tp, int64_t eb) { return familyOf(m).memory(m, std::max(1, tp), eb); };
  return p;
}

PlannerModel plannerModel(const KnownModel& k) {
  PlannerModel p;
  p.name = k.name;
  p.dims = k.dims;
  p.estimate = [k](const Strategy& s, const RequestDims& r, int64_t eb, bool scores) {
    return estimateKnownModelMemory(k, s, r, eb, scores);
  };
  if (k.memory) p.text_encoder = [k](int tp, int64_t eb) { return k.memory(std::max(1, tp), eb); };
  return p;
}

std::vector<KnownModel> knownRealSizeModels() {
  std::vector<KnownModel> v;
  for (const FamilySpec& f : modelFamilies())
    if (f.known_models)
      for (KnownModel& k : f.known_models()) v.push_back(std::move(k));
  return v;
}

KnownModel findKnownModel(const std::string& name) {
  std::string names;
  for (KnownModel& k : knownRealSizeModels()) {
    if (lower(k.name) == lower(name)) return std::move(k);
    names += (names.empty() ? "\"" : ", \"") + k.name + "\"";
  }
  throw std::invalid_argument("no known model named \"" + name + "\"; known models: " + names);
}

Plan planPlacement(const PlannerModel& model, const PlannerRanks& ranks,
                   const PlannerRequest& request) {
  if (ranks.count < 1)
    throw std::invalid_argument("the plan needs at least one rank (got " +
                                std::to_string(ranks.count) + ")");
  if (ranks.hosts < 1 || ranks.count % ranks.hosts != 0)
    throw std::invalid_argument("--hosts " + std::to_string(ranks.hosts) + " must divide --ranks " +
                                std::to_string(ranks.count) + " (the same ranks on every host)");
  if (ranks.memory_per_rank == 0)
    throw std::invalid_argument("the memory per rank must be more than 0 bytes");
  if (request.width <= 0 || request.height <= 0)
    throw std::invalid_argument("the request needs a width and height in pixels");
  if (!model.estimate) throw std::invalid_argument("the model has no memory estimate");

  Plan p;
  p.model = model.name;
  p.ranks = ranks;
  p.request = request;
  p.usable = ranks.usableBytes();
  const int perHost = ranks.ranksPerHost();
  const RequestDims rd = request.dims();
  const bool scores = ranks.device == "cpu";
  const int64_t eb = std::max<int64_t>(1, request.element_bytes);

  // Every strategy of world = count: cfg x tp x ulysses x ring, strict first, then the anything
  // variant of a pure Ulysses / pure ring split.
  std::vector<Candidate> cands;
  std::vector<int> cfgs{1};
  if (request.true_cfg && ranks.count % 2 == 0) cfgs.push_back(2);
  for (int cfg : cfgs)
    for (int tp : divisors(ranks.count / cfg))
      for (int uly : divisors(ranks.count / cfg / tp)) {
        const int ring = ranks.count / cfg / tp / uly;
        std::vector<Strategy> variants;
        Strategy s;
        s.world = ranks.count;
        s.tp_degree = tp;
        s.ulysses_degree = uly;
        s.ring_degree = ring;
        s.cfg_degree = cfg;
        s.device = ranks.device;
        variants.push_back(s);
        if (uly > 1 && ring == 1) {
          s.ulysses_anything = true;
          variants.push_back(s);
        } else if (ring > 1 && uly == 1) {
          s.ring_anything = true;
          variants.push_back(s);
        }
        bool strictValid = false;
        for (const Strategy& v : variants) {
          Candidate c;
          c.s = v;
          c.issues = validateDegrees(v);
          if (c.issues.empty()) c.issues = validateForModel(v, model.dims);
          if (c.issues.empty()) c.issues = validateForRequest(v, model.dims, rd);
          // The anything variant only where the strict split is refused.
          if (anything(v) && strictValid) continue;
          if (c.issues.empty()) {
            if (!anything(v)) strictValid = true;
            c.e = c.sharded = model.estimate(v, rd, eb, scores);
            c.fits = c.e.peak() <= p.usable;
          }
          cands.push_back(std::move(c));
        }
      }

  // The text-encoder placement: the first of the request's under which some strategy fits
  // (else the one with the least peak), every candidate sized under it.
  std::vector<TextEncoderPlacement> order = request.text_encoder_placements;
  if (order.empty()) order.push_back(TextEncoderPlacement::Sharded);
  auto placeAll = [&](TextEncoderPlacement pl) {
    bool any = false;
    uint64_t least = UINT64_MAX;
    for (Candidate& c : cands) {
      if (!c.issues.empty()) continue;
      const auto e = placedEstimate(model, c.sharded, c.s, pl, eb, scores, nullptr);
      c.e = e ? *e : c.sharded;
      c.fits = e && c.e.peak() <= p.usable;
      any = any || c.fits;
      if (e) least = std::min(least, c.e.peak());
    }
    return std::make_pair(any, least);
  };
  TextEncoderPlacement placement = order.front();
  {
    bool found = false;
    uint64_t least = UINT64_MAX;
    TextEncoderPlacement leanestPl = order.front();
    for (TextEncoderPlacement pl : order) {
      const auto [any, pLeast] = placeAll(pl);
      if (any) {
        placement = pl;
        found = true;
        break;
      }
      if (pLeast < least) {
        least = pLeast;
        leanestPl = pl;
      }
    }
    if (!found) placement = leanestPl;
    placeAll(placement);
  }
  p.text_encoder = placement;

  const Candidate* best = nullptr;
  const Candidate* leanest = nullptr;  // least peak among the valid ones
  for (const Candidate& c : cands) {
    if (!c.issues.empty()) continue;
    p.any_valid = true;
    if (!leanest || c.e.peak() < leanest->e.peak()) leanest = &c;
    if (c.fits && (!best || rankKey(c.s, perHost) < rankKey(best->s, perHost))) best = &c;
  }
  const Candidate* chosen = best ? best : leanest;
  p.fits = best != nullptr;

  // The whole text encoder (tp 1) to tell sharded from replicated.
  Strategy one;
  one.device = ranks.device;
  const MemoryEstimate whole = model.estimate(one, rd, eb, scores);

  if (chosen) {
    const Strategy& s = chosen->s;
    p.strategy = s;
    p.memory = chosen->e;
    if (placement == TextEncoderPlacement::HostStreamed)
      p.text_encoder_host_bytes = chosen->sharded.text_encoder_weights;
    p.headroom = p.fits ? p.usable - p.memory.peak() : 0;
    const std::string dtype = request.dtype;

    // Transformer.
    ComponentPlacement t;
    t.component = "transformer";
    t.dtype = dtype;
    t.weights_per_rank = p.memory.transformer_weights;
    t.placement = s.tp_degree > 1
                      ? "sharded tp " + std::to_string(s.tp_degree) + " (its ShardingPlan)"
                      : "whole on every rank";
    if (s.cpDegree() > 1)
      t.placement +=
          "; tokens split " +
          std::string(s.ulysses_degree > 1 ? "ulysses " + std::to_string(s.ulysses_degree) : "") +
          (s.ulysses_degree > 1 && s.ring_degree > 1 ? " x " : "") +
          (s.ring_degree > 1 ? "ring " + std::to_string(s.ring_degree) : "");
    if (s.cfg_degree > 1) t.placement += "; CFG branches on 2 rank groups";
    if (s.tp_degree == 1) {
      t.reason = "tp 1: every rank holds the whole transformer (" +
                 formatBytes(t.weights_per_rank) + ") and no block all-reduces";
    } else {
      t.reason = "tp " + std::to_string(s.tp_degree) + ": " +
                 (p.fits ? "the smallest tensor-parallel degree that fits" : "the least memory") +
                 " (" + formatBytes(whole.transformer_weights) + " whole -> " +
                 formatBytes(t.weights_per_rank) + " per rank)";
      // The next smaller tp that does not fit (its leanest strategy), as the evidence.
      const Candidate* below = nullptr;
      for (const Candidate& c : cands)
        if (c.issues.empty() && c.s.tp_degree < s.tp_degree && !c.fits &&
            (!below || c.s.tp_degree > below->s.tp_degree ||
             (c.s.tp_degree == below->s.tp_degree && c.e.peak() < below->e.peak())))
          below = &c;
      if (below && p.fits)
        t.reason += "; tp " + std::to_string(below->s.tp_degree) + " needs " +
                    formatBytes(below->e.peak()) + " per rank > " + formatBytes(p.usable) +
                    " usable";
      if (ranks.hosts > 1 && !tpCrossesHosts(s, perHost))
        t.reason += "; the tp group stays inside one host (" + std::to_string(perHost) +
                    " ranks per host), where its all-reduces are cheap";
      else if (ranks.hosts > 1)
        t.reason += "; the tp group spans hosts (" + std::to_string(perHost) +
                    " ranks per host) because no tp degree that stays inside a host fits: its "
                    "two all-reduces per block cross the inter-host link (expect a slower step; "
                    "more memory per rank or more ranks per host avoid it)";
    }
    if (s.cpDegree() > 1) {
      t.reason +=
          "; the remaining " + std::to_string(s.cpDegree()) + " ranks per tp slice split the " +
          std::to_string(rd.imageTokens(model.dims.vae_scale_factor) + rd.text_len) + " tokens";
      if (s.ulysses_degree > 1)
        t.reason += ": Ulysses " + std::to_string(s.ulysses_degree) + " (" +
                    std::to_string(model.dims.num_attention_heads) + " heads / tp " +
                    std::to_string(s.tp_degree) + " split " + std::to_string(s.ulysses_degree) +
                    " ways; one all-to-all before and one after attention)";
      if (s.ring_degree > 1)
        t.reason += std::string(s.ulysses_degree > 1 ? " x " : ": ") + "ring " +
                    std::to_string(s.ring_degree) +
                    (ranks.hosts > 1 && ulyssesCrossesHosts(
                                            [&] {
                                              Strategy u = s;
                                              u.ulysses_degree *= u.ring_degree;
                                              u.ring_degree = 1;
                                              return u;
                                            }(),
                                            perHost)
                         ? " across the hosts (point-to-point K/V blocks overlap with compute; "
                           "a Ulysses all-to-all would cross the inter-host link)"
                         : " (K/V blocks passed round the ring)");
      if (anything(s)) t.reason += "; the anything mode because the strict split is refused";
    }
    p.components.push_back(t);

    // Text encoder(s).
    ComponentPlacement te;
    te.component = "text encoder";
    te.dtype = dtype;
    te.weights_per_rank = p.memory.text_encoder_weights;
    const uint64_t teShard = chosen->sharded.text_encoder_weights;
    // Why not resident: the sharded placement's peak at this strategy, when it does not fit.
    const std::string residentPeak =
        "resident (sharded) its peak would be " + formatBytes(chosen->sharded.peak()) +
        " per rank" +
        (chosen->sharded.peak() > p.usable ? " > " + formatBytes(p.usable) + " usable" : "");
    if (placement == TextEncoderPlacement::OwnRank) {
      te.placement = "whole on one rank of each tp x cp group (own-rank), broadcast to the others";
      te.reason = placementCost(placement, teShard, te.weights_per_rank, scores);
    } else if (placement == TextEncoderPlacement::HostStreamed) {
      te.placement = "in host memory (" + formatBytes(teShard) +
                     " per rank), streamed to the device one layer at a time (host-streamed)";
      te.reason = residentPeak + "; streamed, the device holds its largest layer (" +
                  formatBytes(te.weights_per_rank) + ") while it encodes; " +
                  placementCost(placement, teShard, 0, scores);
    } else if (placement == TextEncoderPlacement::Once) {
      te.weights_per_rank = p.memory.text_encode;
      te.placement = "loaded for each request's prompts, freed before the steps (once)";
      te.reason = residentPeak + "; loaded only while it encodes, its " +
                  formatBytes(te.weights_per_rank) +
                  " are a stage of their own instead of weights held through the steps; " +
                  placementCost(placement, teShard, 0, scores);
    } else if (s.tp_degree > 1 && te.weights_per_rank < whole.text_encoder_weights) {
      te.placement = "sharded under the transformer's tp group (tp " + std::to_string(s.tp_degree) +
                     "), replicated across the other groups";
      te.reason = "its own plan divides at tp " + std::to_string(s.tp_degree) + " (" +
                  formatBytes(whole.text_encoder_weights) + " whole -> " +
                  formatBytes(te.weights_per_rank) +
                  " per rank); it stays resident with the transformer";
    } else {
      te.placement = "whole on every rank (replicated)";
      if (s.tp_degree == 1)
        te.reason =
            "tp 1: no tp group to shard it under; every rank loads it and encodes the prompt";
      else if (!p.memory.note.empty())
        te.reason = p.memory.note;
      else
        te.reason = "its family declares no tensor-parallel plan for it";
    }
    if (!p.memory.note.empty() && te.reason != p.memory.note)
      te.reason += " (" + p.memory.note + ")";
    p.components.push_back(te);

    // VAE.
    ComponentPlacement v;
    v.component = "VAE";
    v.dtype = dtype;
    v.weights_per_rank = p.memory.vae_weights;
    v.placement = "whole on every rank; every rank decodes";
    v.reason = "decoded after the last step: its stage (" + formatBytes(p.memory.vae_decode) +
               " at " + std::to_string(request.width) + "x" + std::to_string(request.height) +
               ") replaces the transformer's (" +
               formatBytes(p.memory.activations + p.memory.attention) +
               ") in the peak rather than adding to it";
    p.components.push_back(v);

    // Reasons for the strategy.
    if (p.fits) {
      p.reasons.push_back(
          strategyName(s) + " fits: peak " + formatBytes(p.memory.peak()) + " per rank of " +
          formatBytes(p.usable) + " usable (" + formatBytes(ranks.memory_per_rank) + " x " +
          std::to_string(static_cast<int>(std::lround(ranks.usable_fraction * 100))) +
          "%), headroom " + formatBytes(p.headroom));
      p.reasons.push_back(
          "chosen as the fastest that fits, ranked by its collectives: a tp group inside a host "
          "before one across hosts, then the smallest tp (two all-reduces per block), cfg 2 "
          "with true CFG, Ulysses inside a host and ring across hosts, strict splits before the "
          "anything modes");
    }
  }

  // Alternatives: every other strategy, with why.
  for (const Candidate& c : cands) {
    if (chosen && &c == chosen) continue;
    PlanAlternative a;
    a.what = strategyName(c.s);
    a.valid = c.issues.empty();
    if (!a.valid) {
      a.why = "refused by the strategy rules: " + joinIssues(c.issues);
    } else {
      a.fits = c.fits;
      a.peak = c.e.peak();
      if (!c.fits)
        a.why = "peak " + formatBytes(a.peak) + " per rank > " + formatBytes(p.usable) +
                " usable (" + breakdown(c.e) + ")";
      else
        a.why =
            "fits (peak " + formatBytes(a.peak) + ") but " + slowerBecause(c.s, chosen->s, perHost);
    }
    p.alternatives.push_back(a);
  }
  // The other text-encoder placements at the chosen strategy, sized; those the request did not
  // allow say how to ask for them.
  if (chosen) {
    const uint64_t te = chosen->sharded.text_encoder_weights;
    for (TextEncoderPlacement pl :
         {TextEncoderPlacement::Sharded, TextEncoderPlacement::OwnRank,
          TextEncoderPlacement::HostStreamed, TextEncoderPlacement::Once}) {
      if (pl == placement) continue;
      PlanAlternative a;
      a.what = placementLabel(pl);
      std::string whyNot;
      const auto e = placedEstimate(model, chosen->sharded, chosen->s, pl, eb, scores, &whyNot);
      if (!e) {
        a.runnable = false;
        a.why = whyNot;
        p.alternatives.push_back(a);
        continue;
      }
      a.peak = e->peak();
      a.fits = a.peak <= p.usable;
      const bool allowed = std::find(order.begin(), order.end(), pl) != order.end();
      a.why = a.fits ? "fits (peak " + formatBytes(a.peak) + " per rank) but " +
                           placementCost(pl, te, e->text_encoder_weights, scores)
                     : "peak " + formatBytes(a.peak) + " per rank > " + formatBytes(p.usable) +
                           " usable (" + breakdown(*e) + ")";
      if (!allowed)
        a.why += std::string("; not considered: plan --text-encoder ") +
                 textEncoderPlacementName(pl) + " or auto";
      p.alternatives.push_back(a);
    }
  }

  if (p.fits) {
    p.message = "plan: " + strategyName(p.strategy) + " on " + std::to_string(ranks.count) +
                " rank" + (ranks.count > 1 ? "s" : "") + ", peak " + formatBytes(p.memory.peak()) +
                " per rank of " + formatBytes(p.usable) + " usable";
  } else if (chosen) {
    p.smallest_memory_per_rank = static_cast<uint64_t>(
        std::ceil(static_cast<double>(p.memory.peak()) / ranks.usable_fraction));
    // The largest part of that placement.
    const ComponentPlacement* largest = &p.components.front();
    for (const ComponentPlacement& c : p.components)
      if (c.weights_per_rank > largest->weights_per_rank) largest = &c;
    std::ostringstream o;
    o << "nothing fits " << ranks.count << " rank" << (ranks.count > 1 ? "s" : "") << " x "
      << formatBytes(ranks.memory_per_rank) << " (" << formatBytes(p.usable)
      << " usable each): the least memory-hungry placement the rules allow, "
      << strategyName(p.strategy) << ", needs a peak of " << formatBytes(p.memory.peak())
      << " per rank (" << breakdown(p.memory) << "), i.e. ranks of at least "
      << formatBytes(p.smallest_memory_per_rank) << " each; its largest part is the "
      << largest->component << " (" << largest->placement << ": "
      << formatBytes(largest->weights_per_rank) << " per rank)";
    p.message = o.str();
  } else {
    p.message = "no strategy on " + std::to_string(ranks.count) +
                " ranks passes the rules for this model and request (see the alternatives)";
  }
  return p;
}

std::string planText(const Plan& p) {
  std::ostringstream o;
  o << "Plan for " << p.model << " on " << p.ranks.count << " rank"
    << (p.ranks.count > 1 ? "s" : "") << " x " << formatBytes(p.ranks.memory_per_rank);
  if (p.ranks.hosts > 1) o << " (" << p.ranks.hosts << " hosts x " << p.ranks.ranksPerHost() << ")";
  o << ", " << p.ranks.device << ", " << p.request.width << "x" << p.request.height << ", "
    << p.request.text_len << " text tokens, " << p.request.dtype << "\n";
  o << (p.fits ? "Strategy: " : "Does not fit. Least memory: ")
    << (p.any_valid ? strategyName(p.strategy) : std::string("none")) << "\n";
  if (!p.fits) o << p.message << "\n";
  if (p.any_valid) {
    o << "\n";
    o << std::left << std::setw(14) << "component" << std::setw(14) << "weights/rank"
      << std::setw(10) << "dtype"
      << "placement\n";
    for (const ComponentPlacement& c : p.components)
      o << std::left << std::setw(14) << c.component << std::setw(14)
        << formatBytes(c.weights_per_rank) << std::setw(10) << c.dtype << c.placement << "\n";
    const MemoryEstimate& e = p.memory;
    o << "\nMemory per rank:\n"
      << "  weights        " << formatBytes(e.weights) << "\n"
      << "  activations    " << formatBytes(e.activations) << "\n"
      << "  attention      " << formatBytes(e.attention) << "\n"
      << "  VAE decode     " << formatBytes(e.vae_decode) << "  (after the steps: max with "
      << "activations + attention)\n"
      << (e.text_encode > 0 ? "  text encoding  " + formatBytes(e.text_encode) +
                                  "  (the encoder, before the steps: max with the stages)\n"
                            : std::string())
      << (p.text_encoder_host_bytes > 0
              ? "  host memory    " + formatBytes(p.text_encoder_host_bytes) +
                    "  (the streamed text encoder, not in the peak)\n"
              : std::string())
      << "  peak           " << formatBytes(e.peak()) << "\n"
      << "  usable         " << formatBytes(p.usable) << "  ("
      << static_cast<int>(std::lround(p.ranks.usable_fraction * 100)) << "% of "
      << formatBytes(p.ranks.memory_per_rank) << ")\n";
    if (p.fits) o << "  headroom       " << formatBytes(p.headroom) << "\n";
    o << "\nWhy:\n";
    for (const std::string& r : p.reasons) o << "  - " << r << "\n";
    for (const ComponentPlacement& c : p.components)
      o << "  - " << c.component << ": " << c.reason << "\n";
  }
  o << "\nRejected:\n";
  bool rejected = false;
  for (const PlanAlternative& a : p.alternatives)
    if (a.runnable) {
      o << "  - " << a.what << ": " << a.why << "\n";
      rejected = true;
    }
  if (!rejected) o << "  (none: no other strategy has this many ranks)\n";
  bool unavailable = false;
  for (const PlanAlternative& a : p.alternatives)
    if (!a.runnable) {
      if (!unavailable) o << "\nNot available:\n";
      unavailable = true;
      o << "  - " << a.what << ": " << a.why << "\n";
    }
  return o.str();
}

nlohmann::json planJson(const Plan& p) {
  nlohmann::json j;
  j["model"] = p.model;
  j["ranks"] = {{"count", p.ranks.count},   {"memory_per_rank", p.ranks.memory_per_rank},
                {"hosts", p.ranks.hosts},   {"ranks_per_host", p.ranks.ranksPerHost()},
                {"device", p.ranks.device}, {"usable_fraction", p.ranks.usable_fraction}};
  j["request"] = {{"width", p.request.width},
                  {"height", p.request.height},
                  {"text_len", p.request.text_len},
                  {"dtype", p.request.dtype},
                  {"element_bytes", p.request.element_bytes},
                  {"true_cfg", p.request.true_cfg}};
  j["fits"] = p.fits;
  j["message"] = p.message;
  if (p.any_valid) {
    j["strategy"] = strategyJson(p.strategy);
    j["text_encoder_placement"] = textEncoderPlacementName(p.text_encoder);
    const MemoryEstimate& e = p.memory;
    j["memory_per_rank"] = {{"weights", e.weights},
                            {"transformer_weights", e.transformer_weights},
                            {"text_encoder_weights", e.text_encoder_weights},
                            {"vae_weights", e.vae_weights},
                            {"activations", e.activations},
                            {"attention", e.attention},
                            {"vae_decode", e.vae_decode},
                            {"text_encode", e.text_encode},
                            {"text_encoder_host", p.text_encoder_host_bytes},
                            {"peak", e.peak()},
                            {"usable", p.usable},
                            {"headroom", p.headroom}};
    j["components"] = nlohmann::json::array();
    for (const ComponentPlacement& c : p.components)
      j["components"].push_back({{"component", c.component},
                                 {"placement", c.placement},
                                 {"dtype", c.dtype},
                                 {"weights_per_rank", c.weights_per_rank},
                                 {"reason", c.reason}});
    j["reasons"] = p.reasons;
  } else {
    j["strategy"] = nullptr;
  }
  if (!p.fits && p.smallest_memory_per_rank > 0)
    j["smallest_memory_per_rank"] = p.smallest_memory_per_rank;
  j["alternatives"] = nlohmann::json::array();
  for (const PlanAlternative& a : p.alternatives)
    j["alternatives"].push_back({{"what", a.what},
                                 {"runnable", a.runnable},
                                 {"valid", a.valid},
                                 {"fits", a.fits},
                                 {"peak", a.peak},
                                 {"why", a.why}});
  return j;
}

uint64_t parseMemorySize(const std::string& text) {
  const auto bad = [&] {
    return std::invalid_argument("not a memory size: \"" + text +
                                 "\" (e.g. 80G, 24GiB, 48000M or bytes; G = GiB)");
  };
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  size_t end = i;
  while (end < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[end])) || text[end] == '.'))
    ++end;
  if (end == i) throw bad();
  double value = 0;
  try {
    value = std::stod(text.substr(i, end - i));
  } catch (const std::exception&) {
    throw bad();
  }
  std::string unit;
  for (size_t k = end; k < text.size(); ++k)
    if (!std::isspace(static_cast<unsigned char>(text[k])))
      unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[k])));
  double mult = 1;
  if (unit.empty() || unit == "b")
    mult = 1;
  else {
    const char u = unit[0];
    const std::string rest = unit.substr(1);
    if (rest != "" && rest != "b" && rest != "i" && rest != "ib") throw bad();
    if (u == 'k')
      mult = 1024.0;
    else if (u == 'm')
      mult = 1024.0 * 1024;
    else if (u == 'g')
      mult = 1024.0 * 1024 * 1024;
    else if (u == 't')
      mult = 1024.0 * 1024 * 1024 * 1024;
    else
      throw bad();
  }
  const double bytes = value * mult;
  if (!(bytes >= 1) || bytes > 1.8e19) throw bad();
  return static_cast<uint64_t>(bytes + 0.5);
}

}  // namespace dit
