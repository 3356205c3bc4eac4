#include "jinja_text.h"

#include <algorithm>

#include "unicode.h"

namespace cellm::jinja {
namespace {

char32_t code_point_of(std::string_view cp) {
  const unicode::Utf8Unit u = unicode::decode_utf8(cp, 0);
  return u.valid ? u.code_point : static_cast<char32_t>(0xDC00 + static_cast<uint8_t>(cp[0]));
}

bool is_ascii_upper(char c) {
  return c >= 'A' && c <= 'Z';
}
bool is_ascii_lower(char c) {
  return c >= 'a' && c <= 'z';
}
char upper(char c) {
  return is_ascii_lower(c) ? static_cast<char>(c - 'a' + 'A') : c;
}
char lower(char c) {
  return is_ascii_upper(c) ? static_cast<char>(c - 'A' + 'a') : c;
}

}  // namespace

std::vector<std::string_view> code_points(std::string_view s) {
  std::vector<std::string_view> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const unicode::Utf8Unit u = unicode::decode_utf8(s, i);
    const size_t n = u.valid ? u.size_bytes : 1;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

size_t code_point_count(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++n) {
    const unicode::Utf8Unit u = unicode::decode_utf8(s, i);
    i += u.valid ? u.size_bytes : 1;
  }
  return n;
}

bool is_python_space(char32_t c) {
  return unicode::is_whitespace(c) || (c >= 0x1C && c <= 0x1F);
}

std::string strip(std::string_view s, const std::string* chars, StripSide side) {
  const std::vector<std::string_view> cps = code_points(s);
  std::vector<std::string_view> set;
  if (chars != nullptr) set = code_points(*chars);
  const auto strippable = [&](std::string_view cp) {
    if (chars == nullptr) return is_python_space(code_point_of(cp));
    return std::find(set.begin(), set.end(), cp) != set.end();
  };
  size_t begin = 0, end = cps.size();
  if (side != StripSide::kRight) {
    while (begin < end && strippable(cps[begin])) ++begin;
  }
  if (side != StripSide::kLeft) {
    while (end > begin && strippable(cps[end - 1])) --end;
  }
  if (begin == end) return "";
  const size_t from = static_cast<size_t>(cps[begin].data() - s.data());
  const size_t to = static_cast<size_t>(cps[end - 1].data() - s.data()) + cps[end - 1].size();
  return std::string(s.substr(from, to - from));
}

std::vector<std::string> split(std::string_view s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep != nullptr) {
    size_t start = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      const size_t at = s.find(*sep, start);
      if (at == std::string_view::npos) break;
      out.emplace_back(s.substr(start, at - start));
      start = at + sep->size();
    }
    out.emplace_back(s.substr(start));
    return out;
  }
  const std::vector<std::string_view> cps = code_points(s);
  size_t i = 0;
  const auto space = [&](size_t k) { return is_python_space(code_point_of(cps[k])); };
  while (true) {
    while (i < cps.size() && space(i)) ++i;
    if (i == cps.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      // The rest, with trailing whitespace stripped.
      const size_t from = static_cast<size_t>(cps[i].data() - s.data());
      out.push_back(strip(s.substr(from), nullptr, StripSide::kRight));
      break;
    }
    const size_t begin = i;
    while (i < cps.size() && !space(i)) ++i;
    const size_t from = static_cast<size_t>(cps[begin].data() - s.data());
    const size_t to = static_cast<size_t>(cps[i - 1].data() - s.data()) + cps[i - 1].size();
    out.emplace_back(s.substr(from, to - from));
  }
  return out;
}

std::vector<std::string> splitlines(std::string_view s) {
  std::vector<std::string> out;
  std::string line;
  const std::vector<std::string_view> cps = code_points(s);
  for (size_t i = 0; i < cps.size(); ++i) {
    const char32_t c = code_point_of(cps[i]);
    const bool breaks = c == '\n' || c == '\r' || c == '\v' || c == '\f' || c == 0x1C ||
                        c == 0x1D || c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!breaks) {
      line += cps[i];
      continue;
    }
    if (c == '\r' && i + 1 < cps.size() && cps[i + 1] == "\n") ++i;
    out.push_back(std::move(line));
    line.clear();
  }
  if (!line.empty()) out.push_back(std::move(line));
  return out;
}

std::string replace(std::string_view s, std::string_view old, std::string_view with,
                    int64_t count) {
  std::string out;
  if (old.empty()) {
    const std::vector<std::string_view> cps = code_points(s);
    int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += with;
        ++done;
      }
      if (i < cps.size()) out += cps[i];
    }
    return out;
  }
  size_t start = 0;
  for (int64_t done = 0; count < 0 || done < count; ++done) {
    const size_t at = s.find(old, start);
    if (at == std::string_view::npos) break;
    out += s.substr(start, at - start);
    out += with;
    start = at + old.size();
  }
  out += s.substr(start);
  return out;
}

std::string to_upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = upper(c);
  return out;
}

std::string to_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = lower(c);
  return out;
}

std::string capitalize(std::string_view s) {
  std::string out = to_lower(s);
  if (!out.empty()) out[0] = upper(out[0]);
  return out;
}

std::string python_title(std::string_view s) {
  std::string out(s);
  bool previous_cased = false;
  for (char& c : out) {
    const bool cased = is_ascii_upper(c) || is_ascii_lower(c);
    if (cased) c = previous_cased ? lower(c) : upper(c);
    previous_cased = cased;
  }
  return out;
}

std::string jinja_title(std::string_view s) {
  std::string out(s);
  bool word_start = true;
  for (char& c : out) {
    const bool delimiter = c == '-' || c == ' ' || c == '\t' || c == '\n' || c == '\r' ||
                           c == '\f' || c == '\v' || c == '(' || c == '{' || c == '[' || c == '<';
    if (delimiter) {
      word_start = true;
      continue;
    }
    c = word_start ? upper(c) : lower(c);
    word_start = false;
  }
  return out;
}

int64_t find(std::string_view s, std::string_view sub) {
  const size_t at = s.find(sub);
  if (at == std::string_view::npos) return -1;
  return static_cast<int64_t>(code_point_count(s.substr(0, at)));
}

bool is_lower(std::string_view s) {
  bool cased = false;
  for (char c : s) {
    if (is_ascii_upper(c)) return false;
    cased = cased || is_ascii_lower(c);
  }
  return cased;
}

bool is_upper(std::string_view s) {
  bool cased = false;
  for (char c : s) {
    if (is_ascii_lower(c)) return false;
    cased = cased || is_ascii_upper(c);
  }
  return cased;
}

}  // namespace cellm::jinja
