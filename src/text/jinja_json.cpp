#include "jinja_json.h"

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace cellm::jinja {
namespace {

Value convert(const nlohmann::ordered_json& json, int depth) {
  using Type = nlohmann::ordered_json::value_t;
  switch (json.type()) {
    case Type::null:
    case Type::discarded:
      return Value::none();
    case Type::boolean:
      return Value::boolean(json.get<bool>());
    case Type::number_integer:
      return Value::integer(json.get<int64_t>());
    case Type::number_unsigned: {
      const uint64_t u = json.get<uint64_t>();
      // Python's int is unbounded; beyond int64 the nearest double is the best we hold.
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Value::floating(static_cast<double>(u));
      }
      return Value::integer(static_cast<int64_t>(u));
    }
    case Type::number_float:
      return Value::floating(json.get<double>());
    case Type::string:
      return Value::string(json.get<std::string>());
    case Type::binary:
      throw TemplateError("binary JSON values have no template equivalent");
    case Type::array:
    case Type::object:
      break;
  }
  if (depth >= kMaxValueDepth) {
    throw TemplateError("JSON input nested deeper than " + std::to_string(kMaxValueDepth));
  }
  if (json.is_array()) {
    std::vector<Value> items;
    items.reserve(json.size());
    for (const auto& item : json) items.push_back(convert(item, depth + 1));
    return Value::list(std::move(items));
  }
  std::vector<std::pair<Value, Value>> items;
  items.reserve(json.size());
  for (const auto& [key, value] : json.items()) {
    items.emplace_back(Value::string(key), convert(value, depth + 1));
  }
  // A JSON object's keys are distinct.
  return Value::dict_of_distinct_keys(std::move(items));
}

}  // namespace

Value from_json(const nlohmann::ordered_json& json) {
  return convert(json, 0);
}

}  // namespace cellm::jinja
