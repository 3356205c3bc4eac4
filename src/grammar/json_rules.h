// The building blocks of JSON grammars, made once per builder: bounded
// whitespace, strings (UTF-8 characters and escapes, optionally with a length
// range in characters), numbers, integers and any JSON value.
//
// Layout of generated JSON: a value is followed by `ws` wherever a separator may
// come, and every separator (`,` `:` and the opening bracket) is followed by `ws`,
// so each gap holds exactly one `ws`: at most kMaxJsonWhitespace bytes of space,
// tab, newline or carriage return, and the grammar stays unambiguous.
#pragma once

#include <optional>

#include "grammar/grammar_ir.h"

namespace cellm::grammar {

class JsonRules {
 public:
  explicit JsonRules(IrBuilder& b) : b_(b) {}

  Symbol ws();
  Symbol string();  // any JSON string
  // A string of [min_chars, max_chars] characters (max < 0: no bound); an escape
  // counts as one character (\u escapes outside the surrogates are one code point).
  Symbol string(int min_chars, int max_chars);
  Symbol integer();
  Symbol number();
  Symbol boolean();
  Symbol null();
  Symbol any_value();  // any JSON value (objects and arrays nest, recursively)
  Symbol any_object();
  // An array of `item`, [min_items, max_items] of them (max < 0: no bound).
  Symbol array_of(Symbol item, int min_items, int max_items, std::string_view name);
  // An object whose members are any string key -> `value`.
  Symbol map_of(Symbol value, std::string_view name);

 private:
  Symbol character();  // one string character: UTF-8 or an escape

  IrBuilder& b_;
  std::optional<Symbol> ws_, string_, char_, integer_, number_, boolean_, null_, value_, object_;
};

}  // namespace cellm::grammar
