// Structure-aware input for the fuzz targets: JSON values built from the fuzzer's
// bytes with FuzzedDataProvider, so that mutations change field values and types
// instead of mostly breaking the JSON syntax. Each target serializes what it
// builds and feeds the text through the parser under test, the same path as a
// file or an HTTP body.
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace cellm::fuzz {

// True when `data` looks like JSON text (its first byte opens a value): the
// targets then parse the bytes as they are (mutations of the seed files);
// otherwise they build a structured document from the bytes.
inline bool looks_like_json(const uint8_t* data, size_t size) {
  return size > 0 && (data[0] == '{' || data[0] == '[' || data[0] == ' ' || data[0] == '\n');
}

// A string that is valid UTF-8 (JSON text requires it; nlohmann::json::dump
// refuses anything else). Invalid sequences become U+FFFD.
inline std::string utf8_string(FuzzedDataProvider& fdp, size_t max_length) {
  const std::string raw = fdp.ConsumeRandomLengthString(max_length);
  std::string out;
  for (size_t i = 0; i < raw.size();) {
    const auto c = static_cast<unsigned char>(raw[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = n > 0 && i + n <= raw.size();
    for (size_t k = 1; ok && k < n; ++k) {
      ok = (static_cast<unsigned char>(raw[i + k]) & 0xC0) == 0x80;
    }
    if (ok && n > 1) {
      // Refuse overlong forms, surrogates and values past U+10FFFF.
      uint32_t cp = c & (0x7F >> n);
      for (size_t k = 1; k < n; ++k)
        cp = (cp << 6) | (static_cast<unsigned char>(raw[i + k]) & 0x3F);
      const uint32_t min_cp = n == 2 ? 0x80 : n == 3 ? 0x800 : 0x10000;
      ok = cp >= min_cp && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    }
    if (ok) {
      out.append(raw, i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += 1;
    }
  }
  return out;
}

// An integer, mostly near the interesting edges (0, ±1, small, the int32 and
// int64 limits) and otherwise anything.
inline nlohmann::json edge_integer(FuzzedDataProvider& fdp) {
  switch (fdp.ConsumeIntegralInRange<int>(0, 9)) {
    case 0:
      return 0;
    case 1:
      return fdp.ConsumeIntegralInRange<int64_t>(-2, 2);
    case 2:
      return fdp.ConsumeIntegralInRange<int64_t>(0, 64);
    case 3:
      return fdp.ConsumeIntegralInRange<int64_t>(0, 100000);
    case 4:
      return int64_t{std::numeric_limits<int32_t>::max()} + fdp.ConsumeIntegralInRange<int>(-1, 1);
    case 5:
      return int64_t{std::numeric_limits<int32_t>::min()} + fdp.ConsumeIntegralInRange<int>(-1, 1);
    case 6:
      return std::numeric_limits<int64_t>::max() - fdp.ConsumeIntegralInRange<int>(0, 1);
    case 7:
      return std::numeric_limits<int64_t>::min() + fdp.ConsumeIntegralInRange<int>(0, 1);
    case 8:
      return std::numeric_limits<uint64_t>::max() - fdp.ConsumeIntegralInRange<uint64_t>(0, 1);
    default:
      return fdp.ConsumeIntegral<int64_t>();
  }
}

// A finite number (JSON has no NaN or infinity).
inline nlohmann::json edge_number(FuzzedDataProvider& fdp) {
  switch (fdp.ConsumeIntegralInRange<int>(0, 4)) {
    case 0:
      return fdp.ConsumeFloatingPointInRange<double>(-2.0, 2.0);
    case 1:
      return fdp.ConsumeProbability<double>();
    case 2:
      return std::numeric_limits<double>::max();
    case 3:
      return -std::numeric_limits<double>::denorm_min();
    default: {
      const double d = fdp.ConsumeFloatingPoint<double>();
      return std::isfinite(d) ? d : 1e308;
    }
  }
}

// Any JSON value, nested at most `depth` levels.
inline nlohmann::json any_value(FuzzedDataProvider& fdp, int depth) {
  const int kind = fdp.ConsumeIntegralInRange<int>(0, depth > 0 ? 6 : 4);
  switch (kind) {
    case 0:
      return nullptr;
    case 1:
      return fdp.ConsumeBool();
    case 2:
      return edge_integer(fdp);
    case 3:
      return edge_number(fdp);
    case 4:
      return utf8_string(fdp, 64);
    case 5: {
      nlohmann::json a = nlohmann::json::array();
      const int n = fdp.ConsumeIntegralInRange<int>(0, 6);
      for (int i = 0; i < n; ++i) a.push_back(any_value(fdp, depth - 1));
      return a;
    }
    default: {
      nlohmann::json o = nlohmann::json::object();
      const int n = fdp.ConsumeIntegralInRange<int>(0, 6);
      for (int i = 0; i < n; ++i) o[utf8_string(fdp, 16)] = any_value(fdp, depth - 1);
      return o;
    }
  }
}

// A value for a field whose expected type is `like`: mostly a value of that type
// (numbers near the edges), sometimes anything at all.
inline nlohmann::json value_like(FuzzedDataProvider& fdp, const nlohmann::json& like) {
  if (fdp.ConsumeIntegralInRange<int>(0, 7) == 0) return any_value(fdp, 2);
  switch (like.type()) {
    case nlohmann::json::value_t::boolean:
      return fdp.ConsumeBool();
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
      return edge_integer(fdp);
    case nlohmann::json::value_t::number_float:
      return edge_number(fdp);
    case nlohmann::json::value_t::string:
      return utf8_string(fdp, 64);
    default:
      return any_value(fdp, 2);
  }
}

}  // namespace cellm::fuzz
