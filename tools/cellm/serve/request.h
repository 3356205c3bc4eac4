// Request bodies of the OpenAI-compatible endpoints, parsed and validated once
// into plain structs. Every error is a 400 ApiError whose `param` names the
// field. Fields cellm does not implement are refused when they would change the
// answer (a non-zero presence_penalty, a logit_bias) and ignored otherwise.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "cellm/chat_template.h"
#include "cellm/types.h"
#include "serve/api_error.h"

namespace cellm::cli {

// What the server enforces on every request.
struct RequestLimits {
  int32_t max_n = 1;               // choices per request: at most the session slots
  int32_t max_session_tokens = 0;  // prompt + max_tokens must fit
  int32_t vocab_size = 0;          // token-id prompts must lie in [0, vocab_size)
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
};

struct CompletionRequest {
  GenerationFields fields;
  std::optional<std::string> prompt_text;  // set when the prompt is text
  std::vector<Token> prompt_tokens;        // set when the prompt is token ids
  bool echo = false;                       // prepend the prompt to the text
};

// Parses the body text as JSON (400 on malformed or non-object bodies).
ApiResult<nlohmann::json> parse_json_body(const std::string& body);

enum class Endpoint { kCompletions, kChat };

// The shared fields. Chat reads logprobs (bool) + top_logprobs (int) and
// max_completion_tokens; completions reads logprobs (int).
ApiResult<GenerationFields> parse_generation_fields(const nlohmann::json& body,
                                                    const RequestLimits& limits, Endpoint endpoint);

// The chat endpoint's `messages`: a non-empty list (at most 4096) of {role, content}
// objects; content is a string, null, or a list of {"type": "text", "text"} parts.
ApiResult<std::vector<ChatMessage>> parse_chat_messages(const nlohmann::json& body);

ApiResult<CompletionRequest> parse_completion_request(const nlohmann::json& body,
                                                      const RequestLimits& limits);

// 400 unless prompt_tokens + max_tokens fit a session (the field named is
// `prompt` when the prompt alone does not fit, else `max_tokens`).
std::optional<ApiError> check_session_budget(size_t prompt_tokens, int32_t max_tokens,
                                             const RequestLimits& limits);

}  // namespace cellm::cli
