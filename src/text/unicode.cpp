#include "unicode.h"

#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <new>

namespace cellm::unicode {
namespace {

// Normalizes s with utf8proc, one maximal valid run at a time: utf8proc takes only
// valid UTF-8, and an invalid unit passes through unchanged and, like a starter
// that composes with nothing, neither reorders nor composes with its neighbours.
std::string normalize(std::string_view s, utf8proc_option_t options) {
  std::string out;
  out.reserve(s.size());
  size_t run_start = 0;
  const auto flush_run = [&](size_t run_end) {
    if (run_end == run_start) return;
    utf8proc_uint8_t* mapped = nullptr;
    const utf8proc_ssize_t n =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + run_start),
                     static_cast<utf8proc_ssize_t>(run_end - run_start), &mapped, options);
    // A valid run can fail only for want of memory.
    if (n < 0) throw std::bad_alloc();
    out.append(reinterpret_cast<const char*>(mapped), static_cast<size_t>(n));
    std::free(mapped);
  };
  for (size_t i = 0; i < s.size();) {
    const Utf8Unit u = decode_utf8(s, i);
    if (!u.valid) {
      flush_run(i);
      out.append(s.substr(i, u.size_bytes));
      run_start = i + u.size_bytes;
    }
    i += u.size_bytes;
  }
  flush_run(s.size());
  return out;
}

// Code points below U+0300 are all NFC and NFD-stable except those that
// decompose (U+00C0 and up), which only matter for NFD.
bool below(std::string_view s, uint8_t first_byte_limit) {
  return std::all_of(s.begin(), s.end(),
                     [&](char ch) { return static_cast<uint8_t>(ch) < first_byte_limit; });
}

}  // namespace

Utf8Unit decode_utf8(std::string_view s, size_t offset) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t b0 = byte(offset);
  if (b0 < 0x80) return {b0, 1, true};
  uint32_t length = 0;
  uint8_t lo = 0x80;
  uint8_t hi = 0xBF;
  char32_t cp = 0;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    length = 2;
    cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    length = 3;
    cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    length = 4;
    cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {kReplacementCharacter, 1, false};
  }
  uint32_t consumed = 1;
  while (consumed < length) {
    if (offset + consumed >= s.size()) return {kReplacementCharacter, consumed, false};
    const uint8_t b = byte(offset + consumed);
    if (b < lo || b > hi) return {kReplacementCharacter, consumed, false};
    cp = (cp << 6) | (b & 0x3F);
    lo = 0x80;
    hi = 0xBF;
    ++consumed;
  }
  return {cp, length, true};
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const Utf8Unit u = decode_utf8(s, i);
    if (!u.valid) return false;
    i += u.size_bytes;
  }
  return true;
}

std::string to_valid_utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const Utf8Unit u = decode_utf8(bytes, i);
    if (u.valid) {
      out.append(bytes.substr(i, u.size_bytes));
    } else {
      append_utf8(out, kReplacementCharacter);
    }
    i += u.size_bytes;
  }
  return out;
}

std::string nfd(std::string_view s) {
  if (below(s, 0xC3)) return std::string(s);  // all below U+00C0
  return normalize(s, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE));
}

std::string nfc(std::string_view s) {
  if (below(s, 0xCC)) return std::string(s);  // all below U+0300
  return normalize(s, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
}

bool is_whitespace(char32_t c) {
  switch (c) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

namespace {

struct ByteMap {
  std::array<char32_t, 256> to_char{};
  ByteMap() {
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      to_char[static_cast<size_t>(b)] = printable ? static_cast<char32_t>(b) : next++;
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

}  // namespace

char32_t byte_to_char(uint8_t byte) {
  return byte_map().to_char[byte];
}

std::optional<uint8_t> char_to_byte(char32_t c) {
  if (c < 256) {
    const bool printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
    if (printable) return static_cast<uint8_t>(c);
    return std::nullopt;
  }
  if (c >= 256 + 68) return std::nullopt;  // 68 bytes are remapped above U+00FF
  const auto& map = byte_map().to_char;
  for (size_t b = 0; b < 256; ++b) {
    if (map[b] == c) return static_cast<uint8_t>(b);
  }
  return std::nullopt;
}

}  // namespace cellm::unicode
