// jinja::Value: the data a chat template computes with, modelled on the Python
// objects jinja2 would see: undefined, none, bool, int, float, str, list/tuple,
// dict (insertion-ordered), namespace (the one mutable kind) and callable.
//
// Values are cheap to copy: strings and containers are shared and immutable;
// a namespace is shared by reference, as in Python. Lists and dicts record their
// nesting depth so that no value is deeper than kMaxValueDepth (printing and
// destruction recurse over it).
//
// Errors inside the interpreter are TemplateError exceptions; they never leave
// src/text (ChatTemplate turns them into a Status). Private to src/text.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace cellm::jinja {

inline constexpr int kMaxValueDepth = 100;

// A template error: its message, and the template position (1-based) when known.
class TemplateError : public std::exception {
 public:
  explicit TemplateError(std::string message, int line = 0, int column = 0)
      : message_(std::move(message)), line_(line), column_(column) {}
  const char* what() const noexcept override { return message_.c_str(); }
  const std::string& message() const { return message_; }
  int line() const { return line_; }
  int column() const { return column_; }
  bool has_position() const { return line_ > 0; }

 private:
  std::string message_;
  int line_;
  int column_;
};

// raise_exception("message") in a template: the message is the template's own.
class RaisedError : public TemplateError {
 public:
  explicit RaisedError(std::string message) : TemplateError(std::move(message)) {}
};

class Value;

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

struct Undefined {
  std::string name;  // what was looked up, for "'x' is undefined"
};
struct ListData;
struct DictData;
struct NamespaceData;
struct Callable;

class Value {
 public:
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kCallable
  };

  Value() : v_(Undefined{}) {}
  static Value undefined(std::string name) { return Value(Undefined{std::move(name)}); }
  static Value none() { return Value(nullptr); }
  static Value boolean(bool b) { return Value(b); }
  static Value integer(int64_t i) { return Value(i); }
  static Value floating(double d) { return Value(d); }
  static Value string(std::string s) {
    return Value(std::make_shared<const std::string>(std::move(s)));
  }
  // REQUIRES: no item deeper than kMaxValueDepth - 1 (else TemplateError).
  static Value list(std::vector<Value> items, bool is_tuple = false);
  static Value dict(std::vector<std::pair<Value, Value>> items);
  // A dict whose keys the caller knows to be distinct (e.g. a JSON object's): no
  // duplicate search, so building it is linear. REQUIRES: distinct keys.
  static Value dict_of_distinct_keys(std::vector<std::pair<Value, Value>> items);
  static Value namespace_object(std::shared_ptr<NamespaceData> ns) { return Value(std::move(ns)); }
  static Value callable(std::string name, std::function<Value(CallArgs&)> fn);

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  bool is_bool() const { return kind() == Kind::kBool; }
  // int, float or bool (Python's bool is an int).
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_namespace() const { return kind() == Kind::kNamespace; }
  bool is_callable() const { return kind() == Kind::kCallable; }

  // The value as one type. A value of another type is the template's type
  // error (Python's TypeError), never a crash: a builtin that forgot to check
  // what a template passed it fails the render, not the process.
  bool as_bool() const { return alternative<bool>("bool"); }
  int64_t as_int() const { return alternative<int64_t>("int"); }
  double as_float() const { return alternative<double>("float"); }
  const std::string& as_string() const { return *alternative<StringPtr>("str"); }
  const ListData& as_list() const { return *alternative<ListPtr>("list"); }
  const DictData& as_dict() const { return *alternative<DictPtr>("dict"); }
  NamespaceData& as_namespace() const { return *alternative<NamespacePtr>("namespace"); }
  const Callable& as_callable() const { return *alternative<CallablePtr>("callable"); }
  const std::string& undefined_name() const { return alternative<Undefined>("undefined").name; }
  // A number as a double. REQUIRES: is_number().
  double to_double() const;
  // Nesting depth of lists and dicts: 0 for scalars.
  int depth() const;
  // Identity of the shared object (namespaces and callables compare by it).
  const void* identity() const;

  // Python's truthiness (undefined is false).
  bool truthy() const;
  // Python's str(): what {{ value }} prints (undefined prints nothing).
  std::string str() const;
  // Python's repr(), as lists print their items.
  std::string repr() const;
  // Python's type name, for messages: "str", "int", "NoneType", "list", ...
  std::string type_name() const;

 private:
  using StringPtr = std::shared_ptr<const std::string>;
  using ListPtr = std::shared_ptr<const ListData>;
  using DictPtr = std::shared_ptr<const DictData>;
  using NamespacePtr = std::shared_ptr<NamespaceData>;
  using CallablePtr = std::shared_ptr<const Callable>;
  // Alternatives in Kind order.
  using Variant = std::variant<Undefined, std::nullptr_t, bool, int64_t, double, StringPtr, ListPtr,
                               DictPtr, NamespacePtr, CallablePtr>;
  template <typename T>
  explicit Value(T v) : v_(std::move(v)) {}
  void repr_into(std::string& out, int depth) const;
  template <typename T>
  const T& alternative(const char* type) const {
    if (const T* v = std::get_if<T>(&v_)) return *v;
    throw TemplateError(std::string("expected a value of type '") + type + "', got '" +
                        type_name() + "'");
  }

  Variant v_;
};

struct ListData {
  std::vector<Value> items;
  bool is_tuple = false;
  int depth = 1;
};

struct DictData {
  std::vector<std::pair<Value, Value>> items;  // insertion order, unique keys
  int depth = 1;
  // The value under `key` (Python equality), or nullptr.
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
};

// namespace(): attributes assigned with {% set ns.x = ... %}.
struct NamespaceData {
  std::vector<std::pair<std::string, Value>> attrs;
  const Value* find(std::string_view name) const;
  void set(const std::string& name, Value value);
};

struct Callable {
  std::string name;
  std::function<Value(CallArgs&)> fn;
};

// Python ==, across bool/int/float and deeply for containers.
bool equals(const Value& a, const Value& b);
// Python <: numbers, strings (code point order), lists lexicographically;
// anything else is a TemplateError naming the types.
bool less_than(const Value& a, const Value& b);
// Python's repr of a float: shortest round-trip digits, "1.0", "1e+20", "inf".
std::string format_float(double d);
// json.dumps(value, ensure_ascii=False, indent=indent, separators=..., sort_keys=sort_keys),
// as transformers' tojson filter calls it. indent < 0 means None (one line).
struct JsonFormat {
  int indent = -1;
  bool sort_keys = false;
  std::optional<std::string> item_separator;  // nullopt: ", " without indent, "," with it
  std::string key_separator = ": ";
};
std::string to_json(const Value& value, const JsonFormat& format);

}  // namespace cellm::jinja
