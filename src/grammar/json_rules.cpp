#include "grammar/json_rules.h"

namespace cellm::grammar {

namespace {
ByteSet range_set(uint8_t lo, uint8_t hi) {
  ByteSet s;
  s.set_range(lo, hi);
  return s;
}
}  // namespace

Symbol JsonRules::ws() {
  if (!ws_) {
    ByteSet space;
    for (char c : {' ', '\t', '\n', '\r'}) space.set(static_cast<uint8_t>(c));
    ws_ = b_.repeat({b_.bytes(space)}, 0, kMaxJsonWhitespace, "ws");
  }
  return *ws_;
}

Symbol JsonRules::character() {
  if (!char_) {
    // Unescaped: any code point from U+0020 but '"' and '\'.
    const Symbol plain = b_.codepoints({{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x10FFFF}}, "char");
    ByteSet simple;
    for (char c : {'"', '\\', '/', 'b', 'f', 'n', 'r', 't'}) simple.set(static_cast<uint8_t>(c));
    ByteSet hex = range_set('0', '9');
    hex.set_range('a', 'f');
    hex.set_range('A', 'F');
    // \uXXXX outside D800-DFFF: a first digit other than d/D, or d/D then 0-7.
    ByteSet not_d = range_set('0', '9');
    not_d.set_range('a', 'c'), not_d.set_range('e', 'f');
    not_d.set_range('A', 'C'), not_d.set_range('E', 'F');
    ByteSet d;
    d.set('d'), d.set('D');
    const Symbol h = b_.bytes(hex);
    const Symbol u4 = b_.rule_of(
        "unicode-escape",
        {{b_.bytes(not_d), h, h, h}, {b_.bytes(d), b_.bytes(range_set('0', '7')), h, h}});
    const Symbol escape = b_.rule_of("escape", {{b_.bytes(simple)}, {b_.byte('u'), u4}});
    char_ = b_.rule_of("char", {{plain}, {b_.byte('\\'), escape}});
  }
  return *char_;
}

Symbol JsonRules::string() {
  if (!string_) string_ = string(0, -1);
  return *string_;
}

Symbol JsonRules::string(int min_chars, int max_chars) {
  const Symbol quote = b_.byte('"');
  const Symbol body = b_.repeat({character()}, min_chars, max_chars, "string-body");
  return b_.rule_of("string", {{quote, body, quote}});
}

Symbol JsonRules::integer() {
  if (!integer_) {
    const Symbol digits = b_.repeat({b_.bytes(range_set('0', '9'))}, 0, -1, "digits");
    const Symbol natural =
        b_.rule_of("natural", {{b_.byte('0')}, {b_.bytes(range_set('1', '9')), digits}});
    const Symbol minus = b_.optional({b_.byte('-')}, "minus");
    integer_ = b_.rule_of("integer", {{minus, natural}});
  }
  return *integer_;
}

Symbol JsonRules::number() {
  if (!number_) {
    const Symbol digit = b_.bytes(range_set('0', '9'));
    const Symbol digits1 = b_.repeat({digit}, 1, -1, "digits1");
    const Symbol fraction = b_.optional({b_.byte('.'), digits1}, "fraction");
    ByteSet e;
    e.set('e'), e.set('E');
    ByteSet sign;
    sign.set('+'), sign.set('-');
    const Symbol exponent =
        b_.optional({b_.bytes(e), b_.optional({b_.bytes(sign)}, "sign"), digits1}, "exponent");
    number_ = b_.rule_of("number", {{integer(), fraction, exponent}});
  }
  return *number_;
}

Symbol JsonRules::boolean() {
  if (!boolean_) boolean_ = b_.rule_of("boolean", {b_.literal("true"), b_.literal("false")});
  return *boolean_;
}

Symbol JsonRules::null() {
  if (!null_) null_ = b_.rule_of("null", {b_.literal("null")});
  return *null_;
}

Symbol JsonRules::array_of(Symbol item, int min_items, int max_items, std::string_view name) {
  const Symbol open = b_.byte('['), close = b_.byte(']'), comma = b_.byte(',');
  std::vector<Sequence> alts;
  if (min_items == 0) alts.push_back({open, ws(), close});
  if (max_items != 0) {
    const int more_min = std::max(min_items - 1, 0);
    const int more_max = max_items < 0 ? -1 : max_items - 1;
    const Symbol more =
        b_.repeat({comma, ws(), item, ws()}, more_min, more_max, std::string(name) + "-more");
    alts.push_back({open, ws(), item, ws(), more, close});
  }
  return b_.rule_of(name, std::move(alts));
}

Symbol JsonRules::map_of(Symbol value, std::string_view name) {
  const Symbol open = b_.byte('{'), close = b_.byte('}'), comma = b_.byte(',');
  const Symbol member = b_.rule_of(std::string(name) + "-member",
                                   {{string(), ws(), b_.byte(':'), ws(), value, ws()}});
  const Symbol more = b_.repeat({comma, ws(), member}, 0, -1, std::string(name) + "-more");
  return b_.rule_of(name, {{open, ws(), close}, {open, ws(), member, more, close}});
}

Symbol JsonRules::any_value() {
  if (!value_) {
    const uint32_t value = b_.add_rule("value");
    value_ = Symbol{true, value};
    object_ = map_of(*value_, "object");
    const Symbol array = array_of(*value_, 0, -1, "array");
    for (Symbol s : {*object_, array, string(), number(), boolean(), null()}) {
      b_.add_alternative(value, {s});
    }
  }
  return *value_;
}

Symbol JsonRules::any_object() {
  any_value();
  return *object_;
}

}  // namespace cellm::grammar
