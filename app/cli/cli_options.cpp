// ditstudio-cli's options: see cli_options.h.
#include "app/cli/cli_options.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

#include "app/common/generation.h"
#include "app/protocol/protocol.h"
#include "backend/io/lora_file.h"
#include "backend/models/text_encoder_placement.h"
#include "backend/pipelines/diffusion_pipeline.h"

namespace dit::cli {

namespace fs = std::filesystem;

// --lora FILE[:STRENGTH] -> the request's LoRA list (absolute paths: the worker's current folder
// may differ). STRENGTH is whatever follows the last ':' when it reads fully as a number (default
// 1.0). Every file's header is checked here (inspectLoraFile), so a missing, corrupt or unknown
// file is refused before any process starts.
void applyLoraOptions(CliOptions& o) {
  o.gen.loras.clear();
  for (const std::string& arg : o.loras) {
    protocol::LoraRequest l;
    l.file = arg;
    if (const size_t colon = arg.rfind(':'); colon != std::string::npos && colon + 1 < arg.size()) {
      try {
        size_t used = 0;
        const double s = std::stod(arg.substr(colon + 1), &used);
        if (used == arg.size() - colon - 1) {
          l.file = arg.substr(0, colon);
          l.strength = s;
        }
      } catch (const std::logic_error&) {  // not a number: part of the file name
      }
    }
    if (l.file.empty()) throw std::invalid_argument("--lora '" + arg + "' names no file");
    l.file = fs::absolute(l.file).string();
    (void)inspectLoraFile(l.file);  // throws naming the file and the cause
    o.gen.loras.push_back(std::move(l));
  }
}

// --seed: a 64-bit integer (0 .. 2^64-1, exactly) or a negative number for a random seed.
void applySeed(CliOptions& o) {
  if (o.seed.empty()) return;
  try {
    if (o.seed[0] != '-' && !std::isdigit(static_cast<unsigned char>(o.seed[0])))
      throw std::invalid_argument(o.seed);
    size_t used = 0;
    if (o.seed[0] == '-') {
      (void)std::stoll(o.seed, &used);
      if (used != o.seed.size()) throw std::invalid_argument(o.seed);
      o.gen.random_seed = true;
    } else {
      o.gen.seed = std::stoull(o.seed, &used);
      if (used != o.seed.size()) throw std::invalid_argument(o.seed);
      o.gen.random_seed = false;
    }
  } catch (const std::logic_error&) {
    throw std::invalid_argument("--seed '" + o.seed +
                                "' is not an integer in 0 .. 18446744073709551615 (or -1: random)");
  }
}

// The protocol's checks at the door, with the CLI's option names ("--guidance must be a finite
// number in 0 .. 100, got nan"; "--prompt is not valid UTF-8: byte 3 ...").
void checkOptions(const protocol::GenerateRequest& r) {
  try {
    protocol::checkRequest(r);
  } catch (const protocol::ProtocolError& e) {
    std::string msg = e.what();
    const std::string prefix = "request field '" + e.field() + "'";
    if (!e.field().empty() && msg.rfind(prefix, 0) == 0) {
      std::string opt = e.field();
      // A family knob ("options.true_cfg_scale") is given by its own flag (--true-cfg-scale).
      if (opt.rfind("options.", 0) == 0) opt = opt.substr(8);
      std::replace(opt.begin(), opt.end(), '_', '-');
      msg = "--" + opt + msg.substr(prefix.size());
    }
    throw std::invalid_argument(msg);
  }
}

// Every file the request would write, refused when one exists (unless --overwrite).
void checkOutputPaths(const CliOptions& o) {
  if (o.output.empty())
    throw std::invalid_argument("--output is empty: give the file name of the PNG to write");
  if (o.output.back() == '/' || fs::is_directory(o.output))
    throw std::invalid_argument("--output " + o.output +
                                " is a folder: give the file name of the PNG to write");
  if (!o.outputTensors.empty() &&
      fs::absolute(o.output).lexically_normal() == fs::absolute(o.outputTensors).lexically_normal())
    throw std::invalid_argument("--output and --output-tensors name the same file (" + o.output +
                                "): the tensors would replace the PNG; give two file names");
}

void refuseOverwrite(const CliOptions& o, int count) {
  if (o.overwrite) return;
  for (int i = 0; i < count; ++i)
    for (const std::string* f : {&o.output, &o.outputTensors})
      if (!f->empty() && fs::exists(indexedPath(*f, i, count)))
        throw std::invalid_argument(
            "refusing to overwrite the existing file " + indexedPath(*f, i, count) +
            " (use --overwrite to replace it, or another --output / --output-tensors)");
}

std::string exeDir() {
  std::error_code ec;
  auto p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : p.parent_path().string();
}

double parseKnobValue(const std::string& flag, const std::string& text, bool switchLike) {
  std::string t = text;
  for (char& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (switchLike) {
    if (t == "on" || t == "true" || t == "yes") return 1;
    if (t == "off" || t == "false" || t == "no") return 0;
  }
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0')
    throw std::invalid_argument(flag + " needs a number" +
                                (switchLike ? std::string(" or on / off") : std::string()) +
                                ", got '" + text + "'");
  return v;
}

protocol::GenerateRequest request(const CliOptions& o) {
  protocol::GenerateRequest r;
  r.id = "cli";
  r.params = o.gen;
  r.prompts = o.prompts;
  if (!r.prompts.empty()) r.params.num_images = static_cast<int>(r.prompts.size());
  // The worker's ranks read the init image and mask: absolute paths.
  if (!r.params.init_image.empty())
    r.params.init_image = fs::absolute(r.params.init_image).string();
  if (!r.params.mask_image.empty())
    r.params.mask_image = fs::absolute(r.params.mask_image).string();
  // --image: the reference images, in the order given.
  r.params.reference_images.clear();
  for (const std::string& image : o.images)
    r.params.reference_images.push_back({fs::absolute(image).string(), ""});
  r.output = fs::absolute(o.output).string();
  if (!o.outputTensors.empty()) r.output_tensors = fs::absolute(o.outputTensors).string();
  r.overwrite = o.overwrite;
  return r;
}

void applyTextEncoderOptions(const CliOptions& o, PipelineOptions& po) {
  po.text_encoder = parseTextEncoderPlacement(o.run.text_encoder_placement);
  po.prompt_cache = o.run.prompt_cache;
}

VaeTiling vaeTilingOf(int pixels) {
  VaeTiling t;
  t.enabled = pixels >= 0;
  t.tile_sample_min_size = pixels > 0 ? pixels : 0;
  return t;
}

}  // namespace dit::cli
