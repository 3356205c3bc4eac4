// The grammar IR every front end compiles to: context-free rules whose terminals
// are byte classes. A rule is a list of alternatives, an alternative a sequence of
// symbols, a symbol a byte class or a rule. IrBuilder makes the common shapes
// (literals, code point classes spelled out in UTF-8, optional, repetition) and
// finish() validates the result: every rule defined and productive, no left
// recursion that a pushdown automaton could not follow, sizes within limits.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cellm/grammar.h"
#include "cellm/status.h"

namespace cellm::grammar {

// A set of bytes, 256 bits.
struct ByteSet {
  std::array<uint64_t, 4> words{};

  void set(uint8_t b) { words[b >> 6] |= uint64_t{1} << (b & 63); }
  bool test(uint8_t b) const { return (words[b >> 6] >> (b & 63)) & 1; }
  void set_range(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) set(static_cast<uint8_t>(b));
  }
  bool empty() const { return (words[0] | words[1] | words[2] | words[3]) == 0; }
  // Every byte of this set is in `other`.
  bool subset_of(const ByteSet& other) const {
    for (int i = 0; i < 4; ++i) {
      if (words[i] & ~other.words[i]) return false;
    }
    return true;
  }
  ByteSet& operator|=(const ByteSet& o) {
    for (int i = 0; i < 4; ++i) words[i] |= o.words[i];
    return *this;
  }
  friend bool operator<(const ByteSet& a, const ByteSet& b) { return a.words < b.words; }
  friend bool operator==(const ByteSet& a, const ByteSet& b) { return a.words == b.words; }
};

// A byte class (index into GrammarIr::sets) or a rule (index into rules).
struct Symbol {
  bool is_rule = false;
  uint32_t index = 0;
  friend bool operator==(const Symbol&, const Symbol&) = default;
};
using Sequence = std::vector<Symbol>;

struct Rule {
  std::string name;
  std::vector<Sequence> alternatives;
};

struct GrammarIr {
  std::vector<Rule> rules;
  std::vector<ByteSet> sets;
  uint32_t root = 0;
};

// Inclusive code point range.
using CodepointRange = std::pair<uint32_t, uint32_t>;

// Builds a GrammarIr. Methods that can exceed a limit record the first error;
// finish() returns it.
class IrBuilder {
 public:
  explicit IrBuilder(const GrammarLimits& limits) : limits_(limits) {}

  // A new rule with no alternatives yet; names are made unique.
  uint32_t add_rule(std::string_view name);
  void add_alternative(uint32_t rule, Sequence sequence);
  // A new rule with these alternatives, as a symbol.
  Symbol rule_of(std::string_view name, std::vector<Sequence> alternatives);

  Symbol bytes(const ByteSet& set);  // REQUIRES: !set.empty()
  Symbol byte(uint8_t b);
  Sequence literal(std::string_view text);
  // Exactly one of `words`, as a trie of rules: words that share a prefix share
  // its symbols, so a match holds one parse stack however many words there are
  // (alternatives of whole literals would hold one per word still possible).
  Symbol literal_choice(std::vector<std::string> words, std::string_view name);
  // One UTF-8 encoded code point in the union of `ranges` (surrogates left out).
  // Fails (recorded) when the ranges hold no encodable code point.
  Symbol codepoints(std::vector<CodepointRange> ranges, std::string_view name);

  Symbol optional(const Sequence& body, std::string_view name);
  // body repeated [min, max] times; max < 0 means no upper bound.
  Symbol repeat(const Sequence& body, int min, int max, std::string_view name);

  void fail(Status status);
  bool failed() const { return !error_.ok(); }
  const GrammarLimits& limits() const { return limits_; }
  size_t num_rules() const { return ir_.rules.size(); }

  // Validates and returns the grammar rooted at `root`.
  Result<GrammarIr> finish(uint32_t root);

 private:
  GrammarLimits limits_;
  GrammarIr ir_;
  std::map<ByteSet, uint32_t> set_index_;
  std::map<std::string, int> name_uses_;
  size_t num_symbols_ = 0;
  Status error_;
};

// Validates a grammar: symbols in range, every rule with an alternative, every
// rule reachable from the root productive, no left recursion through a call
// that is not in tail position. Errors name the rule.
Status validate_grammar(const GrammarIr& ir);

// The grammar written out in GBNF (byte classes as [\xNN-\xMM]).
std::string to_gbnf(const GrammarIr& ir);

// Appends the UTF-8 encoding of `cp` (REQUIRES: cp <= 0x10FFFF).
void append_utf8(std::string& out, uint32_t cp);
// Decodes one UTF-8 code point at text[*pos], advancing *pos; false on a malformed
// sequence (then *pos is unchanged).
bool decode_utf8(std::string_view text, size_t* pos, uint32_t* cp);

}  // namespace cellm::grammar

namespace cellm::grammar {

// The IR flattened into positions for the matcher: position p is one dot in one
// alternative; symbol[p] is what comes after the dot.
struct PositionTable {
  static constexpr int32_t kEnd = -1;  // the dot is at the end of its alternative
  // >= 0: a byte class (index into GrammarIr::sets); kEnd; <= -2: rule -(value + 2).
  std::vector<int32_t> symbol;
  std::vector<std::vector<uint32_t>> rule_starts;  // [rule] -> first position of each alt

  static PositionTable build(const GrammarIr& ir);
  static bool is_rule(int32_t s) { return s <= -2; }
  static uint32_t rule_of(int32_t s) { return static_cast<uint32_t>(-(s + 2)); }
};

}  // namespace cellm::grammar

namespace cellm {
struct Grammar::Impl {
  grammar::GrammarIr ir;
  grammar::PositionTable positions;
};
namespace grammar {
// The compiled grammar of a validated IR.
Grammar make_grammar(GrammarIr ir);
}  // namespace grammar
}  // namespace cellm
