// FLUX.2 [klein] text side against the tiny-flux2-A goldens: Qwen2Tokenizer (chat template,
// token ids, masks, untruncated ids), Qwen3Model hidden states and qwen3PromptEmbeds
// (diffusers Flux2KleinPipeline._get_qwen3_prompt_embeds), and refusal of bad files.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/io/safetensors.h"
#include "backend/io/weight_source.h"
#include "backend/models/text_encoders/modeling_qwen3.h"
#include "backend/models/text_encoders/qwen3_config.h"
#include "backend/models/text_encoders/qwen3_plan.h"
#include "backend/tokenizers/qwen2_tokenizer.h"
#include "golden_util.h"

namespace fs = std::filesystem;
using namespace dit;
using dit::test::fixtureDir;
using dit::test::golden;
using dit::test::goldenJson;

namespace {

const Qwen2Tokenizer& tok() {
  static Qwen2Tokenizer t = Qwen2Tokenizer::fromFolder(fixtureDir() + "/tokenizer");
  return t;
}

std::vector<int64_t> asVector(const at::Tensor& t) {
  auto c = t.contiguous().to(at::kLong);
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

const nlohmann::json& prompts() { return goldenJson()["tokenization"]["prompts"]; }

const Qwen3Model& model(int maxLayer) {
  static std::map<int, std::unique_ptr<Qwen3Model>> cache;
  auto& m = cache[maxLayer];
  if (!m) {
    const auto cfg = loadQwen3Config(fixtureDir() + "/text_encoder/config.json");
    auto w = WeightSource::fromFolder(fixtureDir() + "/text_encoder", "model", at::kFloat,
                                      c10::Device(c10::kCPU));
    m = std::make_unique<Qwen3Model>(cfg, *w, nullptr, maxLayer);
  }
  return *m;
}

// atol 1e-4 + rtol 1e-5 (golden README); returns the max abs diff.
double expectClose(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  EXPECT_EQ(got.sizes(), want.sizes()) << what;
  if (got.sizes() != want.sizes()) return 1e30;
  const auto diff = (got - want).abs();
  const auto bound = 1e-4 + 1e-5 * want.abs();
  const double maxDiff = diff.max().item<double>();
  EXPECT_TRUE(diff.le(bound).all().item<bool>()) << what << ": max abs diff " << maxDiff;
  return maxDiff;
}

void writeFile(const fs::path& p, const std::string& s) { std::ofstream(p) << s; }

fs::path copyTokenizer(const std::string& name) {
  const fs::path d =
      fs::temp_directory_path() / ("qwen_tok_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  for (const char* f : {"vocab.json", "merges.txt", "tokenizer_config.json", "tokenizer.json"})
    fs::copy_file(fs::path(fixtureDir()) / "tokenizer" / f, d / f);
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

TEST(Qwen2Tokenizer, ChatTemplateMatchesGolden) {
  ASSERT_EQ(prompts().size(), 13u);
  for (size_t i = 0; i < prompts().size(); ++i)
    EXPECT_EQ(tok().applyChatTemplate(prompts()[i]["prompt"].get<std::string>()),
              prompts()[i]["chat_text"].get<std::string>())
        << "prompt " << i;
}

TEST(Qwen2Tokenizer, TokenIdsMasksAndUntruncatedIdsExact) {
  for (size_t i = 0; i < prompts().size(); ++i) {
    const std::string s = std::to_string(i);
    const std::string chat = tok().applyChatTemplate(prompts()[i]["prompt"].get<std::string>());
    const auto padded = tok().encode(chat, 512);
    EXPECT_EQ(padded.input_ids, asVector(golden("tok.input_ids." + s))) << "prompt " << i;
    EXPECT_EQ(padded.attention_mask, asVector(golden("tok.attention_mask." + s))) << "prompt " << i;
    const auto full = tok().encode(chat, 0);
    EXPECT_EQ(full.input_ids, asVector(golden("tok.untruncated." + s))) << "prompt " << i;
    EXPECT_EQ(padded.untruncated_length, full.input_ids.size());
    EXPECT_EQ(full.input_ids.size(), prompts()[i]["n_tokens"].get<size_t>()) << "prompt " << i;
    // Token strings (byte-level form) as golden.json lists them (the first 512).
    const auto& strs = prompts()[i]["tokens"];
    ASSERT_EQ(strs.size(), std::min<size_t>(full.input_ids.size(), 512)) << "prompt " << i;
    for (size_t k = 0; k < strs.size(); ++k)
      EXPECT_EQ(tok().idToToken(full.input_ids[k]), strs[k].get<std::string>())
          << "prompt " << i << " token " << k;
  }
  const std::string longChat = tok().applyChatTemplate(prompts()[12]["prompt"].get<std::string>());
  const auto m64 = tok().encode(longChat, 64);
  EXPECT_EQ(m64.input_ids, asVector(golden("tok.msl64.input_ids")));
  EXPECT_EQ(m64.attention_mask, asVector(golden("tok.msl64.attention_mask")));
  EXPECT_EQ(m64.untruncated_length, 1037u);
  EXPECT_EQ(tok().padId(), 656);
}

TEST(Qwen2Tokenizer, RefusesBadFiles) {
  {
    auto d = copyTokenizer("merges");
    writeFile(d / "merges.txt", "#version: 0.2\n\xC4\xA0 a\nnot-a-token zz\n");
    const auto msg = errorOf([&] { Qwen2Tokenizer::fromFolder(d.string()); });
    EXPECT_NE(msg.find("merges.txt"), std::string::npos) << msg;
    EXPECT_NE(msg.find("not in vocab.json"), std::string::npos) << msg;
    fs::remove_all(d);
  }
  {
    auto d = copyTokenizer("vocab");
    writeFile(d / "vocab.json", "{\"a\": 1,");
    const auto msg = errorOf([&] { Qwen2Tokenizer::fromFolder(d.string()); });
    EXPECT_NE(msg.find("vocab.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find("not valid JSON"), std::string::npos) << msg;
    fs::remove(d / "vocab.json");
    const auto msg2 = errorOf([&] { Qwen2Tokenizer::fromFolder(d.string()); });
    EXPECT_NE(msg2.find("vocab.json: file not found"), std::string::npos) << msg2;
    fs::remove_all(d);
  }
  {
    auto d = copyTokenizer("template");
    auto cfg = nlohmann::json::parse(std::ifstream(d / "tokenizer_config.json"));
    cfg["chat_template"] = "{% for m in messages %}{{ m.content }}{% endfor %}";
    writeFile(d / "tokenizer_config.json", cfg.dump());
    const auto t = Qwen2Tokenizer::fromFolder(d.string());
    const auto msg = errorOf([&] { t.applyChatTemplate("x"); });
    EXPECT_NE(msg.find("tokenizer_config.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find("unrecognised \"chat_template\""), std::string::npos) << msg;
    EXPECT_NE(msg.find("{% for m in messages %}"), std::string::npos) << msg;
    cfg["pad_token"] = "<|nope|>";
    writeFile(d / "tokenizer_config.json", cfg.dump());
    const auto msg2 = errorOf([&] { Qwen2Tokenizer::fromFolder(d.string()); });
    EXPECT_NE(msg2.find("pad_token \"<|nope|>\""), std::string::npos) << msg2;
    fs::remove_all(d);
  }
  {
    auto d = copyTokenizer("pretok");
    auto tj = nlohmann::json::parse(std::ifstream(d / "tokenizer.json"));
    tj["pre_tokenizer"] = {{"type", "Whitespace"}};
    writeFile(d / "tokenizer.json", tj.dump());
    const auto msg = errorOf([&] { Qwen2Tokenizer::fromFolder(d.string()); });
    EXPECT_NE(msg.find("tokenizer.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find("pre_tokenizer is not Qwen2's"), std::string::npos) << msg;
    fs::remove_all(d);
  }
}

TEST(Qwen3Config, ReadsFixtureAndRefusesBadValues) {
  const auto c = loadQwen3Config(fixtureDir() + "/text_encoder/config.json");
  EXPECT_EQ(c.hidden_size, 24);
  EXPECT_EQ(c.num_hidden_layers, 28);
  EXPECT_EQ(c.num_attention_heads, 2);
  EXPECT_EQ(c.num_key_value_heads, 1);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.intermediate_size, 64);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  auto j = nlohmann::json::parse(std::ifstream(fixtureDir() + "/text_encoder/config.json"));
  auto bad = [&](const char* key, nlohmann::json v) {
    auto k = j;
    k[key] = v;
    return errorOf([&] { parseQwen3Config(k, "text_encoder/config.json"); });
  };
  auto m = bad("num_hidden_layers", -1);
  EXPECT_NE(m.find("text_encoder/config.json: config key 'num_hidden_layers' must be in"),
            std::string::npos)
      << m;
  m = bad("num_key_value_heads", 3);
  EXPECT_NE(m.find("'num_key_value_heads'"), std::string::npos) << m;
  m = bad("hidden_size", "big");
  EXPECT_NE(m.find("'hidden_size' has the wrong type"), std::string::npos) << m;
  m = bad("head_dim", 15);
  EXPECT_NE(m.find("'head_dim' must be even"), std::string::npos) << m;
  m = bad("hidden_act", "gelu");
  EXPECT_NE(m.find("'hidden_act'"), std::string::npos) << m;
  m = bad("rope_scaling", nlohmann::json{{"type", "yarn"}});
  EXPECT_NE(m.find("'rope_scaling'"), std::string::npos) << m;
}

TEST(Qwen3Model, HiddenStatesOfPrompt0) {
  const auto& full = model(28);
  const auto ids = golden("tok.input_ids.0").view({1, 512});
  const auto mask = golden("tok.attention_mask.0").view({1, 512});
  const auto hs = full.hiddenStates(ids, mask, {0, 1, 28});
  ASSERT_EQ(hs.size(), 3u);
  const int ks[] = {0, 1, 28};
  for (size_t i = 0; i < 3; ++i) {
    const double d = expectClose(hs[i][0], golden("enc.hidden_states.0." + std::to_string(ks[i])),
                                 "hidden_states[" + std::to_string(ks[i]) + "]");
    std::printf("hidden_states[%d] max abs diff %.3g\n", ks[i], d);
  }
  EXPECT_THROW(model(27).hiddenStates(ids, mask, {28}), std::invalid_argument);
  EXPECT_THROW(full.hiddenStates(ids, mask, {29}), std::invalid_argument);
  EXPECT_THROW(full.hiddenStates(at::full_like(ids, 704), mask, {1}), std::invalid_argument);
}

TEST(Qwen3Model, PromptEmbedsOfAll13Prompts) {
  const auto& m = model(27);  // (9, 18, 27): 27 of 28 layers loaded and run
  EXPECT_EQ(m.layersLoaded(), 27);
  double worst = 0;
  for (size_t i = 0; i < prompts().size(); ++i) {
    const auto pe = qwen3PromptEmbeds(tok(), m, prompts()[i]["prompt"].get<std::string>());
    ASSERT_EQ(pe.sizes(), (std::vector<int64_t>{1, 512, 72}));
    worst = std::max(worst, expectClose(pe[0], golden("enc.prompt_embeds." + std::to_string(i)),
                                        "prompt_embeds " + std::to_string(i)));
  }
  std::printf("prompt_embeds (13 prompts) max abs diff %.3g\n", worst);
  const auto m64 = qwen3PromptEmbeds(tok(), m, prompts()[12]["prompt"].get<std::string>(), 64);
  std::printf("msl64 max abs diff %.3g\n",
              expectClose(m64[0], golden("enc.msl64.prompt_embeds"), "msl64 prompt_embeds"));
}

TEST(Qwen3Model, AltLayersIncludeEmbeddingsAndFinalNorm) {
  const auto pe = qwen3PromptEmbeds(tok(), model(28), prompts()[1]["prompt"].get<std::string>(),
                                    512, {0, 14, 28});
  std::printf("alt layers max abs diff %.3g\n",
              expectClose(pe[0], golden("enc.alt_layers.prompt_embeds.1"), "alt layers"));
}

TEST(Qwen3Model, RefusesMissingTensor) {
  const auto cfg = loadQwen3Config(fixtureDir() + "/text_encoder/config.json");
  auto c = cfg;
  c.intermediate_size = 65;  // disagrees with the checkpoint
  auto w = WeightSource::fromFolder(fixtureDir() + "/text_encoder", "model", at::kFloat,
                                    c10::Device(c10::kCPU));
  const auto msg = errorOf([&] { Qwen3Model(c, *w, nullptr, 2); });
  EXPECT_NE(msg.find("model.layers.0.mlp.gate_proj.weight"), std::string::npos) << msg;
}

TEST(Qwen3Plan, BytesPerRankAndReplicationFallback) {
  const auto cfg = loadQwen3Config(fixtureDir() + "/text_encoder/config.json");
  const auto table = qwen3ParameterTable(cfg, 27, false);
  const auto plan = qwen3ShardingPlan(cfg);
  EXPECT_TRUE(plan.validate(table, 2).empty());
  EXPECT_TRUE(plan.validate(table, 4).empty());  // falls back to replication, not an error
  std::string why;
  const auto p2 = plan.resolve(table, 2, &why);
  EXPECT_TRUE(why.empty()) << why;
  EXPECT_EQ(p2.rules().size(), plan.rules().size());
  const auto p4 = plan.resolve(table, 4, &why);
  EXPECT_TRUE(p4.rules().empty());
  EXPECT_NE(why.find("tp_degree 4 does not divide num_attention_heads 2"), std::string::npos)
      << why;
  EXPECT_NE(why.find("replicated on every rank"), std::string::npos) << why;
  EXPECT_FALSE(plan.validateStrict(table, 4).empty());
  // 1 KV head: k/v stay whole at tp 2; q/o/gate/up/down halve.
  const int64_t perLayerSharded = (32 * 24) * 2 + (64 * 24) * 3;  // q, o, gate, up, down
  const int64_t perLayerWhole = (16 * 24) * 2 + 16 * 2 + 24 * 2;  // k, v, q/k norm, 2 norms
  const int64_t embed = 704 * 24;
  const uint64_t one = static_cast<uint64_t>((embed + 27 * (perLayerSharded + perLayerWhole)) * 4);
  const uint64_t two =
      static_cast<uint64_t>((embed + 27 * (perLayerSharded / 2 + perLayerWhole)) * 4);
  EXPECT_EQ(plan.bytesPerRank(table, 1, 4), one);
  EXPECT_EQ(plan.bytesPerRank(table, 2, 4), two);
  EXPECT_EQ(plan.bytesPerRank(table, 4, 4), one);
  EXPECT_EQ(model(27).weightBytes(), one);
}
