// Request bodies of the OpenAI-compatible endpoints, parsed and validated once
// into plain structs. Every error is a 400 ApiError whose `param` names the
// field. Each endpoint has an allowlist: a field cellm does not implement, or
// one nobody defines, is refused (`tools`, `suffix`, `foo`); only fields that
// cannot change the answer (`metadata`, `store`) are accepted and ignored.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "cellm/logits_processor.h"
#include "cellm/status.h"
#include "cellm/types.h"
#include "serve/api_error.h"

namespace cellm::cli {

// The sampling defaults a model ships in generation_config.json, used where a
// request is silent (as vLLM's server does); unset: OpenAI's defaults.
struct GenerationDefaults {
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<double> min_p;
  std::optional<int64_t> top_k;
};

// What the server enforces on every request.
struct RequestLimits {
  int32_t max_n = 1;               // choices per request: at most the session slots
  int32_t max_session_tokens = 0;  // prompt + max_tokens must fit
  int64_t model_context = 0;       // the model's context (for error messages)
  int64_t kv_cells = 0;            // the KV pool's cells (for error messages)
  int32_t vocab_size = 0;          // token-id prompts must lie in [0, vocab_size)
  GenerationDefaults defaults;     // where a request gives no sampling field
};

// A request's structured-output constraint, as parsed (compiled by
// serve/structured.h): response_format json_object / json_schema, vLLM's
// guided_json / guided_regex / guided_choice / guided_grammar, or the same under
// structured_outputs.
enum class ConstraintKind { kJsonSchema, kJsonObject, kRegex, kChoice, kGbnf };
struct StructuredConstraint {
  ConstraintKind kind = ConstraintKind::kJsonObject;
  std::string text;                  // the schema (JSON text), regex or GBNF; empty otherwise
  std::vector<std::string> choices;  // kChoice
  std::string field;                 // the request field it came from, for errors
};

// The fields /v1/completions and /v1/chat/completions share.
struct GenerationFields {
  std::optional<std::string> model;     // checked against the served model by the caller
  std::optional<int32_t> max_tokens;    // nullopt: the endpoint's default
  SamplingParams sampling;              // temperature (default 1), top_p, top_k, min_p
  std::optional<uint64_t> seed;         // choice i samples with seed + i
  std::vector<std::string> stop;        // stop strings, not included in the text
  int32_t n = 1;                        // choices
  bool stream = false;                  // Server-Sent Events
  bool include_usage = false;           // stream_options.include_usage
  std::optional<int32_t> top_logprobs;  // alternatives per token; nullopt: no logprobs
  bool ignore_eos = false;              // extension: keep generating past EOS
  std::string user;
  // Structured outputs and sampling controls (serve/structured.h applies them).
  std::optional<StructuredConstraint> constraint;
  // presence/frequency/repetition penalties, logit_bias (ids checked against the
  // vocabulary), min_tokens; stop_tokens is left empty here.
  PenaltyParams penalties;
  std::vector<Token> stop_token_ids;  // end the generation like EOS; no text
};

// One prompt of a completion request: text, or token ids fed as given.
struct PromptInput {
  std::optional<std::string> text;  // set when the prompt is text
  std::vector<Token> tokens;        // set when the prompt is token ids
};

struct CompletionRequest {
  GenerationFields fields;
  // One, or a batch: prompt k's choice i is the answer's choice k * n + i. A batch
  // takes prompts x n sessions at once, at most RequestLimits::max_n.
  std::vector<PromptInput> prompts;
  bool echo = false;  // prepend the prompt to the text
};

// The sampling defaults of a model's generation_config.json at `path` (none when
// the file is absent; an error naming the file and field when it is malformed).
// The names of sampling fields it sets that the server cannot apply are appended
// to `not_applied`.
Result<GenerationDefaults> read_generation_defaults(const std::string& path,
                                                    std::vector<std::string>& not_applied);

// Parses the body text as JSON (400 on malformed or non-object bodies).
ApiResult<nlohmann::json> parse_json_body(const std::string& body);

enum class Endpoint { kCompletions, kChat };

// The shared fields. Chat reads logprobs (bool) + top_logprobs (int) and
// max_completion_tokens; completions reads logprobs (int).
ApiResult<GenerationFields> parse_generation_fields(const nlohmann::json& body,
                                                    const RequestLimits& limits, Endpoint endpoint);

ApiResult<CompletionRequest> parse_completion_request(const nlohmann::json& body,
                                                      const RequestLimits& limits);

// 400 unless prompt_tokens + max_tokens fit a session (the field named is
// `prompt` when the prompt alone does not fit, else `max_tokens`).
std::optional<ApiError> check_session_budget(size_t prompt_tokens, int32_t max_tokens,
                                             const RequestLimits& limits);

}  // namespace cellm::cli
