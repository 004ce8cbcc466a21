// Strategy validation: the rules of DESIGN.md section 3, shared by the worker (before any weight is
// read or any collective runs) and the GUI's strategy editor (live). No Torch, no MPI.
#include "parallel/strategy.h"

#include <sstream>
#include <stdexcept>

namespace dit {

namespace {

std::string str(long long v) { return std::to_string(v); }

void add(std::vector<StrategyIssue>& out, std::string rule, std::string message) {
  out.push_back({std::move(rule), std::move(message)});
}

// "dp_degree 2 x cfg_degree 1 x ring_degree 2 x ulysses_degree 1 x tp_degree 1"
std::string degreeProduct(const Strategy& s) {
  return "dp_degree " + str(s.dp_degree) + " x cfg_degree " + str(s.cfg_degree) +
         " x ring_degree " + str(s.ring_degree) + " x ulysses_degree " + str(s.ulysses_degree) +
         " x tp_degree " + str(s.tp_degree);
}

bool degreesPositive(const Strategy& s) {
  return s.tp_degree >= 1 && s.ring_degree >= 1 && s.ulysses_degree >= 1 && s.cfg_degree >= 1 &&
         s.dp_degree >= 1;
}

// The context-parallel layout in words: "ulysses_degree 4", "ring_degree 2 x ulysses_degree 2".
std::string cpWords(const Strategy& s) {
  if (s.ring_degree > 1 && s.ulysses_degree > 1)
    return "ring_degree " + str(s.ring_degree) + " x ulysses_degree " + str(s.ulysses_degree) +
           " (context-parallel degree " + str(s.cpDegree()) + ")";
  if (s.ring_degree > 1) return "ring_degree " + str(s.ring_degree);
  return "ulysses_degree " + str(s.ulysses_degree);
}

}  // namespace

std::string Strategy::describe() const {
  std::ostringstream o;
  o << world << (world == 1 ? " rank: " : " ranks: ");
  std::vector<std::string> parts;
  if (tp_degree != 1) parts.push_back("tp " + str(tp_degree));
  if (ring_degree != 1)
    parts.push_back("ring " + str(ring_degree) + (ring_anything ? " (anything)" : ""));
  if (ulysses_degree != 1)
    parts.push_back("ulysses " + str(ulysses_degree) + (ulysses_anything ? " (anything)" : ""));
  if (cfg_degree != 1) parts.push_back("cfg " + str(cfg_degree));
  if (dp_degree != 1) parts.push_back("dp " + str(dp_degree));
  if (parts.empty()) {
    o << "no parallelism";
  } else {
    for (size_t i = 0; i < parts.size(); ++i) o << (i ? " x " : "") << parts[i];
  }
  if (device != "cpu") o << " on " << device;
  return o.str();
}

std::vector<StrategyIssue> validateDegrees(const Strategy& s) {
  std::vector<StrategyIssue> out;
  if (s.world < 1) add(out, "world", "world size " + str(s.world) + " must be at least 1 rank");
  const std::pair<const char*, int> degrees[] = {{"dp_degree", s.dp_degree},
                                                 {"cfg_degree", s.cfg_degree},
                                                 {"ring_degree", s.ring_degree},
                                                 {"ulysses_degree", s.ulysses_degree},
                                                 {"tp_degree", s.tp_degree}};
  for (const auto& [name, v] : degrees)
    if (v < 1) add(out, "degree_range", std::string(name) + " " + str(v) + " must be at least 1");
  if (s.cfg_degree > 2)
    add(out, "cfg_degree",
        "cfg_degree " + str(s.cfg_degree) +
            " is not supported: CFG parallel splits the conditional and unconditional branch, so "
            "cfg_degree must be 1 or 2");
  if (degreesPositive(s) && s.world >= 1) {
    const long long product =
        1LL * s.dp_degree * s.cfg_degree * s.ring_degree * s.ulysses_degree * s.tp_degree;
    if (product != s.world)
      add(out, "world",
          degreeProduct(s) + " = " + str(product) + " does not equal the world size " +
              str(s.world) + " (mpirun -np " + str(s.world) +
              "); the product of the degrees must be the rank count");
  }
  if (s.ulysses_anything && s.ring_anything) {
    add(out, "anything_both",
        "ulysses_anything and ring_anything cannot be combined (ring_degree " + str(s.ring_degree) +
            ", ulysses_degree " + str(s.ulysses_degree) + "); choose one context-parallel variant");
  } else {
    if (s.ulysses_anything) {
      if (s.ulysses_degree <= 1)
        add(out, "ulysses_anything",
            "ulysses_anything needs ulysses_degree > 1 (got ulysses_degree " +
                str(s.ulysses_degree) + ")");
      if (s.ring_degree != 1)
        add(out, "ulysses_anything",
            "ulysses_anything needs ring_degree 1 (got ring_degree " + str(s.ring_degree) +
                " with ulysses_degree " + str(s.ulysses_degree) +
                "); use strict unified ring x ulysses or drop the ring");
    }
    if (s.ring_anything) {
      if (s.ring_degree <= 1)
        add(out, "ring_anything",
            "ring_anything needs ring_degree > 1 (got ring_degree " + str(s.ring_degree) + ")");
      if (s.ulysses_degree != 1)
        add(out, "ring_anything",
            "ring_anything needs ulysses_degree 1 (got ulysses_degree " + str(s.ulysses_degree) +
                " with ring_degree " + str(s.ring_degree) +
                "); use strict unified ring x ulysses or drop Ulysses");
    }
  }
  if (s.ring_degree > 1 && s.ulysses_degree > 1 && s.world < 4)
    add(out, "unified",
        "unified ring x ulysses attention (ring_degree " + str(s.ring_degree) +
            " x ulysses_degree " + str(s.ulysses_degree) +
            ") needs at least 4 ranks, world size is " + str(s.world));
  if (s.device != "cpu" && s.device != "cuda")
    add(out, "device", "device '" + s.device + "' is not supported; use cpu or cuda");
  return out;
}

std::vector<StrategyIssue> validateForModel(const Strategy& s, const ModelDims& m) {
  std::vector<StrategyIssue> out = validateDegrees(s);
  if (m.num_attention_heads <= 0 || m.attention_head_dim <= 0) {
    add(out, "model",
        "model sizes unknown (num_attention_heads " + str(m.num_attention_heads) +
            ", attention_head_dim " + str(m.attention_head_dim) + "); cannot check the strategy");
    return out;
  }
  const int heads = m.num_attention_heads;
  const int tp = s.tp_degree;
  if (tp > 1) {
    if (!m.tensor_parallel_plan) {
      add(out, "tp_plan",
          "tp_degree " + str(tp) +
              " is not possible: this model declares no tensor-parallel plan "
              "(use tp_degree 1 and another kind of parallelism)");
    } else if (!m.parameters) {
      add(out, "tp_plan",
          "tp_degree " + str(tp) + " cannot be checked: the model's parameters are unknown");
    } else {
      for (auto& i : m.tensor_parallel_plan->validate(*m.parameters, tp))
        out.push_back(std::move(i));
    }
  }
  if (s.ulysses_degree > 1 && !s.ulysses_anything && tp >= 1 && heads % tp == 0) {
    const int local = heads / tp;
    if (local % s.ulysses_degree != 0)
      add(out, "ulysses_heads",
          "ulysses_degree " + str(s.ulysses_degree) + " does not divide the " + str(local) +
              " attention heads per tensor-parallel rank (num_attention_heads " + str(heads) +
              " / tp_degree " + str(tp) + "); use --ulysses-anything (with ring_degree 1)");
  }
  return out;
}

std::vector<StrategyIssue> validateForRequest(const Strategy& s, const ModelDims& m,
                                              const RequestDims& r) {
  std::vector<StrategyIssue> out = validateForModel(s, m);
  const int vsf = m.vae_scale_factor > 0 ? m.vae_scale_factor : 8;
  const int mult = 2 * vsf;
  bool sizeOk = true;
  if (r.width <= 0 || r.width % mult != 0) {
    sizeOk = false;
    add(out, "size_multiple",
        "width " + str(r.width) + " is not a positive multiple of " + str(mult) +
            " (2 x vae_scale_factor " + str(vsf) + ")");
  }
  if (r.height <= 0 || r.height % mult != 0) {
    sizeOk = false;
    add(out, "size_multiple",
        "height " + str(r.height) + " is not a positive multiple of " + str(mult) +
            " (2 x vae_scale_factor " + str(vsf) + ")");
  }
  if (r.text_len <= 0)
    add(out, "text_len", "text_len " + str(r.text_len) + " must be at least 1 token");
  const int cp = s.cpDegree();
  const bool anything = (s.ulysses_anything && s.ring_degree == 1 && s.ulysses_degree > 1) ||
                        (s.ring_anything && s.ulysses_degree == 1 && s.ring_degree > 1);
  if (cp > 1 && !anything && sizeOk && r.text_len > 0) {
    // The lengths the split sees: padded to the model's sequence multiple (1 = as given).
    // The image stream: the output's tokens and, when editing, the references' after them.
    const int image = m.paddedTokens(r.imageStreamTokens(vsf));
    const int textLen = m.paddedTokens(r.text_len);
    const bool textOk = textLen % cp == 0;
    const bool imageOk = image % cp == 0;
    if (!textOk || !imageOk) {
      const int gw = r.width / mult, gh = r.height / mult;
      std::string which = !textOk && !imageOk
                              ? "neither is"
                              : (!textOk ? "text_len is not" : "image tokens are not");
      add(out,
          s.ring_degree > 1 && s.ulysses_degree > 1
              ? "cp_tokens"
              : (s.ring_degree > 1 ? "ring_tokens" : "ulysses_tokens"),
          cpWords(s) + " needs text_len " + str(textLen) + " and image tokens " + str(image) +
              " (" + str(r.width) + "x" + str(r.height) + " px = " + str(gw) + "x" + str(gh) +
              " tokens" +
              (r.reference_tokens > 0 ? " + " + str(r.reference_tokens) + " reference-image tokens"
                                      : std::string()) +
              ") both divisible by " + str(cp) + "; " + which + " divisible by " + str(cp) +
              "; use --ulysses-anything / --ring-anything" +
              (s.ring_degree > 1 && s.ulysses_degree > 1 ? " (each needs the other degree to be 1)"
                                                         : ""));
    }
  }
  if (s.cfg_degree == 2 && !r.true_cfg)
    add(out, "cfg_true_cfg",
        r.cfg_requirement.empty()
            ? std::string("cfg_degree 2 needs true CFG, a second (unconditional) branch (the "
                          "model's CFG scale above its threshold, with a negative prompt where "
                          "the model needs one); this request runs none, so one half of the "
                          "ranks would idle; use cfg_degree 1 (or dp_degree 2 for throughput)")
            : "cfg_degree 2 needs true CFG, a second (unconditional) branch: " + r.cfg_requirement +
                  "; this request runs none, so one half of the ranks would idle; use "
                  "cfg_degree 1 (or dp_degree 2 for throughput)");
  return out;
}

std::string joinIssues(const std::vector<StrategyIssue>& issues) {
  std::string s;
  for (size_t i = 0; i < issues.size(); ++i) {
    if (i) s += "; ";
    s += issues[i].message;
  }
  return s;
}

std::array<int, 5> meshCoords(const Strategy& s, int rank) {
  if (!degreesPositive(s))
    throw std::invalid_argument("meshCoords: every degree must be at least 1 (" + degreeProduct(s) +
                                ")");
  const long long world =
      1LL * s.dp_degree * s.cfg_degree * s.ring_degree * s.ulysses_degree * s.tp_degree;
  if (rank < 0 || rank >= world)
    throw std::invalid_argument("meshCoords: rank " + str(rank) + " outside the mesh of " +
                                str(world) + " ranks (" + degreeProduct(s) + ")");
  std::array<int, 5> c{};
  int r = rank;
  c[4] = r % s.tp_degree;
  r /= s.tp_degree;
  c[3] = r % s.ulysses_degree;
  r /= s.ulysses_degree;
  c[2] = r % s.ring_degree;
  r /= s.ring_degree;
  c[1] = r % s.cfg_degree;
  r /= s.cfg_degree;
  c[0] = r;
  return c;
}

std::vector<int> evenSplit(int n, int parts) {
  if (parts < 1)
    throw std::invalid_argument("evenSplit: parts " + str(parts) + " must be at least 1");
  if (n < 0) throw std::invalid_argument("evenSplit: n " + str(n) + " must not be negative");
  std::vector<int> out(parts, n / parts);
  for (int i = 0; i < n % parts; ++i) ++out[i];
  return out;
}

}  // namespace dit
