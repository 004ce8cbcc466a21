// parallel/runtime.cpp writes event lines without knowing the protocol: the worker's main installs
// app/protocol's formatters, and programs without the protocol (fault_injection, ditstudio-train,
// ditstudio-bench) get the defaults. The defaults are a copy of the protocol's lines; this test
// fails when the copies drift (the diffusers `# Copied from` + check_copies idea).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "app/protocol/events.h"
#include "app/protocol/protocol.h"
#include "parallel/event_lines.h"

using nlohmann::json;

TEST(RuntimeLines, DefaultEventLineIsTheProtocols) {
  const std::vector<json> events{
      dit::protocol::toJson(dit::protocol::ProgressEvent{"r1", 2, 4, 12.5, 0, 25.0}),
      dit::protocol::toJson(dit::protocol::LogEvent{std::nullopt, 1, "error", "caf\xc3\xa9"}),
      dit::protocol::toJson(dit::protocol::ByeEvent{}),
      // Invalid UTF-8 is replaced by both, never thrown.
      json{{"event", "log"}, {"message", std::string("bad \xff byte")}}};
  for (const json& e : events)
    EXPECT_EQ(dit::defaultEventLine(e), dit::protocol::eventLine(e))
        << e.dump(-1, ' ', false, json::error_handler_t::replace);
}

TEST(RuntimeLines, DefaultFatalLineIsTheProtocols) {
  for (const auto& [rank, msg] : std::vector<std::pair<int, std::string>>{
           {1, "fault injection: rank 1 throws"}, {0, "quote \" and \\ and \n"}, {3, "\xff\xfe"}})
    EXPECT_EQ(dit::defaultFatalLine(dit::FatalError{rank, msg}),
              dit::protocol::fatalErrorLine(rank, msg));
  // The documented order (PROTOCOL.md "Failure"; the fault tests match it).
  EXPECT_EQ(dit::protocol::fatalErrorLine(1, "boom"),
            R"(@@DIT {"event":"error","id":null,"rank":1,"message":"boom","fatal":true})");
}
