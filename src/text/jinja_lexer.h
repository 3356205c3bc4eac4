// Jinja lexer: template source -> tokens, with jinja2's whitespace handling as
// transformers configures it (trim_blocks, lstrip_blocks, no trailing newline).
//
// Text between tags becomes kData tokens; each {{ }} / {% %} becomes a begin
// token, the expression tokens inside, and an end token; comments and their
// whitespace vanish; {% raw %}...{% endraw %} becomes kData verbatim.
// Whitespace control: "{%-"/"{{-"/"{#-" strip all whitespace before the tag,
// "-%}"/"-}}"/"-#}" all whitespace after; "{%+" keeps the indentation that
// lstrip_blocks would remove, "+%}" keeps the newline trim_blocks would remove.
// Private to src/text.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace cellm::jinja {

enum class TokenKind {
  kData,
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,
  kString,    // text: the unescaped value
  kInteger,   // text: the digits
  kFloat,     // text: the literal, underscores removed
  kOperator,  // text: the operator, e.g. "==", "(", "|"
  kEnd,       // end of the template
};

struct Token {
  TokenKind kind;
  std::string text;
  int line = 1;    // 1-based, of the token's first character
  int column = 1;  // 1-based, in bytes
};

// The tokens of `source`, ending with kEnd. Throws TemplateError (with the
// position) for an unclosed tag, comment or string, or an unexpected character.
std::vector<Token> tokenize(std::string_view source);

}  // namespace cellm::jinja
