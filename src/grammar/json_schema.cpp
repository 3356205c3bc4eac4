// JSON Schema -> grammar (compile_json_schema), and json_object mode.
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "grammar/grammar_ir.h"
#include "grammar/json_rules.h"

namespace cellm {

namespace {

using grammar::IrBuilder;
using grammar::JsonRules;
using grammar::Sequence;
using grammar::Symbol;
using Json = nlohmann::ordered_json;

const std::set<std::string>& annotations() {
  static const std::set<std::string> k = {"title",    "description", "default",  "examples",
                                          "$schema",  "$id",         "$comment", "deprecated",
                                          "readOnly", "writeOnly"};
  return k;
}
const std::set<std::string>& supported() {
  static const std::set<std::string> k = {
      "type",      "properties",  "required", "additionalProperties",
      "items",     "minItems",    "maxItems", "minLength",
      "maxLength", "enum",        "const",    "$ref",
      "$defs",     "definitions", "anyOf",    "oneOf",
      "allOf"};
  return k;
}

// The deepest nesting of [ and { in `text` (outside strings), to bound the
// parser and the compiler before either recurses.
int json_nesting(std::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

class SchemaCompiler {
 public:
  SchemaCompiler(const Json& root, const GrammarLimits& limits)
      : root_(root), b_(limits), json_(b_) {}

  Result<Grammar> run() {
    const Symbol value = compile(root_, "", 0);
    if (!error_.ok()) return error_;
    const uint32_t top = b_.add_rule("root");
    b_.add_alternative(top, {value, json_.ws()});
    CELLM_ASSIGN_OR_RETURN(grammar::GrammarIr ir, b_.finish(top));
    return grammar::make_grammar(std::move(ir));
  }

 private:
  Symbol fail(const std::string& where, StatusCode code, const std::string& what) {
    if (error_.ok()) {
      error_ = Status(code,
                      "JSON schema at " + (where.empty() ? std::string("/") : where) + ": " + what);
    }
    return json_.null();
  }

  Symbol compile(const Json& s, const std::string& at, int depth) {
    if (!error_.ok()) return json_.null();
    if (depth > b_.limits().max_nesting) {
      return fail(at, StatusCode::kOutOfResources,
                  "schemas nest deeper than " + std::to_string(b_.limits().max_nesting));
    }
    if (s.is_boolean()) {
      if (s.get<bool>()) return json_.any_value();
      return fail(at, StatusCode::kInvalidArgument, "the schema false matches nothing");
    }
    if (!s.is_object()) return fail(at, StatusCode::kInvalidArgument, "a schema must be an object");
    for (const auto& [key, _] : s.items()) {
      if (!supported().count(key) && !annotations().count(key)) {
        return fail(at, StatusCode::kNotSupported, "keyword '" + key + "' is not supported");
      }
    }
    auto constraining = [&](std::initializer_list<const char*> except) {
      for (const auto& [key, _] : s.items()) {
        if (annotations().count(key) || key == "$defs" || key == "definitions") continue;
        bool skip = false;
        for (const char* e : except) skip = skip || key == e;
        if (!skip) return key;
      }
      return std::string();
    };
    if (s.contains("$ref")) {
      if (auto other = constraining({"$ref"}); !other.empty()) {
        return fail(at, StatusCode::kNotSupported,
                    "'" + other + "' beside '$ref' is not supported");
      }
      return ref(s["$ref"], at + "/$ref", depth);
    }
    if (s.contains("allOf")) {
      const Json& all = s["allOf"];
      if (!all.is_array() || all.size() != 1) {
        return fail(at + "/allOf", StatusCode::kNotSupported,
                    "'allOf' is supported with exactly one schema");
      }
      if (auto other = constraining({"allOf"}); !other.empty()) {
        return fail(at, StatusCode::kNotSupported,
                    "'" + other + "' beside 'allOf' is not supported");
      }
      return compile(all[0], at + "/allOf/0", depth + 1);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      const Json& options = s[key];
      if (!options.is_array() || options.empty()) {
        return fail(at + "/" + key, StatusCode::kInvalidArgument, "must be a non-empty array");
      }
      if (auto other = constraining({key}); !other.empty()) {
        return fail(at, StatusCode::kNotSupported,
                    "'" + other + "' beside '" + key + "' is not supported");
      }
      std::vector<Sequence> alts;
      for (size_t i = 0; i < options.size(); ++i) {
        alts.push_back({compile(options[i], at + "/" + key + "/" + std::to_string(i), depth + 1)});
      }
      return b_.rule_of(key, std::move(alts));
    }
    if (s.contains("const")) return b_.rule_of("const", {b_.literal(s["const"].dump())});
    if (s.contains("enum")) {
      const Json& values = s["enum"];
      if (!values.is_array() || values.empty()) {
        return fail(at + "/enum", StatusCode::kInvalidArgument, "must be a non-empty array");
      }
      std::vector<std::string> texts;
      for (const Json& v : values) texts.push_back(v.dump());
      return b_.literal_choice(std::move(texts), "enum");
    }
    return typed(s, at, depth);
  }

  // The value of a schema by its "type" (a name, a list, or implied by keywords).
  Symbol typed(const Json& s, const std::string& at, int depth) {
    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const Json& x : t) {
          if (!x.is_string()) break;
          types.push_back(x.get<std::string>());
        }
        if (types.size() != t.size()) types.clear();
      }
      if (types.empty()) {
        return fail(at + "/type", StatusCode::kInvalidArgument,
                    "must be a type name or a non-empty list of them");
      }
    } else if (s.contains("properties") || s.contains("additionalProperties") ||
               s.contains("required")) {
      types.push_back("object");
    } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
      types.push_back("array");
    } else if (s.contains("minLength") || s.contains("maxLength")) {
      types.push_back("string");
    } else {
      return json_.any_value();
    }
    std::vector<Sequence> alts;
    for (const std::string& type : types) {
      if (type == "object") {
        alts.push_back({object(s, at, depth)});
      } else if (type == "array") {
        alts.push_back({array(s, at, depth)});
      } else if (type == "string") {
        const int min = count(s, "minLength", at, 0), max = count(s, "maxLength", at, -1);
        if (max >= 0 && max < min) {
          return fail(at, StatusCode::kInvalidArgument, "maxLength is below minLength");
        }
        alts.push_back({(min == 0 && max < 0) ? json_.string() : json_.string(min, max)});
      } else if (type == "number") {
        alts.push_back({json_.number()});
      } else if (type == "integer") {
        alts.push_back({json_.integer()});
      } else if (type == "boolean") {
        alts.push_back({json_.boolean()});
      } else if (type == "null") {
        alts.push_back({json_.null()});
      } else {
        return fail(at + "/type", StatusCode::kInvalidArgument, "unknown type '" + type + "'");
      }
    }
    if (alts.size() == 1) return alts[0][0];
    return b_.rule_of("types", std::move(alts));
  }

  // A non-negative integer keyword, or `absent` when missing.
  int count(const Json& s, const char* key, const std::string& at, int absent) {
    if (!s.contains(key)) return absent;
    const Json& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) {
      fail(at + "/" + key, StatusCode::kInvalidArgument, "must be a non-negative integer");
      return absent;
    }
    if (v.get<int64_t>() > b_.limits().max_repetition) {
      fail(at + "/" + key, StatusCode::kOutOfResources,
           "exceeds " + std::to_string(b_.limits().max_repetition));
      return absent;
    }
    return static_cast<int>(v.get<int64_t>());
  }

  Symbol array(const Json& s, const std::string& at, int depth) {
    const int min = count(s, "minItems", at, 0), max = count(s, "maxItems", at, -1);
    if (max >= 0 && max < min) {
      return fail(at, StatusCode::kInvalidArgument, "maxItems is below minItems");
    }
    const Symbol item =
        s.contains("items") ? compile(s["items"], at + "/items", depth + 1) : json_.any_value();
    return json_.array_of(item, min, max, "array");
  }

  Symbol object(const Json& s, const std::string& at, int depth) {
    const Json empty = Json::object();
    const Json& props = s.contains("properties") ? s["properties"] : empty;
    if (!props.is_object()) {
      return fail(at + "/properties", StatusCode::kInvalidArgument, "must be an object");
    }
    std::set<std::string> required;
    if (s.contains("required")) {
      const Json& r = s["required"];
      if (!r.is_array()) {
        return fail(at + "/required", StatusCode::kInvalidArgument, "must be an array of names");
      }
      for (const Json& name : r) {
        if (!name.is_string()) {
          return fail(at + "/required", StatusCode::kInvalidArgument, "must be an array of names");
        }
        if (!props.contains(name.get<std::string>())) {
          return fail(at + "/required", StatusCode::kNotSupported,
                      "required property '" + name.get<std::string>() +
                          "' is not declared in 'properties'");
        }
        required.insert(name.get<std::string>());
      }
    }
    const Json* additional =
        s.contains("additionalProperties") ? &s["additionalProperties"] : nullptr;
    if (props.empty()) {
      if (additional == nullptr || additional->is_boolean()) {
        if (additional != nullptr && !additional->get<bool>()) {
          const Symbol open = b_.byte('{');
          return b_.rule_of("empty-object", {{open, json_.ws(), b_.byte('}')}});
        }
        return json_.any_object();
      }
      return json_.map_of(compile(*additional, at + "/additionalProperties", depth + 1), "map");
    }
    if (additional != nullptr && !additional->is_boolean()) {
      return fail(at + "/additionalProperties", StatusCode::kNotSupported,
                  "a schema for additional properties beside 'properties' is not supported");
    }
    // Members in the schema's order. F_i: none written yet, next candidate i;
    // T_i: some written, next candidate i. An optional member may be skipped.
    std::vector<Symbol> member;
    std::vector<bool> optional;
    for (const auto& [name, sub] : props.items()) {
      const Symbol value = compile(sub, at + "/properties/" + escape_pointer(name), depth + 1);
      Sequence kv = b_.literal(Json(name).dump());
      kv.insert(kv.end(), {json_.ws(), b_.byte(':'), json_.ws(), value, json_.ws()});
      member.push_back(b_.rule_of("member", {kv}));
      optional.push_back(!required.count(name));
    }
    const size_t n = member.size();
    std::vector<Symbol> first(n + 1), then(n + 1);
    first[n] = then[n] = b_.rule_of("members-end", {{}});
    for (size_t i = n; i-- > 0;) {
      std::vector<Sequence> t_alts{{b_.byte(','), json_.ws(), member[i], then[i + 1]}};
      std::vector<Sequence> f_alts{{member[i], then[i + 1]}};
      if (optional[i]) {
        t_alts.push_back({then[i + 1]});
        f_alts.push_back({first[i + 1]});
      }
      then[i] = b_.rule_of("members-then", std::move(t_alts));
      first[i] = b_.rule_of("members", std::move(f_alts));
    }
    return b_.rule_of("object", {{b_.byte('{'), json_.ws(), first[0], b_.byte('}')}});
  }

  static std::string escape_pointer(const std::string& name) {
    std::string out;
    for (char c : name) {
      if (c == '~') {
        out += "~0";
      } else if (c == '/') {
        out += "~1";
      } else {
        out += c;
      }
    }
    return out;
  }

  Symbol ref(const Json& target, const std::string& at, int depth) {
    if (!target.is_string()) return fail(at, StatusCode::kInvalidArgument, "must be a string");
    const std::string pointer = target.get<std::string>();
    if (auto it = refs_.find(pointer); it != refs_.end()) return Symbol{true, it->second};
    if (pointer.empty() || pointer[0] != '#') {
      return fail(
          at, StatusCode::kNotSupported,
          "only references within the document ('#...') are supported, not '" + pointer + "'");
    }
    // Walk the JSON pointer after '#'.
    const Json* node = &root_;
    std::string rest = pointer.substr(1);
    if (!rest.empty() && rest[0] != '/') {
      return fail(at, StatusCode::kNotSupported,
                  "reference '" + pointer + "' is not a JSON pointer");
    }
    size_t pos = 0;
    while (pos < rest.size()) {
      size_t next = rest.find('/', pos + 1);
      if (next == std::string::npos) next = rest.size();
      std::string token = rest.substr(pos + 1, next - pos - 1);
      std::string key;
      for (size_t i = 0; i < token.size(); ++i) {
        if (token[i] == '~' && i + 1 < token.size() &&
            (token[i + 1] == '0' || token[i + 1] == '1')) {
          key += token[i + 1] == '0' ? '~' : '/';
          ++i;
        } else {
          key += token[i];
        }
      }
      if (node->is_object() && node->contains(key)) {
        node = &(*node)[key];
      } else if (node->is_array() && !key.empty() &&
                 key.find_first_not_of("0123456789") == std::string::npos && key.size() < 9 &&
                 std::stoul(key) < node->size()) {
        node = &(*node)[std::stoul(key)];
      } else {
        return fail(at, StatusCode::kNotFound, "reference '" + pointer + "' points to nothing");
      }
      pos = next;
    }
    // The rule exists before its body, so recursive references find it.
    const uint32_t rule = b_.add_rule("ref");
    refs_.emplace(pointer, rule);
    const Symbol body = compile(*node, pointer.substr(1), depth + 1);
    b_.add_alternative(rule, {body});
    return Symbol{true, rule};
  }

  const Json& root_;
  IrBuilder b_;
  JsonRules json_;
  std::map<std::string, uint32_t> refs_;
  Status error_;
};

}  // namespace

Result<Grammar> compile_json_schema(std::string_view schema_json, const GrammarLimits& limits) {
  if (schema_json.size() > limits.max_input_bytes) {
    return OutOfResources("JSON schema: " + std::to_string(schema_json.size()) +
                          " bytes exceed the limit of " + std::to_string(limits.max_input_bytes));
  }
  if (json_nesting(schema_json) > 2 * limits.max_nesting + 2) {
    return OutOfResources("JSON schema: brackets nest deeper than " +
                          std::to_string(2 * limits.max_nesting + 2));
  }
  Json root = Json::parse(schema_json, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    // Re-parse with exceptions only to recover the position for the message.
    try {
      const Json unused = Json::parse(schema_json);
      (void)unused;
    } catch (const Json::parse_error& e) {
      return InvalidArgument(std::string("JSON schema is not valid JSON: ") + e.what());
    }
    return InvalidArgument("JSON schema is not valid JSON");
  }
  return SchemaCompiler(root, limits).run();
}

Result<Grammar> compile_json_object(const GrammarLimits& limits) {
  IrBuilder b(limits);
  JsonRules json(b);
  const Symbol object = json.any_object();
  const uint32_t top = b.add_rule("root");
  b.add_alternative(top, {object, json.ws()});
  CELLM_ASSIGN_OR_RETURN(grammar::GrammarIr ir, b.finish(top));
  return grammar::make_grammar(std::move(ir));
}

}  // namespace cellm
