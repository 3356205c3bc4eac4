// GBNF -> grammar (compile_gbnf). The format: rules `name ::= body`; a body is
// alternatives separated by '|', each a sequence of "literals", [classes], '.',
// rule names and ( groups ), each optionally followed by * + ? or {m} {m,} {m,n};
// '#' starts a comment. A rule's body runs until the next `name ::=`. The start
// rule is `root`.
#include <algorithm>
#include <cctype>
#include <map>
#include <string>

#include "grammar/grammar_ir.h"

namespace cellm {

namespace {

using grammar::CodepointRange;
using grammar::IrBuilder;
using grammar::Sequence;
using grammar::Symbol;

bool is_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
}

class GbnfParser {
 public:
  GbnfParser(std::string_view text, const GrammarLimits& limits) : t_(text), b_(limits) {}

  Result<Grammar> run() {
    skip_space();
    while (error_.ok() && pos_ < t_.size()) {
      const size_t name_pos = pos_;
      const std::string name = read_name();
      if (name.empty()) return error_at(pos_, "expected a rule name");
      skip_space();
      if (t_.substr(pos_, 3) != "::=")
        return error_at(pos_, "expected '::=' after rule name '" + name + "'");
      pos_ += 3;
      const uint32_t rule = rule_id(name, name_pos);
      if (defined_.count(name)) return error_at(name_pos, "rule '" + name + "' is defined twice");
      defined_[name] = name_pos;
      for (Sequence& alt : alternatives(0)) b_.add_alternative(rule, std::move(alt));
      skip_space();
    }
    if (!error_.ok()) return error_;
    for (const auto& [name, where] : referenced_) {
      if (!defined_.count(name)) return error_at(where, "rule '" + name + "' is not defined");
    }
    auto root = rules_.find("root");
    if (root == rules_.end()) return InvalidArgument("GBNF: the grammar has no 'root' rule");
    CELLM_ASSIGN_OR_RETURN(grammar::GrammarIr ir, b_.finish(root->second));
    return grammar::make_grammar(std::move(ir));
  }

 private:
  Status error_at(size_t at, const std::string& what) {
    fail_at(at, what);
    return error_;
  }
  void fail_at(size_t at, const std::string& what) {
    if (error_.ok()) {
      size_t line = 1, col = 1;
      for (size_t i = 0; i < at && i < t_.size(); ++i) {
        if (t_[i] == '\n') {
          ++line, col = 1;
        } else {
          ++col;
        }
      }
      error_ = InvalidArgument("GBNF at line " + std::to_string(line) + ", column " +
                               std::to_string(col) + ": " + what);
    }
  }
  bool ok() const { return error_.ok(); }

  void skip_space() {
    while (pos_ < t_.size()) {
      const char c = t_[pos_];
      if (c == '#') {
        while (pos_ < t_.size() && t_[pos_] != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else {
        break;
      }
    }
  }

  std::string read_name() {
    const size_t start = pos_;
    while (pos_ < t_.size() && is_name_char(t_[pos_])) ++pos_;
    return std::string(t_.substr(start, pos_ - start));
  }

  uint32_t rule_id(const std::string& name, size_t where) {
    auto it = rules_.find(name);
    if (it != rules_.end()) return it->second;
    referenced_.emplace(name, where);
    const uint32_t id = b_.add_rule(name);
    rules_.emplace(name, id);
    return id;
  }

  // Whether a name at pos_ starts the next rule (`name ::=`).
  bool at_rule_start() const {
    size_t p = pos_;
    while (p < t_.size() && is_name_char(t_[p])) ++p;
    if (p == pos_) return false;
    while (p < t_.size() && (t_[p] == ' ' || t_[p] == '\t' || t_[p] == '\n' || t_[p] == '\r')) ++p;
    return t_.substr(p, 3) == "::=";
  }

  std::vector<Sequence> alternatives(int depth) {
    if (depth > b_.limits().max_nesting) {
      fail_at(pos_, "groups nest deeper than " + std::to_string(b_.limits().max_nesting));
      return {};
    }
    std::vector<Sequence> alts{sequence(depth)};
    while (ok() && pos_ < t_.size() && t_[pos_] == '|') {
      ++pos_;
      alts.push_back(sequence(depth));
    }
    return alts;
  }

  Sequence sequence(int depth) {
    Sequence seq;
    while (ok()) {
      skip_space();
      if (pos_ >= t_.size() || t_[pos_] == '|' || t_[pos_] == ')' || at_rule_start()) break;
      Sequence item = element(depth);
      if (!ok()) break;
      repetitions(item);
      seq.insert(seq.end(), item.begin(), item.end());
    }
    return seq;
  }

  void repetitions(Sequence& item) {
    while (ok() && pos_ < t_.size()) {
      const char c = t_[pos_];
      int min = 0, max = -1;
      if (c == '*') {
        ++pos_;
      } else if (c == '+') {
        min = 1, ++pos_;
      } else if (c == '?') {
        max = 1, ++pos_;
      } else if (c == '{') {
        if (!braces(&min, &max)) return;
      } else {
        return;
      }
      item = {b_.repeat(item, min, max, "repeat")};
    }
  }

  bool braces(int* min, int* max) {
    const size_t open = pos_;
    ++pos_;
    auto number = [&](int* v) {
      skip_space();
      const size_t start = pos_;
      long long x = 0;
      while (pos_ < t_.size() && std::isdigit(static_cast<unsigned char>(t_[pos_]))) {
        x = std::min<long long>(x * 10 + (t_[pos_] - '0'), 1LL << 40);
        ++pos_;
      }
      *v = static_cast<int>(std::min<long long>(x, 1 << 30));
      skip_space();
      return pos_ > start;
    };
    bool have_min = number(min);
    if (!have_min) *min = 0;
    if (pos_ < t_.size() && t_[pos_] == '}' && have_min) {
      *max = *min, ++pos_;
      return true;
    }
    if (pos_ >= t_.size() || t_[pos_] != ',') {
      fail_at(open, "a repetition must read {m}, {m,}, {,n} or {m,n}");
      return false;
    }
    ++pos_;
    if (!number(max)) *max = -1;
    if (pos_ >= t_.size() || t_[pos_] != '}') {
      fail_at(open, "a repetition is not closed by '}'");
      return false;
    }
    ++pos_;
    return true;
  }

  Sequence element(int depth) {
    const size_t start = pos_;
    const char c = t_[pos_];
    if (c == '"') {
      ++pos_;
      std::string bytes;
      while (ok()) {
        if (pos_ >= t_.size()) {
          fail_at(start, "a string literal is not closed");
          return {};
        }
        if (t_[pos_] == '"') break;
        uint32_t cp;
        if (!character(&cp)) return {};
        grammar::append_utf8(bytes, cp);
      }
      ++pos_;
      return b_.literal(bytes);
    }
    if (c == '[') return {char_class()};
    if (c == '.') {
      ++pos_;
      return {b_.codepoints({{0, 0x10FFFF}}, "any")};
    }
    if (c == '(') {
      ++pos_;
      std::vector<Sequence> alts = alternatives(depth + 1);
      skip_space();
      if (ok() && (pos_ >= t_.size() || t_[pos_] != ')')) {
        fail_at(start, "a group is not closed");
        return {};
      }
      ++pos_;
      return {b_.rule_of("group", std::move(alts))};
    }
    if (is_name_char(c)) {
      const std::string name = read_name();
      return {Symbol{true, rule_id(name, start)}};
    }
    fail_at(start, std::string("unexpected character '") + c + "'");
    return {};
  }

  // One character of a literal or class at pos_ (escapes decoded).
  bool character(uint32_t* cp) {
    if (t_[pos_] != '\\') {
      if (!grammar::decode_utf8(t_, &pos_, cp)) {
        fail_at(pos_, "invalid UTF-8");
        return false;
      }
      return true;
    }
    const size_t at = pos_;
    ++pos_;
    if (pos_ >= t_.size()) {
      fail_at(at, "the text ends in a backslash");
      return false;
    }
    const char e = t_[pos_++];
    int digits = 0;
    switch (e) {
      case 'n':
        *cp = '\n';
        return true;
      case 't':
        *cp = '\t';
        return true;
      case 'r':
        *cp = '\r';
        return true;
      case '\\':
      case '"':
      case '[':
      case ']':
      case '-':
      case '^':
        *cp = static_cast<uint8_t>(e);
        return true;
      case 'x':
        digits = 2;
        break;
      case 'u':
        digits = 4;
        break;
      case 'U':
        digits = 8;
        break;
      default:
        fail_at(at, std::string("unknown escape '\\") + e + "'");
        return false;
    }
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (pos_ >= t_.size() || !std::isxdigit(static_cast<unsigned char>(t_[pos_]))) {
        fail_at(at, "expected " + std::to_string(digits) + " hex digits");
        return false;
      }
      const char h = t_[pos_++];
      v = v * 16 + static_cast<uint32_t>(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
    }
    if (v > 0x10FFFF) {
      fail_at(at, "code point beyond U+10FFFF");
      return false;
    }
    *cp = v;
    return true;
  }

  Symbol char_class() {
    const size_t open = pos_;
    ++pos_;
    bool negate = false;
    if (pos_ < t_.size() && t_[pos_] == '^') negate = true, ++pos_;
    std::vector<CodepointRange> ranges;
    while (ok()) {
      if (pos_ >= t_.size()) {
        fail_at(open, "a character class is not closed");
        break;
      }
      if (t_[pos_] == ']') break;
      uint32_t lo, hi;
      if (!character(&lo)) break;
      hi = lo;
      if (pos_ + 1 < t_.size() && t_[pos_] == '-' && t_[pos_ + 1] != ']') {
        ++pos_;
        if (!character(&hi)) break;
        if (hi < lo) {
          fail_at(open, "a range in a character class is out of order");
          break;
        }
      }
      ranges.emplace_back(lo, hi);
    }
    if (!ok()) return b_.byte(0);
    ++pos_;
    if (negate) {
      std::sort(ranges.begin(), ranges.end());
      std::vector<CodepointRange> out;
      uint32_t next = 0;
      for (auto [lo, hi] : ranges) {
        if (lo > next) out.emplace_back(next, lo - 1);
        next = std::max(next, hi + 1);
      }
      if (next <= 0x10FFFF) out.emplace_back(next, 0x10FFFF);
      ranges = std::move(out);
    }
    if (ranges.empty()) {
      fail_at(open, "a character class matches no character");
      return b_.byte(0);
    }
    return b_.codepoints(ranges, "class");
  }

  std::string_view t_;
  size_t pos_ = 0;
  IrBuilder b_;
  Status error_;
  std::map<std::string, uint32_t> rules_;
  std::map<std::string, size_t> defined_;
  std::map<std::string, size_t> referenced_;  // first mention
};

}  // namespace

Result<Grammar> compile_gbnf(std::string_view text, const GrammarLimits& limits) {
  if (text.size() > limits.max_input_bytes) {
    return OutOfResources("GBNF: " + std::to_string(text.size()) + " bytes exceed the limit of " +
                          std::to_string(limits.max_input_bytes));
  }
  return GbnfParser(text, limits).run();
}

}  // namespace cellm
