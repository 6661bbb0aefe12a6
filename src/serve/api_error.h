// ApiError: an error answered to an HTTP client in OpenAI's shape,
// {"error": {"message", "type", "param", "code"}}, with its HTTP status. Plain value type.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace ember::serve {

struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending request field ("" -> null)
  std::string code;   // machine-readable reason ("" -> null)

  nlohmann::json ToJson() const {
    nlohmann::json error = {{"message", message}, {"type", type}, {"param", nullptr},
                            {"code", nullptr}};
    if (!param.empty()) error["param"] = param;
    if (!code.empty()) error["code"] = code;
    return {{"error", error}};
  }
};

inline ApiError InvalidRequest(std::string message, std::string param = "",
                               std::string code = "invalid_value") {
  return ApiError{400, std::move(message), "invalid_request_error", std::move(param),
                  std::move(code)};
}

}  // namespace ember::serve
