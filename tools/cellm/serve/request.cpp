#include "serve/request.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <utility>

#include "cellm/sampler.h"

namespace cellm::cli {
namespace {

using nlohmann::json;

constexpr int32_t kMaxTopLogprobs = 20;
constexpr size_t kMaxStopStrings = 16;
constexpr size_t kMaxStopBytes = 256;

const char* type_name(const json& v) {
  return v.type_name();
}

// A present, non-null field, or nullptr.
const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

ApiResult<std::optional<int64_t>> read_int(const json& body, const char* name, int64_t min_value,
                                           int64_t max_value) {
  const json* v = field(body, name);
  if (v == nullptr) return std::optional<int64_t>();
  if (!v->is_number_integer()) {
    return invalid_field(name,
                         std::string("'") + name + "' must be an integer, got " + type_name(*v));
  }
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(max_value)) {
    return invalid_field(
        name, std::string("'") + name + "' must be at most " + std::to_string(max_value));
  }
  const int64_t x = v->get<int64_t>();
  if (x < min_value || x > max_value) {
    return invalid_field(name, std::string("'") + name + "' must be in [" +
                                   std::to_string(min_value) + ", " + std::to_string(max_value) +
                                   "], got " + std::to_string(x));
  }
  return std::optional<int64_t>(x);
}

ApiResult<std::optional<double>> read_number(const json& body, const char* name, double min_value,
                                             double max_value) {
  const json* v = field(body, name);
  if (v == nullptr) return std::optional<double>();
  if (!v->is_number()) {
    return invalid_field(name,
                         std::string("'") + name + "' must be a number, got " + type_name(*v));
  }
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < min_value || x > max_value) {
    return invalid_field(name, std::string("'") + name + "' must be in [" +
                                   std::to_string(min_value) + ", " + std::to_string(max_value) +
                                   "]");
  }
  return std::optional<double>(x);
}

ApiResult<std::optional<bool>> read_bool(const json& body, const char* name) {
  const json* v = field(body, name);
  if (v == nullptr) return std::optional<bool>();
  if (!v->is_boolean()) {
    return invalid_field(name,
                         std::string("'") + name + "' must be a boolean, got " + type_name(*v));
  }
  return std::optional<bool>(v->get<bool>());
}

ApiResult<std::optional<std::string>> read_string(const json& body, const char* name) {
  const json* v = field(body, name);
  if (v == nullptr) return std::optional<std::string>();
  if (!v->is_string()) {
    return invalid_field(name,
                         std::string("'") + name + "' must be a string, got " + type_name(*v));
  }
  return std::optional<std::string>(v->get<std::string>());
}

// Unwraps `r` into `out`, or returns its error from the enclosing function.
#define SERVE_TRY(out, expr)                                   \
  do {                                                         \
    auto serve_r_ = (expr);                                    \
    if (auto* e = std::get_if<ApiError>(&serve_r_)) return *e; \
    out = std::move(std::get<0>(serve_r_));                    \
  } while (0)

ApiResult<std::vector<std::string>> read_stop(const json& body) {
  const json* v = field(body, "stop");
  std::vector<std::string> stops;
  if (v == nullptr) return stops;
  if (v->is_string()) {
    stops.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    if (v->size() > kMaxStopStrings) {
      return invalid_field("stop",
                           "'stop' holds at most " + std::to_string(kMaxStopStrings) + " strings");
    }
    for (const json& s : *v) {
      if (!s.is_string()) return invalid_field("stop", "'stop' must hold only strings");
      stops.push_back(s.get<std::string>());
    }
  } else {
    return invalid_field(
        "stop", std::string("'stop' must be a string or a list of strings, got ") + type_name(*v));
  }
  for (const std::string& s : stops) {
    if (s.size() > kMaxStopBytes) {
      return invalid_field("stop",
                           "a stop string is at most " + std::to_string(kMaxStopBytes) + " bytes");
    }
  }
  return stops;
}

// Every top-level field a request may carry, per endpoint. A field the server
// implements is read by the parsers below; a field that cannot change the answer
// (who sent it, metadata for the client's own records) is accepted and ignored;
// any other field, a known one cellm does not implement or one nobody defines,
// is refused with a 400 naming it, as OpenAI's API refuses unrecognized
// arguments. Nothing changes the answer silently.
enum FieldUse : uint8_t { kRead, kIgnored };
constexpr uint8_t kOnCompletions = 1;
constexpr uint8_t kOnChat = 2;
constexpr uint8_t kOnBoth = kOnCompletions | kOnChat;

struct KnownField {
  const char* name;
  uint8_t endpoints;
  FieldUse use;
};

constexpr KnownField kKnownFields[] = {
    {"model", kOnBoth, kRead},
    {"max_tokens", kOnBoth, kRead},
    {"temperature", kOnBoth, kRead},
    {"top_p", kOnBoth, kRead},
    {"top_k", kOnBoth, kRead},
    {"min_p", kOnBoth, kRead},
    {"seed", kOnBoth, kRead},
    {"stop", kOnBoth, kRead},
    {"n", kOnBoth, kRead},
    {"best_of", kOnBoth, kRead},
    {"stream", kOnBoth, kRead},
    {"stream_options", kOnBoth, kRead},
    {"ignore_eos", kOnBoth, kRead},
    {"logprobs", kOnBoth, kRead},
    {"presence_penalty", kOnBoth, kRead},
    {"frequency_penalty", kOnBoth, kRead},
    {"repetition_penalty", kOnBoth, kRead},
    {"logit_bias", kOnBoth, kRead},
    {"min_tokens", kOnBoth, kRead},
    {"stop_token_ids", kOnBoth, kRead},
    {"response_format", kOnBoth, kRead},
    {"guided_json", kOnBoth, kRead},
    {"guided_regex", kOnBoth, kRead},
    {"guided_choice", kOnBoth, kRead},
    {"guided_grammar", kOnBoth, kRead},
    {"structured_outputs", kOnBoth, kRead},
    {"user", kOnBoth, kRead},
    {"prompt", kOnCompletions, kRead},
    {"echo", kOnCompletions, kRead},
    {"suffix", kOnCompletions, kRead},  // refused when present
    {"messages", kOnChat, kRead},
    {"max_completion_tokens", kOnChat, kRead},
    {"top_logprobs", kOnChat, kRead},
    {"tools", kOnChat, kRead},  // these four: chat_request.cpp
    {"tool_choice", kOnChat, kRead},
    {"parallel_tool_calls", kOnChat, kRead},
    {"chat_template_kwargs", kOnChat, kRead},
    // The client's own bookkeeping: no effect on what is generated.
    {"metadata", kOnChat, kIgnored},
    {"store", kOnChat, kIgnored},
    {"prompt_cache_key", kOnChat, kIgnored},  // a hint; every prefix is cached anyway
    {"safety_identifier", kOnChat, kIgnored},
};

std::optional<ApiError> refuse_unknown_fields(const json& body, Endpoint endpoint) {
  const uint8_t here = endpoint == Endpoint::kChat ? kOnChat : kOnCompletions;
  for (const auto& [name, value] : body.items()) {
    bool known = false;
    for (const KnownField& f : kKnownFields) {
      if (name == f.name && (f.endpoints & here) != 0) {
        known = true;
        break;
      }
    }
    if (!known) {
      const std::string where =
          endpoint == Endpoint::kChat ? "/v1/chat/completions" : "/v1/completions";
      return invalid_field(name, "'" + name + "' is not supported by " + where + " on this server");
    }
  }
  return std::nullopt;
}

// Fields that would change the answer and that cellm does not implement.
std::optional<ApiError> refuse_unsupported(const json& body) {
  if (const json* v = field(body, "suffix"); v != nullptr) {
    return invalid_field("suffix", "'suffix' is not supported");
  }
  return std::nullopt;
}

constexpr size_t kMaxLogitBias = 1024;
constexpr size_t kMaxStopTokenIds = 64;
constexpr size_t kMaxChoices = 1024;

// A token id of the vocabulary, for the 400 of `name`.
std::optional<ApiError> check_token_id(int64_t id, const RequestLimits& limits,
                                       const std::string& name) {
  if (id < 0 || id >= limits.vocab_size) {
    return invalid_field(name, "'" + name + "' holds token id " + std::to_string(id) +
                                   ", outside the vocabulary [0, " +
                                   std::to_string(limits.vocab_size) + ")");
  }
  return std::nullopt;
}

// presence_penalty, frequency_penalty, repetition_penalty, logit_bias, min_tokens
// and stop_token_ids into f.penalties and f.stop_token_ids.
std::optional<ApiError> read_sampling_controls(const json& body, const RequestLimits& limits,
                                               GenerationFields& f) {
  std::optional<double> x;
  SERVE_TRY(x, read_number(body, "presence_penalty", -2.0, 2.0));
  f.penalties.presence_penalty = static_cast<float>(x.value_or(0.0));
  SERVE_TRY(x, read_number(body, "frequency_penalty", -2.0, 2.0));
  f.penalties.frequency_penalty = static_cast<float>(x.value_or(0.0));
  SERVE_TRY(x, read_number(body, "repetition_penalty", 0.0, std::numeric_limits<float>::max()));
  if (x && *x <= 0.0) {
    return invalid_field("repetition_penalty", "'repetition_penalty' must be greater than 0");
  }
  f.penalties.repetition_penalty = static_cast<float>(x.value_or(1.0));

  if (const json* v = field(body, "logit_bias")) {
    if (!v->is_object()) {
      return invalid_field("logit_bias",
                           "'logit_bias' must be an object of token ids to numbers, got " +
                               std::string(type_name(*v)));
    }
    if (v->size() > kMaxLogitBias) {
      return invalid_field(
          "logit_bias", "'logit_bias' holds at most " + std::to_string(kMaxLogitBias) + " tokens");
    }
    for (const auto& [key, value] : v->items()) {
      // A key is a decimal token id ("50256"), as OpenAI's API takes it.
      int64_t id = 0;
      bool digits = !key.empty() && key.size() <= 10;
      for (char c : key) {
        if (c < '0' || c > '9') digits = false;
      }
      if (!digits) {
        return invalid_field(
            "logit_bias", "'logit_bias' keys must be token ids, got '" + key.substr(0, 32) + "'");
      }
      id = std::stoll(key);
      if (auto e = check_token_id(id, limits, "logit_bias")) return e;
      if (!value.is_number() || !std::isfinite(value.get<double>()) ||
          value.get<double>() < -100.0 || value.get<double>() > 100.0) {
        return invalid_field(
            "logit_bias", "'logit_bias' values must be numbers in [-100, 100] (token " + key + ")");
      }
      for (const auto& [other, bias] : f.penalties.logit_bias) {
        if (other == static_cast<Token>(id)) {
          return invalid_field("logit_bias", "'logit_bias' names token " + key + " twice");
        }
      }
      f.penalties.logit_bias.emplace_back(static_cast<Token>(id), value.get<float>());
    }
  }

  std::optional<int64_t> i;
  SERVE_TRY(i, read_int(body, "min_tokens", 0, std::numeric_limits<int32_t>::max()));
  f.penalties.min_tokens = static_cast<int32_t>(i.value_or(0));
  if (f.max_tokens && f.penalties.min_tokens > *f.max_tokens) {
    return invalid_field("min_tokens", "'min_tokens' (" + std::to_string(f.penalties.min_tokens) +
                                           ") must not exceed 'max_tokens' (" +
                                           std::to_string(*f.max_tokens) + ")");
  }

  if (const json* v = field(body, "stop_token_ids")) {
    if (!v->is_array()) {
      return invalid_field("stop_token_ids", "'stop_token_ids' must be a list of token ids");
    }
    if (v->size() > kMaxStopTokenIds) {
      return invalid_field("stop_token_ids", "'stop_token_ids' holds at most " +
                                                 std::to_string(kMaxStopTokenIds) + " ids");
    }
    for (const json& t : *v) {
      if (!t.is_number_integer()) {
        return invalid_field("stop_token_ids", "'stop_token_ids' must hold only integers");
      }
      const int64_t id = t.is_number_unsigned() && t.get<uint64_t>() > (uint64_t{1} << 62)
                             ? std::numeric_limits<int64_t>::max()
                             : t.get<int64_t>();
      if (auto e = check_token_id(id, limits, "stop_token_ids")) return e;
      f.stop_token_ids.push_back(static_cast<Token>(id));
    }
  }
  return std::nullopt;
}

// One constraint's JSON schema: an object, or a string holding one (guided_json).
ApiResult<std::string> schema_text(const json& v, const std::string& name) {
  if (v.is_object() || v.is_boolean()) return v.dump();
  if (v.is_string()) return v.get<std::string>();
  return invalid_field(name, "'" + name + "' must be a JSON schema (an object or a string), got " +
                                 std::string(type_name(v)));
}

ApiResult<std::vector<std::string>> choice_list(const json& v, const std::string& name) {
  if (!v.is_array() || v.empty()) {
    return invalid_field(name, "'" + name + "' must be a non-empty list of strings");
  }
  if (v.size() > kMaxChoices) {
    return invalid_field(
        name, "'" + name + "' holds at most " + std::to_string(kMaxChoices) + " strings");
  }
  std::vector<std::string> out;
  for (const json& c : v) {
    if (!c.is_string()) return invalid_field(name, "'" + name + "' must hold only strings");
    out.push_back(c.get<std::string>());
  }
  return out;
}

ApiResult<std::string> string_of(const json& v, const std::string& name) {
  if (!v.is_string()) {
    return invalid_field(name, "'" + name + "' must be a string, got " + std::string(type_name(v)));
  }
  return v.get<std::string>();
}

// The constraint of response_format: nullopt for {"type": "text"}.
ApiResult<std::optional<StructuredConstraint>> response_format_constraint(const json& v) {
  if (!v.is_object() || !v.contains("type") || !v["type"].is_string()) {
    return invalid_field("response_format",
                         "'response_format' must be an object with a string 'type'");
  }
  const std::string type = v["type"].get<std::string>();
  StructuredConstraint c;
  c.field = "response_format";
  if (type == "text") return std::optional<StructuredConstraint>();
  if (type == "json_object") {
    c.kind = ConstraintKind::kJsonObject;
    return std::optional<StructuredConstraint>(std::move(c));
  }
  if (type != "json_schema") {
    return invalid_field("response_format.type",
                         "'response_format.type' must be \"text\", \"json_object\" or "
                         "\"json_schema\", got \"" +
                             type.substr(0, 64) + "\"");
  }
  auto js = v.find("json_schema");
  if (js == v.end() || !js->is_object()) {
    return invalid_field("response_format.json_schema",
                         "'response_format.json_schema' must be an object holding 'schema'");
  }
  for (const auto& [key, value] : js->items()) {
    if (key != "name" && key != "schema" && key != "strict" && key != "description") {
      return invalid_field("response_format.json_schema." + key,
                           "'response_format.json_schema." + key + "' is not supported");
    }
  }
  if (js->contains("name") && !(*js)["name"].is_string()) {
    return invalid_field("response_format.json_schema.name",
                         "'response_format.json_schema.name' must be a string");
  }
  if (js->contains("strict") && !(*js)["strict"].is_boolean() && !(*js)["strict"].is_null()) {
    return invalid_field("response_format.json_schema.strict",
                         "'response_format.json_schema.strict' must be a boolean");
  }
  auto schema = js->find("schema");
  if (schema == js->end() || !schema->is_object()) {
    return invalid_field("response_format.json_schema.schema",
                         "'response_format.json_schema.schema' must be a JSON schema object");
  }
  c.kind = ConstraintKind::kJsonSchema;
  c.field = "response_format.json_schema.schema";
  c.text = schema->dump();
  return std::optional<StructuredConstraint>(std::move(c));
}

// One of the keys of vLLM's structured_outputs / guided_* families.
ApiResult<StructuredConstraint> family_constraint(const std::string& kind, const json& v,
                                                  const std::string& name) {
  StructuredConstraint c;
  c.field = name;
  if (kind == "json") {
    c.kind = ConstraintKind::kJsonSchema;
    SERVE_TRY(c.text, schema_text(v, name));
  } else if (kind == "regex") {
    c.kind = ConstraintKind::kRegex;
    SERVE_TRY(c.text, string_of(v, name));
  } else if (kind == "choice") {
    c.kind = ConstraintKind::kChoice;
    SERVE_TRY(c.choices, choice_list(v, name));
  } else if (kind == "grammar") {
    c.kind = ConstraintKind::kGbnf;
    SERVE_TRY(c.text, string_of(v, name));
  } else {  // json_object
    if (!v.is_boolean()) return invalid_field(name, "'" + name + "' must be a boolean");
    c.kind = ConstraintKind::kJsonObject;
  }
  return c;
}

// The request's one constraint, if any; 400 naming the fields when several are given.
ApiResult<std::optional<StructuredConstraint>> read_constraint(const json& body) {
  std::vector<StructuredConstraint> found;
  if (const json* v = field(body, "response_format")) {
    std::optional<StructuredConstraint> c;
    SERVE_TRY(c, response_format_constraint(*v));
    if (c) found.push_back(std::move(*c));
  }
  for (const char* kind : {"json", "regex", "choice", "grammar"}) {
    const std::string name = std::string("guided_") + kind;
    if (const json* v = field(body, name.c_str())) {
      StructuredConstraint c;
      SERVE_TRY(c, family_constraint(kind, *v, name));
      found.push_back(std::move(c));
    }
  }
  if (const json* so = field(body, "structured_outputs")) {
    if (!so->is_object()) {
      return invalid_field("structured_outputs", "'structured_outputs' must be an object");
    }
    for (const auto& [key, value] : so->items()) {
      const std::string name = "structured_outputs." + key;
      if (key != "json" && key != "regex" && key != "choice" && key != "grammar" &&
          key != "json_object") {
        return invalid_field(name, "'" + name + "' is not supported on this server");
      }
      if (value.is_null() || (key == "json_object" && value == false)) continue;
      StructuredConstraint c;
      SERVE_TRY(c, family_constraint(key, value, name));
      found.push_back(std::move(c));
    }
  }
  if (found.size() > 1) {
    std::string names;
    for (const StructuredConstraint& c : found) {
      names += (names.empty() ? "'" : ", '") + c.field + "'";
    }
    return invalid_field(found[1].field,
                         "a request takes at most one structured-output constraint; got " + names);
  }
  if (found.empty()) return std::optional<StructuredConstraint>();
  return std::optional<StructuredConstraint>(std::move(found[0]));
}

}  // namespace

Result<GenerationDefaults> read_generation_defaults(const std::string& path,
                                                    std::vector<std::string>& not_applied) {
  GenerationDefaults d;
  std::ifstream in(path);
  if (!in) return d;  // the file is optional
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgument(path + ": not a JSON object");
  }
  auto number = [&](const char* name, double lo, double hi) -> Result<std::optional<double>> {
    auto it = j.find(name);
    if (it == j.end() || it->is_null()) return std::optional<double>();
    if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() < lo ||
        it->get<double>() > hi) {
      return InvalidArgument(path + ": '" + name + "' must be a number in [" + std::to_string(lo) +
                             ", " + std::to_string(hi) + "]");
    }
    return std::optional<double>(it->get<double>());
  };
  CELLM_ASSIGN_OR_RETURN(d.temperature, number("temperature", 0.0, 2.0));
  CELLM_ASSIGN_OR_RETURN(d.top_p, number("top_p", 1e-6, 1.0));
  CELLM_ASSIGN_OR_RETURN(d.min_p, number("min_p", 0.0, 1.0));
  CELLM_ASSIGN_OR_RETURN(std::optional<double> top_k, number("top_k", -1.0, 1e9));
  if (top_k) d.top_k = static_cast<int64_t>(*top_k);
  for (const char* name : {"repetition_penalty", "presence_penalty", "frequency_penalty"}) {
    auto it = j.find(name);
    if (it != j.end() && it->is_number() && it->get<double>() != (name[0] == 'r' ? 1.0 : 0.0)) {
      not_applied.push_back(name);
    }
  }
  return d;
}

ApiResult<json> parse_json_body(const std::string& body) {
  json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    return ApiError{400, "the request body is not valid JSON (UTF-8)", "invalid_request_error", "",
                    ""};
  }
  if (!parsed.is_object()) {
    return ApiError{400, "the request body must be a JSON object", "invalid_request_error", "", ""};
  }
  return parsed;
}

ApiResult<GenerationFields> parse_generation_fields(const json& body, const RequestLimits& limits,
                                                    Endpoint endpoint) {
  GenerationFields f;
  if (auto e = refuse_unknown_fields(body, endpoint)) return *e;
  if (auto e = refuse_unsupported(body)) return *e;
  SERVE_TRY(f.model, read_string(body, "model"));

  std::optional<int64_t> max_tokens;
  // Completions take 0 with echo (the prompt alone, as evaluation harnesses ask for
  // prompt log-probabilities); parse_completion_request checks that.
  SERVE_TRY(max_tokens, read_int(body, "max_tokens", endpoint == Endpoint::kCompletions ? 0 : 1,
                                 std::numeric_limits<int32_t>::max()));
  if (endpoint == Endpoint::kChat && !max_tokens) {
    SERVE_TRY(max_tokens,
              read_int(body, "max_completion_tokens", 1, std::numeric_limits<int32_t>::max()));
  }
  if (max_tokens) f.max_tokens = static_cast<int32_t>(*max_tokens);

  std::optional<double> x;
  const GenerationDefaults& d = limits.defaults;
  SERVE_TRY(x, read_number(body, "temperature", 0.0, 2.0));
  f.sampling.temperature = static_cast<float>(x.value_or(d.temperature.value_or(1.0)));
  SERVE_TRY(x, read_number(body, "top_p", 0.0, 1.0));
  if (x && *x <= 0.0) return invalid_field("top_p", "'top_p' must be greater than 0");
  f.sampling.top_p = static_cast<float>(x.value_or(d.top_p.value_or(1.0)));
  SERVE_TRY(x, read_number(body, "min_p", 0.0, 1.0));
  f.sampling.min_p = static_cast<float>(x.value_or(d.min_p.value_or(0.0)));
  std::optional<int64_t> i;
  SERVE_TRY(i, read_int(body, "top_k", -1, std::numeric_limits<int32_t>::max()));
  if (!i) i = d.top_k;
  f.sampling.top_k = static_cast<int32_t>(i && *i > 0 ? *i : 0);  // -1 (vLLM's "off") = 0
  if (Status s = validate_sampling(f.sampling); !s.ok()) return invalid_field("", s.message());

  SERVE_TRY(i, read_int(body, "seed", std::numeric_limits<int64_t>::min(),
                        std::numeric_limits<int64_t>::max()));
  if (i) f.seed = static_cast<uint64_t>(*i);
  SERVE_TRY(f.stop, read_stop(body));
  SERVE_TRY(i, read_int(body, "n", 1, limits.max_n));
  f.n = static_cast<int32_t>(i.value_or(1));
  SERVE_TRY(i, read_int(body, "best_of", 1, limits.max_n));
  if (i && *i != f.n) return invalid_field("best_of", "'best_of' must equal 'n' when given");

  std::optional<bool> b;
  SERVE_TRY(b, read_bool(body, "stream"));
  f.stream = b.value_or(false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object())
      return invalid_field("stream_options", "'stream_options' must be an object");
    SERVE_TRY(b, read_bool(*so, "include_usage"));
    f.include_usage = b.value_or(false);
  }
  SERVE_TRY(b, read_bool(body, "ignore_eos"));
  f.ignore_eos = b.value_or(false);

  if (endpoint == Endpoint::kCompletions) {
    SERVE_TRY(i, read_int(body, "logprobs", 0, kMaxTopLogprobs));
    if (i) f.top_logprobs = static_cast<int32_t>(*i);
  } else {
    SERVE_TRY(b, read_bool(body, "logprobs"));
    SERVE_TRY(i, read_int(body, "top_logprobs", 0, kMaxTopLogprobs));
    if (i && !b.value_or(false)) {
      return invalid_field("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    }
    if (b.value_or(false)) f.top_logprobs = static_cast<int32_t>(i.value_or(0));
  }
  std::optional<std::string> user;
  SERVE_TRY(user, read_string(body, "user"));
  f.user = user.value_or("");
  if (auto e = read_sampling_controls(body, limits, f)) return *e;
  SERVE_TRY(f.constraint, read_constraint(body));
  return f;
}

ApiResult<CompletionRequest> parse_completion_request(const json& body,
                                                      const RequestLimits& limits) {
  CompletionRequest r;
  SERVE_TRY(r.fields, parse_generation_fields(body, limits, Endpoint::kCompletions));
  std::optional<bool> echo;
  SERVE_TRY(echo, read_bool(body, "echo"));
  r.echo = echo.value_or(false);
  if (r.fields.max_tokens == 0 && !r.echo) {
    return invalid_field("max_tokens",
                         "'max_tokens' must be at least 1 (0 only with 'echo': true, which "
                         "returns the prompt and its log-probabilities without generating)");
  }

  const json* p = field(body, "prompt");
  if (p == nullptr) return invalid_field("prompt", "'prompt' is required");
  // One prompt is text or a list of token ids; a batch is a list of either.
  auto one = [&](const json& v, const std::string& param) -> ApiResult<PromptInput> {
    PromptInput in;
    if (v.is_string()) {
      in.text = v.get<std::string>();
      if (in.text->empty()) return invalid_field("prompt", "'" + param + "' must not be empty");
      return in;
    }
    if (!v.is_array()) {
      return invalid_field(
          "prompt", "'" + param + "' must be a string or a list of token ids, got " + type_name(v));
    }
    if (v.empty()) return invalid_field("prompt", "'" + param + "' must not be empty");
    for (const json& t : v) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= limits.vocab_size ||
          (t.is_number_unsigned() &&
           t.get<uint64_t>() >= static_cast<uint64_t>(limits.vocab_size))) {
        return invalid_field("prompt", "'" + param + "' token ids must be integers in [0, " +
                                           std::to_string(limits.vocab_size) + ")");
      }
      in.tokens.push_back(static_cast<Token>(t.get<int64_t>()));
    }
    return in;
  };
  const bool batch = p->is_array() && !p->empty() && ((*p)[0].is_string() || (*p)[0].is_array());
  if (!batch) {
    PromptInput in;
    SERVE_TRY(in, one(*p, "prompt"));
    r.prompts.push_back(std::move(in));
    return r;
  }
  const auto choices = static_cast<int64_t>(p->size()) * r.fields.n;
  if (choices > limits.max_n) {
    return invalid_field("prompt", "a batch of " + std::to_string(p->size()) +
                                       " prompts with n = " + std::to_string(r.fields.n) +
                                       " needs " + std::to_string(choices) +
                                       " sessions at once; this server "
                                       "gives a request at most " +
                                       std::to_string(limits.max_n));
  }
  for (size_t k = 0; k < p->size(); ++k) {
    PromptInput in;
    SERVE_TRY(in, one((*p)[k], "prompt[" + std::to_string(k) + "]"));
    r.prompts.push_back(std::move(in));
  }
  return r;
}

std::optional<ApiError> check_session_budget(size_t prompt_tokens, int32_t max_tokens,
                                             const RequestLimits& limits) {
  const auto budget = static_cast<size_t>(limits.max_session_tokens);
  // Why a session holds no more: the model's context, the KV pool, or a set cap.
  std::string why;
  if (limits.model_context > 0 && budget >= static_cast<size_t>(limits.model_context)) {
    why = " (the model's context)";
  } else if (limits.kv_cells > 0 && budget + 1 >= static_cast<size_t>(limits.kv_cells)) {
    why = " (the KV pool has " + std::to_string(limits.kv_cells) + " cells)";
  } else if (limits.model_context > 0) {
    why = " (--max-session-tokens; the model's context is " + std::to_string(limits.model_context) +
          ")";
  }
  if (prompt_tokens >= budget) {
    return invalid_field("prompt", "the prompt has " + std::to_string(prompt_tokens) +
                                       " tokens; a session holds at most " +
                                       std::to_string(budget) + why +
                                       ", prompt and completion together");
  }
  if (prompt_tokens + static_cast<size_t>(max_tokens) > budget) {
    return invalid_field("max_tokens", "the prompt (" + std::to_string(prompt_tokens) +
                                           " tokens) plus max_tokens (" +
                                           std::to_string(max_tokens) + ") exceeds the " +
                                           std::to_string(budget) + " positions of a session" +
                                           why);
  }
  return std::nullopt;
}

}  // namespace cellm::cli
