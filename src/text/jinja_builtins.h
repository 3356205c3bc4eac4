// The built-in behaviour of Jinja values as jinja2 gives it under transformers:
// filters, tests, attribute and item access (including Python's str and dict
// methods), slicing, iteration, and the global functions (range, namespace,
// dict, raise_exception, strftime_now). All of it throws TemplateError on
// misuse, with Python's wording where practical. Private to src/text.
#pragma once

#include <ctime>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "jinja_limits.h"
#include "jinja_value.h"

namespace cellm::jinja {

// Names checked at parse time.
bool is_filter(std::string_view name);
bool is_test(std::string_view name);

// value | name(args...). REQUIRES: is_filter(name).
Value apply_filter(Budget& budget, std::string_view name, const Value& value, CallArgs& args);
// value is name(args...). REQUIRES: is_test(name).
bool apply_test(std::string_view name, const Value& value, const CallArgs& args);

// object.name: a dict's key, a namespace's attribute, a str/dict method bound
// to the object; else an Undefined naming what was missing. Undefined objects
// throw (jinja2's default Undefined).
Value get_attribute(Budget& budget, const Value& object, const std::string& name);
// object[key]: list index (negative from the end), dict key, str code point;
// a string key falls back to get_attribute. Missing: Undefined.
Value get_item(Budget& budget, const Value& object, const Value& key);
// object[start:stop:step] for lists and strings; each bound may be none/undefined.
Value get_slice(Budget& budget, const Value& object, const Value& start, const Value& stop,
                const Value& step);
// The items a for loop visits: a list's items, a dict's keys, a string's code
// points, nothing for undefined. Anything else throws.
std::vector<Value> iterate(const Value& value);
// Undefined objects throw "'name' is undefined" (for operations on them).
void require_defined(const Value& value);

// The global functions: range, namespace, dict, raise_exception, strftime_now
// (formatting `now`, or the local time when it is nullopt).
std::vector<std::pair<std::string, Value>> global_functions(Budget& budget,
                                                            std::optional<std::tm> now);

// Binds call arguments to parameter names: positional first, then keywords.
// Too many or unknown arguments throw naming `function`.
class BoundArgs {
 public:
  BoundArgs(const CallArgs& args, std::string_view function, std::vector<std::string> names);
  // The argument for parameter i, or nullptr when not given.
  const Value* get(size_t i) const { return values_[i]; }
  Value get_or(size_t i, Value fallback) const { return values_[i] ? *values_[i] : fallback; }

 private:
  std::vector<const Value*> values_;
};

}  // namespace cellm::jinja
