// A compiled PCRE2 pattern (UTF, Unicode properties) and the patterns that
// tokenizer.json components use: {"Regex": ...} or {"String": ...} literals.
//
// Hugging Face compiles its regexes with Oniguruma; Regex::compile translates the
// few spots where PCRE2 differs (\s and \S mean Unicode White_Space there).
// Invalid UTF-8 in the subject never matches and never fails: such bytes fall
// between matches. Immutable after construction; safe to share between threads.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "cellm/status.h"

namespace cellm {

// A match at [begin, end) in bytes.
struct Match {
  size_t begin = 0;
  size_t end = 0;
};

class Regex {
 public:
  // `pattern` in Oniguruma syntax as tokenizer.json writes it.
  static Result<Regex> compile(const std::string& pattern);

  // All non-overlapping matches, left to right; an empty match advances one
  // character, and one right after the previous match is skipped.
  std::vector<Match> find_all(std::string_view subject) const;

 private:
  struct Code;
  std::shared_ptr<const Code> code_;
};

// {"String": s} (matches s literally) or {"Regex": r}.
class Pattern {
 public:
  static Result<Pattern> parse(const nlohmann::json& j);
  std::vector<Match> find_all(std::string_view subject) const;

 private:
  bool is_regex_ = false;
  std::string literal_;
  std::shared_ptr<const Regex> regex_;
};

}  // namespace cellm
