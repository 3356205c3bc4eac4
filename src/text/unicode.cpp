#include "unicode.h"

#include <algorithm>
#include <array>
#include <vector>

#include "unicode_nfc_data.h"

namespace cellm::unicode {
namespace {

constexpr char32_t kHangulSBase = 0xAC00;
constexpr char32_t kHangulLBase = 0x1100;
constexpr char32_t kHangulVBase = 0x1161;
constexpr char32_t kHangulTBase = 0x11A7;
constexpr char32_t kHangulLCount = 19;
constexpr char32_t kHangulVCount = 21;
constexpr char32_t kHangulTCount = 28;
constexpr char32_t kHangulNCount = kHangulVCount * kHangulTCount;
constexpr char32_t kHangulSCount = kHangulLCount * kHangulNCount;

// A unit of a string being normalized: a code point or raw invalid bytes.
struct NormUnit {
  char32_t code_point;
  uint8_t combining_class;
  bool valid;
  std::string_view raw;  // the source bytes when !valid
};

uint8_t combining_class(char32_t c) {
  if (c < 0x300) return 0;
  const CombiningClassEntry* end = kCombiningClasses + kNumCombiningClasses;
  const CombiningClassEntry* it =
      std::lower_bound(kCombiningClasses, end, c,
                       [](const CombiningClassEntry& e, char32_t v) { return e.code_point < v; });
  return (it != end && it->code_point == c) ? it->combining_class : 0;
}

void decompose_into(char32_t c, std::vector<NormUnit>& out) {
  if (c >= kHangulSBase && c < kHangulSBase + kHangulSCount) {
    const char32_t s_index = c - kHangulSBase;
    out.push_back({kHangulLBase + s_index / kHangulNCount, 0, true, {}});
    out.push_back({kHangulVBase + (s_index % kHangulNCount) / kHangulTCount, 0, true, {}});
    const char32_t t = s_index % kHangulTCount;
    if (t != 0) out.push_back({kHangulTBase + t, 0, true, {}});
    return;
  }
  if (c >= 0xC0) {
    const DecompositionEntry* end = kDecompositions + kNumDecompositions;
    const DecompositionEntry* it =
        std::lower_bound(kDecompositions, end, c,
                         [](const DecompositionEntry& e, char32_t v) { return e.code_point < v; });
    if (it != end && it->code_point == c) {
      for (uint32_t i = 0; i < it->length; ++i) {
        const char32_t d = kDecompositionData[it->offset + i];
        out.push_back({d, combining_class(d), true, {}});
      }
      return;
    }
  }
  out.push_back({c, combining_class(c), true, {}});
}

std::optional<char32_t> compose_pair(char32_t first, char32_t second) {
  if (first >= kHangulLBase && first < kHangulLBase + kHangulLCount && second >= kHangulVBase &&
      second < kHangulVBase + kHangulVCount) {
    return kHangulSBase +
           ((first - kHangulLBase) * kHangulVCount + (second - kHangulVBase)) * kHangulTCount;
  }
  if (first >= kHangulSBase && first < kHangulSBase + kHangulSCount &&
      (first - kHangulSBase) % kHangulTCount == 0 && second > kHangulTBase &&
      second < kHangulTBase + kHangulTCount) {
    return first + (second - kHangulTBase);
  }
  const CompositionEntry* end = kCompositions + kNumCompositions;
  const CompositionEntry* it = std::lower_bound(
      kCompositions, end, std::pair{first, second}, [](const CompositionEntry& e, auto v) {
        return e.first < v.first || (e.first == v.first && e.second < v.second);
      });
  if (it != end && it->first == first && it->second == second) return it->composite;
  return std::nullopt;
}

// Full canonical decomposition in canonical order.
std::vector<NormUnit> decompose(std::string_view s) {
  std::vector<NormUnit> units;
  units.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const Utf8Unit u = decode_utf8(s, i);
    if (u.valid) {
      decompose_into(u.code_point, units);
    } else {
      units.push_back({0, 0, false, s.substr(i, u.size_bytes)});
    }
    i += u.size_bytes;
  }
  // Canonical ordering: stable sort each run of non-starters by class.
  for (size_t i = 0; i < units.size();) {
    if (units[i].combining_class == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < units.size() && units[j].combining_class != 0) ++j;
    std::stable_sort(
        units.begin() + static_cast<std::ptrdiff_t>(i),
        units.begin() + static_cast<std::ptrdiff_t>(j),
        [](const NormUnit& a, const NormUnit& b) { return a.combining_class < b.combining_class; });
    i = j;
  }
  return units;
}

std::string encode_units(const std::vector<NormUnit>& units) {
  std::string out;
  for (const NormUnit& u : units) {
    if (u.valid) {
      append_utf8(out, u.code_point);
    } else {
      out.append(u.raw);
    }
  }
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
  return encode_units(decompose(s));
}

std::string nfc(std::string_view s) {
  if (below(s, 0xCC)) return std::string(s);  // all below U+0300
  std::vector<NormUnit> units = decompose(s);
  // Canonical composition (Unicode §3.11): each character composes with the last
  // starter unless a character between them blocks it.
  std::vector<NormUnit> out;
  out.reserve(units.size());
  std::optional<size_t> starter;  // index in out of the last starter
  for (const NormUnit& u : units) {
    if (!u.valid) {
      out.push_back(u);
      starter.reset();
      continue;
    }
    if (starter) {
      const NormUnit& last = out.back();
      const bool adjacent = *starter == out.size() - 1;
      const bool blocked =
          !adjacent && (last.combining_class == 0 || last.combining_class >= u.combining_class);
      if (!blocked) {
        if (std::optional<char32_t> c = compose_pair(out[*starter].code_point, u.code_point)) {
          out[*starter].code_point = *c;
          continue;
        }
      }
    }
    out.push_back(u);
    if (u.combining_class == 0) starter = out.size() - 1;
  }
  return encode_units(out);
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
