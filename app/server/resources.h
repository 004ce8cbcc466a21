// Files compiled into ditstudio-server (embed_resources.cmake writes resources.cpp at build time):
// the page served at / (app/server/page.html: no external assets) and the built-in presets
// (resources/presets/builtin-presets.json, as the GUI ships them).
#pragma once

namespace dit::server {
extern const char* const kPageHtml;
extern const char* const kBuiltinPresetsJson;
}  // namespace dit::server
