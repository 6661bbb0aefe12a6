// The web chat page that `ember serve` answers at GET /: the embedded files of src/serve/web/
// (web_assets.h) served from memory with their content type, an ETag (304 when If-None-Match
// names it), `Cache-Control: no-cache` (every load revalidates, so a new binary's page is seen
// at once) and a Content-Security-Policy that lets the page load and call nothing but its own
// origin. The page needs no API key; it asks the user for one when the API answers 401.
// Also the same-origin test that lets the page's own POSTs (browsers send Origin on them)
// through the server's Origin rule. Stateless; any thread.
#pragma once

#include <string_view>

#include "serve/http_transport.h"

namespace ember::serve {

// Whether `path` is one of the page's files ("/" for index.html, "/chat.js", ...).
bool IsWebUiPath(std::string_view path);

// The answer to a GET or HEAD of a web-UI path (200 with the file, or 304). The caller has
// checked the method and the path (IsWebUiPath).
HttpResponse WebUiResponse(const HttpRequest& req);

// Whether an Origin header ("http://127.0.0.1:8080") names the host the request was sent to
// (its Host header), i.e. the request comes from a page this server served. Scheme http or
// https (a TLS proxy in front), host compared without case, default ports (80, 443) optional.
bool IsSameOrigin(std::string_view origin, std::string_view host_header);

}  // namespace ember::serve
