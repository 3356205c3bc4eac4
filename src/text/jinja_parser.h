// Jinja parser: tokens -> syntax tree, for the subset of Jinja that chat
// templates use.
//
// Statements: if/elif/else, for (tuple targets, "if" filter, else, loop.*),
// break/continue, set (name, tuple, ns.attr, and {% set x %}...{% endset %}),
// macro (positional/keyword parameters with defaults), raw, generation.
// Expressions: literals (str with Python escapes, int, float, true/false/none
// in either case, list, tuple, dict), names, .attr, [index], [a:b:c], calls
// with keyword arguments, filters, tests (is / is not), unary - + not, ** * / //
// % + - ~, chained comparisons, in / not in, and, or, "a if c else b".
// Not supported (a parse error names them): call blocks, filter blocks, with,
// include/import/extends, recursive loops, *args/**kwargs.
//
// Filter and test names are checked here, so an unknown one fails at parse
// time as in jinja2. Nesting is bounded by Limits. Private to src/text.
#pragma once

#include <string_view>

#include "jinja_ast.h"
#include "jinja_limits.h"

namespace cellm::jinja {

// Throws TemplateError with the line and column of the problem.
Body parse_template(std::string_view source, const Limits& limits);

}  // namespace cellm::jinja
