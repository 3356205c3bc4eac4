// The syntax tree of a parsed Jinja template: expressions and statements, each
// with the position it came from. Built by jinja_parser.cpp, walked by
// jinja_eval.cpp; immutable after parsing. Private to src/text.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja_value.h"

namespace cellm::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Expr {
  enum class Kind {
    kLiteral,      // value
    kName,         // name
    kList,         // children: the items
    kTuple,        // children: the items
    kDict,         // children: key0, value0, key1, value1, ...
    kGetAttr,      // children[0].name
    kGetItem,      // children[0][children[1]]
    kSlice,        // children[0][children[1]:children[2]:children[3]] (each may be null)
    kCall,         // children[0](children[1..], keyword)
    kFilter,       // children[0] | name(children[1..], keyword)
    kTest,         // children[0] is [not] name(children[1..]); negated
    kUnary,        // name ("-", "+", "not") children[0]
    kBinary,       // children[0] name children[1]: arithmetic and "~"
    kCompare,      // children[0] ops[0] children[1] ops[1] ...: ==, <, in, not in, ...
    kAnd,          // children[0] and children[1]
    kOr,           // children[0] or children[1]
    kConditional,  // children[0] if children[1] else children[2] (null: undefined)
  };
  Kind kind;
  int line = 0;
  int column = 0;
  Value value;
  std::string name;
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
  std::vector<std::string> ops;  // kCompare
  bool negated = false;
  int depth = 1;  // height of this subtree
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null: required
};

struct Stmt {
  enum class Kind {
    kText,   // text
    kPrint,  // {{ expr }}
    kIf,     // conditions[i] -> bodies[i]; bodies.back() is the else when longer
    kFor,    // for targets in expr [if condition]: bodies[0], else bodies[1]
    kSet,    // targets (or target.attribute) = expr, or the rendered bodies[0]
    kMacro,  // {% macro name(params) %} bodies[0]
    kBreak,
    kContinue,
    kScope,  // bodies[0] rendered in place ({% generation %})
  };
  Kind kind;
  int line = 0;
  int column = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;
  std::vector<ExprPtr> conditions;
  std::vector<Body> bodies;
  std::vector<std::string> targets;
  std::string attribute;  // kSet: "ns.attr" targets "ns" (targets[0]) and "attr"
  std::string name;       // kMacro
  std::vector<MacroParam> params;
};

}  // namespace cellm::jinja
