// Issue 14 request fields in the protocol (Torch-free): init_image, init_image_sha256, mask_image,
// strength, cache — JSON round trip, defaults, and the refusals at the door.
#include <gtest/gtest.h>

#include "app/protocol/protocol.h"

using namespace dit::protocol;
using nlohmann::json;

TEST(ProtocolI2I, RoundTrip) {
  GenerationParams p;
  p.init_image = "/tmp/in.png";
  p.init_image_sha256 = std::string(64, 'a');
  p.mask_image = "/tmp/mask.png";
  p.strength = 0.85;
  p.cache = "first-block:0.08";
  const json j = toJson(p);
  EXPECT_EQ(j["init_image"], "/tmp/in.png");
  EXPECT_EQ(j["strength"], 0.85);
  EXPECT_EQ(j["cache"], "first-block:0.08");
  EXPECT_EQ(paramsFromJson(j), p);
  // Text-to-image requests keep their JSON: no image or cache keys.
  const json t = toJson(GenerationParams{});
  for (const char* k : {"init_image", "mask_image", "strength", "cache", "init_image_sha256"})
    EXPECT_FALSE(t.contains(k)) << k;
  EXPECT_EQ(paramsFromJson(t).strength, 0.6);
}

TEST(ProtocolI2I, RefusedAtTheDoor) {
  auto refused = [](const json& j, const std::string& field, const std::string& text) {
    try {
      paramsFromJson(j);
      ADD_FAILURE() << j.dump() << " accepted";
    } catch (const ProtocolError& e) {
      EXPECT_EQ(e.field(), field) << e.what();
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  refused({{"init_image", "a.png"}, {"strength", 0}}, "strength", "(0, 1]");
  refused({{"init_image", "a.png"}, {"strength", 1.01}}, "strength", "got 1.01");
  refused({{"init_image", "a.png"}, {"strength", "x"}}, "strength", "wrong type");
  refused({{"mask_image", "m.png"}}, "mask_image", "needs an init_image");
  refused({{"cache", "fast"}}, "cache", "unknown cache mode 'fast'");
  refused({{"cache", "first-block:0"}}, "cache", "greater than 0");
  refused({{"cache", "taylorseer:1,0,2"}}, "cache", "interval");
  refused({{"init_image", "a.png"}, {"init_image_sha256", "xyz"}}, "init_image_sha256",
          "64 hex digits");
  refused({{"init_image", 5}}, "init_image", "wrong type");
  EXPECT_NO_THROW(paramsFromJson({{"cache", "taylorseer:2,3,2,lite"}}));
  EXPECT_NO_THROW(paramsFromJson({{"cache", "none"}}));
}
