// Python str operations over UTF-8 for the Jinja interpreter: indexing and
// lengths in code points, strip/split/replace/splitlines with Python's
// whitespace, and case mapping. Case mapping covers ASCII only (Python maps all
// of Unicode). Invalid UTF-8 bytes count as one code point each. Private to src/text.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cellm::jinja {

// The code points of `s` as byte slices of it.
std::vector<std::string_view> code_points(std::string_view s);
size_t code_point_count(std::string_view s);
// Python's str.isspace() for one code point.
bool is_python_space(char32_t c);

enum class StripSide { kBoth, kLeft, kRight };
// str.strip / lstrip / rstrip; `chars` null: whitespace.
std::string strip(std::string_view s, const std::string* chars, StripSide side);
// str.split(sep, maxsplit); sep null: runs of whitespace. maxsplit < 0: no limit.
std::vector<std::string> split(std::string_view s, const std::string* sep, int64_t maxsplit);
std::vector<std::string> splitlines(std::string_view s);
// str.replace(old, new, count); count < 0: all.
std::string replace(std::string_view s, std::string_view old, std::string_view with, int64_t count);
std::string to_upper(std::string_view s);
std::string to_lower(std::string_view s);
// str.capitalize(): first upper, the rest lower.
std::string capitalize(std::string_view s);
// str.title(): a letter after a letter is lower, any other letter upper.
std::string python_title(std::string_view s);
// jinja2's title filter: each run between "-", whitespace, "(", "{", "[", "<"
// capitalized.
std::string jinja_title(std::string_view s);
// str.find(sub): the code point index, or -1.
int64_t find(std::string_view s, std::string_view sub);
bool is_lower(std::string_view s);
bool is_upper(std::string_view s);

}  // namespace cellm::jinja
