// Fuzz targets (seeded, ctest label `fuzz`; the sanitize preset runs them under ASan + UBSan) for
// the parser entries ditstudio-server added in front of its routes: the JSON body scan + parse +
// field types (every JSON route's body and the multipart 'loras' field), the Host / Origin /
// Content-Type readers, the message scrubber, and upload decoding (PNG, JPEG, WebP, BMP, GIF, PNM
// with the cut-short checks). Each input must be accepted or refused with our own message: no
// crash, no sanitizer report, no JSON library text, no exception of another type.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "app/server/image_codec.h"
#include "app/server/request_guard.h"

using namespace dit::server;
using nlohmann::json;

namespace {

std::string mutate(std::string s, std::mt19937_64& g) {
  std::uniform_int_distribution<int> kind(0, 7), byte(0, 255);
  const int edits = 1 + static_cast<int>(g() % 4);
  for (int e = 0; e < edits; ++e) {
    const std::size_t at = s.empty() ? 0 : g() % s.size();
    switch (kind(g)) {
      case 0:  // flip a byte
        if (!s.empty()) s[at] = static_cast<char>(byte(g));
        break;
      case 1:  // cut
        s.resize(at);
        break;
      case 2:  // insert structure
        s.insert(at, std::string(1 + g() % 40, "[{\"]},:\\"[g() % 8]));
        break;
      case 3:  // a byte that is not UTF-8
        s.insert(at, 1, static_cast<char>(0x80 + g() % 128));
        break;
      case 4:  // duplicate a slice
        if (!s.empty()) s.insert(at, s.substr(g() % s.size(), 1 + g() % 64));
        break;
      case 5:  // 0 / 0xff runs (lengths, sizes in binary headers)
        s.insert(at, std::string(1 + g() % 8, g() % 2 ? '\0' : '\xff'));
        break;
      case 6:  // delete a slice
        if (!s.empty()) s.erase(at, 1 + g() % 16);
        break;
      default:  // append bytes
        for (int i = 0; i < 1 + static_cast<int>(g() % 32); ++i) s += static_cast<char>(byte(g));
        break;
    }
  }
  return s;
}

void expectOurWords(const FieldError& e, const std::string& input) {
  EXPECT_FALSE(e.message.empty()) << input.substr(0, 200);
  EXPECT_EQ(e.message.find("json.exception"), std::string::npos) << e.message;
  EXPECT_EQ(e.message.find("[json"), std::string::npos) << e.message;
}

}  // namespace

TEST(ServerFuzz, JsonBodiesParseOrRefuseInOurWords) {
  const std::vector<std::string> seeds{
      R"({"prompt": "a star", "n": 2, "size": "64x64", "seed": 7, "loras": [{"name": "a.safetensors", "strength": 0.5}]})",
      R"({"prompt": "x", "negative_prompt": "", "cfg_scale": 4, "width": 64, "height": 64, "override_settings": {"a": [1, {"b": null}]}})",
      R"({"prompt": "caf\u00e9 \"q\"", "init_images": ["iVBORw0KGgo="], "mask": "", "inpainting_mask_invert": 1})",
      "{\"prompt\": \"\xc3\xa9\xf0\x9f\x8c\x9f\", \"stream\": true, \"partial_images\": 2}",
  };
  std::mt19937_64 g(48);
  int parsed = 0, refused = 0;
  for (int i = 0; i < 6000; ++i) {
    const std::string body = mutate(seeds[static_cast<std::size_t>(i) % seeds.size()], g);
    json out;
    const auto e = parseJsonBody(body, 16, out);
    if (e) {
      expectOurWords(*e, body);
      ++refused;
      continue;
    }
    ASSERT_TRUE(out.is_object());
    for (BodyKind k : {BodyKind::OpenAi, BodyKind::Sdapi, BodyKind::SdapiImg2Img})
      if (auto t = checkFieldTypes(out, k)) expectOurWords(*t, body);
    ++parsed;
  }
  // Deep nests of every shape, far past the limit: refused by the scan, no recursion.
  for (int i = 0; i < 50; ++i) {
    std::string b = "{\"a\":";
    const int depth = 17 + static_cast<int>(g() % 200000);
    for (int d = 0; d < depth; ++d) b += g() % 2 ? "[" : "{\"k\":";
    json out;
    const auto e = parseJsonBody(b, 16, out);
    ASSERT_TRUE(e);
    EXPECT_NE(e->message.find("more than 16 levels"), std::string::npos) << e->message;
  }
  std::cout << "json bodies: " << parsed << " parsed, " << refused << " refused" << std::endl;
  EXPECT_GT(parsed, 100);
  EXPECT_GT(refused, 1000);
}

TEST(ServerFuzz, HeadersAndMessagesNeverThrow) {
  std::mt19937_64 g(4848);
  const std::vector<std::string> seeds{"127.0.0.1:8000",
                                       "[::1]:80",
                                       "localhost.",
                                       "http://a.example:1",
                                       "application/json; charset=utf-8",
                                       "cannot read /srv/x/y.png: 'z' (/a/) 4/5"};
  const auto allowed = defaultAllowedHosts("127.0.0.1");
  for (int i = 0; i < 20000; ++i) {
    const std::string s = mutate(seeds[static_cast<std::size_t>(i) % seeds.size()], g);
    (void)hostName(s);
    (void)hostAllowed(s, allowed);
    (void)originAllowed(s, "127.0.0.1:8000", {});
    (void)isJsonContentType(s);
    (void)isMultipartContentType(s);
    const std::string m = clientMessage(s, {{"/srv/x", "name"}});
    EXPECT_LE(m.size(), s.size() + 4 * 8) << s;
  }
}

TEST(ServerFuzz, UploadsDecodeOrRefuseCleanly) {
  Pixels px;
  px.width = 7;
  px.height = 5;
  px.channels = 3;
  for (int i = 0; i < 7 * 5 * 3; ++i) px.data.push_back(static_cast<std::uint8_t>(i * 37 % 251));
  Pixels rgba = px;
  rgba.channels = 4;
  rgba.data.clear();
  for (int i = 0; i < 7 * 5 * 4; ++i) rgba.data.push_back(static_cast<std::uint8_t>(i * 11 % 253));
  std::vector<std::string> seeds{encodeImage(px, "png", 100), encodeImage(rgba, "png", 100),
                                 encodeImage(px, "jpeg", 80), encodeImage(px, "webp", 100),
                                 encodeImage(rgba, "webp", 70)};
  std::string ppm = "P6\n7 5\n255\n";
  ppm.append(reinterpret_cast<const char*>(px.data.data()), px.data.size());
  seeds.push_back(ppm);
  seeds.push_back("P5 7 5 65535 " + std::string(7 * 5 * 2, '\x10'));
  seeds.push_back(
      std::string("GIF89a\x01\x00\x01\x00\x80\x00\x00\x00\x00\x00\xff\xff\xff"
                  "\x21\xf9\x04\x01\x00\x00\x00\x00\x2c\x00\x00\x00\x00\x01\x00"
                  "\x01\x00\x00\x02\x02\x44\x01\x00\x3b",
                  43));
  std::string bmp = "BM";
  auto le = [&](std::uint32_t v, int n) {
    for (int i = 0; i < n; ++i) bmp += static_cast<char>((v >> (8 * i)) & 0xff);
  };
  le(54 + 24 * 5, 4), le(0, 4), le(54, 4), le(40, 4), le(7, 4), le(5, 4), le(1, 2), le(24, 2);
  le(0, 4), le(24 * 5, 4), le(0, 4), le(0, 4), le(0, 4), le(0, 4);
  bmp.append(24 * 5, '\x33');
  seeds.push_back(bmp);
  for (const std::string& s : seeds) ASSERT_NO_THROW(decodeImage(s, "image", 64, 4096));
  std::mt19937_64 g(4849);
  int decoded = 0, refused = 0;
  for (int i = 0; i < 4000; ++i) {
    const std::string bytes = mutate(seeds[static_cast<std::size_t>(i) % seeds.size()], g);
    try {
      const Pixels p = decodeImage(bytes, "image", 256, 256 * 256);
      ASSERT_GE(p.width, 1);
      ASSERT_LE(p.width, 256);
      ASSERT_GE(p.height, 1);
      ASSERT_LE(p.height, 256);
      ASSERT_GE(p.channels, 1);
      ASSERT_LE(p.channels, 4);
      ASSERT_EQ(p.data.size(), static_cast<std::size_t>(p.width) * p.height * p.channels);
      ++decoded;
    } catch (const ImageError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("'image' ", 0), 0u) << e.what();
      ++refused;
    }
  }
  std::cout << "uploads: " << decoded << " decoded, " << refused << " refused" << std::endl;
  EXPECT_GT(refused, 500);
}
