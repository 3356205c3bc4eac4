// The canonical Unicode tables behind NFC and NFD, generated into
// unicode_nfc_data.cpp by tools/gen_nfc_table.py. Every table is sorted by its
// leading code point(s) for binary search. Hangul syllables are algorithmic and
// absent from the tables. Read-only data; safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cellm::unicode {

struct CombiningClassEntry {
  char32_t code_point;
  uint8_t combining_class;  // canonical combining class, never 0 here
};

// kDecompositionData[offset, offset + length) is the full canonical decomposition.
struct DecompositionEntry {
  char32_t code_point;
  uint32_t offset;
  uint32_t length;
};

// first + second compose canonically to composite (a primary composite).
struct CompositionEntry {
  char32_t first;
  char32_t second;
  char32_t composite;
};

extern const char* const kNfcUnicodeVersion;
extern const CombiningClassEntry kCombiningClasses[];
extern const size_t kNumCombiningClasses;
extern const char32_t kDecompositionData[];
extern const DecompositionEntry kDecompositions[];
extern const size_t kNumDecompositions;
extern const CompositionEntry kCompositions[];
extern const size_t kNumCompositions;

}  // namespace cellm::unicode
