#include "serve/web_ui.h"

#include <algorithm>
#include <string>

#include "serve/web_assets.h"

namespace ember::serve {

namespace {

// Nothing but this origin: scripts and styles from the page's own files, fetches to its own API;
// no inline script or style, no frames, no form posts, and no HTML-string sinks (the page builds
// its DOM from text nodes; Trusted Types turns any innerHTML assignment into an error).
constexpr const char* kContentSecurityPolicy =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'; "
    "require-trusted-types-for 'script'; trusted-types 'none'";

std::string_view ContentType(std::string_view name) {
  const auto ends_with = [&](std::string_view suffix) {
    return name.size() >= suffix.size() && name.substr(name.size() - suffix.size()) == suffix;
  };
  if (ends_with(".html")) return "text/html; charset=utf-8";
  if (ends_with(".js")) return "text/javascript; charset=utf-8";
  if (ends_with(".css")) return "text/css; charset=utf-8";
  if (ends_with(".svg")) return "image/svg+xml";
  return "application/octet-stream";
}

// "/" serves index.html; every other file is served under its own name.
const WebAsset* FindAsset(std::string_view path) {
  if (path.empty() || path[0] != '/') return nullptr;
  const std::string_view name = path == "/" ? std::string_view("index.html") : path.substr(1);
  if (name == "index.html" && path != "/") return nullptr;  // one address per file
  for (const WebAsset& asset : EmbeddedWebAssets())
    if (asset.name == name) return &asset;
  return nullptr;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// If-None-Match: "*" or a comma-separated list of (possibly weak, W/"...") entity tags.
bool MatchesEtag(std::string_view if_none_match, std::string_view quoted_etag) {
  while (!if_none_match.empty()) {
    const size_t comma = if_none_match.find(',');
    std::string_view tag = Trim(if_none_match.substr(0, comma));
    if (tag == "*") return true;
    if (tag.substr(0, 2) == "W/") tag.remove_prefix(2);
    if (tag == quoted_etag) return true;
    if (comma == std::string_view::npos) break;
    if_none_match.remove_prefix(comma + 1);
  }
  return false;
}

char LowerAscii(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

// Lower-cased, without the scheme's default port: "LocalHost:80" -> "localhost".
std::string NormalizedAuthority(std::string_view authority, std::string_view default_port) {
  std::string out;
  for (char c : authority) out += LowerAscii(c);
  const size_t port_at = out.size() - std::min(out.size(), default_port.size() + 1);
  if (port_at > 0 && out[port_at] == ':' &&
      std::string_view(out).substr(port_at + 1) == default_port) {
    // "[::1]:80" and "host:80" have a port; an unbracketed IPv6 literal has no port to strip.
    if (out[port_at - 1] == ']' || out.find(':') == port_at) out.resize(port_at);
  }
  return out;
}

}  // namespace

bool IsWebUiPath(std::string_view path) {
  return FindAsset(path) != nullptr;
}

HttpResponse WebUiResponse(const HttpRequest& req) {
  const WebAsset* asset = FindAsset(req.path);
  HttpResponse res;
  std::string etag = "\"";  // appended piecewise: GCC 12's -Wrestrict misfires on "\"" + string
  etag.append(asset->etag).push_back('"');
  res.headers = {{"ETag", etag},
                 {"Cache-Control", "no-cache"},
                 {"Content-Security-Policy", kContentSecurityPolicy},
                 {"X-Content-Type-Options", "nosniff"},
                 {"Referrer-Policy", "no-referrer"},
                 {"X-Frame-Options", "DENY"}};
  if (MatchesEtag(req.Header("if-none-match"), etag)) {
    res.status = 304;
    return res;
  }
  res.content_type = std::string(ContentType(asset->name));
  res.body = std::string(asset->bytes);
  return res;
}

bool IsSameOrigin(std::string_view origin, std::string_view host_header) {
  std::string_view default_port;
  std::string scheme;
  for (char c : origin.substr(0, origin.find("://"))) scheme += LowerAscii(c);
  if (scheme == "http") {
    default_port = "80";
  } else if (scheme == "https") {
    default_port = "443";
  } else {
    return false;  // "null" (a sandboxed or file: page), or no scheme at all
  }
  const std::string_view authority = origin.substr(scheme.size() + 3);
  if (authority.empty() || host_header.empty()) return false;
  return NormalizedAuthority(authority, default_port) ==
         NormalizedAuthority(host_header, default_port);
}

}  // namespace ember::serve
