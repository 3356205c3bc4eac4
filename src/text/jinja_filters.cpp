// Filters and tests (see jinja_builtins.h), after jinja2 3.1's filters.py and
// tests.py, with transformers' tojson.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "jinja_builtins.h"
#include "jinja_text.h"

namespace cellm::jinja {
namespace {

[[noreturn]] void type_error(const std::string& message) {
  throw TemplateError(message);
}

constexpr std::array<std::string_view, 36> kFilters = {
    "abs",    "capitalize", "count",     "default", "d",          "dictsort", "first",   "float",
    "indent", "int",        "items",     "join",    "last",       "length",   "list",    "lower",
    "map",    "max",        "min",       "reject",  "rejectattr", "replace",  "reverse", "round",
    "select", "selectattr", "sort",      "string",  "sum",        "title",    "tojson",  "trim",
    "unique", "upper",      "wordcount", "batch"};

constexpr std::array<std::string_view, 31> kTests = {
    "defined",  "undefined", "none",        "string", "mapping", "iterable", "number",
    "integer",  "float",     "boolean",     "true",   "false",   "sequence", "callable",
    "odd",      "even",      "divisibleby", "eq",     "equalto", "ne",       "lt",
    "lessthan", "gt",        "greaterthan", "le",     "ge",      "in",       "lower",
    "upper",    "sameas",    "escaped"};

bool flag(const Value* v, bool fallback) {
  return v == nullptr ? fallback : v->truthy();
}

// item.a.b for an attribute path "a.b" (parts that are digits index lists).
Value attribute_path(Budget& budget, const Value& item, const Value& path) {
  if (path.is_int()) return get_item(budget, item, path);
  const std::string text = path.str();
  Value v = item;
  size_t start = 0;
  while (true) {
    const size_t dot = text.find('.', start);
    const std::string part =
        text.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(),
                                                     [](char c) { return c >= '0' && c <= '9'; });
    v = digits ? get_item(budget, v, Value::integer(std::strtoll(part.c_str(), nullptr, 10)))
               : get_item(budget, v, Value::string(part));
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

// A sort key: strings lowered unless case-sensitive.
Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::string(to_lower(v.as_string()));
  return v;
}

Value add(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return Value::floating(a.to_double() + b.to_double());
    int64_t r = 0;
    const int64_t x = a.is_int() ? a.as_int() : a.as_bool();
    const int64_t y = b.is_int() ? b.as_int() : b.as_bool();
    if (__builtin_add_overflow(x, y, &r)) type_error("integer overflow");
    return Value::integer(r);
  }
  type_error("unsupported operand type(s) for +: '" + a.type_name() + "' and '" + b.type_name() +
             "'");
}

Value filter_select(Budget& budget, std::string_view name, const Value& value,
                    const CallArgs& args) {
  const bool by_attribute = name == "selectattr" || name == "rejectattr";
  const bool keep_on = name == "select" || name == "selectattr";
  if (!args.keyword.empty()) type_error(std::string(name) + "() takes no keyword arguments");
  size_t next = 0;
  Value attribute;
  if (by_attribute) {
    if (args.positional.empty()) type_error(std::string(name) + "() missing the attribute");
    attribute = args.positional[next++];
  }
  std::string test;
  if (next < args.positional.size()) {
    const Value& t = args.positional[next++];
    if (!t.is_string() || !is_test(t.as_string())) type_error("no test named " + t.repr());
    test = t.as_string();
  }
  CallArgs test_args;
  test_args.positional.assign(args.positional.begin() + static_cast<ptrdiff_t>(next),
                              args.positional.end());
  std::vector<Value> out;
  for (const Value& item : iterate(value)) {
    const Value subject = by_attribute ? attribute_path(budget, item, attribute) : item;
    const bool passes = test.empty() ? subject.truthy() : apply_test(test, subject, test_args);
    if (passes == keep_on) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value filter_map(Budget& budget, const Value& value, CallArgs& args) {
  std::vector<Value> items = iterate(value);
  const auto attribute = std::find_if(args.keyword.begin(), args.keyword.end(),
                                      [](const auto& kv) { return kv.first == "attribute"; });
  std::vector<Value> out;
  out.reserve(items.size());
  if (attribute != args.keyword.end()) {
    const BoundArgs a(args, "map", {"attribute", "default"});
    for (const Value& item : items) {
      Value v = attribute_path(budget, item, *a.get(0));
      if (v.is_undefined() && a.get(1) != nullptr) v = *a.get(1);
      out.push_back(std::move(v));
    }
    return Value::list(std::move(out));
  }
  if (args.positional.empty() || !args.positional[0].is_string()) {
    type_error("map() needs a filter name or attribute=");
  }
  const std::string filter = args.positional[0].as_string();
  if (!is_filter(filter)) type_error("no filter named '" + filter + "'");
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  for (const Value& item : items) {
    CallArgs call = rest;
    out.push_back(apply_filter(budget, filter, item, call));
  }
  return Value::list(std::move(out));
}

Value filter_round(const Value& value, const BoundArgs& a) {
  if (!value.is_number()) type_error("type " + value.type_name() + " doesn't define __round__");
  if (a.get(0) != nullptr && !a.get(0)->is_int()) {
    type_error("round() precision must be an int, not " + a.get(0)->type_name());
  }
  const int64_t precision = a.get(0) == nullptr ? 0 : a.get(0)->as_int();
  const std::string method = a.get(1) == nullptr ? "common" : a.get(1)->str();
  const double x = value.to_double();
  const double scale = std::pow(10.0, static_cast<double>(precision));
  if (method == "ceil") return Value::floating(std::ceil(x * scale) / scale);
  if (method == "floor") return Value::floating(std::floor(x * scale) / scale);
  if (method != "common") type_error("method must be common, ceil or floor");
  if (precision < 0 || precision > 300) return Value::floating(std::nearbyint(x * scale) / scale);
  // Python's round(): half to even on the exact binary value, as printf does.
  char buf[512];
  std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(precision), x);
  return Value::floating(std::strtod(buf, nullptr));
}

Value filter_int(const Value& value, const BoundArgs& a) {
  const Value fallback = a.get_or(0, Value::integer(0));
  if (value.is_int()) return value;
  if (value.is_bool()) return Value::integer(value.as_bool());
  if (value.is_float()) {
    const double d = value.as_float();
    if (!std::isfinite(d) || std::fabs(d) > 9.2e18) return fallback;
    return Value::integer(static_cast<int64_t>(d));
  }
  if (value.is_string()) {
    std::string s = strip(value.as_string(), nullptr, StripSide::kBoth);
    s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
    if (s.empty()) return fallback;
    char* end = nullptr;
    errno = 0;
    const long long i = std::strtoll(s.c_str(), &end, 10);
    if (end == s.c_str() + s.size() && errno == 0) return Value::integer(i);
    const double d = std::strtod(s.c_str(), &end);
    if (end == s.c_str() + s.size() && std::isfinite(d) && std::fabs(d) < 9.2e18) {
      return Value::integer(static_cast<int64_t>(d));
    }
  }
  return fallback;
}

Value filter_float(const Value& value, const BoundArgs& a) {
  const Value fallback = a.get_or(0, Value::floating(0.0));
  if (value.is_number()) return Value::floating(value.to_double());
  if (value.is_string()) {
    const std::string s = strip(value.as_string(), nullptr, StripSide::kBoth);
    char* end = nullptr;
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end == s.c_str() + s.size()) return Value::floating(d);
  }
  return fallback;
}

std::string filter_indent(const std::string& s, const BoundArgs& a) {
  std::string indentation = "    ";
  if (const Value* width = a.get(0)) {
    if (width->is_string()) {
      indentation = width->as_string();
    } else if (width->is_int()) {
      indentation.assign(static_cast<size_t>(std::clamp<int64_t>(width->as_int(), 0, 4096)), ' ');
    } else {
      type_error("indent width must be an int or a str");
    }
  }
  const bool first = flag(a.get(1), false);
  const bool blank = flag(a.get(2), false);
  const std::vector<std::string> lines = splitlines(s + "\n");
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) {
      out += '\n';
      if (blank || !lines[i].empty()) out += indentation;
    }
    out += lines[i];
  }
  if (first) out = indentation + out;
  return out;
}

Value min_max(Budget& budget, const Value& value, const BoundArgs& a, bool want_max) {
  const std::vector<Value> items = iterate(value);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  const bool case_sensitive = flag(a.get(0), false);
  const Value* attribute = a.get(1);
  const auto key = [&](const Value& v) {
    return sort_key(attribute ? attribute_path(budget, v, *attribute) : v, case_sensitive);
  };
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    const bool better = want_max ? less_than(key(items[best]), key(items[i]))
                                 : less_than(key(items[i]), key(items[best]));
    if (better) best = i;
  }
  return items[best];
}

}  // namespace

bool is_filter(std::string_view name) {
  return std::find(kFilters.begin(), kFilters.end(), name) != kFilters.end();
}

bool is_test(std::string_view name) {
  return std::find(kTests.begin(), kTests.end(), name) != kTests.end();
}

Value apply_filter(Budget& budget, std::string_view name, const Value& value, CallArgs& args) {
  const std::string n(name);
  if (name == "default" || name == "d") {
    const BoundArgs a(args, n, {"default_value", "boolean"});
    const bool use_default = value.is_undefined() || (flag(a.get(1), false) && !value.truthy());
    return use_default ? a.get_or(0, Value::string("")) : value;
  }
  if (name == "length" || name == "count") {
    const BoundArgs a(args, n, {});
    switch (value.kind()) {
      case Value::Kind::kUndefined:
        return Value::integer(0);
      case Value::Kind::kString:
        return Value::integer(static_cast<int64_t>(code_point_count(value.as_string())));
      case Value::Kind::kList:
        return Value::integer(static_cast<int64_t>(value.as_list().items.size()));
      case Value::Kind::kDict:
        return Value::integer(static_cast<int64_t>(value.as_dict().items.size()));
      default:
        type_error("object of type '" + value.type_name() + "' has no len()");
    }
  }
  if (name == "string") {
    const BoundArgs a(args, n, {});
    return value.is_string() ? value : budget.string(value.str());
  }
  if (name == "trim") {
    const BoundArgs a(args, n, {"chars"});
    const Value* chars = a.get(0);
    const std::string* set = chars == nullptr || chars->is_none() ? nullptr : &chars->as_string();
    if (chars != nullptr && !chars->is_none() && !chars->is_string())
      type_error("trim chars must be a str");
    return budget.string(strip(value.str(), set, StripSide::kBoth));
  }
  if (name == "upper" || name == "lower" || name == "capitalize" || name == "title") {
    const BoundArgs a(args, n, {});
    const std::string s = value.str();
    if (name == "upper") return budget.string(to_upper(s));
    if (name == "lower") return budget.string(to_lower(s));
    if (name == "capitalize") return budget.string(capitalize(s));
    return budget.string(jinja_title(s));
  }
  if (name == "replace") {
    const BoundArgs a(args, n, {"old", "new", "count"});
    if (a.get(0) == nullptr || a.get(1) == nullptr) type_error("replace() needs old and new");
    const std::string s = value.str();
    const std::string old = a.get(0)->str();
    const std::string with = a.get(1)->str();
    const bool all = a.get(2) == nullptr || a.get(2)->is_none();
    if (!all && !a.get(2)->is_int()) {
      type_error("replace() count must be an int, not " + a.get(2)->type_name());
    }
    const int64_t count = all ? -1 : a.get(2)->as_int();
    if (!old.empty() && with.size() > old.size()) {
      size_t k = 0;
      for (size_t at = s.find(old); at != std::string::npos; at = s.find(old, at + old.size())) ++k;
      budget.charge_items(s.size() + k * (with.size() - old.size()), "string");
    }
    return budget.string(replace(s, old, with, count));
  }
  if (name == "tojson") {
    const BoundArgs a(args, n, {"ensure_ascii", "indent", "separators", "sort_keys"});
    if (flag(a.get(0), false)) type_error("tojson(ensure_ascii=True) is not supported");
    JsonFormat format;
    if (const Value* indent = a.get(1); indent != nullptr && !indent->is_none()) {
      if (!indent->is_int()) type_error("tojson indent must be an int");
      format.indent = static_cast<int>(std::clamp<int64_t>(indent->as_int(), 0, 64));
    }
    if (const Value* separators = a.get(2); separators != nullptr && !separators->is_none()) {
      if (!separators->is_list() || separators->as_list().items.size() != 2) {
        type_error("tojson separators must be a pair of strings");
      }
      format.item_separator = separators->as_list().items[0].str();
      format.key_separator = separators->as_list().items[1].str();
    }
    format.sort_keys = flag(a.get(3), false);
    return budget.string(to_json(value, format));
  }
  if (name == "join") {
    const BoundArgs a(args, n, {"d", "attribute"});
    const std::string separator = a.get(0) == nullptr ? "" : a.get(0)->str();
    std::string out;
    size_t i = 0;
    for (const Value& item : iterate(value)) {
      if (i++ > 0) out += separator;
      out += (a.get(1) ? attribute_path(budget, item, *a.get(1)) : item).str();
      budget.charge_items(out.size(), "string");
    }
    return budget.string(std::move(out));
  }
  if (name == "first" || name == "last") {
    const BoundArgs a(args, n, {});
    const std::vector<Value> items = iterate(value);
    if (items.empty()) return Value::undefined("No " + n + " item, sequence was empty.");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") {
    const BoundArgs a(args, n, {});
    std::vector<Value> items = iterate(value);
    budget.charge_list_items(items.size(), "list");
    return Value::list(std::move(items));
  }
  if (name == "items") {
    const BoundArgs a(args, n, {});
    if (value.is_undefined()) return Value::list({});
    if (!value.is_dict()) type_error("Can only get item pairs from a mapping.");
    std::vector<Value> out;
    for (const auto& [k, v] : value.as_dict().items) out.push_back(Value::list({k, v}, true));
    return Value::list(std::move(out));
  }
  if (name == "dictsort") {
    const BoundArgs a(args, n, {"case_sensitive", "by", "reverse"});
    if (!value.is_dict()) type_error("dictsort expects a mapping");
    const bool case_sensitive = flag(a.get(0), false);
    const bool by_value = a.get(1) != nullptr && a.get(1)->str() == "value";
    std::vector<std::pair<Value, Value>> entries = value.as_dict().items;
    std::stable_sort(entries.begin(), entries.end(), [&](const auto& x, const auto& y) {
      return less_than(sort_key(by_value ? x.second : x.first, case_sensitive),
                       sort_key(by_value ? y.second : y.first, case_sensitive));
    });
    if (flag(a.get(2), false)) std::reverse(entries.begin(), entries.end());
    std::vector<Value> out;
    for (auto& [k, v] : entries) out.push_back(Value::list({k, v}, true));
    return Value::list(std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    return filter_select(budget, name, value, args);
  }
  if (name == "map") return filter_map(budget, value, args);
  if (name == "sort") {
    const BoundArgs a(args, n, {"reverse", "case_sensitive", "attribute"});
    std::vector<Value> items = iterate(value);
    const bool case_sensitive = flag(a.get(1), false);
    const Value* attribute = a.get(2);
    const auto key = [&](const Value& v) {
      return sort_key(attribute ? attribute_path(budget, v, *attribute) : v, case_sensitive);
    };
    const bool reverse = flag(a.get(0), false);
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      return reverse ? less_than(key(y), key(x)) : less_than(key(x), key(y));
    });
    return Value::list(std::move(items));
  }
  if (name == "unique") {
    const BoundArgs a(args, n, {"case_sensitive", "attribute"});
    const bool case_sensitive = flag(a.get(0), false);
    std::vector<Value> out, seen;
    for (const Value& item : iterate(value)) {
      budget.check_time();  // quadratic in the distinct items
      const Value k =
          sort_key(a.get(1) ? attribute_path(budget, item, *a.get(1)) : item, case_sensitive);
      if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, k); })) {
        seen.push_back(k);
        out.push_back(item);
      }
    }
    return Value::list(std::move(out));
  }
  if (name == "reverse") {
    const BoundArgs a(args, n, {});
    if (value.is_string()) {
      auto cps = code_points(value.as_string());
      std::string out;
      for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
      return budget.string(std::move(out));
    }
    std::vector<Value> items = iterate(value);
    std::reverse(items.begin(), items.end());
    return Value::list(std::move(items));
  }
  if (name == "sum") {
    const BoundArgs a(args, n, {"attribute", "start"});
    Value total = a.get_or(1, Value::integer(0));
    for (const Value& item : iterate(value)) {
      total = add(total, a.get(0) ? attribute_path(budget, item, *a.get(0)) : item);
    }
    return total;
  }
  if (name == "min" || name == "max") {
    const BoundArgs a(args, n, {"case_sensitive", "attribute"});
    return min_max(budget, value, a, name == "max");
  }
  if (name == "abs") {
    const BoundArgs a(args, n, {});
    if (value.is_float()) return Value::floating(std::fabs(value.as_float()));
    if (value.is_int()) {
      if (value.as_int() == INT64_MIN) type_error("integer overflow");
      return Value::integer(std::llabs(value.as_int()));
    }
    if (value.is_bool()) return Value::integer(value.as_bool());
    type_error("bad operand type for abs(): '" + value.type_name() + "'");
  }
  if (name == "round") return filter_round(value, BoundArgs(args, n, {"precision", "method"}));
  if (name == "int") return filter_int(value, BoundArgs(args, n, {"default", "base"}));
  if (name == "float") return filter_float(value, BoundArgs(args, n, {"default"}));
  if (name == "indent") {
    const BoundArgs a(args, n, {"width", "first", "blank"});
    return budget.string(filter_indent(value.str(), a));
  }
  if (name == "wordcount") {
    const BoundArgs a(args, n, {});
    return Value::integer(static_cast<int64_t>(split(value.str(), nullptr, -1).size()));
  }
  if (name == "batch") {
    const BoundArgs a(args, n, {"linecount", "fill_with"});
    if (a.get(0) == nullptr || !a.get(0)->is_int() || a.get(0)->as_int() <= 0) {
      type_error("batch() needs a positive line count");
    }
    const auto size = static_cast<size_t>(a.get(0)->as_int());
    std::vector<Value> out, current;
    for (const Value& item : iterate(value)) {
      current.push_back(item);
      if (current.size() == size) out.push_back(Value::list(std::exchange(current, {})));
    }
    if (!current.empty()) {
      if (a.get(1) != nullptr) {
        while (current.size() < size) current.push_back(*a.get(1));
      }
      out.push_back(Value::list(std::move(current)));
    }
    return Value::list(std::move(out));
  }
  type_error("no filter named '" + n + "'");
}

bool apply_test(std::string_view name, const Value& value, const CallArgs& args) {
  const std::string n(name);
  const BoundArgs a(args, n, {"other"});
  const auto other = [&]() -> const Value& {
    if (a.get(0) == nullptr) type_error("test '" + n + "' needs an argument");
    return *a.get(0);
  };
  const auto integer = [&]() {
    if (!value.is_int() && !value.is_bool()) {
      type_error("test '" + n + "' needs an integer, not " + value.type_name());
    }
    return value.is_int() ? value.as_int() : int64_t{value.as_bool()};
  };
  if (name == "defined") return !value.is_undefined();
  if (name == "undefined") return value.is_undefined();
  if (name == "none") return value.is_none();
  if (name == "string") return value.is_string();
  if (name == "mapping") return value.is_dict();
  if (name == "iterable")
    return value.is_undefined() || value.is_string() || value.is_list() || value.is_dict();
  if (name == "sequence")
    return value.is_undefined() || value.is_string() || value.is_list() || value.is_dict();
  if (name == "number") return value.is_number();
  if (name == "integer") return value.is_int();
  if (name == "float") return value.is_float();
  if (name == "boolean") return value.is_bool();
  if (name == "true") return value.is_bool() && value.as_bool();
  if (name == "false") return value.is_bool() && !value.as_bool();
  if (name == "callable") return value.is_callable();
  if (name == "escaped") return false;
  if (name == "odd") return integer() % 2 != 0;
  if (name == "even") return integer() % 2 == 0;
  if (name == "divisibleby") {
    const Value& d = other();
    if (!d.is_int() || d.as_int() == 0) type_error("divisibleby needs a nonzero integer");
    return integer() % d.as_int() == 0;
  }
  if (name == "eq" || name == "equalto") return equals(value, other());
  if (name == "ne") return !equals(value, other());
  if (name == "lt" || name == "lessthan") return less_than(value, other());
  if (name == "gt" || name == "greaterthan") return less_than(other(), value);
  if (name == "le") return !less_than(other(), value);
  if (name == "ge") return !less_than(value, other());
  if (name == "in") {
    const Value& container = other();
    if (container.is_string()) {
      if (!value.is_string()) type_error("'in <string>' requires string as left operand");
      return container.as_string().find(value.as_string()) != std::string::npos;
    }
    for (const Value& item : iterate(container)) {
      if (equals(item, value)) return true;
    }
    return false;
  }
  if (name == "lower") return is_lower(value.str());
  if (name == "upper") return is_upper(value.str());
  if (name == "sameas") {
    const Value& o = other();
    if (value.kind() != o.kind()) return false;
    if (value.is_none() || value.is_undefined()) return true;
    if (value.is_bool()) return value.as_bool() == o.as_bool();
    if (value.is_int()) return value.as_int() == o.as_int();
    if (value.is_float()) return false;
    return value.identity() == o.identity();
  }
  type_error("no test named '" + n + "'");
}

}  // namespace cellm::jinja
