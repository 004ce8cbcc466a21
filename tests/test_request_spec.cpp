// The declared request (backend/models/request_spec.h) on its own, Torch-free: each family's
// RequestSpec for its fixture (fields, guider, size rule, knobs), resolveRequest's rules (sizes
// floored or refused, the init image's size, knob defaults and ranges, unknown knobs, ignored
// fields as notes), and the documentation's family tables equal to the specs
// (docs/request-fields.md, regenerated with `ditstudio-cli --print-request-spec`).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "backend/io/model_folder.h"
#include "backend/models/family_registry.h"
#include "backend/models/request_spec.h"

using namespace dit;

namespace {

std::string data(const std::string& name) { return std::string(DITSTUDIO_TEST_DATA) + "/" + name; }

RequestSpec specOf(const std::string& fixture) {
  return requestSpecOf(ModelFolder::open(data(fixture)));
}

// A fake decoder: every init image is `w` x `h`.
ImageSizeFn imageOf(int w, int h) {
  return [w, h](const std::string&) { return std::pair<int, int>(w, h); };
}

bool hasNote(const ResolvedRequest& r, const std::string& text) {
  for (const std::string& n : r.notes)
    if (n.find(text) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST(RequestSpec, EachFamilyDeclaresItsGuiderAndFields) {
  const RequestSpec flux = specOf("tiny-flux-A");
  EXPECT_EQ(flux.family, "FLUX.1");
  EXPECT_EQ(flux.guider.kind, GuiderSpec::Kind::TrueCfg);
  EXPECT_EQ(flux.guider.scale_field, "true_cfg_scale");
  EXPECT_TRUE(flux.field("guidance")->read);  // guidance_embeds: the distilled embedding
  EXPECT_EQ(flux.size.rounding, SizeRule::Rounding::Refuse);
  // FluxPipeline's true_cfg_scale is the family's knob (its guider's scale field).
  ASSERT_EQ(flux.knobs().size(), 1u);
  EXPECT_EQ(flux.knobs()[0]->name, "true_cfg_scale");
  EXPECT_TRUE(flux.knobs()[0]->read);
  EXPECT_EQ(flux.knobs()[0]->default_value, 1.0);
  EXPECT_TRUE(flux.inputs.init_image && flux.inputs.mask && flux.inputs.step_cache);

  const RequestSpec klein = specOf("tiny-flux2-A");
  EXPECT_EQ(klein.guider.kind, GuiderSpec::Kind::ClassicCfg);
  EXPECT_EQ(klein.guider.scale_field, "guidance");
  EXPECT_EQ(klein.guider.threshold, 1.0);
  EXPECT_FALSE(klein.field("true_cfg_scale")->read);  // declared, not read: a note, not a refusal
  EXPECT_TRUE(klein.field("true_cfg_scale")->knob);
  EXPECT_EQ(klein.size.rounding, SizeRule::Rounding::Floor);
  EXPECT_EQ(klein.size.init_image, SizeRule::FromInitImage::Always);
  EXPECT_EQ(klein.default_steps, 50);

  const RequestSpec z = specOf("tiny-zimage-A");
  EXPECT_EQ(z.guider.kind, GuiderSpec::Kind::ClassicCfg);
  EXPECT_EQ(z.guider.threshold, 0.0);
  EXPECT_EQ(z.guider.formula, GuiderSpec::Formula::CondPlus);
  ASSERT_EQ(z.knobs().size(), 4u);
  EXPECT_EQ(z.knobs()[0]->name, "true_cfg_scale");  // declared as not read (guidance is CFG)
  EXPECT_FALSE(z.knobs()[0]->read);
  EXPECT_EQ(z.knobs()[1]->name, "shift");  // the folder's scheduler shift
  EXPECT_EQ(z.knobs()[1]->default_value, 3.0);
  EXPECT_TRUE(z.knobs()[1]->min_exclusive);
  EXPECT_EQ(z.knobs()[2]->name, "cfg_truncation");
  EXPECT_EQ(z.knobs()[2]->default_value, 1.0);
  EXPECT_EQ(z.knobs()[3]->name, "cfg_normalization");
  EXPECT_FALSE(z.inputs.init_image);
  EXPECT_FALSE(z.field("init_image")->read);

  const RequestSpec q = specOf("tiny-qwenimage-A");
  EXPECT_EQ(q.guider.kind, GuiderSpec::Kind::TrueCfg);
  EXPECT_EQ(q.guider.rescale, GuiderSpec::Rescale::PerTokenNorm);
  EXPECT_FALSE(q.field("guidance")->read);
  EXPECT_EQ(q.field("max_sequence_length")->max, 1024);
}

TEST(RequestSpec, SizesFlooredOrRefusedAsTheFamilyDeclares) {
  RequestValues v;
  v.width = 63;
  v.height = 64;
  const ResolvedRequest f = resolveRequest(specOf("tiny-flux-A"), v);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.problems[0].field, "width");
  EXPECT_EQ(f.problems[0].rule, "multiple");
  EXPECT_NE(f.message().find("try 60x64"), std::string::npos) << f.message();
  const ResolvedRequest k = resolveRequest(specOf("tiny-flux2-A"), v);
  ASSERT_TRUE(k.ok()) << k.message();
  EXPECT_EQ(k.values.width, 56);
  EXPECT_EQ(k.values.height, 64);
  EXPECT_TRUE(hasNote(k, "floored to multiples of 8"));
}

TEST(RequestSpec, InitImageSetsTheSizeByTheFamilysRule) {
  RequestValues v;
  v.init_image = "in.png";
  v.width = 32;
  // FLUX.1: a given width stays, a height of 0 takes the image's (floored to 4).
  ResolvedRequest r = resolveRequest(specOf("tiny-flux-A"), v, imageOf(70, 50));
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(r.values.width, 32);
  EXPECT_EQ(r.values.height, 48);
  // FLUX.2 [klein]: always the image's size, its area first capped at 1024^2.
  r = resolveRequest(specOf("tiny-flux2-A"), v, imageOf(2048, 1024));
  ASSERT_TRUE(r.ok()) << r.message();
  // scale = sqrt(1024^2 / (2048 * 1024)): int(2048 * s) = 1448, int(1024 * s) = 724, floored to 8.
  EXPECT_EQ(r.values.width, 1448);
  EXPECT_EQ(r.values.height, 720);
  // An image smaller than the multiple.
  r = resolveRequest(specOf("tiny-flux2-A"), v, imageOf(6, 40));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.problems[0].field, "init_image");
  // Unreadable: the decoder's error, naming the file.
  r = resolveRequest(specOf("tiny-flux-A"), v, [](const std::string& p) -> std::pair<int, int> {
    throw std::runtime_error("cannot read " + p);
  });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.problems[0].rule, "image");
  EXPECT_NE(r.message().find("cannot read in.png"), std::string::npos);
}

TEST(RequestSpec, KnobsTakeTheirDefaultsAndRanges) {
  const RequestSpec z = specOf("tiny-zimage-A");
  RequestValues v;
  ResolvedRequest r = resolveRequest(z, v);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.values.options.at("cfg_truncation"), 1.0);
  EXPECT_EQ(r.values.options.at("cfg_normalization"), 0.0);
  v.options["cfg_truncation"] = 100.5;
  r = resolveRequest(z, v);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.problems[0].field, "cfg_truncation");
  EXPECT_NE(r.message().find("0 .. 100"), std::string::npos) << r.message();
  v.options = {{"cfg_truncation", 0.0}, {"cfg_normalization", 100.0}};
  EXPECT_TRUE(resolveRequest(z, v).ok());
  v.options = {{"nope", 1.0}};
  r = resolveRequest(z, v);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.problems[0].field, "nope");
  EXPECT_EQ(r.problems[0].rule, "unknown");
  EXPECT_NE(r.message().find("it takes shift, cfg_truncation, cfg_normalization"),
            std::string::npos);
  // Another family has no such knob.
  v.options = {{"cfg_truncation", 0.5}};
  r = resolveRequest(specOf("tiny-flux-A"), v);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("it takes true_cfg_scale"), std::string::npos) << r.message();
  r = resolveRequest(specOf("tiny-qwenimage-A"), v);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("it takes true_cfg_scale"), std::string::npos) << r.message();
  // The generic CFG scale option lands on the field the family's guider reads.
  v.options = {{"cfg_scale", 4.0}};
  v.negative_prompt = "blurry";
  r = resolveRequest(specOf("tiny-flux-A"), v);
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(r.values.options.at("true_cfg_scale"), 4.0);
  EXPECT_EQ(r.values.options.count("cfg_scale"), 0u);
  EXPECT_TRUE(r.cfg);
  v.options = {{"cfg_scale", 4.0}};
  r = resolveRequest(specOf("tiny-flux2-A"), v);
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(r.values.guidance, 4.0);
  EXPECT_TRUE(r.cfg);
}

TEST(RequestSpec, GuiderDecidesTheSecondBranch) {
  RequestValues v;
  v.negative_prompt = "blurry";
  v.options["true_cfg_scale"] = 4;
  v.guidance = 1.0;
  EXPECT_TRUE(resolveRequest(specOf("tiny-flux-A"), v).cfg);
  EXPECT_TRUE(resolveRequest(specOf("tiny-qwenimage-A"), v).cfg);
  EXPECT_FALSE(resolveRequest(specOf("tiny-flux2-A"), v).cfg);  // classic CFG: guidance 1
  EXPECT_TRUE(resolveRequest(specOf("tiny-zimage-A"), v).cfg);  // guidance > 0
  v.guidance = 0;
  EXPECT_FALSE(resolveRequest(specOf("tiny-zimage-A"), v).cfg);
  v.negative_prompt.clear();
  EXPECT_FALSE(resolveRequest(specOf("tiny-flux-A"), v).cfg);
  v.negative_prompt_given = true;  // "" given: still true CFG (diffusers: not None)
  EXPECT_TRUE(resolveRequest(specOf("tiny-flux-A"), v).cfg);
}

TEST(RequestSpec, IgnoredFieldsAreNotesOnlyWhenGiven) {
  RequestValues v;
  v.guidance = 4;
  ResolvedRequest r = resolveRequest(specOf("tiny-qwenimage-A"), v);
  EXPECT_FALSE(hasNote(r, "guidance is ignored"));
  v.given = {"guidance"};
  r = resolveRequest(specOf("tiny-qwenimage-A"), v);
  EXPECT_TRUE(hasNote(r, "guidance is ignored"));
}

// The documentation's tables are the specs: docs/request-fields.md holds, between
// `<!-- request-spec: FIXTURE -->` and `<!-- /request-spec -->`, exactly what
// requestSpecMarkdown prints for that fixture (`ditstudio-cli --print-request-spec`).
TEST(RequestSpec, DocsFamilyTablesEqualTheSpecs) {
  std::ifstream in(std::string(DITSTUDIO_SOURCE_DIR) + "/docs/request-fields.md");
  ASSERT_TRUE(in) << "docs/request-fields.md is missing";
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string doc = ss.str();
  for (const char* fixture : {"tiny-flux-A", "tiny-flux-kontext-A", "tiny-flux2-A",
                              "tiny-flux2dev-A", "tiny-zimage-A", "tiny-qwenimage-A"}) {
    SCOPED_TRACE(fixture);
    const std::string open = std::string("<!-- request-spec: ") + fixture + " -->\n";
    const size_t a = doc.find(open);
    ASSERT_NE(a, std::string::npos) << "no block for " << fixture;
    const size_t b = doc.find("<!-- /request-spec -->", a);
    ASSERT_NE(b, std::string::npos);
    const std::string block = doc.substr(a + open.size(), b - a - open.size());
    EXPECT_EQ(block, requestSpecMarkdown(specOf(fixture)))
        << "docs/request-fields.md disagrees with the spec; regenerate it with ditstudio-cli "
           "--model tests/data/"
        << fixture << " --print-request-spec";
  }
}

// The spec travels in the worker's ready event as JSON: every member comes back.
TEST(RequestSpec, JsonRoundTripKeepsEveryMember) {
  for (const char* fixture :
       {"tiny-flux-A", "tiny-flux2-A", "tiny-flux2dev-A", "tiny-zimage-A", "tiny-qwenimage-A"}) {
    SCOPED_TRACE(fixture);
    const RequestSpec s = specOf(fixture);
    const RequestSpec back = requestSpecFromJson(requestSpecToJson(s));
    EXPECT_EQ(requestSpecToJson(back), requestSpecToJson(s));
    EXPECT_EQ(requestSpecMarkdown(back), requestSpecMarkdown(s));
  }
  EXPECT_THROW(requestSpecFromJson(nlohmann::json::array()), std::invalid_argument);
  EXPECT_THROW(requestSpecFromJson({{"guider", {{"kind", "magic"}}}}), std::invalid_argument);
  EXPECT_THROW(requestSpecFromJson({{"default_steps", "many"}}), std::invalid_argument);
}
