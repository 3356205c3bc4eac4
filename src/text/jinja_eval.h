// The tree-walking interpreter: renders a parsed template (jinja_ast.h) with
// the given top-level variables, as jinja2 would.
//
// Scoping follows jinja2: each for-loop iteration and each macro call gets its
// own scope (so {% set %} inside them does not leak out; namespaces exist for
// that); if-blocks share their enclosing scope. Undefined names are Undefined
// values: printing them gives "", testing them is false, using them in
// arithmetic or as objects is an error.
// Errors are TemplateError with the line/column of the innermost expression or
// statement; RaisedError (raise_exception) passes through unchanged. Limits
// come from the Budget. Private to src/text.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "jinja_ast.h"
#include "jinja_limits.h"

namespace cellm::jinja {

std::string render_template(const Body& body,
                            const std::vector<std::pair<std::string, Value>>& variables,
                            Budget& budget);

}  // namespace cellm::jinja
