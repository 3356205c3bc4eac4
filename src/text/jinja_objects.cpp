// Attribute and item access, str/dict methods, slicing, iteration and the
// global functions (see jinja_builtins.h).
#include <algorithm>
#include <array>
#include <ctime>

#include "jinja_builtins.h"
#include "jinja_text.h"

namespace cellm::jinja {
namespace {

[[noreturn]] void type_error(const std::string& message) {
  throw TemplateError(message);
}

const std::string& string_arg(const Value* v, std::string_view function, std::string_view what) {
  if (v == nullptr || !v->is_string()) {
    type_error(std::string(function) + "() argument '" + std::string(what) + "' must be str, not " +
               (v == nullptr ? "missing" : v->type_name()));
  }
  return v->as_string();
}

int64_t int_arg(const Value* v, std::string_view function, int64_t fallback) {
  if (v == nullptr || v->is_none()) return fallback;
  if (v->is_int()) return v->as_int();
  if (v->is_bool()) return v->as_bool() ? 1 : 0;
  type_error("'" + v->type_name() + "' object cannot be interpreted as an integer in " +
             std::string(function) + "()");
}

Value string_list(Budget& budget, std::vector<std::string> parts) {
  budget.charge_list_items(parts.size(), "list");
  std::vector<Value> items;
  items.reserve(parts.size());
  for (auto& p : parts) items.push_back(budget.string(std::move(p)));
  return Value::list(std::move(items));
}

// "startswith"/"endswith": the argument is a str or a tuple/list of them.
bool affix_match(const std::string& s, const Value* arg, std::string_view method, bool prefix) {
  std::vector<std::string> affixes;
  if (arg != nullptr && arg->is_list()) {
    for (const Value& v : arg->as_list().items) affixes.push_back(string_arg(&v, method, "prefix"));
  } else {
    affixes.push_back(string_arg(arg, method, "prefix"));
  }
  return std::any_of(affixes.begin(), affixes.end(), [&](const std::string& a) {
    return prefix ? s.starts_with(a) : s.ends_with(a);
  });
}

Value string_method(Budget& budget, const std::string& s, const std::string& name, CallArgs& call) {
  const auto chars_arg = [&](const BoundArgs& a) -> const std::string* {
    const Value* v = a.get(0);
    if (v == nullptr || v->is_none()) return nullptr;
    return &string_arg(v, name, "chars");
  };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const BoundArgs a(call, name, {"chars"});
    const StripSide side = name == "strip"    ? StripSide::kBoth
                           : name == "lstrip" ? StripSide::kLeft
                                              : StripSide::kRight;
    return budget.string(strip(s, chars_arg(a), side));
  }
  if (name == "startswith" || name == "endswith") {
    const BoundArgs a(call, name, {"prefix"});
    return Value::boolean(affix_match(s, a.get(0), name, name == "startswith"));
  }
  if (name == "split") {
    const BoundArgs a(call, name, {"sep", "maxsplit"});
    const Value* sep = a.get(0);
    const std::string* sep_str =
        sep == nullptr || sep->is_none() ? nullptr : &string_arg(sep, name, "sep");
    if (sep_str != nullptr && sep_str->empty()) type_error("empty separator");
    return string_list(budget, split(s, sep_str, int_arg(a.get(1), name, -1)));
  }
  if (name == "splitlines") {
    const BoundArgs a(call, name, {});
    return string_list(budget, splitlines(s));
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    const BoundArgs a(call, name, {});
    if (name == "upper") return budget.string(to_upper(s));
    if (name == "lower") return budget.string(to_lower(s));
    if (name == "title") return budget.string(python_title(s));
    return budget.string(capitalize(s));
  }
  if (name == "replace") {
    const BoundArgs a(call, name, {"old", "new", "count"});
    const std::string& old = string_arg(a.get(0), name, "old");
    const std::string& with = string_arg(a.get(1), name, "new");
    if (!old.empty() && !with.empty()) {
      // Bound the result before building it.
      size_t n = 0;
      for (size_t at = s.find(old); at != std::string::npos; at = s.find(old, at + old.size())) ++n;
      if (with.size() > old.size())
        budget.charge_items(s.size() + n * (with.size() - old.size()), "string");
    }
    return budget.string(replace(s, old, with, int_arg(a.get(2), name, -1)));
  }
  if (name == "find") {
    const BoundArgs a(call, name, {"sub"});
    return Value::integer(find(s, string_arg(a.get(0), name, "sub")));
  }
  if (name == "count") {
    const BoundArgs a(call, name, {"sub"});
    const std::string& sub = string_arg(a.get(0), name, "sub");
    if (sub.empty()) return Value::integer(static_cast<int64_t>(code_point_count(s)) + 1);
    int64_t n = 0;
    for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
    return Value::integer(n);
  }
  if (name == "join") {
    const BoundArgs a(call, name, {"iterable"});
    if (a.get(0) == nullptr) type_error("join() takes exactly one argument");
    std::string out;
    size_t i = 0;
    for (const Value& item : iterate(*a.get(0))) {
      if (!item.is_string()) {
        type_error("sequence item " + std::to_string(i) + ": expected str instance, " +
                   item.type_name() + " found");
      }
      if (i++ > 0) out += s;
      out += item.as_string();
      budget.charge_items(out.size(), "string");
    }
    return budget.string(std::move(out));
  }
  if (name == "islower" || name == "isupper") {
    const BoundArgs a(call, name, {});
    return Value::boolean(name == "islower" ? is_lower(s) : is_upper(s));
  }
  if (name == "isspace") {
    const BoundArgs a(call, name, {});
    return Value::boolean(!s.empty() && strip(s, nullptr, StripSide::kBoth).empty());
  }
  if (name == "isdigit") {
    const BoundArgs a(call, name, {});
    return Value::boolean(
        !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }));
  }
  type_error("'str' object has no method '" + name + "'");
}

constexpr std::array<std::string_view, 19> kStringMethods = {
    "strip", "lstrip",  "rstrip",  "startswith", "endswith", "split", "splitlines",
    "upper", "lower",   "title",   "capitalize", "replace",  "find",  "count",
    "join",  "islower", "isupper", "isspace",    "isdigit"};

bool is_string_method(const std::string& name) {
  return std::find(kStringMethods.begin(), kStringMethods.end(), name) != kStringMethods.end();
}

bool is_dict_method(const std::string& name) {
  return name == "get" || name == "items" || name == "keys" || name == "values";
}

Value dict_method(const Value& dict, const std::string& name, CallArgs& call) {
  const DictData& d = dict.as_dict();
  if (name == "get") {
    const BoundArgs a(call, name, {"key", "default"});
    if (a.get(0) == nullptr) type_error("get expected at least 1 argument, got 0");
    const Value* v = d.find(*a.get(0));
    return v != nullptr ? *v : a.get_or(1, Value::none());
  }
  const BoundArgs a(call, name, {});
  std::vector<Value> out;
  for (const auto& [k, v] : d.items) {
    if (name == "items") {
      out.push_back(Value::list({k, v}, /*is_tuple=*/true));
    } else {
      out.push_back(name == "keys" ? k : v);
    }
  }
  return Value::list(std::move(out));
}

// Python's slice.indices(): clamps start/stop for `length` items.
std::vector<size_t> slice_indices(size_t length, const Value& start_v, const Value& stop_v,
                                  const Value& step_v) {
  const auto bound = [](const Value& v) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (v.is_int()) return v.as_int();
    if (v.is_bool()) return v.as_bool() ? 1 : 0;
    type_error("slice indices must be integers or None");
  };
  const int64_t n = static_cast<int64_t>(length);
  const int64_t step = bound(step_v).value_or(1);
  if (step == 0) type_error("slice step cannot be zero");
  const auto clamp = [&](std::optional<int64_t> v, int64_t fallback) {
    if (!v) return fallback;
    int64_t i = *v;
    if (i < 0) i += n;
    if (step > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t start = clamp(bound(start_v), step > 0 ? 0 : n - 1);
  const int64_t stop = clamp(bound(stop_v), step > 0 ? n : -1);
  std::vector<size_t> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    out.push_back(static_cast<size_t>(i));
  }
  return out;
}

std::string format_time(const std::string& format, const std::tm& tm) {
  if (format.empty()) return "";
  std::string buffer(format.size() * 4 + 64, '\0');
  for (int attempt = 0; attempt < 8; ++attempt) {
    const size_t n = std::strftime(buffer.data(), buffer.size(), format.c_str(), &tm);
    if (n > 0) return buffer.substr(0, n);
    buffer.resize(buffer.size() * 4);
  }
  return "";
}

}  // namespace

BoundArgs::BoundArgs(const CallArgs& args, std::string_view function,
                     std::vector<std::string> names)
    : values_(names.size(), nullptr) {
  if (args.positional.size() > names.size()) {
    type_error(std::string(function) + "() takes at most " + std::to_string(names.size()) +
               " argument(s) (" + std::to_string(args.positional.size()) + " given)");
  }
  for (size_t i = 0; i < args.positional.size(); ++i) values_[i] = &args.positional[i];
  for (const auto& [key, value] : args.keyword) {
    const auto it = std::find(names.begin(), names.end(), key);
    if (it == names.end()) {
      type_error(std::string(function) + "() got an unexpected keyword argument '" + key + "'");
    }
    const auto i = static_cast<size_t>(it - names.begin());
    if (values_[i] != nullptr) {
      type_error(std::string(function) + "() got multiple values for argument '" + key + "'");
    }
    values_[i] = &value;
  }
}

void require_defined(const Value& value) {
  if (value.is_undefined()) {
    const std::string& name = value.undefined_name();
    throw TemplateError(name.empty() ? "undefined value" : name);
  }
}

Value get_attribute(Budget& budget, const Value& object, const std::string& name) {
  require_defined(object);
  switch (object.kind()) {
    case Value::Kind::kDict:
      if (is_dict_method(name)) {
        return Value::callable(
            name, [object, name](CallArgs& args) { return dict_method(object, name, args); });
      }
      if (const Value* v = object.as_dict().find(name)) return *v;
      return Value::undefined("'dict object' has no attribute '" + name + "'");
    case Value::Kind::kNamespace:
      if (const Value* v = object.as_namespace().find(name)) return *v;
      return Value::undefined("'Namespace object' has no attribute '" + name + "'");
    case Value::Kind::kString:
      if (is_string_method(name)) {
        return Value::callable(name, [&budget, object, name](CallArgs& args) {
          return string_method(budget, object.as_string(), name, args);
        });
      }
      break;
    default:
      break;
  }
  return Value::undefined("'" + object.type_name() + " object' has no attribute '" + name + "'");
}

Value get_item(Budget& budget, const Value& object, const Value& key) {
  require_defined(object);
  if (object.is_list() && (key.is_int() || key.is_bool())) {
    const auto& items = object.as_list().items;
    int64_t i = key.is_int() ? key.as_int() : key.as_bool();
    if (i < 0) i += static_cast<int64_t>(items.size());
    if (i >= 0 && i < static_cast<int64_t>(items.size())) return items[static_cast<size_t>(i)];
    return Value::undefined(object.type_name() + " object has no element " + key.repr());
  }
  if (object.is_string() && (key.is_int() || key.is_bool())) {
    const auto cps = code_points(object.as_string());
    int64_t i = key.is_int() ? key.as_int() : key.as_bool();
    if (i < 0) i += static_cast<int64_t>(cps.size());
    if (i >= 0 && i < static_cast<int64_t>(cps.size())) {
      return Value::string(std::string(cps[static_cast<size_t>(i)]));
    }
    return Value::undefined("str object has no element " + key.repr());
  }
  if (object.is_dict()) {
    if (const Value* v = object.as_dict().find(key)) return *v;
  }
  if (key.is_string()) return get_attribute(budget, object, key.as_string());
  return Value::undefined(object.type_name() + " object has no element " + key.repr());
}

Value get_slice(Budget& budget, const Value& object, const Value& start, const Value& stop,
                const Value& step) {
  require_defined(object);
  if (object.is_list()) {
    const auto& items = object.as_list().items;
    const std::vector<size_t> picks = slice_indices(items.size(), start, stop, step);
    budget.charge_list_items(picks.size(), "list");
    std::vector<Value> out;
    out.reserve(picks.size());
    for (size_t i : picks) out.push_back(items[i]);
    return Value::list(std::move(out), object.as_list().is_tuple);
  }
  if (object.is_string()) {
    const auto cps = code_points(object.as_string());
    std::string out;
    for (size_t i : slice_indices(cps.size(), start, stop, step)) out += cps[i];
    return budget.string(std::move(out));
  }
  type_error("'" + object.type_name() + "' object is not subscriptable");
}

std::vector<Value> iterate(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return {};
    case Value::Kind::kList:
      return value.as_list().items;
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      for (const auto& [k, v] : value.as_dict().items) keys.push_back(k);
      return keys;
    }
    case Value::Kind::kString: {
      std::vector<Value> out;
      for (std::string_view cp : code_points(value.as_string())) {
        out.push_back(Value::string(std::string(cp)));
      }
      return out;
    }
    default:
      type_error("'" + value.type_name() + "' object is not iterable");
  }
}

std::vector<std::pair<std::string, Value>> global_functions(Budget& budget,
                                                            std::optional<std::tm> now) {
  std::vector<std::pair<std::string, Value>> out;
  out.emplace_back(
      "range", Value::callable("range", [&budget](CallArgs& args) {
        if (!args.keyword.empty()) type_error("range() takes no keyword arguments");
        const auto& p = args.positional;
        if (p.empty() || p.size() > 3) type_error("range expected 1 to 3 arguments");
        for (const Value& v : p) {
          if (!v.is_int() && !v.is_bool()) {
            type_error("'" + v.type_name() + "' object cannot be interpreted as an integer");
          }
        }
        const auto arg = [&](size_t i) { return p[i].is_int() ? p[i].as_int() : p[i].as_bool(); };
        const int64_t start = p.size() == 1 ? 0 : arg(0);
        const int64_t stop = p.size() == 1 ? arg(0) : arg(1);
        const int64_t step = p.size() == 3 ? arg(2) : 1;
        if (step == 0) type_error("range() arg 3 must not be zero");
        const double count = step > 0 ? (static_cast<double>(stop) - static_cast<double>(start)) /
                                            static_cast<double>(step)
                                      : (static_cast<double>(start) - static_cast<double>(stop)) /
                                            static_cast<double>(-step);
        if (count > static_cast<double>(budget.limits().max_loop_iterations)) {
          type_error("Range too big. The sandbox blocks ranges larger than MAX_RANGE (" +
                     std::to_string(budget.limits().max_loop_iterations) + ").");
        }
        std::vector<Value> items;
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
          items.push_back(Value::integer(i));
        }
        budget.charge_list_items(items.size(), "list");
        return Value::list(std::move(items));
      }));
  out.emplace_back("namespace", Value::callable("namespace", [&budget](CallArgs& args) {
                     Value ns = budget.new_namespace();
                     if (args.positional.size() > 1)
                       type_error("namespace() takes at most 1 positional argument");
                     if (!args.positional.empty()) {
                       const Value& init = args.positional[0];
                       if (!init.is_dict()) type_error("namespace() argument must be a dict");
                       for (const auto& [k, v] : init.as_dict().items) {
                         if (!k.is_string()) type_error("namespace() keywords must be strings");
                         ns.as_namespace().set(k.as_string(), v);
                       }
                     }
                     for (const auto& [k, v] : args.keyword) ns.as_namespace().set(k, v);
                     return ns;
                   }));
  out.emplace_back("dict", Value::callable("dict", [](CallArgs& args) {
                     std::vector<std::pair<Value, Value>> items;
                     if (args.positional.size() > 1) type_error("dict expected at most 1 argument");
                     if (!args.positional.empty()) {
                       if (!args.positional[0].is_dict())
                         type_error("dict() argument must be a dict");
                       items = args.positional[0].as_dict().items;
                     }
                     for (const auto& [k, v] : args.keyword)
                       items.emplace_back(Value::string(k), v);
                     return Value::dict(std::move(items));
                   }));
  out.emplace_back("raise_exception",
                   Value::callable("raise_exception", [](CallArgs& args) -> Value {
                     const BoundArgs a(args, "raise_exception", {"message"});
                     throw RaisedError(a.get(0) == nullptr ? "" : a.get(0)->str());
                   }));
  out.emplace_back("strftime_now", Value::callable("strftime_now", [now](CallArgs& args) {
                     const BoundArgs a(args, "strftime_now", {"format"});
                     const std::string& format = string_arg(a.get(0), "strftime_now", "format");
                     std::tm tm{};
                     if (now) {
                       tm = *now;
                     } else {
                       const std::time_t t = std::time(nullptr);
                       localtime_r(&t, &tm);
                     }
                     return Value::string(format_time(format, tm));
                   }));
  return out;
}

}  // namespace cellm::jinja
