#include "jinja_parser.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <initializer_list>

#include "jinja_builtins.h"
#include "jinja_lexer.h"

namespace cellm::jinja {
namespace {

class Parser {
 public:
  Parser(std::vector<Token> tokens, const Limits& limits)
      : tokens_(std::move(tokens)), limits_(limits) {}

  Body parse() {
    Body body = parse_body({});
    if (current().kind != TokenKind::kEnd) fail("unexpected '" + current().text + "'");
    return body;
  }

 private:
  // --- token stream --------------------------------------------------------

  const Token& current() const { return tokens_[pos_]; }
  const Token& peek(size_t ahead = 1) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  const Token& next() {
    const Token& t = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return t;
  }
  bool is_op(std::string_view op) const {
    return current().kind == TokenKind::kOperator && current().text == op;
  }
  bool is_name(std::string_view name) const {
    return current().kind == TokenKind::kName && current().text == name;
  }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }
  [[noreturn]] void fail(const std::string& message) const { fail_at(current(), message); }
  [[noreturn]] static void fail_at(const Token& at, const std::string& message) {
    throw TemplateError(message, at.line, at.column);
  }
  static std::string describe(const Token& t) {
    switch (t.kind) {
      case TokenKind::kEnd:
        return "end of template";
      case TokenKind::kBlockEnd:
        return "end of statement block";
      case TokenKind::kVariableEnd:
        return "end of print statement";
      case TokenKind::kData:
        return "template data";
      default:
        return "'" + t.text + "'";
    }
  }
  void expect_op(std::string_view op) {
    if (!skip_op(op)) fail("expected '" + std::string(op) + "', got " + describe(current()));
  }
  std::string expect_name() {
    if (current().kind != TokenKind::kName) fail("expected a name, got " + describe(current()));
    return next().text;
  }
  void expect_block_end() {
    if (current().kind != TokenKind::kBlockEnd) {
      fail("expected end of statement block, got " + describe(current()));
    }
    next();
  }

  // --- statements ----------------------------------------------------------

  struct NestingGuard {
    NestingGuard(Parser& p) : parser(p) {
      if (++parser.nesting_ > parser.limits_.max_nesting) {
        parser.fail("blocks nested deeper than " + std::to_string(parser.limits_.max_nesting));
      }
    }
    ~NestingGuard() { --parser.nesting_; }
    Parser& parser;
  };

  // Statements up to a {% name %} with name in `ends` (left unconsumed), or the
  // end of the template when `ends` is empty.
  Body parse_body(std::initializer_list<std::string_view> ends) {
    NestingGuard guard(*this);
    Body body;
    while (true) {
      const Token& t = current();
      switch (t.kind) {
        case TokenKind::kEnd:
          if (ends.size() != 0) {
            std::string expected;
            for (std::string_view e : ends) {
              expected += (expected.empty() ? "'" : ", '") + std::string(e) + "'";
            }
            fail("unexpected end of template; expected " + expected);
          }
          return body;
        case TokenKind::kData: {
          auto s = stmt(Stmt::Kind::kText, t);
          s->text = t.text;
          body.push_back(std::move(s));
          next();
          break;
        }
        case TokenKind::kVariableBegin: {
          auto s = stmt(Stmt::Kind::kPrint, t);
          next();
          s->expr = parse_tuple_expression();
          if (current().kind != TokenKind::kVariableEnd) {
            fail("expected end of print statement, got " + describe(current()));
          }
          next();
          body.push_back(std::move(s));
          break;
        }
        case TokenKind::kBlockBegin: {
          const Token& keyword = peek();
          if (keyword.kind == TokenKind::kName &&
              std::find(ends.begin(), ends.end(), keyword.text) != ends.end()) {
            return body;
          }
          next();
          body.push_back(parse_statement(t));
          break;
        }
        default:
          fail("unexpected " + describe(t));
      }
    }
  }

  static StmtPtr stmt(Stmt::Kind kind, const Token& at) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = at.line;
    s->column = at.column;
    return s;
  }

  // Consumes "{% name" (when at it) and the block end: the closing tag of a block.
  void end_tag(std::string_view name) {
    next();  // {%
    if (!skip_name(name)) fail("expected '" + std::string(name) + "'");
    expect_block_end();
  }
  // At "{% name ...": consumes "{% name", leaving what follows.
  std::string open_tag() {
    next();  // {%
    return next().text;
  }

  StmtPtr parse_statement(const Token& begin) {
    if (current().kind != TokenKind::kName)
      fail("expected a statement name, got " + describe(current()));
    const Token& keyword = next();
    const std::string& k = keyword.text;
    if (k == "if") return parse_if(begin);
    if (k == "for") return parse_for(begin);
    if (k == "set") return parse_set(begin);
    if (k == "macro") return parse_macro(begin);
    if (k == "break" || k == "continue") {
      if (loop_depth_ == 0) fail_at(keyword, "'" + k + "' outside of a loop");
      expect_block_end();
      return stmt(k == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue, begin);
    }
    if (k == "generation") {
      expect_block_end();
      auto s = stmt(Stmt::Kind::kScope, begin);
      s->bodies.push_back(parse_body({"endgeneration"}));
      end_tag("endgeneration");
      return s;
    }
    if (k == "call" || k == "filter" || k == "with" || k == "include" || k == "import" ||
        k == "from" || k == "extends" || k == "block" || k == "autoescape" || k == "do") {
      fail_at(keyword, "the '" + k + "' tag is not supported");
    }
    if (k.starts_with("end") || k == "elif" || k == "else") {
      fail_at(keyword, "unexpected '" + k + "'");
    }
    fail_at(keyword, "unknown tag '" + k + "'");
  }

  StmtPtr parse_if(const Token& begin) {
    auto s = stmt(Stmt::Kind::kIf, begin);
    s->conditions.push_back(parse_tuple_expression());
    expect_block_end();
    while (true) {
      s->bodies.push_back(parse_body({"elif", "else", "endif"}));
      const std::string tag = open_tag();
      if (tag == "elif") {
        s->conditions.push_back(parse_tuple_expression());
        expect_block_end();
      } else if (tag == "else") {
        expect_block_end();
        s->bodies.push_back(parse_body({"endif"}));
        end_tag("endif");
        return s;
      } else {
        expect_block_end();
        return s;
      }
    }
  }

  StmtPtr parse_for(const Token& begin) {
    auto s = stmt(Stmt::Kind::kFor, begin);
    const bool parenthesized = skip_op("(");
    do {
      s->targets.push_back(expect_name());
    } while (skip_op(","));
    if (parenthesized) expect_op(")");
    if (!skip_name("in")) fail("expected 'in', got " + describe(current()));
    s->expr = parse_tuple_expression(/*with_conditional=*/false);
    if (skip_name("if")) s->condition = parse_expression();
    if (is_name("recursive")) fail("recursive loops are not supported");
    expect_block_end();
    ++loop_depth_;
    s->bodies.push_back(parse_body({"else", "endfor"}));
    --loop_depth_;
    if (open_tag() == "else") {
      expect_block_end();
      s->bodies.push_back(parse_body({"endfor"}));
      end_tag("endfor");
    } else {
      expect_block_end();
    }
    return s;
  }

  StmtPtr parse_set(const Token& begin) {
    auto s = stmt(Stmt::Kind::kSet, begin);
    s->targets.push_back(expect_name());
    if (skip_op(".")) {
      s->attribute = expect_name();
    } else {
      while (skip_op(",")) s->targets.push_back(expect_name());
    }
    if (skip_op("=")) {
      s->expr = parse_tuple_expression();
      expect_block_end();
      return s;
    }
    if (s->targets.size() != 1 || !s->attribute.empty()) fail("expected '='");
    if (is_op("|")) fail("filtered {% set %} blocks are not supported");
    expect_block_end();
    s->bodies.push_back(parse_body({"endset"}));
    end_tag("endset");
    return s;
  }

  StmtPtr parse_macro(const Token& begin) {
    auto s = stmt(Stmt::Kind::kMacro, begin);
    s->name = expect_name();
    expect_op("(");
    while (!skip_op(")")) {
      if (!s->params.empty()) expect_op(",");
      if (skip_op(")")) break;
      MacroParam param;
      param.name = expect_name();
      if (skip_op("=")) {
        param.default_value = parse_expression();
      } else if (!s->params.empty() && s->params.back().default_value) {
        fail("non-default argument follows default argument");
      }
      s->params.push_back(std::move(param));
    }
    expect_block_end();
    const int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;
    s->bodies.push_back(parse_body({"endmacro"}));
    loop_depth_ = saved_loop_depth;
    next();  // {%
    next();  // endmacro
    if (current().kind == TokenKind::kName) next();
    expect_block_end();
    return s;
  }

  // --- expressions ---------------------------------------------------------

  ExprPtr node(Expr::Kind kind, const Token& at) const {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = at.line;
    e->column = at.column;
    return e;
  }
  ExprPtr node(Expr::Kind kind, const Expr& at) const {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = at.line;
    e->column = at.column;
    return e;
  }
  // Records a finished node's height; too tall a tree is an error.
  ExprPtr done(ExprPtr e) const {
    int height = 0;
    for (const auto& c : e->children) {
      if (c) height = std::max(height, c->depth);
    }
    for (const auto& [name, c] : e->keyword) height = std::max(height, c->depth);
    e->depth = height + 1;
    if (e->depth > limits_.max_expression_depth) {
      throw TemplateError(
          "expression nested deeper than " + std::to_string(limits_.max_expression_depth), e->line,
          e->column);
    }
    return e;
  }
  ExprPtr binary(Expr::Kind kind, std::string op, ExprPtr left, ExprPtr right) const {
    auto e = node(kind, *left);
    e->name = std::move(op);
    e->children.push_back(std::move(left));
    e->children.push_back(std::move(right));
    return done(std::move(e));
  }

  // An expression, or a tuple of them without parentheses ("a, b").
  ExprPtr parse_tuple_expression(bool with_conditional = true) {
    const Token& start = current();
    ExprPtr first = with_conditional ? parse_expression() : parse_or();
    if (!is_op(",")) return first;
    auto tuple = node(Expr::Kind::kTuple, start);
    tuple->children.push_back(std::move(first));
    while (skip_op(",")) {
      if (current().kind == TokenKind::kBlockEnd || current().kind == TokenKind::kVariableEnd) {
        break;
      }
      tuple->children.push_back(with_conditional ? parse_expression() : parse_or());
    }
    return done(std::move(tuple));
  }

  // Bounds the parser's own recursion (parentheses, "not not", "- -").
  struct RecursionGuard {
    RecursionGuard(Parser& p) : parser(p) {
      if (++parser.recursion_ > parser.limits_.max_expression_depth) {
        parser.fail("expression nested deeper than " +
                    std::to_string(parser.limits_.max_expression_depth));
      }
    }
    ~RecursionGuard() { --parser.recursion_; }
    Parser& parser;
  };

  ExprPtr parse_expression() {
    RecursionGuard guard(*this);
    ExprPtr e = parse_or();
    while (skip_name("if")) {
      auto c = node(Expr::Kind::kConditional, *e);
      ExprPtr condition = parse_or();
      ExprPtr otherwise = skip_name("else") ? parse_expression() : nullptr;
      c->children.push_back(std::move(e));
      c->children.push_back(std::move(condition));
      c->children.push_back(std::move(otherwise));
      e = done(std::move(c));
    }
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (skip_name("or")) e = binary(Expr::Kind::kOr, "or", std::move(e), parse_and());
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (skip_name("and")) e = binary(Expr::Kind::kAnd, "and", std::move(e), parse_not());
    return e;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      RecursionGuard guard(*this);
      auto e = node(Expr::Kind::kUnary, next());
      e->name = "not";
      e->children.push_back(parse_not());
      return done(std::move(e));
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    ExprPtr first = parse_math1();
    ExprPtr compare;
    while (true) {
      std::string op;
      if (current().kind == TokenKind::kOperator &&
          (is_op("==") || is_op("!=") || is_op("<") || is_op("<=") || is_op(">") || is_op(">="))) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && peek().kind == TokenKind::kName && peek().text == "in") {
        next();
        next();
        op = "not in";
      } else {
        break;
      }
      if (!compare) {
        compare = node(Expr::Kind::kCompare, *first);
        compare->children.push_back(std::move(first));
      }
      compare->ops.push_back(op);
      compare->children.push_back(parse_math1());
    }
    return compare ? done(std::move(compare)) : std::move(first);
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = next().text;
      e = binary(Expr::Kind::kBinary, op, std::move(e), parse_concat());
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (skip_op("~")) e = binary(Expr::Kind::kBinary, "~", std::move(e), parse_math2());
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = next().text;
      e = binary(Expr::Kind::kBinary, op, std::move(e), parse_pow());
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (skip_op("**")) e = binary(Expr::Kind::kBinary, "**", std::move(e), parse_unary(true));
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      RecursionGuard guard(*this);
      e = node(Expr::Kind::kUnary, current());
      e->name = next().text;
      e->children.push_back(parse_unary(false));
      e = done(std::move(e));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expression(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = current();
    switch (t.kind) {
      case TokenKind::kName: {
        next();
        if (t.text == "true" || t.text == "True") return literal(t, Value::boolean(true));
        if (t.text == "false" || t.text == "False") return literal(t, Value::boolean(false));
        if (t.text == "none" || t.text == "None") return literal(t, Value::none());
        auto e = node(Expr::Kind::kName, t);
        e->name = t.text;
        return done(std::move(e));
      }
      case TokenKind::kString: {
        std::string s;
        while (current().kind == TokenKind::kString) s += next().text;
        return literal(t, Value::string(std::move(s)));
      }
      case TokenKind::kInteger: {
        next();
        int64_t v = 0;
        const auto r = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
        if (r.ec != std::errc()) fail_at(t, "integer literal " + t.text + " is out of range");
        return literal(t, Value::integer(v));
      }
      case TokenKind::kFloat:
        next();
        return literal(t, Value::floating(std::strtod(t.text.c_str(), nullptr)));
      case TokenKind::kOperator:
        if (t.text == "(") return parse_parenthesized();
        if (t.text == "[") return parse_list();
        if (t.text == "{") return parse_dict();
        [[fallthrough]];
      default:
        fail("unexpected " + describe(t));
    }
  }

  ExprPtr literal(const Token& at, Value v) const {
    auto e = node(Expr::Kind::kLiteral, at);
    e->value = std::move(v);
    return done(std::move(e));
  }

  ExprPtr parse_parenthesized() {
    const Token& open = next();
    if (skip_op(")")) return done(node(Expr::Kind::kTuple, open));
    ExprPtr first = parse_expression();
    if (skip_op(")")) return first;
    auto tuple = node(Expr::Kind::kTuple, open);
    tuple->children.push_back(std::move(first));
    while (skip_op(",")) {
      if (is_op(")")) break;
      tuple->children.push_back(parse_expression());
    }
    expect_op(")");
    return done(std::move(tuple));
  }

  ExprPtr parse_list() {
    auto list = node(Expr::Kind::kList, next());
    while (!skip_op("]")) {
      if (!list->children.empty()) {
        expect_op(",");
        if (skip_op("]")) break;
      }
      list->children.push_back(parse_expression());
    }
    return done(std::move(list));
  }

  ExprPtr parse_dict() {
    auto dict = node(Expr::Kind::kDict, next());
    while (!skip_op("}")) {
      if (!dict->children.empty()) {
        expect_op(",");
        if (skip_op("}")) break;
      }
      dict->children.push_back(parse_expression());
      expect_op(":");
      dict->children.push_back(parse_expression());
    }
    return done(std::move(dict));
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        const Token& dot = next();
        if (current().kind == TokenKind::kInteger) {
          auto item = node(Expr::Kind::kGetItem, dot);
          item->children.push_back(std::move(e));
          item->children.push_back(parse_primary());
          e = done(std::move(item));
          continue;
        }
        auto attr = node(Expr::Kind::kGetAttr, dot);
        attr->name = expect_name();
        attr->children.push_back(std::move(e));
        e = done(std::move(attr));
      } else if (is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr subject) {
    const Token& open = next();
    ExprPtr parts[3];
    int colons = 0;
    while (!is_op("]")) {
      if (skip_op(":")) {
        if (++colons > 2) fail("too many ':' in a slice");
        continue;
      }
      if (parts[colons]) fail("expected ':' or ']', got " + describe(current()));
      parts[colons] = parse_expression();
    }
    next();
    if (colons == 0) {
      if (!parts[0]) fail_at(open, "expected a subscript");
      auto e = node(Expr::Kind::kGetItem, open);
      e->children.push_back(std::move(subject));
      e->children.push_back(std::move(parts[0]));
      return done(std::move(e));
    }
    auto e = node(Expr::Kind::kSlice, open);
    e->children.push_back(std::move(subject));
    for (auto& p : parts) e->children.push_back(std::move(p));
    return done(std::move(e));
  }

  // "(" args ")" into e->children (after what is there) and e->keyword.
  void parse_call_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!skip_op(")")) {
      if (!first) {
        expect_op(",");
        if (skip_op(")")) break;
      }
      first = false;
      if (is_op("*") || is_op("**")) fail("*args and **kwargs are not supported");
      if (current().kind == TokenKind::kName && peek().kind == TokenKind::kOperator &&
          peek().text == "=") {
        std::string name = next().text;
        next();
        e.keyword.emplace_back(std::move(name), parse_expression());
      } else {
        if (!e.keyword.empty()) fail("positional argument follows keyword argument");
        e.children.push_back(parse_expression());
      }
    }
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = node(Expr::Kind::kCall, *callee);
    e->children.push_back(std::move(callee));
    parse_call_args(*e);
    return done(std::move(e));
  }

  ExprPtr parse_filter_expression(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        next();
        const Token& name = current();
        auto f = node(Expr::Kind::kFilter, name);
        f->name = expect_name();
        if (!is_filter(f->name)) fail_at(name, "no filter named '" + f->name + "'");
        f->children.push_back(std::move(e));
        if (is_op("(")) parse_call_args(*f);
        e = done(std::move(f));
      } else if (is_name("is")) {
        next();
        const bool negated = skip_name("not");
        const Token& name = current();
        auto t = node(Expr::Kind::kTest, name);
        t->negated = negated;
        t->name = expect_name();
        if (!is_test(t->name)) fail_at(name, "no test named '" + t->name + "'");
        t->children.push_back(std::move(e));
        if (is_op("(")) {
          parse_call_args(*t);
        } else if ((current().kind == TokenKind::kName && !is_name("else") && !is_name("or") &&
                    !is_name("and")) ||
                   current().kind == TokenKind::kString || current().kind == TokenKind::kInteger ||
                   current().kind == TokenKind::kFloat || is_op("[") || is_op("{")) {
          if (is_name("is")) fail("cannot chain multiple tests with 'is'");
          t->children.push_back(parse_postfix(parse_primary()));
        }
        e = done(std::move(t));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  std::vector<Token> tokens_;
  const Limits& limits_;
  size_t pos_ = 0;
  int nesting_ = 0;
  int recursion_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Body parse_template(std::string_view source, const Limits& limits) {
  return Parser(tokenize(source), limits).parse();
}

}  // namespace cellm::jinja
