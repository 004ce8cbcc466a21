#include "backend/models/flux/flux_lora.h"

#include <map>
#include <regex>

namespace dit {

namespace {

std::vector<KohyaTarget> whole(const std::string& module, int64_t out) {
  return {KohyaTarget{module, 0, out, false, false}};
}

std::vector<KohyaTarget> split(const std::string& prefix, const std::vector<std::string>& names,
                               const std::vector<int64_t>& rows) {
  std::vector<KohyaTarget> t;
  int64_t start = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    t.push_back(KohyaTarget{prefix + names[i], start, rows[i], false, false});
    start += rows[i];
  }
  return t;
}

}  // namespace

std::vector<KohyaTarget> fluxKohyaTargets(const std::string& module, int64_t out, int64_t in) {
  static const std::map<std::string, std::string> kGlobal = {
      {"img_in", "x_embedder"},
      {"txt_in", "context_embedder"},
      {"time_in_in_layer", "time_text_embed.timestep_embedder.linear_1"},
      {"time_in_out_layer", "time_text_embed.timestep_embedder.linear_2"},
      {"vector_in_in_layer", "time_text_embed.text_embedder.linear_1"},
      {"vector_in_out_layer", "time_text_embed.text_embedder.linear_2"},
      {"guidance_in_in_layer", "time_text_embed.guidance_embedder.linear_1"},
      {"guidance_in_out_layer", "time_text_embed.guidance_embedder.linear_2"},
      {"final_layer_linear", "proj_out"},
  };
  if (auto it = kGlobal.find(module); it != kGlobal.end()) return whole(it->second, out);
  if (module == "final_layer_adaLN_modulation_1") {
    if (out % 2 != 0) return {};
    return {KohyaTarget{"norm_out.linear", 0, out, true, true}};
  }
  static const std::regex kDouble(
      "double_blocks_([0-9]+)_(img|txt)_(attn_qkv|attn_proj|mlp_0|"
      "mlp_2|mod_lin)");
  static const std::regex kSingle("single_blocks_([0-9]+)_(linear1|linear2|modulation_lin)");
  std::smatch m;
  if (std::regex_match(module, m, kDouble)) {
    const std::string p = "transformer_blocks." + m[1].str() + ".";
    const bool img = m[2] == "img";
    const std::string what = m[3];
    if (what == "attn_qkv") {
      if (out % 3 != 0) return {};
      const int64_t d = out / 3;
      return img ? split(p + "attn.", {"to_q", "to_k", "to_v"}, {d, d, d})
                 : split(p + "attn.", {"add_q_proj", "add_k_proj", "add_v_proj"}, {d, d, d});
    }
    if (what == "attn_proj") return whole(p + (img ? "attn.to_out.0" : "attn.to_add_out"), out);
    if (what == "mlp_0") return whole(p + (img ? "ff.net.0.proj" : "ff_context.net.0.proj"), out);
    if (what == "mlp_2") return whole(p + (img ? "ff.net.2" : "ff_context.net.2"), out);
    return whole(p + (img ? "norm1.linear" : "norm1_context.linear"), out);
  }
  if (std::regex_match(module, m, kSingle)) {
    const std::string p = "single_transformer_blocks." + m[1].str() + ".";
    const std::string what = m[2];
    if (what == "linear1") {
      // linear1 = cat(q, k, v, mlp) over the hidden size `in`.
      if (out <= 3 * in) return {};
      return split(p, {"attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"},
                   {in, in, in, out - 3 * in});
    }
    if (what == "linear2") return whole(p + "proj_out", out);
    return whole(p + "norm.linear", out);
  }
  return {};
}

}  // namespace dit
