// The component-source flags shared by ditstudio-cli and ditstudio-worker (the CLI passes them on
// to every rank): --config, --vae, --text-encoder, --text-encoder-2, --tokenizer, --tokenizer-2.
// --model stays each program's own option (it has a default). See ModelSources (model_folder.h).
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "backend/io/model_folder.h"

namespace dit {

/// Registers the component-source flags on `app`, bound to `s`.
inline void addModelSourceOptions(CLI::App& app, ModelSources& s) {
  app.add_option("--config", s.config,
                 "diffusers FLUX.1 folder whose configs complete single-file checkpoints (RoPE "
                 "axes, VAE scaling, scheduler; default: FLUX.1's published configs)");
  app.add_option("--vae", s.vae, "VAE: diffusers component folder or single file (ae.safetensors)");
  app.add_option("--text-encoder", s.text_encoder,
                 "CLIP-L text encoder: diffusers component folder or single file");
  app.add_option("--text-encoder-2", s.text_encoder_2,
                 "T5 text encoder: diffusers component folder or single file");
  app.add_option("--tokenizer", s.tokenizer, "CLIP tokenizer folder");
  app.add_option("--tokenizer-2", s.tokenizer_2, "T5 tokenizer folder");
}

/// The flags of `s` other than --model, as arguments for ditstudio-worker (only those given).
inline std::vector<std::string> modelSourceArgs(const ModelSources& s) {
  std::vector<std::string> a;
  auto add = [&](const char* flag, const std::string& v) {
    if (v.empty()) return;
    a.push_back(flag);
    a.push_back(v);
  };
  add("--config", s.config);
  add("--vae", s.vae);
  add("--text-encoder", s.text_encoder);
  add("--text-encoder-2", s.text_encoder_2);
  add("--tokenizer", s.tokenizer);
  add("--tokenizer-2", s.tokenizer_2);
  return a;
}

}  // namespace dit
