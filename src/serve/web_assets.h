// The web chat page's static files (src/serve/web/), compiled into the binary: web_assets.cc is
// generated at build time by embed_web.cmake, so the page needs no files at run time. The table
// is immutable and lives for the whole program; read it from any thread.
#pragma once

#include <span>
#include <string_view>

namespace ember::serve {

struct WebAsset {
  std::string_view name;   // file name in src/serve/web/, e.g. "chat.js"
  std::string_view etag;   // first 16 hex digits of the file's SHA-256 (no quotes)
  std::string_view bytes;  // the file's contents
};

// Every embedded file, in the order CMake lists them.
std::span<const WebAsset> EmbeddedWebAssets();

}  // namespace ember::serve
