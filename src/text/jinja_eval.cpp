#include "jinja_eval.h"

#include <cmath>
#include <unordered_map>

#include "jinja_builtins.h"

namespace cellm::jinja {
namespace {

[[noreturn]] void type_error(const std::string& message) {
  throw TemplateError(message);
}

struct Scope {
  explicit Scope(const Scope* parent) : parent(parent) {}
  const Scope* parent;
  std::unordered_map<std::string, Value> vars;

  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent) {
      const auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

enum class Flow { kNormal, kBreak, kContinue };

int64_t as_integer(const Value& v) {
  return v.is_int() ? v.as_int() : int64_t{v.as_bool()};
}
bool is_integral(const Value& v) {
  return v.is_int() || v.is_bool();
}

[[noreturn]] void unsupported_operands(const std::string& op, const Value& a, const Value& b) {
  type_error("unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" +
             b.type_name() + "'");
}

int64_t checked_add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) type_error("integer overflow");
  return r;
}
int64_t checked_sub(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_sub_overflow(a, b, &r)) type_error("integer overflow");
  return r;
}
int64_t checked_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) type_error("integer overflow");
  return r;
}

// Python's floor division and modulo for ints (b != 0).
int64_t floor_div(int64_t a, int64_t b) {
  if (a == INT64_MIN && b == -1) type_error("integer overflow");
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
int64_t floor_mod(int64_t a, int64_t b) {
  if (b == -1) return 0;
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

Value repeat(Budget& budget, const Value& sequence, int64_t times) {
  const size_t n = times <= 0 ? 0 : static_cast<size_t>(times);
  if (sequence.is_string()) {
    const std::string& s = sequence.as_string();
    if (n != 0 && s.size() > budget.limits().max_string_bytes / n) {
      budget.charge_items(budget.limits().max_string_bytes + 1, "string");
    }
    std::string out;
    out.reserve(s.size() * n);
    for (size_t i = 0; i < n; ++i) out += s;
    return budget.string(std::move(out));
  }
  const auto& items = sequence.as_list().items;
  if (n != 0 && items.size() > budget.limits().max_string_bytes / n) {
    budget.charge_list_items(budget.limits().max_string_bytes + 1, "list");
  }
  budget.charge_list_items(items.size() * n, "list");
  std::vector<Value> out;
  out.reserve(items.size() * n);
  for (size_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
  return Value::list(std::move(out), sequence.as_list().is_tuple);
}

Value arithmetic(Budget& budget, const std::string& op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string s = a.str();
    budget.charge_items(s.size() + (b.is_string() ? b.as_string().size() : 0), "string");
    s += b.str();
    return budget.string(std::move(s));
  }
  require_defined(a);
  require_defined(b);
  const bool numbers = a.is_number() && b.is_number();
  const bool floats = numbers && (a.is_float() || b.is_float());
  if (op == "+") {
    if (floats) return Value::floating(a.to_double() + b.to_double());
    if (numbers) return Value::integer(checked_add(as_integer(a), as_integer(b)));
    if (a.is_string() && b.is_string()) {
      budget.charge_items(a.as_string().size() + b.as_string().size(), "string");
      return budget.string(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list() && a.as_list().is_tuple == b.as_list().is_tuple) {
      const auto& x = a.as_list().items;
      const auto& y = b.as_list().items;
      budget.charge_list_items(x.size() + y.size(), "list");
      std::vector<Value> items = x;
      items.insert(items.end(), y.begin(), y.end());
      return Value::list(std::move(items), a.as_list().is_tuple);
    }
    if (a.is_string())
      type_error("can only concatenate str (not \"" + b.type_name() + "\") to str");
    if (a.is_list()) {
      type_error("can only concatenate " + a.type_name() + " (not \"" + b.type_name() + "\") to " +
                 a.type_name());
    }
    unsupported_operands(op, a, b);
  }
  if (op == "-") {
    if (floats) return Value::floating(a.to_double() - b.to_double());
    if (numbers) return Value::integer(checked_sub(as_integer(a), as_integer(b)));
    unsupported_operands(op, a, b);
  }
  if (op == "*") {
    if (floats) return Value::floating(a.to_double() * b.to_double());
    if (numbers) return Value::integer(checked_mul(as_integer(a), as_integer(b)));
    if ((a.is_string() || a.is_list()) && is_integral(b)) return repeat(budget, a, as_integer(b));
    if (is_integral(a) && (b.is_string() || b.is_list())) return repeat(budget, b, as_integer(a));
    if (a.is_string() || b.is_string() || a.is_list() || b.is_list()) {
      type_error("can't multiply sequence by non-int of type '" +
                 (a.is_string() || a.is_list() ? b : a).type_name() + "'");
    }
    unsupported_operands(op, a, b);
  }
  if (op == "/") {
    if (!numbers) unsupported_operands(op, a, b);
    if (b.to_double() == 0.0) type_error("division by zero");
    return Value::floating(a.to_double() / b.to_double());
  }
  if (op == "//" || op == "%") {
    if (a.is_string() && op == "%")
      type_error("printf-style '%' string formatting is not supported");
    if (!numbers) unsupported_operands(op, a, b);
    if (b.to_double() == 0.0) {
      type_error(floats ? "float modulo or floor division by zero"
                        : "integer division or modulo by zero");
    }
    if (!floats) {
      return Value::integer(op == "//" ? floor_div(as_integer(a), as_integer(b))
                                       : floor_mod(as_integer(a), as_integer(b)));
    }
    const double x = a.to_double(), y = b.to_double();
    if (op == "//") return Value::floating(std::floor(x / y));
    double m = std::fmod(x, y);
    if (m != 0.0 && ((m < 0) != (y < 0))) m += y;
    return Value::floating(m);
  }
  if (op == "**") {
    if (!numbers) unsupported_operands(op, a, b);
    if (!floats && as_integer(b) >= 0) {
      int64_t base = as_integer(a), exponent = as_integer(b), result = 1;
      while (exponent > 0) {
        if (exponent & 1) result = checked_mul(result, base);
        exponent >>= 1;
        if (exponent > 0) base = checked_mul(base, base);
      }
      return Value::integer(result);
    }
    if (a.to_double() == 0.0 && b.to_double() < 0) type_error("zero to a negative power");
    return Value::floating(std::pow(a.to_double(), b.to_double()));
  }
  type_error("unknown operator " + op);
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kString:
      if (!item.is_string()) {
        type_error("'in <string>' requires string as left operand, not " + item.type_name());
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& v : container.as_list().items) {
        if (equals(v, item)) return true;
      }
      return false;
    case Value::Kind::kDict:
      return container.as_dict().find(item) != nullptr;
    case Value::Kind::kUndefined:
      return false;
    default:
      type_error("argument of type '" + container.type_name() + "' is not iterable");
  }
}

bool compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return equals(a, b);
  if (op == "!=") return !equals(a, b);
  if (op == "in") return contains(b, a);
  if (op == "not in") return !contains(b, a);
  require_defined(a);
  require_defined(b);
  if (op == "<") return less_than(a, b);
  if (op == ">") return less_than(b, a);
  if (op == "<=") return !less_than(b, a);
  if (op == ">=") return !less_than(a, b);
  type_error("unknown comparison " + op);
}

class Evaluator {
 public:
  explicit Evaluator(Budget& budget) : budget_(budget) {}

  std::string render(const Body& body,
                     const std::vector<std::pair<std::string, Value>>& variables) {
    Scope root(nullptr);
    for (const auto& [name, value] : variables) root.vars[name] = value;
    root_ = &root;
    std::string out;
    out_ = &out;
    exec_body(body, root);
    return out;
  }

 private:
  // --- statements ----------------------------------------------------------

  Flow exec_body(const Body& body, Scope& scope) {
    for (const StmtPtr& s : body) {
      const Flow flow = exec(*s, scope);
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  Flow exec(const Stmt& s, Scope& scope) {
    try {
      return exec_unpositioned(s, scope);
    } catch (const RaisedError&) {
      throw;
    } catch (const TemplateError& e) {
      if (e.has_position()) throw;
      throw TemplateError(e.message(), s.line, s.column);
    }
  }

  void emit(const std::string& text) {
    if (out_->size() + text.size() > budget_.limits().max_output_bytes) {
      type_error("template output exceeds " + std::to_string(budget_.limits().max_output_bytes) +
                 " bytes");
    }
    *out_ += text;
  }

  Flow exec_unpositioned(const Stmt& s, Scope& scope) {
    switch (s.kind) {
      case Stmt::Kind::kText:
        emit(s.text);
        return Flow::kNormal;
      case Stmt::Kind::kPrint:
        emit(eval(*s.expr, scope).str());
        return Flow::kNormal;
      case Stmt::Kind::kIf:
        for (size_t i = 0; i < s.conditions.size(); ++i) {
          if (eval(*s.conditions[i], scope).truthy()) return exec_body(s.bodies[i], scope);
        }
        if (s.bodies.size() > s.conditions.size()) return exec_body(s.bodies.back(), scope);
        return Flow::kNormal;
      case Stmt::Kind::kFor:
        exec_for(s, scope);
        return Flow::kNormal;
      case Stmt::Kind::kSet:
        exec_set(s, scope);
        return Flow::kNormal;
      case Stmt::Kind::kMacro: {
        const Stmt* macro = &s;
        scope.vars[s.name] = Value::callable(
            s.name, [this, macro](CallArgs& args) { return call_macro(*macro, args); });
        return Flow::kNormal;
      }
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
      case Stmt::Kind::kScope:
        return exec_body(s.bodies[0], scope);
    }
    return Flow::kNormal;
  }

  void bind_targets(const std::vector<std::string>& targets, const Value& item, Scope& scope) {
    if (targets.size() == 1) {
      scope.vars[targets[0]] = item;
      return;
    }
    const std::vector<Value> parts = iterate(item);
    if (parts.size() != targets.size()) {
      type_error(parts.size() > targets.size()
                     ? "too many values to unpack (expected " + std::to_string(targets.size()) + ")"
                     : "not enough values to unpack (expected " + std::to_string(targets.size()) +
                           ", got " + std::to_string(parts.size()) + ")");
    }
    for (size_t i = 0; i < targets.size(); ++i) scope.vars[targets[i]] = parts[i];
  }

  void exec_for(const Stmt& s, Scope& scope) {
    const Value iterable = eval(*s.expr, scope);
    if (!iterable.is_undefined() && !iterable.is_list() && !iterable.is_dict() &&
        !iterable.is_string()) {
      type_error("'" + iterable.type_name() + "' object is not iterable");
    }
    std::vector<Value> items = iterate(iterable);
    if (s.condition) {
      std::vector<Value> kept;
      for (const Value& item : items) {
        budget_.iteration();
        Scope filter_scope(&scope);
        bind_targets(s.targets, item, filter_scope);
        if (eval(*s.condition, filter_scope).truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      if (s.bodies.size() > 1) {
        Scope else_scope(&scope);
        exec_body(s.bodies[1], else_scope);
      }
      return;
    }
    const auto n = static_cast<int64_t>(items.size());
    const Value length = Value::integer(n);
    for (int64_t i = 0; i < n; ++i) {
      budget_.iteration();
      Scope iteration(&scope);
      const auto index = static_cast<size_t>(i);
      std::vector<std::pair<Value, Value>> loop;
      loop.reserve(12);
      const auto field = [&](const char* name, Value v) {
        loop.emplace_back(Value::string(name), std::move(v));
      };
      field("index", Value::integer(i + 1));
      field("index0", Value::integer(i));
      field("revindex", Value::integer(n - i));
      field("revindex0", Value::integer(n - i - 1));
      field("first", Value::boolean(i == 0));
      field("last", Value::boolean(i == n - 1));
      field("length", length);
      field("depth", Value::integer(1));
      field("depth0", Value::integer(0));
      field("previtem", i > 0 ? items[index - 1] : Value::undefined("there is no previous item"));
      field("nextitem", i + 1 < n ? items[index + 1] : Value::undefined("there is no next item"));
      field("cycle", Value::callable("cycle", [i](CallArgs& args) {
              if (args.positional.empty()) type_error("no items for cycling given");
              return args.positional[static_cast<size_t>(i) % args.positional.size()];
            }));
      iteration.vars["loop"] = Value::dict(std::move(loop));
      bind_targets(s.targets, items[index], iteration);
      if (exec_body(s.bodies[0], iteration) == Flow::kBreak) break;
    }
  }

  void exec_set(const Stmt& s, Scope& scope) {
    Value value;
    if (s.expr) {
      value = eval(*s.expr, scope);
    } else {
      std::string captured;
      std::string* saved = out_;
      out_ = &captured;
      try {
        exec_body(s.bodies[0], scope);
      } catch (...) {
        out_ = saved;
        throw;
      }
      out_ = saved;
      value = budget_.string(std::move(captured));
    }
    if (!s.attribute.empty()) {
      const Value* target = scope.find(s.targets[0]);
      if (target == nullptr || !target->is_namespace()) {
        type_error("cannot assign attribute on non-namespace object");
      }
      target->as_namespace().set(s.attribute, std::move(value));
      return;
    }
    bind_targets(s.targets, value, scope);
  }

  Value call_macro(const Stmt& macro, CallArgs& args) {
    if (call_depth_ >= budget_.limits().max_call_depth) {
      type_error("macro calls nested deeper than " +
                 std::to_string(budget_.limits().max_call_depth));
    }
    if (args.positional.size() > macro.params.size()) {
      type_error("macro '" + macro.name + "' takes not more than " +
                 std::to_string(macro.params.size()) + " argument(s)");
    }
    Scope scope(root_);
    std::vector<bool> given(macro.params.size(), false);
    for (size_t i = 0; i < args.positional.size(); ++i) {
      scope.vars[macro.params[i].name] = args.positional[i];
      given[i] = true;
    }
    for (auto& [key, value] : args.keyword) {
      size_t i = 0;
      while (i < macro.params.size() && macro.params[i].name != key) ++i;
      if (i == macro.params.size()) {
        type_error("macro '" + macro.name + "' takes no keyword argument '" + key + "'");
      }
      if (given[i])
        type_error("macro '" + macro.name + "' got multiple values for argument '" + key + "'");
      scope.vars[key] = value;
      given[i] = true;
    }
    ++call_depth_;
    std::string captured;
    std::string* saved = out_;
    out_ = &captured;
    try {
      for (size_t i = 0; i < macro.params.size(); ++i) {
        if (given[i]) continue;
        const MacroParam& p = macro.params[i];
        scope.vars[p.name] = p.default_value
                                 ? eval(*p.default_value, scope)
                                 : Value::undefined("parameter '" + p.name + "' was not provided");
      }
      exec_body(macro.bodies[0], scope);
    } catch (...) {
      out_ = saved;
      --call_depth_;
      throw;
    }
    out_ = saved;
    --call_depth_;
    return budget_.string(std::move(captured));
  }

  // --- expressions ---------------------------------------------------------

  Value eval(const Expr& e, const Scope& scope) {
    try {
      return eval_unpositioned(e, scope);
    } catch (const RaisedError&) {
      throw;
    } catch (const TemplateError& error) {
      if (error.has_position()) throw;
      throw TemplateError(error.message(), e.line, e.column);
    }
  }

  CallArgs eval_args(const Expr& e, size_t first, const Scope& scope) {
    CallArgs args;
    for (size_t i = first; i < e.children.size(); ++i) {
      args.positional.push_back(eval(*e.children[i], scope));
    }
    for (const auto& [name, arg] : e.keyword) args.keyword.emplace_back(name, eval(*arg, scope));
    return args;
  }

  Value eval_unpositioned(const Expr& e, const Scope& scope) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.value;
      case Expr::Kind::kName: {
        const Value* v = scope.find(e.name);
        return v != nullptr ? *v : Value::undefined("'" + e.name + "' is undefined");
      }
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        std::vector<Value> items;
        items.reserve(e.children.size());
        for (const auto& c : e.children) items.push_back(eval(*c, scope));
        budget_.charge_list_items(items.size(), "list");
        return Value::list(std::move(items), e.kind == Expr::Kind::kTuple);
      }
      case Expr::Kind::kDict: {
        std::vector<std::pair<Value, Value>> items;
        for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
          Value key = eval(*e.children[i], scope);
          if (key.is_list() && !key.as_list().is_tuple) type_error("unhashable type: 'list'");
          if (key.is_dict()) type_error("unhashable type: 'dict'");
          items.emplace_back(std::move(key), eval(*e.children[i + 1], scope));
        }
        budget_.charge_list_items(items.size(), "dict");
        return Value::dict(std::move(items));
      }
      case Expr::Kind::kGetAttr:
        return get_attribute(budget_, eval(*e.children[0], scope), e.name);
      case Expr::Kind::kGetItem: {
        const Value object = eval(*e.children[0], scope);
        return get_item(budget_, object, eval(*e.children[1], scope));
      }
      case Expr::Kind::kSlice: {
        const Value object = eval(*e.children[0], scope);
        Value bounds[3];
        for (size_t i = 0; i < 3; ++i) {
          if (e.children[i + 1]) bounds[i] = eval(*e.children[i + 1], scope);
        }
        return get_slice(budget_, object, bounds[0], bounds[1], bounds[2]);
      }
      case Expr::Kind::kCall: {
        const Value callee = eval(*e.children[0], scope);
        CallArgs args = eval_args(e, 1, scope);
        require_defined(callee);
        if (!callee.is_callable())
          type_error("'" + callee.type_name() + "' object is not callable");
        return callee.as_callable().fn(args);
      }
      case Expr::Kind::kFilter: {
        const Value subject = eval(*e.children[0], scope);
        CallArgs args = eval_args(e, 1, scope);
        return apply_filter(budget_, e.name, subject, args);
      }
      case Expr::Kind::kTest: {
        const Value subject = eval(*e.children[0], scope);
        const CallArgs args = eval_args(e, 1, scope);
        return Value::boolean(apply_test(e.name, subject, args) != e.negated);
      }
      case Expr::Kind::kUnary: {
        const Value v = eval(*e.children[0], scope);
        if (e.name == "not") return Value::boolean(!v.truthy());
        require_defined(v);
        if (!v.is_number())
          type_error("bad operand type for unary " + e.name + ": '" + v.type_name() + "'");
        if (e.name == "+") return v.is_bool() ? Value::integer(v.as_bool()) : v;
        if (v.is_float()) return Value::floating(-v.as_float());
        return Value::integer(checked_sub(0, as_integer(v)));
      }
      case Expr::Kind::kBinary: {
        const Value a = eval(*e.children[0], scope);
        const Value b = eval(*e.children[1], scope);
        return arithmetic(budget_, e.name, a, b);
      }
      case Expr::Kind::kCompare: {
        Value left = eval(*e.children[0], scope);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.children[i + 1], scope);
          if (!compare(e.ops[i], left, right)) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case Expr::Kind::kAnd: {
        Value a = eval(*e.children[0], scope);
        return a.truthy() ? eval(*e.children[1], scope) : a;
      }
      case Expr::Kind::kOr: {
        Value a = eval(*e.children[0], scope);
        return a.truthy() ? a : eval(*e.children[1], scope);
      }
      case Expr::Kind::kConditional:
        if (eval(*e.children[1], scope).truthy()) return eval(*e.children[0], scope);
        if (e.children[2]) return eval(*e.children[2], scope);
        return Value::undefined(
            "the inline if-expression evaluated to false and no else section was defined");
    }
    return Value();
  }

  Budget& budget_;
  const Scope* root_ = nullptr;
  std::string* out_ = nullptr;
  int call_depth_ = 0;
};

}  // namespace

std::string render_template(const Body& body,
                            const std::vector<std::pair<std::string, Value>>& variables,
                            Budget& budget) {
  return Evaluator(budget).render(body, variables);
}

}  // namespace cellm::jinja
