// UTF-8 helpers for the tokenizer: decoding that never fails (invalid bytes come
// back as marked units), lossy conversion like Rust's String::from_utf8_lossy,
// canonical normalization (NFC, NFD, by utf8proc) and the GPT-2 byte <-> character
// map.
//
// Invalid input is split into "maximal subparts" (Unicode §3.9, Table 3-7): the
// longest prefix of a well-formed sequence, or one byte. Each becomes one unit.
// Stateless functions over immutable tables; safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace cellm::unicode {

inline constexpr char32_t kReplacementCharacter = 0xFFFD;

// One unit of a UTF-8 string: a code point, or a maximal invalid subpart.
struct Utf8Unit {
  char32_t code_point = 0;  // kReplacementCharacter when !valid
  uint32_t size_bytes = 0;  // >= 1
  bool valid = false;
};

// The unit at s[offset]. REQUIRES: offset < s.size().
Utf8Unit decode_utf8(std::string_view s, size_t offset);

void append_utf8(std::string& out, char32_t code_point);
bool is_valid_utf8(std::string_view s);

// Every maximal invalid subpart replaced by U+FFFD.
std::string to_valid_utf8_lossy(std::string_view bytes);

// Canonical composition / decomposition. Invalid units pass through unchanged
// and block composition across them.
std::string nfc(std::string_view s);
std::string nfd(std::string_view s);

// The White_Space property (Rust's char::is_whitespace).
bool is_whitespace(char32_t c);

// GPT-2's byte-level alphabet: each byte maps to a printable character.
char32_t byte_to_char(uint8_t byte);
std::optional<uint8_t> char_to_byte(char32_t c);

}  // namespace cellm::unicode
