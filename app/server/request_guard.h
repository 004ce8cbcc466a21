// What ditstudio-server checks about a request before any handler works on it: the JSON body's
// nesting depth and text encoding (scanned without recursion, before the JSON library sees it),
// the JSON types of the fields the routes read, the browser headers (Host against DNS rebinding,
// Origin, Content-Type) and the file paths in messages sent back (the client's own names, never
// the server's folders). Pure functions over strings: no sockets, no Torch, no Qt. Part of
// dit_server; docs/security.md lists the limits.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dit::server {

/// A client mistake found by a check: the message (our words, never the JSON library's) and the
/// field it names in OpenAI's `param` ("" = the body as a whole).
struct FieldError {
  std::string message;
  std::string param;
};

/// Scans a JSON body without recursion: nesting deeper than `maxDepth` (objects and arrays; what
/// is inside strings does not count) and invalid UTF-8 inside a string are refused naming the
/// field where they occur ("loras[0].name"). Other syntax errors are left to the parser.
std::optional<FieldError> scanJsonBody(std::string_view body, int maxDepth);

/// Parses a JSON request body: empty, too deep, not UTF-8 (scanJsonBody), not valid JSON ("the
/// request body is not valid JSON (at byte 12)") or not an object: a FieldError. `out` is set
/// only when it returns nullopt.
std::optional<FieldError> parseJsonBody(std::string_view body, int maxDepth, nlohmann::json& out);

/// `text` is valid UTF-8 (no overlong forms, no surrogates, at most U+10FFFF); else the offset of
/// the first bad byte.
std::optional<std::size_t> invalidUtf8At(std::string_view text);

/// Which route's body: the JSON types of the fields it reads, checked before the route reads
/// them (a number where a string belongs gets a 400 naming the field, never a JSON library
/// exception).
enum class BodyKind { OpenAi, Sdapi, SdapiImg2Img };
std::optional<FieldError> checkFieldTypes(const nlohmann::json& body, BodyKind kind);

/// The name part of a Host header ("localhost:8000" -> "localhost", "[::1]:8000" -> "::1"),
/// lower-cased; "" when the header is malformed.
std::string hostName(std::string_view hostHeader);
/// Whether a request's Host header names this server: "*" in `allowed` accepts any; otherwise
/// its name must be one of `allowed` (compared without the port, case-insensitively).
bool hostAllowed(std::string_view hostHeader, const std::vector<std::string>& allowed);
/// The Host names a server listening on `bindHost` answers to by default: for a loopback address
/// "localhost", "127.0.0.1", "::1" and the address itself; for a wildcard address ("0.0.0.0",
/// "::", "") any ("*": a token is required there); otherwise the address and the loopback names.
std::vector<std::string> defaultAllowedHosts(const std::string& bindHost);
/// Whether a browser's Origin header may use the server: absent, the server's own origin
/// ("http://" + the request's Host), or one of `corsOrigins` ("*" = any).
bool originAllowed(std::string_view origin, std::string_view hostHeader,
                   const std::vector<std::string>& corsOrigins);
/// Content-Type of a JSON body: application/json or any application/...+json (parameters such as
/// charset allowed).
bool isJsonContentType(std::string_view contentType);
bool isMultipartContentType(std::string_view contentType);

/// A message from a rank or the file system made fit for a client: each `names` pair (server
/// path -> the name the client used) replaced first, then every other absolute path reduced to
/// its file name, so no folder of the server is shown.
std::string clientMessage(std::string message,
                          const std::vector<std::pair<std::string, std::string>>& names = {});

}  // namespace dit::server
