// Fuzzes the /v1/chat/completions request body: the bytes (or a structured body
// built from them) through parse_json_body, parse_generation_fields and
// parse_chat_conversation (messages, tools, tool_choice, chat_template_kwargs),
// then the conversation rendered with a Llama-3-style chat template, as
// handle_chat runs them. Every answer must be a request that holds to the limits
// or a 400 naming a field.
#include <cstdint>
#include <ctime>
#include <string>

#include "cellm/chat_template.h"
#include "fuzz_check.h"
#include "request_body.h"
#include "serve/chat_request.h"
#include "serve/request.h"

namespace {

using cellm::cli::ApiError;
using cellm::cli::ApiResult;
using nlohmann::json;

constexpr const char* kTemplate =
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}";

const cellm::ChatTemplate& chat_template() {
  static const cellm::ChatTemplate t = [] {
    std::tm now{};
    now.tm_year = 126;
    cellm::Result<cellm::ChatTemplate> r =
        cellm::ChatTemplate::parse(kTemplate, "<|begin_of_text|>", "<|eot_id|>", now);
    FUZZ_CHECK(r.ok(), "the fixed chat template parses");
    return *r;
  }();
  return t;
}

std::string make_body(const uint8_t* data, size_t size) {
  if (cellm::fuzz::looks_like_json(data, size)) {
    return std::string(reinterpret_cast<const char*>(data), size);
  }
  FuzzedDataProvider fdp(data, size);
  json body = json::object();
  if (fdp.ConsumeIntegralInRange<int>(0, 7) != 0) {
    body["messages"] = cellm::fuzz::messages_value(fdp);
  }
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
  const json& object = std::get<json>(body);
  ApiResult<cellm::cli::GenerationFields> fields =
      cellm::cli::parse_generation_fields(object, limits, cellm::cli::Endpoint::kChat);
  if (const auto* e = std::get_if<ApiError>(&fields)) {
    cellm::fuzz::check_request_error(*e);
    return 0;
  }
  const cellm::cli::GenerationFields& f = std::get<cellm::cli::GenerationFields>(fields);
  FUZZ_CHECK(f.n >= 1 && f.n <= limits.max_n, "n within [1, max_n]");
  FUZZ_CHECK(!f.max_tokens || *f.max_tokens >= 1, "max_tokens positive");
  FUZZ_CHECK(!f.top_logprobs || (*f.top_logprobs >= 0 && *f.top_logprobs <= 20),
             "top_logprobs within [0, 20]");
  ApiResult<cellm::cli::ChatConversation> conversation =
      cellm::cli::parse_chat_conversation(object.dump());
  if (const auto* e = std::get_if<ApiError>(&conversation)) {
    cellm::fuzz::check_request_error(*e);
    return 0;
  }
  const auto& c = std::get<cellm::cli::ChatConversation>(conversation);
  FUZZ_CHECK(c.messages.is_array() && !c.messages.empty() && c.messages.size() <= 4096,
             "between 1 and 4096 messages");
  for (const auto& m : c.messages) {
    FUZZ_CHECK(m.is_object() && m.contains("role") && m["role"].is_string(), "every role named");
  }
  FUZZ_CHECK(c.tool_choice != cellm::cli::ToolChoice::kNamed || !c.named_function.empty(),
             "a named tool choice names a function");
  // The template reads message['content'] as a string: render only conversations whose
  // contents are strings (as the server does after joining text parts).
  bool all_strings = true;
  for (const auto& m : c.messages) {
    all_strings = all_strings && m.contains("content") && m["content"].is_string();
  }
  if (!all_strings) return 0;
  cellm::Result<std::string> rendered =
      chat_template().render(c.messages, c.tools, c.kwargs, /*add_generation_prompt=*/true);
  FUZZ_CHECK(rendered.ok(), "a template that only concatenates renders any messages");
  return 0;
}
