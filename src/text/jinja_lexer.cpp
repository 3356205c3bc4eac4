#include "jinja_lexer.h"

#include <cctype>
#include <cstring>

#include "jinja_value.h"
#include "unicode.h"

namespace cellm::jinja {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_name_start(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_';
}
bool is_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

// "\r\n" and "\r" become "\n"; one trailing newline is dropped (jinja2's
// keep_trailing_newline=False).
std::string normalize_newlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// Python's unicode-escape decoding of a string literal's body.
std::string unescape(std::string_view body, int line, int column) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 == body.size()) {
      out += body[i];
      continue;
    }
    const char c = body[++i];
    const auto hex = [&](size_t digits) {
      uint32_t value = 0;
      for (size_t k = 1; k <= digits; ++k) {
        const char h = i + k < body.size() ? body[i + k] : 'g';
        if (!std::isxdigit(static_cast<unsigned char>(h))) {
          throw TemplateError("truncated \\" + std::string(1, c) + " escape in string", line,
                              column);
        }
        value = value * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h))
                                                       ? h - '0'
                                                       : std::tolower(h) - 'a' + 10);
      }
      i += digits;
      if (value > 0x10FFFF)
        throw TemplateError("illegal Unicode character in string", line, column);
      unicode::append_utf8(out, value);
    };
    switch (c) {
      case '\n':
        break;  // a line continuation
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'v':
        out += '\v';
        break;
      case 'x':
        hex(2);
        break;
      case 'u':
        hex(4);
        break;
      case 'U':
        hex(8);
        break;
      default:
        if (c >= '0' && c <= '7') {
          uint32_t value = static_cast<uint32_t>(c - '0');
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7';
               ++k) {
            value = value * 8 + static_cast<uint32_t>(body[++i] - '0');
          }
          unicode::append_utf8(out, value);
        } else {
          out += '\\';
          out += c;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) : src_(normalize_newlines(source)) {}

  std::vector<Token> run() {
    bool line_starting = true;  // whether the text to come begins a line
    while (pos_ < src_.size()) {
      const size_t tag = find_tag(pos_);
      std::string data = src_.substr(pos_, tag - pos_);
      if (tag == src_.size()) {
        emit_data(std::move(data));
        advance_to(tag);
        break;
      }
      const char kind = src_[tag + 1];  // '{', '%' or '#'
      const char control = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (control == '-') {
        while (!data.empty() && is_space(data.back())) data.pop_back();
      } else if (control != '+' && kind != '{') {
        const size_t newline = data.rfind('\n');
        const size_t line_begin = newline == std::string::npos ? 0 : newline + 1;
        if ((line_begin > 0 || line_starting) &&
            data.find_first_not_of(" \t", line_begin) == std::string::npos) {
          data.resize(line_begin);
        }
      }
      emit_data(std::move(data));
      advance_to(tag);
      const size_t tag_start = pos_;
      if (kind == '#') {
        lex_comment();
      } else if (kind == '{' || !try_raw()) {
        lex_tag(kind);
      }
      line_starting = pos_ > tag_start && src_[pos_ - 1] == '\n';
    }
    tokens_.push_back(Token{TokenKind::kEnd, "", line_, column_});
    return std::move(tokens_);
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return src_.size();
  }

  void advance_to(size_t target) {
    for (; pos_ < target; ++pos_) {
      if (src_[pos_] == '\n') {
        ++line_;
        column_ = 1;
      } else {
        ++column_;
      }
    }
  }

  // Data at the current position (before advancing past it).
  void emit_data(std::string data) {
    if (data.empty()) return;
    tokens_.push_back(Token{TokenKind::kData, std::move(data), line_, column_});
  }

  [[noreturn]] void fail(const std::string& message) const {
    throw TemplateError(message, line_, column_);
  }

  // After a tag's closing delimiter: "-" stripped all whitespace; otherwise a
  // block or comment drops one newline (trim_blocks) unless it ended in "+".
  void after_tag_end(bool strip, bool keep_newline, bool is_variable) {
    if (strip) {
      size_t end = pos_;
      while (end < src_.size() && is_space(src_[end])) ++end;
      advance_to(end);
    } else if (!is_variable && !keep_newline && pos_ < src_.size() && src_[pos_] == '\n') {
      advance_to(pos_ + 1);
    }
  }

  void lex_comment() {
    const int line = line_, column = column_;
    const size_t end = src_.find("#}", pos_ + 2);
    if (end == std::string::npos) throw TemplateError("missing end of comment tag", line, column);
    const bool strip = end > pos_ + 2 && src_[end - 1] == '-';
    const bool keep = end > pos_ + 2 && src_[end - 1] == '+';
    advance_to(end + 2);
    after_tag_end(strip, keep, false);
  }

  // {% raw %}...{% endraw %}: the body is data, verbatim.
  bool try_raw() {
    size_t p = pos_ + 2;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0 || (p + 3 < src_.size() && is_name_char(src_[p + 3]))) {
      return false;
    }
    p += 3;
    while (p < src_.size() && is_space(src_[p])) ++p;
    bool strip_after_open = false;
    if (p < src_.size() && src_[p] == '-') {
      strip_after_open = true;
      ++p;
    }
    if (src_.compare(p, 2, "%}") != 0) fail("expected '%}' after 'raw'");
    const int line = line_, column = column_;
    advance_to(p + 2);
    after_tag_end(strip_after_open, false, false);
    // Find "{%[-+]? *endraw *-?%}".
    for (size_t at = src_.find("{%", pos_); at != std::string::npos; at = src_.find("{%", at + 2)) {
      size_t q = at + 2;
      const bool strip_before = q < src_.size() && src_[q] == '-';
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) ++q;
      while (q < src_.size() && is_space(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < src_.size() && is_space(src_[q])) ++q;
      bool strip_after = false;
      if (q < src_.size() && src_[q] == '-') {
        strip_after = true;
        ++q;
      }
      if (src_.compare(q, 2, "%}") != 0) continue;
      std::string body = src_.substr(pos_, at - pos_);
      if (strip_before) {
        while (!body.empty() && is_space(body.back())) body.pop_back();
      } else {
        const size_t newline = body.rfind('\n');
        const size_t line_begin = newline == std::string::npos ? body.size() : newline + 1;
        if (line_begin < body.size() &&
            body.find_first_not_of(" \t", line_begin) == std::string::npos) {
          body.resize(line_begin);
        }
      }
      emit_data(std::move(body));
      advance_to(q + 2);
      after_tag_end(strip_after, false, false);
      return true;
    }
    throw TemplateError("missing {% endraw %} for {% raw %}", line, column);
  }

  void lex_tag(char kind) {
    const bool is_variable = kind == '{';
    const int open_line = line_, open_column = column_;
    tokens_.push_back(Token{is_variable ? TokenKind::kVariableBegin : TokenKind::kBlockBegin,
                            is_variable ? "{{" : "{%", line_, column_});
    size_t p = pos_ + 2;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
    advance_to(p);
    const char close = is_variable ? '}' : '%';
    std::string brackets;  // open brackets, innermost last: "}}" closes a dict first
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) advance_to(pos_ + 1);
      if (pos_ >= src_.size()) {
        throw TemplateError(std::string("unexpected end of template: missing '") + close + "}'",
                            open_line, open_column);
      }
      const char c = src_[pos_];
      if (brackets.empty() || brackets.back() != '{') {
        const std::string end_delimiter = std::string(1, close) + "}";
        const bool strip = c == '-' && src_.compare(pos_ + 1, 2, end_delimiter) == 0;
        const bool keep = !is_variable && c == '+' && src_.compare(pos_ + 1, 2, "%}") == 0;
        if (strip || keep || src_.compare(pos_, 2, end_delimiter) == 0) {
          tokens_.push_back(Token{is_variable ? TokenKind::kVariableEnd : TokenKind::kBlockEnd,
                                  is_variable ? "}}" : "%}", line_, column_});
          advance_to(pos_ + (strip || keep ? 3 : 2));
          after_tag_end(strip, keep, is_variable);
          return;
        }
      }
      if (is_name_start(c)) {
        size_t end = pos_;
        while (end < src_.size() && is_name_char(src_[end])) ++end;
        push(TokenKind::kName, src_.substr(pos_, end - pos_), end);
      } else if (is_digit(c)) {
        lex_number();
      } else if (c == '\'' || c == '"') {
        lex_string(c);
      } else {
        static const char* const kOperators[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                                 "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                                 "]",  "{",  "}",  ",",  ".",  ":",  "|"};
        const char* match = nullptr;
        for (const char* op : kOperators) {
          if (src_.compare(pos_, std::strlen(op), op) == 0) {
            match = op;
            break;
          }
        }
        if (match == nullptr) fail(std::string("unexpected character '") + c + "'");
        const std::string op = match;
        if (op == "(" || op == "[" || op == "{") brackets += op;
        if (op == ")" || op == "]" || op == "}") {
          if (brackets.empty()) fail("unexpected '" + op + "'");
          brackets.pop_back();
        }
        push(TokenKind::kOperator, op, pos_ + op.size());
      }
    }
  }

  void push(TokenKind kind, std::string text, size_t end) {
    tokens_.push_back(Token{kind, std::move(text), line_, column_});
    advance_to(end);
  }

  void lex_number() {
    size_t p = pos_;
    std::string digits;
    const auto run = [&] {
      while (p < src_.size() && (is_digit(src_[p]) || (src_[p] == '_' && p + 1 < src_.size() &&
                                                       is_digit(src_[p + 1])))) {
        if (src_[p] != '_') digits += src_[p];
        ++p;
      }
    };
    run();
    bool is_float = false;
    if (p + 1 < src_.size() && src_[p] == '.' && is_digit(src_[p + 1])) {
      is_float = true;
      digits += src_[p++];
      run();
    }
    if (p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
      size_t q = p + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && is_digit(src_[q])) {
        is_float = true;
        digits += 'e';
        digits.append(src_, p + 1, q - p - 1);
        p = q;
        run();
      }
    }
    push(is_float ? TokenKind::kFloat : TokenKind::kInteger, digits, p);
  }

  void lex_string(char quote) {
    size_t p = pos_ + 1;
    while (p < src_.size() && src_[p] != quote) {
      if (src_[p] == '\\') ++p;
      ++p;
    }
    if (p >= src_.size()) fail("unterminated string");
    const std::string value =
        unescape(std::string_view(src_).substr(pos_ + 1, p - pos_ - 1), line_, column_);
    push(TokenKind::kString, value, p + 1);
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  int column_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source) {
  return Lexer(source).run();
}

}  // namespace cellm::jinja
