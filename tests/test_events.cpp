// Typed events (app/protocol/events.h): each encoder writes exactly the JSON the worker built by
// hand before (the literals below are copied from app/worker.cpp as it was), and decodeEvent reads
// every field back; decoding is lenient (wrong types keep defaults, unknown names are kept).
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>

#include "app/protocol/events.h"

using nlohmann::json;
namespace p = dit::protocol;

namespace {
// The event as the launcher sees it: through its line.
p::WorkerEvent throughLine(const json& j) {
  auto ev = p::parseEventLine(p::eventLine(j));
  EXPECT_TRUE(ev.has_value());
  return p::decodeEvent(*ev);
}
}  // namespace

TEST(Events, EncodersWriteTheWorkersJson) {
  EXPECT_EQ(p::toJson(p::HelloEvent{1, 2, 4242, "h", json{{"library", "openblas"}}}),
            (json{{"event", "hello"},
                  {"rank", 1},
                  {"world", 2},
                  {"pid", 4242},
                  {"host", "h"},
                  {"blas", {{"library", "openblas"}}}}));
  EXPECT_EQ(p::toJson(p::LogEvent{std::nullopt, 0, "warning", "note"}),
            (json{{"event", "log"}, {"rank", 0}, {"level", "warning"}, {"message", "note"}}));
  EXPECT_EQ(
      p::toJson(p::LogEvent{std::string("r1"), 0, "info", "cache"}),
      (json{{"event", "log"}, {"id", "r1"}, {"rank", 0}, {"level", "info"}, {"message", "cache"}}));
  EXPECT_EQ(p::toJson(p::StatusEvent{"loading", "loading /m", std::nullopt}),
            (json{{"event", "status"}, {"stage", "loading"}, {"message", "loading /m"}}));
  EXPECT_EQ(p::toJson(p::StatusEvent{"idle", "idle", std::string("r1")}),
            (json{{"event", "status"}, {"stage", "idle"}, {"id", "r1"}, {"message", "idle"}}));
  EXPECT_EQ(p::toJson(p::AcceptedEvent{"r2", 1}),
            (json{{"event", "accepted"}, {"id", "r2"}, {"queue_position", std::size_t(1)}}));
  EXPECT_EQ(p::toJson(p::CancelledEvent{"r2", 3}),
            (json{{"event", "cancelled"}, {"id", "r2"}, {"step", 3}}));
  EXPECT_EQ(p::toJson(p::DoneEvent{"r2", 1.5}),
            (json{{"event", "done"}, {"id", "r2"}, {"seconds", 1.5}}));
  EXPECT_EQ(p::toJson(p::ByeEvent{}), (json{{"event", "bye"}}));
  EXPECT_EQ(p::toJson(p::ProgressEvent{"r1", 2, 4, 10.0, 1, 10.0 * (4 - 2) / 1000.0}),
            (json{{"event", "progress"},
                  {"id", "r1"},
                  {"step", 2},
                  {"steps", 4},
                  {"step_ms", 10.0},
                  {"image_index", 1},
                  {"eta_s", 10.0 * (4 - 2) / 1000.0}}));
  EXPECT_EQ(
      p::toJson(p::PreviewEvent{"r1", 2, 0, "iVBO"}),
      (json{{"event", "preview"}, {"id", "r1"}, {"step", 2}, {"image_index", 0}, {"png", "iVBO"}}));
  p::ImageEvent im;
  im.id = "r1";
  im.image_index = 0;
  im.path = "/o.png";
  im.seed = std::numeric_limits<std::uint64_t>::max();
  im.has_seed = true;
  im.params = json{{"steps", 4}};
  im.rank = 0;
  im.seconds = 0.25;
  EXPECT_EQ(p::toJson(im), (json{{"event", "image"},
                                 {"id", "r1"},
                                 {"cache", nullptr},
                                 {"image_index", 0},
                                 {"path", "/o.png"},
                                 {"seed", std::numeric_limits<std::uint64_t>::max()},
                                 {"params", {{"steps", 4}}},
                                 {"rank", 0},
                                 {"seconds", 0.25}}));
  im.host = "other";
  EXPECT_EQ(p::toJson(im).at("host"), "other");
  EXPECT_EQ(p::toJson(p::ErrorEvent{std::nullopt, 1, "boom", true}),
            p::errorEvent(std::nullopt, 1, "boom", true));
  EXPECT_EQ(
      p::toJson(p::ErrorEvent{std::string("r1"), 0, "bad", false}),
      (json{{"event", "error"}, {"id", "r1"}, {"rank", 0}, {"message", "bad"}, {"fatal", false}}));
  p::RanksEvent rk;
  p::RankStats st;
  st.rank = 0;
  st.stage = "denoising";
  st.step = 1;
  st.steps = 4;
  st.rss = 100;
  st.rss_peak = 200;
  st.dev = 0;
  st.dev_peak = 0;
  st.bytes_sent = 64;
  st.step_ms = 1.5;
  rk.ranks.push_back(st);
  EXPECT_EQ(p::toJson(rk).dump(),
            (json{{"event", "ranks"},
                  {"ranks", json::array({json{{"rank", 0},
                                              {"stage", "denoising"},
                                              {"step", 1},
                                              {"steps", 4},
                                              {"rss", std::uint64_t(100)},
                                              {"rss_peak", std::uint64_t(200)},
                                              {"dev", std::uint64_t(0)},
                                              {"dev_peak", std::uint64_t(0)},
                                              {"bytes_sent", std::uint64_t(64)},
                                              {"step_ms", 1.5}}})}})
                .dump());
}

TEST(Events, DecodeReadsEveryField) {
  p::ImageEvent im;
  im.id = "r7";
  im.image_index = 3;
  im.path = "/x.png";
  im.seed = 18446744073709551615ull;
  im.has_seed = true;
  im.rank = 2;
  im.seconds = 1.25;
  im.host = "h2";
  const auto back = std::get<p::ImageEvent>(throughLine(p::toJson(im)));
  EXPECT_EQ(back.id, "r7");
  EXPECT_EQ(back.image_index, 3);
  EXPECT_EQ(back.seed, 18446744073709551615ull);
  EXPECT_TRUE(back.has_seed);
  EXPECT_EQ(back.rank, 2);
  EXPECT_EQ(back.host, std::optional<std::string>("h2"));
  EXPECT_DOUBLE_EQ(back.seconds, 1.25);

  const auto err =
      std::get<p::ErrorEvent>(throughLine(p::toJson(p::ErrorEvent{std::nullopt, 1, "m", true})));
  EXPECT_FALSE(err.id.has_value());
  EXPECT_EQ(err.rank, 1);
  EXPECT_TRUE(err.fatal);
  const auto pr =
      std::get<p::ProgressEvent>(throughLine(p::toJson(p::ProgressEvent{"a", 2, 5, 3.5, 1, 0.01})));
  EXPECT_EQ(pr.step, 2);
  EXPECT_EQ(pr.steps, 5);
  EXPECT_DOUBLE_EQ(pr.step_ms, 3.5);
  EXPECT_EQ(pr.image_index, 1);
  p::ReadyEvent r;
  r.world = 2;
  r.model = json{{"max_sequence_length", 512}};
  const auto rb = std::get<p::ReadyEvent>(throughLine(p::toJson(r)));
  EXPECT_EQ(rb.world, 2);
  EXPECT_EQ(rb.model.at("max_sequence_length"), 512);
  EXPECT_TRUE(std::holds_alternative<p::ByeEvent>(throughLine(p::toJson(p::ByeEvent{}))));
  for (const p::WorkerEvent& e :
       {p::WorkerEvent(p::HelloEvent{}), p::WorkerEvent(p::LoraEvent{}),
        p::WorkerEvent(p::DoneEvent{}), p::WorkerEvent(p::CancelledEvent{}),
        p::WorkerEvent(p::AcceptedEvent{}), p::WorkerEvent(p::StatusEvent{}),
        p::WorkerEvent(p::RanksEvent{}), p::WorkerEvent(p::PreviewEvent{}),
        p::WorkerEvent(p::LogEvent{})})
    EXPECT_EQ(throughLine(p::toJson(e)).index(), e.index()) << p::eventName(e);
}

TEST(Events, DecodeIsLenient) {
  // Wrong types keep the defaults; nothing throws.
  const auto pr = std::get<p::ProgressEvent>(
      throughLine(json{{"event", "progress"}, {"id", 5}, {"step", "two"}, {"steps", 4.0}}));
  EXPECT_EQ(pr.id, "");
  EXPECT_EQ(pr.step, 0);
  EXPECT_EQ(pr.steps, 4);
  const auto im = std::get<p::ImageEvent>(throughLine(json{{"event", "image"}, {"seed", -1}}));
  EXPECT_FALSE(im.has_seed);
  const auto im2 = std::get<p::ImageEvent>(throughLine(json{{"event", "image"}, {"seed", 1.5}}));
  EXPECT_FALSE(im2.has_seed);
  const auto u = throughLine(json{{"event", "future_thing"}, {"x", 1}});
  ASSERT_TRUE(std::holds_alternative<p::UnknownEvent>(u));
  EXPECT_EQ(p::eventName(u), "future_thing");
}
