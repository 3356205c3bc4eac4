// Fuzzes the /v1/completions request body: the bytes (or a structured body built
// from them) through parse_json_body, parse_completion_request and the session
// budget check, as handle_completions runs them. Every answer must be a request
// that holds to the limits or a 400 naming a field, and must serialize.
#include <algorithm>
#include <cstdint>
#include <string>

#include "fuzz_check.h"
#include "request_body.h"
#include "serve/request.h"

namespace {

using cellm::cli::ApiError;
using cellm::cli::ApiResult;
using nlohmann::json;

std::string make_body(const uint8_t* data, size_t size) {
  if (cellm::fuzz::looks_like_json(data, size)) {
    return std::string(reinterpret_cast<const char*>(data), size);
  }
  FuzzedDataProvider fdp(data, size);
  json body = json::object();
  if (fdp.ConsumeIntegralInRange<int>(0, 7) != 0) body["prompt"] = cellm::fuzz::prompt_value(fdp);
  cellm::fuzz::add_generation_fields(fdp, body);
  return body.dump();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const cellm::cli::RequestLimits limits = cellm::fuzz::request_limits();
  ApiResult<json> body = cellm::cli::parse_json_body(make_body(data, size));
  if (const auto* e = std::get_if<ApiError>(&body)) {
    cellm::fuzz::check_request_error(*e);
    return 0;
  }
  FUZZ_CHECK(std::get<json>(body).is_object(), "a parsed body is an object");
  ApiResult<cellm::cli::CompletionRequest> parsed =
      cellm::cli::parse_completion_request(std::get<json>(body), limits);
  if (const auto* e = std::get_if<ApiError>(&parsed)) {
    cellm::fuzz::check_request_error(*e);
    return 0;
  }
  const cellm::cli::CompletionRequest& r = std::get<cellm::cli::CompletionRequest>(parsed);
  const cellm::cli::GenerationFields& f = r.fields;
  FUZZ_CHECK(f.n >= 1 && f.n <= limits.max_n, "n within [1, max_n]");
  // max_tokens 0 is the prompt-scoring form (echo: the prompt's logprobs, nothing generated).
  FUZZ_CHECK(!f.max_tokens || *f.max_tokens >= 1 || (*f.max_tokens == 0 && r.echo),
             "max_tokens positive, or 0 with echo");
  FUZZ_CHECK(!f.top_logprobs || (*f.top_logprobs >= 0 && *f.top_logprobs <= 20),
             "logprobs within [0, 20]");
  FUZZ_CHECK(f.stop.size() <= 16, "at most 16 stop strings");
  FUZZ_CHECK(!r.prompts.empty() && static_cast<int64_t>(r.prompts.size()) * f.n <= limits.max_n,
             "one prompt, or a batch within the sessions a request may hold");
  size_t prompt_size = 0;
  for (const cellm::cli::PromptInput& in : r.prompts) {
    FUZZ_CHECK(in.text.has_value() != !in.tokens.empty(),
               "exactly one of prompt text and prompt tokens");
    FUZZ_CHECK(!in.text || !in.text->empty(), "a text prompt is not empty");
    for (cellm::Token t : in.tokens) {
      FUZZ_CHECK(t >= 0 && t < limits.vocab_size, "prompt token ids inside the vocabulary");
    }
    prompt_size = std::max(prompt_size, in.text ? in.text->size() : in.tokens.size());
  }
  if (auto e = cellm::cli::check_session_budget(prompt_size, f.max_tokens.value_or(16), limits)) {
    cellm::fuzz::check_request_error(*e);
  }
  return 0;
}
