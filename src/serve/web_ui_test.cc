// The web chat page's routes: every embedded file at its address with its content type and the
// caching and security headers, 304 on a matching If-None-Match, the files' references to each
// other all embedded, and the same-origin rule that lets the page's own POSTs in.
#include "serve/web_ui.h"

#include <gtest/gtest.h>

#include <string>

#include "serve/web_assets.h"

namespace ember::serve {
namespace {

HttpRequest Get(std::string path, std::string if_none_match = "") {
  HttpRequest req;
  req.method = "GET";
  req.path = path;
  req.target = path;
  if (!if_none_match.empty()) req.headers.emplace_back("if-none-match", if_none_match);
  return req;
}

std::string HeaderOf(const HttpResponse& res, const std::string& name) {
  for (const auto& [key, value] : res.headers)
    if (key == name) return value;
  return "";
}

const WebAsset& Asset(std::string_view name) {
  for (const WebAsset& asset : EmbeddedWebAssets())
    if (asset.name == name) return asset;
  ADD_FAILURE() << name << " is not embedded";
  static const WebAsset kNone{};
  return kNone;
}

TEST(WebUi, RootServesIndexHtmlWithSecurityHeaders) {
  ASSERT_TRUE(IsWebUiPath("/"));
  const HttpResponse res = WebUiResponse(Get("/"));
  EXPECT_EQ(res.status, 200);
  EXPECT_EQ(res.content_type, "text/html; charset=utf-8");
  EXPECT_EQ(res.body, Asset("index.html").bytes);
  EXPECT_NE(res.body.find("<!doctype html>"), std::string::npos);
  EXPECT_EQ(HeaderOf(res, "Cache-Control"), "no-cache");
  const std::string etag = HeaderOf(res, "ETag");  // "0123456789abcdef"
  EXPECT_TRUE(etag.size() == 18 && etag.front() == '"' && etag.back() == '"' &&
              etag.find_first_not_of("0123456789abcdef", 1) == 17)
      << etag;
  const std::string csp = HeaderOf(res, "Content-Security-Policy");
  for (const char* directive :
       {"default-src 'none'", "script-src 'self'", "style-src 'self'", "connect-src 'self'",
        "frame-ancestors 'none'", "require-trusted-types-for 'script'"})
    EXPECT_NE(csp.find(directive), std::string::npos) << directive;
  EXPECT_EQ(csp.find("unsafe"), std::string::npos) << csp;
  EXPECT_EQ(HeaderOf(res, "X-Content-Type-Options"), "nosniff");
}

TEST(WebUi, EveryFileHasItsContentTypeAndOwnEtag) {
  const std::pair<const char*, const char*> expected[] = {
      {"/chat.js", "text/javascript; charset=utf-8"},
      {"/markdown.js", "text/javascript; charset=utf-8"},
      {"/sse.js", "text/javascript; charset=utf-8"},
      {"/store.js", "text/javascript; charset=utf-8"},
      {"/chat.css", "text/css; charset=utf-8"},
      {"/favicon.svg", "image/svg+xml"}};
  for (const auto& [path, type] : expected) {
    ASSERT_TRUE(IsWebUiPath(path)) << path;
    const HttpResponse res = WebUiResponse(Get(path));
    EXPECT_EQ(res.status, 200) << path;
    EXPECT_EQ(res.content_type, type) << path;
    EXPECT_EQ(res.body, Asset(std::string_view(path).substr(1)).bytes) << path;
    EXPECT_FALSE(res.body.empty()) << path;
    EXPECT_NE(HeaderOf(res, "ETag"), HeaderOf(WebUiResponse(Get("/")), "ETag")) << path;
  }
}

TEST(WebUi, OnlyTheEmbeddedFilesAreRoutes) {
  for (const char* path : {"", "/index.html", "/nope.js", "/v1/models", "/chat.js/", "//chat.js",
                           "/../chat.js", "/CHAT.JS"})
    EXPECT_FALSE(IsWebUiPath(path)) << path;
}

TEST(WebUi, MatchingIfNoneMatchIsA304WithoutBody) {
  const std::string etag = HeaderOf(WebUiResponse(Get("/chat.css")), "ETag");
  for (const std::string& header :
       {etag, "W/" + etag, "\"0000000000000000\", " + etag, std::string("*")}) {
    const HttpResponse res = WebUiResponse(Get("/chat.css", header));
    EXPECT_EQ(res.status, 304) << header;
    EXPECT_TRUE(res.body.empty()) << header;
    EXPECT_EQ(HeaderOf(res, "ETag"), etag);
    EXPECT_EQ(HeaderOf(res, "Cache-Control"), "no-cache");
  }
  EXPECT_EQ(WebUiResponse(Get("/chat.css", "\"0000000000000000\"")).status, 200);
  // An old page's tag does not match a new file.
  EXPECT_EQ(WebUiResponse(Get("/chat.js", etag)).status, 200);
}

// Every file the page and its modules load (src="/x", href="/x", import ... from './x.js') is
// embedded, so a new file cannot be forgotten in CMakeLists.txt's list.
TEST(WebUi, EveryReferencedFileIsEmbedded) {
  // (Plain string scans, not <regex>: GCC 12's std::regex trips -Wmaybe-uninitialized under the
  // sanitizer build.)
  int num_references = 0;
  for (const WebAsset& asset : EmbeddedWebAssets()) {
    const std::string text(asset.bytes);
    for (const auto& [open, close] : {std::pair<std::string, char>{"src=\"/", '"'},
                                      {"href=\"/", '"'},
                                      {"from './", '\''}}) {
      for (size_t at = text.find(open); at != std::string::npos; at = text.find(open, at + 1)) {
        const size_t begin = at + open.size();
        const size_t end = text.find_first_of(std::string(1, close) + "?#", begin);
        if (end == std::string::npos || end == begin) continue;
        const std::string name = text.substr(begin, end - begin);
        EXPECT_TRUE(IsWebUiPath("/" + name)) << asset.name << " references " << name;
        ++num_references;
      }
    }
  }
  EXPECT_GE(num_references, 6);
}

TEST(WebUi, SameOriginComparesSchemeHostAndPort) {
  EXPECT_TRUE(IsSameOrigin("http://127.0.0.1:8080", "127.0.0.1:8080"));
  EXPECT_TRUE(IsSameOrigin("http://localhost", "LocalHost:80"));
  EXPECT_TRUE(IsSameOrigin("http://localhost:80", "localhost"));
  EXPECT_TRUE(IsSameOrigin("http://[::1]:8080", "[::1]:8080"));
  EXPECT_TRUE(IsSameOrigin("http://[::1]", "[::1]:80"));
  EXPECT_TRUE(IsSameOrigin("https://chat.example", "chat.example:443"));
  EXPECT_FALSE(IsSameOrigin("http://127.0.0.1:8081", "127.0.0.1:8080"));
  EXPECT_FALSE(IsSameOrigin("http://evil.example", "127.0.0.1:8080"));
  EXPECT_FALSE(IsSameOrigin("http://127.0.0.1:8080.evil.example", "127.0.0.1:8080"));
  EXPECT_FALSE(IsSameOrigin("https://localhost", "localhost:80"));
  EXPECT_FALSE(IsSameOrigin("null", "localhost"));
  EXPECT_FALSE(IsSameOrigin("file://", "localhost"));
  EXPECT_FALSE(IsSameOrigin("http://", ""));
  EXPECT_FALSE(IsSameOrigin("http://localhost", ""));
}

}  // namespace
}  // namespace ember::serve
