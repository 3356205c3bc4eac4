// ApiError: an HTTP error answer in OpenAI's shape,
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
// with the status it goes out with. `param` names the offending request field
// (empty: null); `code` is a short machine-readable reason (empty: null).
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <variant>

namespace cellm::cli {

// `text` with every byte that does not begin a well-formed UTF-8 sequence (overlong,
// surrogate, past U+10FFFF or cut short) replaced by U+FFFD.
inline std::string valid_utf8(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = s[i];
    size_t len = c < 0x80           ? 1
                 : (c >> 5) == 0x6  ? 2
                 : (c >> 4) == 0xE  ? 3
                 : (c >> 3) == 0x1E ? 4
                                    : 0;
    bool ok = len != 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) ok = (s[i + k] & 0xC0) == 0x80;
    if (ok && len > 1) {
      uint32_t cp = c & (0x7F >> len);
      for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (s[i + k] & 0x3F);
      const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
      ok = cp >= min[len] && cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF);
    }
    if (ok) {
      out.append(text, i, len);
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;
  std::string code;

  // The message and param may quote a client's bytes (a field's name): invalid UTF-8 in
  // them becomes U+FFFD, so the body is always valid JSON text.
  nlohmann::json to_json() const {
    nlohmann::json e = {
        {"message", valid_utf8(message)}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
    if (!param.empty()) e["param"] = valid_utf8(param);
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
