// How a rank's event lines are written (parallel/runtime.h: emitEvent, abortGroup) without
// parallel/ knowing the worker protocol: the program's main installs formatters (the worker
// installs app/protocol's eventLine / fatalErrorLine); programs without the protocol (tests, tools)
// get the defaults below, which write the same lines (tests/test_runtime_lines.cpp fails when the
// copies drift). Torch-free.
#pragma once

#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>

namespace dit {

/// A rank's fatal error, as abortGroup reports it.
struct FatalError {
  int rank = 0;
  std::string message;
};
/// Formats one event object as its output line (no trailing newline).
using EventLineFormatter = std::function<std::string(const nlohmann::json&)>;
/// Formats abortGroup's fatal error as its output line (no trailing newline).
using FatalLineFormatter = std::function<std::string(const FatalError&)>;

/// Installs the formatter of emitEvent(const nlohmann::json&) / of abortGroup(); an empty
/// function restores the default. Thread-safe; call before the first event for a consistent
/// stream.
void setEventLineFormatter(EventLineFormatter f);
void setFatalLineFormatter(FatalLineFormatter f);

/// "@@DIT " + the object on one line (keys sorted; invalid UTF-8 replaced, never thrown).
std::string defaultEventLine(const nlohmann::json& event);
/// "@@DIT " + {"event":"error","id":null,"rank":R,"message":"...","fatal":true}, keys in that
/// order (invalid UTF-8 replaced).
std::string defaultFatalLine(const FatalError& e);

}  // namespace dit
