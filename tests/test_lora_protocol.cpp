// The request field "loras" (issue 13) in dit_protocol: round trip through JSON (file, strength,
// sha256), absent = none, and every refusal at the door naming the entry.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "app/protocol/protocol.h"

using namespace dit::protocol;
using nlohmann::json;

namespace {
std::string refusal(const json& loras) {
  json j{{"type", "generate"}, {"id", "r"}, {"loras", loras}};
  try {
    parseRequest(j);
  } catch (const ProtocolError& e) {
    EXPECT_EQ(e.field(), "loras") << e.what();
    return e.what();
  }
  ADD_FAILURE() << "accepted " << loras.dump();
  return {};
}
}  // namespace

TEST(LoraProtocol, RoundTrip) {
  GenerateRequest g;
  g.id = "r1";
  g.params.loras = {{"/a/style.safetensors", 0.8, ""},
                    {"/b/kohya.safetensors", -1.5, std::string(64, 'a')}};
  const Request back = parseRequestLine(requestLine(g));
  EXPECT_EQ(std::get<GenerateRequest>(back), g);
  const json j = toJson(g.params);
  ASSERT_EQ(j["loras"].size(), 2u);
  EXPECT_EQ(j["loras"][0], (json{{"file", "/a/style.safetensors"}, {"strength", 0.8}}));
  EXPECT_EQ(j["loras"][1]["sha256"], std::string(64, 'a'));
  // Absent: none, and no key written.
  const auto plain =
      std::get<GenerateRequest>(parseRequest(json{{"type", "generate"}, {"id", "x"}}));
  EXPECT_TRUE(plain.params.loras.empty());
  EXPECT_FALSE(toJson(plain.params).contains("loras"));
  // Default strength 1.
  EXPECT_EQ(paramsFromJson(json{{"loras", {{{"file", "f"}}}}}).loras.at(0).strength, 1.0);
}

TEST(LoraProtocol, RefusedAtTheDoor) {
  EXPECT_NE(refusal("x").find("request field 'loras' has the wrong type"), std::string::npos);
  EXPECT_NE(refusal(json::array({5})).find("'loras[0]' must be an object"), std::string::npos);
  EXPECT_NE(refusal(json::array({json::object()})).find("'loras[0].file' must name a LoRA file"),
            std::string::npos);
  EXPECT_NE(refusal(json::array({{{"file", "f"}, {"strength", 11}}}))
                .find("'loras[0].strength' must be a finite number in -10 .. 10, got 11"),
            std::string::npos);
  EXPECT_NE(refusal(json::array({{{"file", "f"}, {"strength", "1"}}}))
                .find("'loras[0].strength' has the wrong type"),
            std::string::npos);
  EXPECT_NE(refusal(json::array({{{"file", "f"}, {"weight", 1}}})).find("unknown key 'weight'"),
            std::string::npos);
  EXPECT_NE(refusal(json::array({{{"file", "f"}, {"sha256", "xyz"}}}))
                .find("'loras[0].sha256' must be 64 lowercase hex digits"),
            std::string::npos);
  json many = json::array();
  for (int i = 0; i < kMaxLoras + 1; ++i) many.push_back({{"file", "f"}});
  EXPECT_NE(refusal(many).find("at most 16"), std::string::npos);
  GenerationParams p;
  p.loras = {{"f", std::nan(""), ""}};
  EXPECT_THROW(checkParams(p), ProtocolError);
  p.loras = {{"bad\xff", 1.0, ""}};
  EXPECT_THROW(checkParams(p), ProtocolError);
}
