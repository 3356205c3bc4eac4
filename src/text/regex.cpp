#include "regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <optional>

#include <nlohmann/json.hpp>

#include "unicode.h"

namespace cellm {
namespace {

// Oniguruma's \s: the White_Space property (PCRE2's \s leaves out U+0085).
constexpr std::string_view kWhiteSpaceClassBody =
    "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

// Rewrites \s and \S into explicit White_Space classes.
Result<std::string> translate(const std::string& pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[i + 1];
      ++i;
      if (next == 's') {
        if (in_class) {
          out.append(kWhiteSpaceClassBody);
        } else {
          out.append("[").append(kWhiteSpaceClassBody).append("]");
        }
      } else if (next == 'S') {
        if (in_class) return NotSupported("\\S inside a character class: " + pattern);
        out.append("[^").append(kWhiteSpaceClassBody).append("]");
      } else {
        out.push_back(c);
        out.push_back(next);
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out.push_back(pattern[++i]);
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out.push_back(pattern[++i]);
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      const size_t close = pattern.find(":]", i + 2);
      if (close != std::string::npos) {
        out.append(pattern, i, close + 2 - i);
        i = close + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
  }
  return out;
}

}  // namespace

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

Result<Regex> Regex::compile(const std::string& pattern) {
  CELLM_ASSIGN_OR_RETURN(std::string translated, translate(pattern));
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(
      reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
      PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR buffer[256];
    pcre2_get_error_message(error_code, buffer, sizeof(buffer));
    return InvalidProgram("regex '" + pattern + "' does not compile at offset " +
                          std::to_string(error_offset) + ": " +
                          reinterpret_cast<const char*>(buffer));
  }
  // JIT is an optimization: without it matching is slower but identical.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  auto owned = std::make_shared<Code>();
  owned->code = code;
  Regex regex;
  regex.code_ = std::move(owned);
  return regex;
}

std::vector<Match> Regex::find_all(std::string_view subject) const {
  std::vector<Match> matches;
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> data(
      pcre2_match_data_create_from_pattern(code_->code, nullptr), &pcre2_match_data_free);
  CELLM_CHECK(data != nullptr);
  const auto* bytes = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t position = 0;
  std::optional<size_t> last_match_end;
  while (position <= subject.size()) {
    int rc = pcre2_match(code_->code, bytes, subject.size(), position, 0, data.get(), nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      rc = pcre2_match(code_->code, bytes, subject.size(), position, PCRE2_NO_JIT, data.get(),
                       nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    CELLM_CHECK_MSG(rc > 0, "pcre2_match failed with code " + std::to_string(rc));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
    const size_t begin = ovector[0];
    const size_t end = ovector[1];
    const size_t step =
        begin < subject.size() ? unicode::decode_utf8(subject, begin).size_bytes : size_t{1};
    if (begin == end) {
      if (last_match_end != end) {
        matches.push_back({begin, end});
        last_match_end = end;
      }
      position = end + step;
      continue;
    }
    matches.push_back({begin, end});
    last_match_end = end;
    position = end;
  }
  return matches;
}

Result<Pattern> Pattern::parse(const nlohmann::json& j) {
  Pattern p;
  if (j.is_object() && j.contains("String")) {
    p.literal_ = j.at("String").get<std::string>();
    return p;
  }
  if (j.is_object() && j.contains("Regex")) {
    CELLM_ASSIGN_OR_RETURN(Regex regex, Regex::compile(j.at("Regex").get<std::string>()));
    p.is_regex_ = true;
    p.regex_ = std::make_shared<const Regex>(std::move(regex));
    return p;
  }
  return InvalidProgram("a pattern must be {\"String\": ...} or {\"Regex\": ...}, not " + j.dump());
}

std::vector<Match> Pattern::find_all(std::string_view subject) const {
  if (is_regex_) return regex_->find_all(subject);
  std::vector<Match> matches;
  if (literal_.empty()) return matches;
  for (size_t at = subject.find(literal_); at != std::string_view::npos;
       at = subject.find(literal_, at + literal_.size())) {
    matches.push_back({at, at + literal_.size()});
  }
  return matches;
}

}  // namespace cellm
