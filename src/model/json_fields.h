// JsonFields: typed, error-reporting access to the fields of one JSON object of a
// model file (config.json, a safetensors header, an index). Every error names the
// file (`source`) and the field's dotted path. Private to src/model.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "cellm/status.h"

namespace cellm {

// Parses `text`; a syntax error becomes InvalidProgram naming `source` and the byte.
// A number too large for a double (1e400) is not a syntax error to nlohmann::json
// but an out_of_range exception: it becomes InvalidProgram as well.
inline Result<nlohmann::json> parse_json_text(std::string_view text, std::string_view source) {
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    return InvalidProgram(std::string(source) + ": malformed JSON at byte " +
                          std::to_string(e.byte) + ": " + e.what());
  } catch (const nlohmann::json::exception& e) {
    return InvalidProgram(std::string(source) + ": malformed JSON: " + e.what());
  }
}

class JsonFields {
 public:
  // REQUIRES: object->is_object(); *object outlives this.
  JsonFields(const nlohmann::json& object, std::string source, std::string prefix = "")
      : object_(&object), source_(std::move(source)), prefix_(std::move(prefix)) {}

  const std::string& source() const { return source_; }
  // The dotted path of `field` for messages: "rope_scaling.factor".
  std::string path(std::string_view field) const { return prefix_ + std::string(field); }

  // The field's value, or nullptr when it is absent or null.
  const nlohmann::json* find(std::string_view field) const {
    auto it = object_->find(field);
    if (it == object_->end() || it->is_null()) return nullptr;
    return &*it;
  }

  Status error(std::string_view field, const std::string& problem) const {
    return InvalidProgram(source_ + ": " + path(field) + ": " + problem);
  }
  Status missing(std::string_view field) const { return error(field, "missing required field"); }

  Result<std::optional<int64_t>> optional_int(std::string_view field) const {
    const nlohmann::json* v = find(field);
    if (v == nullptr) return std::optional<int64_t>();
    if (v->is_number_integer()) {
      if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t{INT64_MAX}) {
        return error(field, "integer " + v->dump() + " is out of range");
      }
      return std::optional<int64_t>(v->get<int64_t>());
    }
    if (v->is_number_float()) {
      const double d = v->get<double>();
      if (std::isfinite(d) && std::floor(d) == d && std::fabs(d) < 9.0e15) {
        return std::optional<int64_t>(static_cast<int64_t>(d));
      }
    }
    return error(field, "expected an integer, got " + type_and_value(*v));
  }
  Result<int64_t> required_int(std::string_view field) const {
    CELLM_ASSIGN_OR_RETURN(std::optional<int64_t> v, optional_int(field));
    if (!v) return missing(field);
    return *v;
  }

  Result<std::optional<double>> optional_number(std::string_view field) const {
    const nlohmann::json* v = find(field);
    if (v == nullptr) return std::optional<double>();
    if (!v->is_number()) return error(field, "expected a number, got " + type_and_value(*v));
    return std::optional<double>(v->get<double>());
  }
  Result<double> required_number(std::string_view field) const {
    CELLM_ASSIGN_OR_RETURN(std::optional<double> v, optional_number(field));
    if (!v) return missing(field);
    return *v;
  }

  Result<std::optional<bool>> optional_bool(std::string_view field) const {
    const nlohmann::json* v = find(field);
    if (v == nullptr) return std::optional<bool>();
    if (!v->is_boolean()) return error(field, "expected true or false, got " + type_and_value(*v));
    return std::optional<bool>(v->get<bool>());
  }

  Result<std::optional<std::string>> optional_string(std::string_view field) const {
    const nlohmann::json* v = find(field);
    if (v == nullptr) return std::optional<std::string>();
    if (!v->is_string()) return error(field, "expected a string, got " + type_and_value(*v));
    return std::optional<std::string>(v->get<std::string>());
  }

  // A nested object as fields whose paths start with "<field>.".
  Result<std::optional<JsonFields>> optional_object(std::string_view field) const {
    const nlohmann::json* v = find(field);
    if (v == nullptr) return std::optional<JsonFields>();
    if (!v->is_object()) return error(field, "expected an object, got " + type_and_value(*v));
    return std::optional<JsonFields>(JsonFields(*v, source_, path(field) + "."));
  }

  static std::string type_and_value(const nlohmann::json& v) {
    std::string text = v.dump();
    if (text.size() > 40) text = text.substr(0, 37) + "...";
    return std::string(v.type_name()) + " " + text;
  }

 private:
  const nlohmann::json* object_;
  std::string source_;
  std::string prefix_;
};

}  // namespace cellm
