// Fuzz targets (seeded, ctest label `fuzz`; the sanitize preset runs them under ASan + UBSan) for
// the parser entries ditstudio-server added in front of its routes: the JSON body scan + parse +
// field types (every JSON route's body and the multipart 'loras' field), the Host / Origin /
// Content-Type readers, the message scrubber, and upload decoding (PNG, JPEG, WebP, BMP, GIF, PNM
// with the cut-short checks). Each input must be accepted or refused with our own message: no
// crash, no sanitizer report, no JSON library text, no exception of another type. The last target
// sends whole mutated HTTP requests (JSON, chunked and multipart bodies, headers) to an in-process
// HttpServer over sockets: each is answered or closed, and the server still answers afterwards.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "app/server/http_server.h"
#include "app/server/image_codec.h"
#include "app/server/pool.h"
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

namespace {

// One raw exchange: sends `req` and reads until a response head arrives, the server closes, or
// `ms` pass. Returns the response's status (0: closed without one; -1: nothing within `ms`, e.g. a
// Content-Length larger than the body sent: the server waits for the rest until its deadline).
// The client never half-closes: cpp-httplib 0.11 does not answer a client that did.
int exchange(int port, const std::string& req, int ms) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return 0;
  }
  for (std::size_t off = 0; off < req.size();) {
    const ssize_t n = ::send(fd, req.data() + off, req.size() - off, MSG_NOSIGNAL);
    if (n <= 0) break;
    off += static_cast<std::size_t>(n);
  }
  std::string got;
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  bool closed = false;
  while (!closed && got.find("\r\n\r\n") == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      closed = true;
    } else {
      got.append(buf, static_cast<std::size_t>(n));
    }
  }
  ::close(fd);
  if (got.rfind("HTTP/1.1 ", 0) == 0 && got.size() >= 12) return std::stoi(got.substr(9, 3));
  return closed ? 0 : -1;
}

std::string httpRequest(const std::string& method, const std::string& path,
                        const std::vector<std::string>& headers, const std::string& body,
                        bool chunked = false) {
  std::string r = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  for (const auto& h : headers) r += h + "\r\n";
  if (chunked) {
    r += "Transfer-Encoding: chunked\r\n\r\n";
    for (std::size_t off = 0; off < body.size(); off += 100) {
      const std::string part = body.substr(off, 100);
      char len[16];
      std::snprintf(len, sizeof len, "%zx\r\n", part.size());
      r += len + part + "\r\n";
    }
    return r + "0\r\n\r\n";
  }
  if (!body.empty()) r += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  return r + "\r\n" + body;
}

}  // namespace

TEST(ServerFuzz, HttpRequestsOverASocketAnsweredOrClosed) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("ditstudio-server-fuzz-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  GroupSpec g;
  g.model = (dir / "no-model").string();  // never started: jobs queue, nothing runs
  PoolOptions po;
  po.images_dir = (dir / "images").string();
  po.exe_dir = dir.string();
  po.max_queue = 1;
  Pool pool({g}, po);
  ServerOptions so;
  so.port = 0;
  so.max_body_bytes = 1 << 20;
  so.request_timeout_s = 2;
  so.max_prompt_bytes = 4096;
  int port = 0;
  std::map<int, int> statuses;
  int unanswered = 0;
  {
    HttpServer http(pool, so);
    port = http.bind();
    std::thread serve([&] { http.listen(); });
    Pixels px;
    px.width = 8;
    px.height = 8;
    px.channels = 3;
    px.data.assign(8 * 8 * 3, 77);
    const std::string png = encodeImage(px, "png", 100);
    const std::string b64 = encodeBase64(png);
    const std::string boundary = "xYzBoUnDaRy";
    auto part = [&](const std::string& name, const std::string& value,
                    const std::string& file = "") {
      return "--" + boundary + "\r\nContent-Disposition: form-data; name=\"" + name + "\"" +
             (file.empty() ? "" : "; filename=\"" + file + "\"\r\nContent-Type: image/png") +
             "\r\n\r\n" + value + "\r\n";
    };
    const std::string form = part("prompt", "a star") + part("n", "1") + part("size", "64x64") +
                             part("loras", "[{\"name\": \"a\"}]") + part("image", png, "i.png") +
                             part("mask", png, "m.png") + "--" + boundary + "--\r\n";
    const std::vector<std::string> seeds{
        httpRequest("POST", "/v1/images/generations", {"Content-Type: application/json"},
                    R"({"prompt": "a star", "size": "64x64", "steps": 2, "seed": 7, "n": 1})"),
        httpRequest(
            "POST", "/sdapi/v1/img2img", {"Content-Type: application/json"},
            R"({"prompt": "x", "init_images": [")" + b64 +
                R"("], "width": 64, "denoising_strength": 0.5, "override_settings": {"a": [1]}})"),
        httpRequest("POST", "/v1/images/edits",
                    {"Content-Type: multipart/form-data; boundary=" + boundary}, form),
        httpRequest("POST", "/v1/jobs", {"Content-Type: application/json"},
                    R"({"prompt": "chunked", "size": "64x64", "loras": null})", true),
        httpRequest("GET", "/v1/jobs?since=5", {"Origin: http://127.0.0.1", "Accept: */*"}, ""),
        httpRequest("OPTIONS", "/v1/models", {"Origin: http://evil.example"}, ""),
        httpRequest("DELETE", "/v1/jobs/img-1-abc", {}, ""),
        httpRequest("GET", "/v1/events?since=0", {}, ""),
    };
    std::mt19937_64 rng(4850);
    for (int i = 0; i < 640; ++i) {
      const std::string& seed = seeds[static_cast<std::size_t>(i) % seeds.size()];
      const int st = exchange(port, mutate(seed, rng), 150);
      if (st < 0)
        ++unanswered;
      else
        ++statuses[st];
    }
    // Still serving: health answered, and a generation still checked (the queue of 1 is full).
    EXPECT_EQ(exchange(port, httpRequest("GET", "/v1/health", {"Connection: close"}, ""), 5000),
              200);
    EXPECT_EQ(exchange(port, seeds[0], 5000), 429);
    http.stop();
    serve.join();
  }
  std::string counts;
  for (const auto& [st, n] : statuses) counts += " " + std::to_string(st) + ":" + std::to_string(n);
  std::cout << "http requests (status:count, 0 = closed without an answer):" << counts << "; "
            << unanswered << " still waiting for the bytes their header promised after 150 ms"
            << std::endl;
  EXPECT_EQ(statuses.count(500), 0u) << counts;  // no internal error from a client's bytes
  EXPECT_GT(statuses[400], 60) << counts;
  EXPECT_LT(unanswered, 240) << counts;
  fs::remove_all(dir);
}
