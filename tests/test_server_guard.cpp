// What ditstudio-server checks before any work starts (app/server/request_guard.*, image_codec.*):
// JSON bodies scanned for depth and UTF-8 naming the field, field types in our words, Host /
// Origin / Content-Type, server folders kept out of messages, uploads that must be whole, WebP
// decoded. No sockets, no worker; tests/server/hostile.test.mjs drives the real binary.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "app/server/image_codec.h"
#include "app/server/request_guard.h"

using namespace dit::server;
using nlohmann::json;

namespace {
std::string messageOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}
Pixels rgb(int w, int h, std::uint8_t v) {
  Pixels p;
  p.width = w;
  p.height = h;
  p.channels = 3;
  p.data.assign(static_cast<size_t>(w) * h * 3, v);
  for (size_t i = 0; i < p.data.size(); ++i) p.data[i] = static_cast<std::uint8_t>(v + i * 7);
  return p;
}
std::string deep(int n) { return std::string(n, '[') + std::string(n, ']'); }
}  // namespace

TEST(ServerGuard, DeepJsonRefusedNamingTheFieldWithoutRecursion) {
  // 100,000 levels (the A1111 body that was a SIGSEGV): refused by the scan, never parsed.
  const std::string body = R"({"prompt": "x", "override_settings": )" + deep(100000) + "}";
  json out;
  auto e = parseJsonBody(body, 16, out);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "override_settings");
  EXPECT_NE(e->message.find("nests JSON more than 16 levels deep"), std::string::npos)
      << e->message;
  // Exactly at the limit: accepted; brackets inside strings do not count.
  EXPECT_FALSE(parseJsonBody(R"({"a": )" + deep(15) + "}", 16, out));
  EXPECT_FALSE(parseJsonBody(R"({"a": ")" + std::string(1000, '[') + R"("})", 16, out));
  EXPECT_TRUE(parseJsonBody(R"({"a": )" + deep(16) + "}", 16, out));
  // The path through arrays and objects.
  e = scanJsonBody(R"({"loras": [{"name": "a"}, {"x": [[[[1]]]]}]})", 5);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "loras");
}

TEST(ServerGuard, InvalidUtf8NamedByFieldAndOffset) {
  json out;
  auto e = parseJsonBody("{\"prompt\": \"caf\xe9 au lait\"}", 16, out);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "prompt");
  EXPECT_NE(e->message.find("'prompt' is not valid UTF-8 text (byte 0xe9 at offset 3"),
            std::string::npos)
      << e->message;
  e = parseJsonBody("{\"loras\": [{\"name\": \"\xc0\xaf\"}]}", 16, out);  // overlong '/'
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "loras[0].name");
  e = parseJsonBody("{\"p\": \"\xed\xa0\x80\"}", 16, out);  // a surrogate
  ASSERT_TRUE(e);
  EXPECT_FALSE(parseJsonBody("{\"p\": \"caf\xc3\xa9 \xf0\x9f\x8c\x9f\"}", 16, out));
  EXPECT_EQ(out["p"], "caf\xc3\xa9 \xf0\x9f\x8c\x9f");
  EXPECT_EQ(invalidUtf8At("ab\xff"), std::optional<std::size_t>(2));
  EXPECT_EQ(invalidUtf8At("ab\xe2\x82"), std::optional<std::size_t>(2));  // cut short
  EXPECT_FALSE(invalidUtf8At("\xe2\x82\xac"));
}

TEST(ServerGuard, SyntaxErrorsInOurWords) {
  json out;
  for (const std::string body :
       {"{\"prompt\": \"x\",", "[1,2", "{\"a\" 1}", "nul", "{\"a\": \"\\ud800\"}"}) {
    auto e = parseJsonBody(body, 16, out);
    ASSERT_TRUE(e) << body;
    EXPECT_EQ(e->message.find("json.exception"), std::string::npos) << e->message;
    EXPECT_EQ(e->message.find("[json"), std::string::npos) << e->message;
    EXPECT_NE(e->message.find("not valid JSON (at byte"), std::string::npos) << e->message;
  }
  auto e = parseJsonBody("[1, 2]", 16, out);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message, "the request body must be a JSON object, got an array");
  e = parseJsonBody("", 16, out);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("empty"), std::string::npos);
}

TEST(ServerGuard, FieldTypesNamedBeforeTheRoutesReadThem) {
  auto check = [](const char* body, BodyKind k) { return checkFieldTypes(json::parse(body), k); };
  auto e = check(R"({"prompt": "x", "loras": [{"name": 5}]})", BodyKind::OpenAi);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "loras[0].name");
  EXPECT_EQ(e->message, "'loras[0].name' must be a string, got an integer");
  e = check(R"({"loras": [{"name": "a", "strength": "high"}]})", BodyKind::OpenAi);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "loras[0].strength");
  e = check(R"({"loras": [{"name": null}]})", BodyKind::OpenAi);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message, "'loras[0].name' must be a string, got null");
  e = check(R"({"inpainting_mask_invert": null})", BodyKind::SdapiImg2Img);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "inpainting_mask_invert");
  e = check(R"({"loras": ["a"]})", BodyKind::OpenAi);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "loras[0]");
  e = check(R"({"prompt": "x", "inpainting_mask_invert": "yes"})", BodyKind::SdapiImg2Img);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "inpainting_mask_invert");
  e = check(R"({"width": "64"})", BodyKind::Sdapi);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message, "'width' must be an integer, got a string");
  e = check(R"({"init_images": [5]})", BodyKind::SdapiImg2Img);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "init_images[0]");
  e = check(R"({"seed": 1.5})", BodyKind::OpenAi);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "seed");
  EXPECT_FALSE(check(R"({"prompt": "x", "n": 2, "seed": -1, "guidance": 3, "loras": null,
                         "extra": {"anything": [1]}})",
                     BodyKind::OpenAi));
}

TEST(ServerGuard, HostOriginAndContentType) {
  const auto loop = defaultAllowedHosts("127.0.0.1");
  EXPECT_TRUE(hostAllowed("127.0.0.1:8000", loop));
  EXPECT_TRUE(hostAllowed("localhost:8000", loop));
  EXPECT_TRUE(hostAllowed("LOCALHOST.", loop));
  EXPECT_TRUE(hostAllowed("[::1]:8000", loop));
  EXPECT_FALSE(hostAllowed("evil.example:8000", loop));  // DNS rebinding
  EXPECT_FALSE(hostAllowed("127.0.0.1.evil.example", loop));
  EXPECT_FALSE(hostAllowed("", loop));
  EXPECT_FALSE(hostAllowed("a b", loop));
  EXPECT_TRUE(hostAllowed("anything", defaultAllowedHosts("0.0.0.0")));
  EXPECT_TRUE(hostAllowed("10.0.0.5:8000", defaultAllowedHosts("10.0.0.5")));
  EXPECT_FALSE(hostAllowed("evil:8000", defaultAllowedHosts("10.0.0.5")));
  EXPECT_TRUE(hostAllowed("studio.lan:8000", {"studio.lan"}));
  EXPECT_TRUE(hostAllowed("[fe80::1]:80", {"fe80::1"}));
  EXPECT_EQ(hostName("[::1]:80"), "::1");
  EXPECT_EQ(hostName("::1"), "");

  EXPECT_TRUE(originAllowed("", "127.0.0.1:8000", {}));
  EXPECT_TRUE(originAllowed("http://127.0.0.1:8000", "127.0.0.1:8000", {}));  // the page
  EXPECT_FALSE(originAllowed("http://evil.example", "127.0.0.1:8000", {}));
  EXPECT_FALSE(originAllowed("null", "127.0.0.1:8000", {}));
  EXPECT_FALSE(originAllowed("http://127.0.0.1:9999", "127.0.0.1:8000", {}));
  EXPECT_TRUE(originAllowed("http://app.example", "127.0.0.1:8000", {"http://app.example"}));
  EXPECT_TRUE(originAllowed("http://x", "127.0.0.1:8000", {"*"}));

  EXPECT_TRUE(isJsonContentType("application/json"));
  EXPECT_TRUE(isJsonContentType("Application/JSON; charset=utf-8"));
  EXPECT_TRUE(isJsonContentType("application/merge-patch+json"));
  EXPECT_FALSE(isJsonContentType("text/plain"));
  EXPECT_FALSE(isJsonContentType("application/x-www-form-urlencoded"));
  EXPECT_FALSE(isJsonContentType(""));
  EXPECT_TRUE(isMultipartContentType("multipart/form-data; boundary=x"));
  EXPECT_FALSE(isMultipartContentType("multipart/mixed"));
}

TEST(ServerGuard, MessagesCarryTheClientsNamesNotTheServersFolders) {
  EXPECT_EQ(clientMessage("cannot read /srv/images/uploads/upload-1-image.png: truncated",
                          {{"/srv/images/uploads/upload-1-image.png", "the uploaded image"}}),
            "cannot read the uploaded image: truncated");
  EXPECT_EQ(clientMessage("LoRA '/home/op/loras/style.safetensors' has no tensors"),
            "LoRA 'style.safetensors' has no tensors");
  EXPECT_EQ(clientMessage("/a/b/c.txt and (/x/y/) at step 4/28"), "c.txt and (y) at step 4/28");
  EXPECT_EQ(clientMessage("group a failed: rank 0 (pid 42 on h) was killed while denoising (step "
                          "40/1000)"),
            "group a failed: rank 0 (pid 42 on h) was killed while denoising (step 40/1000)");
}

TEST(ServerGuard, CutShortUploadsRefusedForEveryFormat) {
  const Pixels px = rgb(8, 6, 10);
  const std::string png = encodeImage(px, "png", 100);
  const std::string jpg = encodeImage(px, "jpeg", 90);
  // P6 and BMP by hand.
  std::string ppm = "P6\n# made by hand\n8 6\n255\n";
  ppm.append(reinterpret_cast<const char*>(px.data.data()), px.data.size());
  std::string bmp = "BM";
  auto le32 = [](std::string& s, std::uint32_t v) {
    for (int i = 0; i < 4; ++i) s += static_cast<char>((v >> (8 * i)) & 0xff);
  };
  auto le16 = [](std::string& s, std::uint32_t v) {
    s += static_cast<char>(v & 0xff);
    s += static_cast<char>((v >> 8) & 0xff);
  };
  const std::uint32_t stride = 8 * 3;  // 24 bytes: a multiple of 4
  le32(bmp, 54 + stride * 6);
  le32(bmp, 0);
  le32(bmp, 54);
  le32(bmp, 40);
  le32(bmp, 8);
  le32(bmp, 6);
  le16(bmp, 1);
  le16(bmp, 24);
  le32(bmp, 0);
  le32(bmp, stride * 6);
  le32(bmp, 2835);
  le32(bmp, 2835);
  le32(bmp, 0);
  le32(bmp, 0);
  bmp.append(stride * 6, '\x40');
  const std::string webp = encodeImage(px, "webp", 100);
  for (const auto& [name, whole] : std::vector<std::pair<std::string, std::string>>{
           {"PNG", png}, {"JPEG", jpg}, {"PNM", ppm}, {"BMP", bmp}, {"WebP", webp}}) {
    const Pixels back = decodeImage(whole, "image", 64, 4096);
    EXPECT_EQ(back.width, 8) << name;
    EXPECT_EQ(back.height, 6) << name;
    if (name == "PNG" || name == "PNM" || name == "WebP") {  // lossless (BMP rows are BGR)
      EXPECT_EQ(back.data, px.data) << name;
    }
    for (const std::size_t cut : {whole.size() - 1, whole.size() * 2 / 3, whole.size() / 2}) {
      const std::string msg =
          messageOf([&] { decodeImage(whole.substr(0, cut), "image", 64, 4096); });
      EXPECT_NE(msg.find("'image' is cut short"), std::string::npos)
          << name << " cut at " << cut << " of " << whole.size() << ": " << msg;
    }
  }
  // A WebP's limits come from its header, before decoding; an upload of another kind is named.
  EXPECT_NE(messageOf([&] { decodeImage(webp, "image", 4, 4096); }).find("8x6 pixels"),
            std::string::npos);
  EXPECT_NE(messageOf([] {
              decodeImage("II*\0 a TIFF", "mask", 64, 4096);
            }).find("'mask' is not a PNG, JPEG, WebP, BMP, GIF or PNM"),
            std::string::npos);
}
