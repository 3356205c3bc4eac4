// ApiError: an HTTP error answer in OpenAI's shape,
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
// with the status it goes out with. `param` names the offending request field
// (empty: null); `code` is a short machine-readable reason (empty: null).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <variant>

namespace cellm::cli {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;
  std::string code;

  nlohmann::json to_json() const {
    nlohmann::json e = {
        {"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
    if (!param.empty()) e["param"] = param;
    if (!code.empty()) e["code"] = code;
    return {{"error", std::move(e)}};
  }
};

// 400 naming the field.
inline ApiError invalid_field(std::string param, std::string message) {
  return ApiError{400, std::move(message), "invalid_request_error", std::move(param), ""};
}

// A value or the error that answers the request instead.
template <typename T>
using ApiResult = std::variant<T, ApiError>;

}  // namespace cellm::cli
