// FLUX.2 [dev] text side against the tiny-flux2dev-A goldens (golden/README.md): MistralTokenizer
// (format_input + SYSTEM_MESSAGE through the Mistral chat template, the tekken pre-tokenizer,
// left padding; ids and masks exact on all 13 prompts), the Mistral decoder (Qwen3Model with
// parseMistralTextConfig's switches: GQA, explicit head_dim, no q/k norm, SDPA's zero output for
// the all-masked left-padding rows) and mistralPromptEmbeds (diffusers Flux2Pipeline.
// _get_mistral_3_small_prompt_embeds, layers 10/20/30) within 2e-5, and refusal of bad files.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/io/config_json.h"
#include "backend/io/safetensors.h"
#include "backend/io/tensor_io.h"
#include "backend/io/weight_source.h"
#include "backend/models/text_encoders/modeling_qwen3.h"
#include "backend/models/text_encoders/qwen3_config.h"
#include "backend/models/text_encoders/qwen3_plan.h"
#include "backend/tokenizers/mistral_tokenizer.h"
#include "golden_util.h"

namespace fs = std::filesystem;
using namespace dit;
using dit::test::fixtureDir;
using dit::test::golden;
using dit::test::goldenJson;

namespace {

const MistralTokenizer& tok() {
  static MistralTokenizer t = MistralTokenizer::fromFolder(fixtureDir() + "/tokenizer");
  return t;
}

std::vector<int64_t> asVector(const at::Tensor& t) {
  auto c = t.contiguous().to(at::kLong);
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

const nlohmann::json& prompts() { return goldenJson()["tokenization"]["prompts"]; }
std::string prompt(size_t i) { return prompts()[i]["prompt"].get<std::string>(); }

Qwen3Config config() {
  const std::string f = fixtureDir() + "/text_encoder/config.json";
  return parseMistralTextConfig(readConfigJson(f), f);
}

const Qwen3Model& model(int maxLayer) {
  static std::map<int, std::unique_ptr<Qwen3Model>> cache;
  auto& m = cache[maxLayer];
  if (!m) {
    auto w = WeightSource::fromFolder(fixtureDir() + "/text_encoder", "model", at::kFloat,
                                      c10::Device(c10::kCPU));
    m = std::make_unique<Qwen3Model>(config(), *w, nullptr, maxLayer);
  }
  return *m;
}

// Issue 47's tolerance on the prompt embeddings: 2e-5 absolute. Returns the max abs diff.
double expectClose(const at::Tensor& got, const at::Tensor& want, const std::string& what,
                   double atol = 2e-5) {
  EXPECT_EQ(got.sizes(), want.sizes()) << what;
  if (got.sizes() != want.sizes()) return 1e30;
  const double maxDiff = (got - want).abs().max().item<double>();
  EXPECT_LE(maxDiff, atol) << what;
  return maxDiff;
}

void writeFile(const fs::path& p, const std::string& s) { std::ofstream(p) << s; }

fs::path copyTokenizer(const std::string& name) {
  const fs::path d = test::tempDir("tok_" + name);
  for (auto& e : fs::directory_iterator(fs::path(fixtureDir()) / "tokenizer"))
    fs::copy_file(e.path(), d / e.path().filename());
  for (auto& e : fs::directory_iterator(d))
    fs::permissions(e.path(), fs::perms::owner_read | fs::perms::owner_write);
  return d;
}

std::string errorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(MistralTokenizer, ChatTemplateMatchesGolden) {
  ASSERT_EQ(prompts().size(), 13u);
  for (size_t i = 0; i < prompts().size(); ++i)
    EXPECT_EQ(tok().applyChatTemplate(prompt(i)), prompts()[i]["chat_text"].get<std::string>())
        << "prompt " << i;
  EXPECT_EQ(std::string(MistralTokenizer::kFlux2SystemMessage),
            goldenJson()["tokenization"]["system_message"].get<std::string>());
  // format_input: one str.replace pass, so "[IM[IMG]G]" leaves a real "[IMG]".
  EXPECT_EQ(tok().applyChatTemplate("a[IMG]b[IM[IMG]G]c", "S"),
            "<s>[SYSTEM_PROMPT]S[/SYSTEM_PROMPT][INST]ab[IMG]c[/INST]");
}

TEST(MistralTokenizer, TokenIdsMasksAndUntruncatedIdsExact) {
  EXPECT_EQ(tok().padId(), 11);
  EXPECT_EQ(tok().bosId(), 1);
  EXPECT_TRUE(tok().padsLeft());
  for (size_t i = 0; i < prompts().size(); ++i) {
    SCOPED_TRACE("prompt " + std::to_string(i));
    const std::string s = std::to_string(i);
    const std::string chat = tok().applyChatTemplate(prompt(i));
    const auto padded = tok().encode(chat, 512);
    EXPECT_EQ(padded.input_ids, asVector(golden("tok.input_ids." + s)));
    EXPECT_EQ(padded.attention_mask, asVector(golden("tok.attention_mask." + s)));
    const auto full = tok().encode(chat, 0);
    EXPECT_EQ(full.input_ids, asVector(golden("tok.untruncated." + s)));
    EXPECT_EQ(padded.untruncated_length, full.input_ids.size());
    EXPECT_EQ(full.input_ids.size(), prompts()[i]["n_tokens"].get<size_t>());
    // Token strings (byte-level form) as golden.json lists them (the first 512).
    const auto& strs = prompts()[i]["tokens"];
    ASSERT_EQ(strs.size(), std::min<size_t>(full.input_ids.size(), 512));
    for (size_t k = 0; k < strs.size(); ++k)
      EXPECT_EQ(tok().idToToken(full.input_ids[k]), strs[k].get<std::string>()) << "token " << k;
    // max_sequence_length 64: the first 64 ids, left-padded.
    const auto m64 = tok().encode(chat, 64);
    const size_t real = prompts()[i]["n_real_msl64"].get<size_t>();
    ASSERT_EQ(m64.input_ids.size(), 64u);
    EXPECT_EQ(std::count(m64.attention_mask.begin(), m64.attention_mask.end(), 1),
              static_cast<std::ptrdiff_t>(real));
    for (size_t k = 0; k < 64 - real; ++k) EXPECT_EQ(m64.input_ids[k], 11) << "pad " << k;
    EXPECT_TRUE(std::equal(m64.input_ids.begin() + static_cast<std::ptrdiff_t>(64 - real),
                           m64.input_ids.end(), full.input_ids.begin()));
    if (i == 0) {
      EXPECT_EQ(m64.input_ids, asVector(golden("enc.msl64.input_ids.0")));
      EXPECT_EQ(m64.attention_mask, asVector(golden("enc.msl64.attention_mask.0")));
    }
  }
  // The empty prompt: the template alone is 32 tokens.
  EXPECT_EQ(tok().encode(tok().applyChatTemplate(""), 0).input_ids.size(),
            goldenJson()["tokenization"]["tokens_of_template_with_empty_prompt"].get<size_t>());
}

TEST(MistralTokenizer, RefusesBadFiles) {
  {
    // No chat template anywhere: named, with the file it looked for.
    auto d = copyTokenizer("notemplate");
    fs::remove(d / "chat_template.jinja");
    auto cfg = nlohmann::json::parse(std::ifstream(d / "tokenizer_config.json"));
    cfg.erase("chat_template");
    writeFile(d / "tokenizer_config.json", cfg.dump());
    const auto msg = errorOf([&] { MistralTokenizer::fromFolder(d.string()); });
    EXPECT_NE(msg.find("chat_template.jinja: no chat template"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tokenizer_config.json"), std::string::npos) << msg;
    // ... but tokenizer_config.json's copy alone is enough.
    cfg["chat_template"] = nlohmann::json::parse(std::ifstream(
        fs::path(fixtureDir()) / "tokenizer" / "tokenizer_config.json"))["chat_template"];
    writeFile(d / "tokenizer_config.json", cfg.dump());
    EXPECT_EQ(MistralTokenizer::fromFolder(d.string()).applyChatTemplate(prompt(0)),
              prompts()[0]["chat_text"].get<std::string>());
  }
  {
    auto d = copyTokenizer("othertemplate");
    writeFile(d / "chat_template.jinja", "{% for m in messages %}{{ m.content }}{% endfor %}");
    const auto msg = errorOf([&] { MistralTokenizer::fromFolder(d.string()); });
    EXPECT_NE(msg.find("chat_template.jinja: unrecognised chat template"), std::string::npos)
        << msg;
  }
  {
    auto d = copyTokenizer("pretok");
    auto tj = nlohmann::json::parse(std::ifstream(d / "tokenizer.json"));
    auto pre = tj["pre_tokenizer"];
    tj["pre_tokenizer"] = {{"type", "Whitespace"}};
    writeFile(d / "tokenizer.json", tj.dump());
    auto msg = errorOf([&] { MistralTokenizer::fromFolder(d.string()); });
    EXPECT_NE(msg.find("tokenizer.json: pre_tokenizer is not tekken's"), std::string::npos) << msg;
    tj["pre_tokenizer"] = pre;
    tj["normalizer"] = {{"type", "NFC"}};
    writeFile(d / "tokenizer.json", tj.dump());
    msg = errorOf([&] { MistralTokenizer::fromFolder(d.string()); });
    EXPECT_NE(msg.find("normalizer \"NFC\""), std::string::npos) << msg;
    tj["normalizer"] = nullptr;
    tj["model"]["merges"].push_back(nlohmann::json::array({"zz", "qq"}));
    writeFile(d / "tokenizer.json", tj.dump());
    msg = errorOf([&] { MistralTokenizer::fromFolder(d.string()); });
    EXPECT_NE(msg.find("token \"zz\" is not in model.vocab"), std::string::npos) << msg;
  }
  {
    auto d = copyTokenizer("pad");
    auto cfg = nlohmann::json::parse(std::ifstream(d / "tokenizer_config.json"));
    cfg["pad_token"] = "<nope>";
    writeFile(d / "tokenizer_config.json", cfg.dump());
    const auto msg = errorOf([&] { MistralTokenizer::fromFolder(d.string()); });
    EXPECT_NE(msg.find("pad_token \"<nope>\" is not a known token"), std::string::npos) << msg;
  }
}

TEST(MistralConfig, ReadsFixtureAndRefusesBadValues) {
  const Qwen3Config c = config();
  EXPECT_EQ(c.hidden_size, 24);
  EXPECT_EQ(c.num_hidden_layers, 32);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.intermediate_size, 48);
  EXPECT_EQ(c.vocab_size, 704);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e9);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_FALSE(c.hasQkvBias());
  EXPECT_FALSE(c.positions_from_mask);
  EXPECT_TRUE(c.masked_rows_zero);
  const std::string f = "text_encoder/config.json";
  auto j = nlohmann::json::parse(std::ifstream(fixtureDir() + "/text_encoder/config.json"));
  auto bad = [&](const char* key, nlohmann::json v) {
    auto k = j;
    k["text_config"][key] = v;
    return errorOf([&] { parseMistralTextConfig(k, f); });
  };
  auto m = bad("num_key_value_heads", 3);
  EXPECT_NE(m.find("'num_key_value_heads'"), std::string::npos) << m;
  m = bad("head_dim", 7);
  EXPECT_NE(m.find("'head_dim' must be even"), std::string::npos) << m;
  m = bad("sliding_window", 4096);
  EXPECT_NE(m.find("'sliding_window' is set"), std::string::npos) << m;
  m = bad("hidden_act", "gelu");
  EXPECT_NE(m.find("'hidden_act'"), std::string::npos) << m;
  m = bad("model_type", "llama");
  EXPECT_NE(m.find("llama"), std::string::npos) << m;
  // head_dim null: hidden_size / num_attention_heads (transformers' MistralConfig).
  auto k = j;
  k["text_config"]["head_dim"] = nullptr;
  EXPECT_EQ(parseMistralTextConfig(k, f).head_dim, 6);
  // A Qwen3 config is not read as Mistral, nor the other way round.
  EXPECT_NE(errorOf([&] { parseQwen3Config(j, f); }).find("mistral3"), std::string::npos);
  auto q = j;
  q["model_type"] = "qwen3";
  EXPECT_NE(errorOf([&] { parseMistralTextConfig(q, f); }).find("qwen3"), std::string::npos);
}

TEST(MistralTextEncoder, HiddenStatesOfPrompt0) {
  const auto& full = model(32);
  const auto ids = golden("enc.msl64.input_ids.0").view({1, 64});
  const auto mask = golden("enc.msl64.attention_mask.0").view({1, 64});
  const int ks[] = {0, 1, 10, 32};  // 32: the final-RMSNorm output
  const auto hs = full.hiddenStates(ids, mask, {0, 1, 10, 32});
  ASSERT_EQ(hs.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    const double d = expectClose(hs[i][0], golden("enc.hidden_states.0." + std::to_string(ks[i])),
                                 "hidden_states[" + std::to_string(ks[i]) + "]");
    std::printf("hidden_states[%d] max abs diff %.3g\n", ks[i], d);
  }
  // SDPA: the left-padding rows attend to nothing, so they are all the same row.
  const at::Tensor h10 = hs[2][0];
  const int64_t pad = 64 - mask.sum().item<int64_t>();
  ASSERT_GT(pad, 1);
  EXPECT_LE((h10.narrow(0, 0, pad) - h10[0]).abs().max().item<double>(), 1e-5);
  EXPECT_THROW(model(30).hiddenStates(ids, mask, {31}), std::invalid_argument);
  EXPECT_THROW(full.hiddenStates(at::full_like(ids, 704), mask, {1}), std::invalid_argument);
}

TEST(MistralTextEncoder, PromptEmbedsOfAll13PromptsWithin2e5) {
  const auto& m = model(30);  // (10, 20, 30): 30 of 32 layers loaded and run
  EXPECT_EQ(m.layersLoaded(), 30);
  double worst = 0;
  for (size_t i = 0; i < prompts().size(); ++i) {
    const auto pe = mistralPromptEmbeds(tok(), m, prompt(i), 64);
    ASSERT_EQ(pe.sizes(), (std::vector<int64_t>{1, 64, 72}));
    worst =
        std::max(worst, expectClose(pe[0], golden("enc.msl64.prompt_embeds." + std::to_string(i)),
                                    "prompt_embeds " + std::to_string(i)));
  }
  for (int i : {0, 2}) {
    const auto pe = mistralPromptEmbeds(tok(), m, prompt(static_cast<size_t>(i)));
    ASSERT_EQ(pe.sizes(), (std::vector<int64_t>{1, 512, 72}));
    worst =
        std::max(worst, expectClose(pe[0], golden("enc.msl512.prompt_embeds." + std::to_string(i)),
                                    "msl512 prompt_embeds " + std::to_string(i)));
  }
  std::printf("prompt_embeds (13 prompts at 64, 2 at 512) max abs diff %.3g\n", worst);
}

TEST(MistralTextEncoder, AltLayersIncludeEmbeddingsAndFinalNorm) {
  const auto pe = mistralPromptEmbeds(tok(), model(32), prompt(1), 64, {0, 16, 32});
  std::printf("alt layers max abs diff %.3g\n",
              expectClose(pe[0], golden("enc.alt_layers.prompt_embeds.1"), "alt layers"));
}

// Only the layers up to the largest index are read; the vision tower / projector / lm_head never.
TEST(MistralTextEncoder, LoadsOnlyTheLanguageModelLayersItRuns) {
  const Qwen3Config c = config();
  const auto table = qwen3ParameterTable(c, 30, false, "F32", 4, "model.language_model.");
  uint64_t bytes = 0;
  for (const auto& p : table) bytes += static_cast<uint64_t>(p.numel() * 4);
  EXPECT_EQ(model(30).weightBytes(), bytes);
  SafetensorsCollection file(fixtureDir() + "/text_encoder/model.safetensors");
  size_t vision = 0;
  for (const auto& n : file.names()) vision += n.rfind("model.language_model.", 0) != 0;
  EXPECT_GT(vision, 0u);  // the checkpoint has them; the table does not declare them
  for (const auto& p : table) EXPECT_EQ(file.info(p.name).shape, p.shape) << p.name;
}

// Mistral3 checkpoints saved before transformers 4.52 keep the language model under
// "language_model.model.*": the same encoder, the same embeddings.
TEST(MistralTextEncoder, ReadsTheOlderLanguageModelPrefix) {
  SafetensorsCollection file(fixtureDir() + "/text_encoder/model.safetensors");
  std::map<std::string, at::Tensor> renamed;
  const std::string now = "model.language_model.", before = "language_model.model.";
  for (const auto& n : file.names())
    if (n.rfind(now, 0) == 0)
      renamed[before + n.substr(now.size())] = loadTensor(file, n, at::kFloat);
  auto w = WeightSource::fromTensors(std::move(renamed));
  const Qwen3Model old(config(), *w, nullptr, 30);
  const auto a = mistralPromptEmbeds(tok(), old, prompt(1), 64);
  const auto b = mistralPromptEmbeds(tok(), model(30), prompt(1), 64);
  EXPECT_TRUE(a.equal(b));
}
