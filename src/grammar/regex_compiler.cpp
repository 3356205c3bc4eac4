// Regular expression -> grammar (compile_regex), and a choice among strings
// (compile_choice). The regex is matched against the whole output.
#include <algorithm>
#include <cctype>
#include <string>

#include "grammar/grammar_ir.h"

namespace cellm {

namespace {

using grammar::CodepointRange;
using grammar::IrBuilder;
using grammar::Sequence;
using grammar::Symbol;

constexpr uint32_t kMaxCodepoint = 0x10FFFF;

std::vector<CodepointRange> complement(std::vector<CodepointRange> ranges) {
  std::sort(ranges.begin(), ranges.end());
  std::vector<CodepointRange> out;
  uint32_t next = 0;
  for (auto [lo, hi] : ranges) {
    if (lo > next) out.emplace_back(next, lo - 1);
    if (hi >= next) next = hi + 1;
    if (next > kMaxCodepoint) return out;
  }
  out.emplace_back(next, kMaxCodepoint);
  return out;
}

// The ASCII meaning of a class escape letter (d w s, upper case negated), or
// false when `c` is none.
bool class_escape(char c, std::vector<CodepointRange>* out) {
  std::vector<CodepointRange> r;
  switch (c | 0x20) {
    case 'd':
      r = {{'0', '9'}};
      break;
    case 'w':
      r = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
      break;
    case 's':
      r = {{'\t', '\r'}, {' ', ' '}};  // \t \n \v \f \r and space
      break;
    default:
      return false;
  }
  if (c >= 'A' && c <= 'Z') r = complement(r);
  out->insert(out->end(), r.begin(), r.end());
  return true;
}

class RegexParser {
 public:
  RegexParser(std::string_view p, const GrammarLimits& limits) : p_(p), b_(limits) {}

  Result<Grammar> run() {
    size_t end = p_.size();
    if (!p_.empty() && p_[0] == '^') pos_ = 1;
    // A final unescaped '$' anchors the end (implied anyway).
    if (end > pos_ && p_[end - 1] == '$') {
      size_t slashes = 0;
      while (end - 1 - slashes > pos_ && p_[end - 2 - slashes] == '\\') ++slashes;
      if (slashes % 2 == 0) --end;
    }
    p_ = p_.substr(0, end);
    Sequence seq = alternation(0);
    if (error_.ok() && pos_ < p_.size()) fail("unbalanced ')'");
    if (!error_.ok()) return error_;
    const Symbol root = b_.rule_of("root", {seq});
    CELLM_ASSIGN_OR_RETURN(grammar::GrammarIr ir, b_.finish(root.index));
    return grammar::make_grammar(std::move(ir));
  }

 private:
  void fail(const std::string& what) {
    if (error_.ok()) {
      error_ = InvalidArgument("regex at offset " + std::to_string(pos_) + ": " + what);
    }
  }
  void unsupported(const std::string& what) {
    if (error_.ok()) {
      error_ = NotSupported("regex at offset " + std::to_string(pos_) + ": " + what +
                            " is not supported");
    }
  }
  bool at_end() const { return pos_ >= p_.size() || !error_.ok(); }
  char peek() const { return p_[pos_]; }

  Sequence alternation(int depth) {
    if (depth > b_.limits().max_nesting) {
      error_ =
          OutOfResources("regex at offset " + std::to_string(pos_) + ": groups nest deeper than " +
                         std::to_string(b_.limits().max_nesting));
      return {};
    }
    std::vector<Sequence> alts{concatenation(depth)};
    while (!at_end() && peek() == '|') {
      ++pos_;
      alts.push_back(concatenation(depth));
    }
    if (alts.size() == 1) return std::move(alts[0]);
    return {b_.rule_of("alt", std::move(alts))};
  }

  Sequence concatenation(int depth) {
    Sequence seq;
    while (!at_end() && peek() != '|' && peek() != ')') {
      Sequence atom_seq = atom(depth);
      while (!at_end() && quantifier(atom_seq)) {
      }
      seq.insert(seq.end(), atom_seq.begin(), atom_seq.end());
    }
    return seq;
  }

  // Applies a quantifier at pos_ to `seq`; false when there is none.
  bool quantifier(Sequence& seq) {
    const size_t start = pos_;
    int min = 0, max = -1;
    const char c = peek();
    if (c == '?') {
      max = 1, ++pos_;
    } else if (c == '*') {
      ++pos_;
    } else if (c == '+') {
      min = 1, ++pos_;
    } else if (c == '{') {
      if (!braces(&min, &max)) {
        pos_ = start;
        return false;  // a literal '{', as Python reads it
      }
    } else {
      return false;
    }
    if (!at_end() && peek() == '?') ++pos_;  // lazy: the same language
    if (!at_end() && peek() == '+') {
      unsupported("a possessive quantifier");
      return false;
    }
    if (seq.empty()) {
      pos_ = start;
      fail("a quantifier follows nothing");
      return false;
    }
    seq = {b_.repeat(seq, min, max, "repeat")};
    return true;
  }

  // {m}, {m,}, {m,n} at pos_; false (pos_ anywhere) when not of that form.
  bool braces(int* min, int* max) {
    ++pos_;
    auto number = [&](int* v) {
      const size_t start = pos_;
      long long x = 0;
      while (!at_end() && peek() >= '0' && peek() <= '9') {
        x = std::min<long long>(x * 10 + (peek() - '0'), 1LL << 40);
        ++pos_;
      }
      *v = static_cast<int>(std::min<long long>(x, 1 << 30));
      return pos_ > start;
    };
    if (!number(min)) {
      if (at_end() || peek() != ',') return false;
      *min = 0;  // {,n}
    }
    if (!at_end() && peek() == '}') {
      *max = *min, ++pos_;
      return true;
    }
    if (at_end() || peek() != ',') return false;
    ++pos_;
    if (!at_end() && peek() == '}') {
      *max = -1, ++pos_;
      return true;
    }
    if (!number(max) || at_end() || peek() != '}') return false;
    ++pos_;
    return true;
  }

  Sequence atom(int depth) {
    const char c = peek();
    if (c == '(') {
      ++pos_;
      if (!at_end() && peek() == '?') {
        if (p_.substr(pos_, 2) == "?:") {
          pos_ += 2;
        } else if (p_.substr(pos_, 3) == "?P<" || p_.substr(pos_, 2) == "?<") {
          const size_t close = p_.find('>', pos_);
          if (close == std::string_view::npos || p_.substr(pos_, 3) == "?<=" ||
              p_.substr(pos_, 3) == "?<!") {
            unsupported("a lookbehind or malformed group name");
            return {};
          }
          pos_ = close + 1;
        } else {
          unsupported("the group '(" + std::string(p_.substr(pos_, 2)) + "'");
          return {};
        }
      }
      Sequence inner = alternation(depth + 1);
      if (at_end() || peek() != ')') {
        fail("a group is not closed");
        return {};
      }
      ++pos_;
      return {b_.rule_of("group", {inner})};
    }
    if (c == '[') return {char_class()};
    if (c == '.') {
      ++pos_;
      return {b_.codepoints({{0, '\n' - 1}, {'\n' + 1, kMaxCodepoint}}, "any")};
    }
    if (c == '*' || c == '+' || c == '?') {
      fail("a quantifier follows nothing");
      return {};
    }
    if (c == '^' || c == '$') {
      unsupported("an anchor inside the pattern");
      return {};
    }
    if (c == '\\') {
      std::vector<CodepointRange> ranges;
      uint32_t cp = 0;
      if (!escape(/*in_class=*/false, &ranges, &cp)) return {};
      if (!ranges.empty()) return {b_.codepoints(ranges, "class")};
      return literal_codepoint(cp);
    }
    uint32_t cp;
    if (!grammar::decode_utf8(p_, &pos_, &cp)) {
      fail("invalid UTF-8");
      return {};
    }
    return literal_codepoint(cp);
  }

  Sequence literal_codepoint(uint32_t cp) {
    std::string s;
    grammar::append_utf8(s, cp);
    return b_.literal(s);
  }

  // An escape at pos_ ('\\'): a class (into *ranges) or one code point (*cp).
  bool escape(bool in_class, std::vector<CodepointRange>* ranges, uint32_t* cp) {
    ++pos_;
    if (at_end()) {
      fail("the pattern ends in a backslash");
      return false;
    }
    const char c = peek();
    if (class_escape(c, ranges)) {
      ++pos_;
      return true;
    }
    ++pos_;
    switch (c) {
      case 'n':
        *cp = '\n';
        return true;
      case 't':
        *cp = '\t';
        return true;
      case 'r':
        *cp = '\r';
        return true;
      case 'f':
        *cp = '\f';
        return true;
      case 'v':
        *cp = '\v';
        return true;
      case '0':
        *cp = 0;
        return true;
      case 'x':
        return hex(2, cp);
      case 'u':
        return hex(4, cp);
      case 'U':
        return hex(8, cp);
      default:
        break;
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '1' && c <= '9')) {
      --pos_;
      if (c == 'b' && in_class) {
        ++pos_;
        *cp = '\b';
        return true;
      }
      unsupported(std::string("the escape '\\") + c + "'");
      return false;
    }
    --pos_;
    if (!grammar::decode_utf8(p_, &pos_, cp)) {
      fail("invalid UTF-8");
      return false;
    }
    return true;
  }

  bool hex(int digits, uint32_t* cp) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (at_end() || !std::isxdigit(static_cast<unsigned char>(peek()))) {
        fail("expected " + std::to_string(digits) + " hex digits");
        return false;
      }
      const char h = peek();
      v = v * 16 + static_cast<uint32_t>(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
      ++pos_;
    }
    if (v > kMaxCodepoint) {
      fail("code point beyond U+10FFFF");
      return false;
    }
    *cp = v;
    return true;
  }

  Symbol char_class() {
    const size_t open = pos_;
    ++pos_;
    bool negate = false;
    if (!at_end() && peek() == '^') negate = true, ++pos_;
    std::vector<CodepointRange> ranges;
    bool first = true;
    while (true) {
      if (at_end()) {
        if (error_.ok()) pos_ = open, fail("a character class is not closed");
        return b_.byte(0);
      }
      if (peek() == ']' && !first) break;
      first = false;
      uint32_t lo;
      if (!class_char(&ranges, &lo)) {
        if (!error_.ok()) return b_.byte(0);
        continue;  // a class escape was added
      }
      uint32_t hi = lo;
      if (pos_ + 1 < p_.size() && peek() == '-' && p_[pos_ + 1] != ']') {
        ++pos_;
        std::vector<CodepointRange> bad;
        if (!class_char(&bad, &hi)) {
          if (error_.ok()) fail("a range ends in a class escape");
          return b_.byte(0);
        }
        if (hi < lo) {
          fail("a range is out of order");
          return b_.byte(0);
        }
      }
      ranges.emplace_back(lo, hi);
    }
    ++pos_;
    if (negate) ranges = complement(ranges);
    const Symbol s = b_.codepoints(ranges, "class");
    return s;
  }

  // One class member at pos_: a code point (true, *cp) or a class escape added to
  // *ranges (false with no error).
  bool class_char(std::vector<CodepointRange>* ranges, uint32_t* cp) {
    if (peek() == '\\') {
      std::vector<CodepointRange> added;
      if (!escape(/*in_class=*/true, &added, cp)) return false;
      if (!added.empty()) {
        ranges->insert(ranges->end(), added.begin(), added.end());
        return false;
      }
      return true;
    }
    if (p_.substr(pos_, 2) == "[:") {
      unsupported("a POSIX class");
      return false;
    }
    if (!grammar::decode_utf8(p_, &pos_, cp)) {
      fail("invalid UTF-8");
      return false;
    }
    return true;
  }

  std::string_view p_;
  size_t pos_ = 0;
  IrBuilder b_;
  Status error_;
};

}  // namespace

Result<Grammar> compile_regex(std::string_view pattern, const GrammarLimits& limits) {
  if (pattern.size() > limits.max_input_bytes) {
    return OutOfResources("regex: " + std::to_string(pattern.size()) +
                          " bytes exceed the limit of " + std::to_string(limits.max_input_bytes));
  }
  return RegexParser(pattern, limits).run();
}

Result<Grammar> compile_choice(std::span<const std::string> choices, const GrammarLimits& limits) {
  if (choices.empty()) return InvalidArgument("choice: the list of strings is empty");
  size_t total = 0;
  for (const std::string& c : choices) total += c.size();
  if (total > limits.max_input_bytes) {
    return OutOfResources("choice: " + std::to_string(total) + " bytes exceed the limit of " +
                          std::to_string(limits.max_input_bytes));
  }
  IrBuilder b(limits);
  const Symbol root = b.literal_choice({choices.begin(), choices.end()}, "root");
  CELLM_ASSIGN_OR_RETURN(grammar::GrammarIr ir, b.finish(root.index));
  return grammar::make_grammar(std::move(ir));
}

}  // namespace cellm
