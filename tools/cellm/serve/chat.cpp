// POST /v1/chat/completions: messages rendered with the model's chat template
// (cellm::ChatTemplate, add_generation_prompt), then generated like a
// completion; streaming sends OpenAI's chat.completion.chunk deltas (the first
// of each choice carries the assistant role).
#include "cellm/chat_template.h"

#include <memory>
#include <nlohmann/json.hpp>

#include "serve/connection.h"
#include "serve/endpoints.h"
#include "serve/http.h"
#include "serve/request.h"
#include "serve/streaming.h"
#include "serve/structured.h"

namespace cellm::cli {

struct ChatEndpoint {
  Result<ChatTemplate> chat_template;
};

std::shared_ptr<const ChatEndpoint> make_chat_endpoint(const ChatTemplate* chat_template,
                                                       const Status& status) {
  return std::make_shared<const ChatEndpoint>(
      ChatEndpoint{chat_template != nullptr ? Result<ChatTemplate>(*chat_template)
                                            : Result<ChatTemplate>(status)});
}

const Status& chat_template_status(const ChatEndpoint& endpoint) {
  return endpoint.chat_template.status();
}

namespace {

using nlohmann::json;

// The chat logprobs object for `tokens`.
json chat_logprobs(const Tokenizer& tok, const std::vector<Token>& tokens,
                   const std::vector<TokenLogprobs>& logprobs, int32_t top_n) {
  auto entry = [&](Token id, float lp) {
    const std::string text = tok.decode(std::span<const Token>(&id, 1));
    json bytes = json::array();
    for (unsigned char c : text) bytes.push_back(static_cast<int>(c));
    return json{{"token", text}, {"logprob", lp}, {"bytes", std::move(bytes)}};
  };
  json content = json::array();
  for (size_t i = 0; i < tokens.size() && i < logprobs.size(); ++i) {
    json e = entry(tokens[i], logprobs[i].logprob);
    json top = json::array();
    for (size_t k = 0; k < logprobs[i].top.size() && static_cast<int32_t>(k) < top_n; ++k) {
      top.push_back(entry(logprobs[i].top[k].first, logprobs[i].top[k].second));
    }
    e["top_logprobs"] = std::move(top);
    content.push_back(std::move(e));
  }
  return {{"content", std::move(content)}};
}

}  // namespace

ApiResult<std::vector<Token>> chat_prompt(const ServeContext& ctx, const ChatEndpoint& endpoint,
                                          const json& body, bool add_generation_prompt) {
  ApiResult<std::vector<ChatMessage>> messages = parse_chat_messages(body);
  if (auto* e = std::get_if<ApiError>(&messages)) return *e;
  if (!endpoint.chat_template.ok()) {
    return ApiError{400,
                    "this model has no usable chat template (" +
                        endpoint.chat_template.status().message() + "); use /v1/completions",
                    "invalid_request_error", "messages", "no_chat_template"};
  }
  Result<std::string> rendered = endpoint.chat_template->render(
      std::get<std::vector<ChatMessage>>(messages), add_generation_prompt);
  if (!rendered.ok()) {
    return invalid_field("messages",
                         "the chat template refused the messages: " + rendered.status().message());
  }
  // The template writes the special tokens (BOS included) itself.
  std::vector<Token> prompt = ctx.tokenizer.encode(*rendered, /*add_special_tokens=*/false);
  if (prompt.empty()) return invalid_field("messages", "the messages render to no tokens");
  return prompt;
}

void handle_chat(const ServeContext& ctx, const ChatEndpoint& endpoint, const httplib::Request& req,
                 httplib::Response& res) {
  ApiResult<json> body_or = parse_json_body(req.body);
  if (auto* e = std::get_if<ApiError>(&body_or)) return send_error(res, *e);
  const json& body = std::get<json>(body_or);
  ApiResult<GenerationFields> fields_or =
      parse_generation_fields(body, ctx.limits, Endpoint::kChat);
  if (auto* e = std::get_if<ApiError>(&fields_or)) return send_error(res, *e);
  const GenerationFields& fields = std::get<GenerationFields>(fields_or);
  if (auto e = check_model(ctx, fields.model)) return send_error(res, *e);
  ApiResult<std::vector<Token>> prompt_or =
      chat_prompt(ctx, endpoint, body, /*add_generation_prompt=*/true);
  if (auto* e = std::get_if<ApiError>(&prompt_or)) return send_error(res, *e);
  std::vector<Token> prompt = std::move(std::get<std::vector<Token>>(prompt_or));
  if (prompt.size() >= static_cast<size_t>(ctx.limits.max_session_tokens)) {
    return send_error(res, *check_session_budget(prompt.size(), 1, ctx.limits));
  }
  const int32_t max_tokens = fields.max_tokens.value_or(ctx.limits.max_session_tokens -
                                                        static_cast<int32_t>(prompt.size()));
  if (auto e = check_session_budget(prompt.size(), max_tokens, ctx.limits)) {
    return send_error(res, *e);
  }
  JobSpec spec = make_job_spec(ctx, fields, std::move(prompt), max_tokens);
  if (auto e = attach_logits_processing(ctx.tokenizer, fields, spec)) return send_error(res, *e);
  ApiResult<std::shared_ptr<Job>> started = admit_and_start(ctx, std::move(spec));
  if (auto* e = std::get_if<ApiError>(&started)) return send_error(res, *e);
  std::shared_ptr<Job> job = std::get<std::shared_ptr<Job>>(started);

  const std::string id = make_id("chatcmpl-");
  const int64_t created = unix_now();
  const std::optional<int32_t> top_n = fields.top_logprobs;
  const Tokenizer tok = ctx.tokenizer;
  const std::string model = ctx.model_id;
  const PeerWatch peer(req);

  if (fields.stream) {
    const bool include_usage = fields.include_usage;
    const int32_t n = fields.n;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream", [=](size_t, httplib::DataSink& data_sink) {
          std::vector<bool> role_sent(static_cast<size_t>(n), false);
          SseSink sink(data_sink, peer, [&](const ChoiceDelta& d) {
            json delta = json::object();
            if (!role_sent[static_cast<size_t>(d.index)]) {
              delta["role"] = "assistant";
              role_sent[static_cast<size_t>(d.index)] = true;
            }
            if (!d.text.empty() || delta.contains("role")) delta["content"] = d.text;
            json choice = {
                {"index", d.index},
                {"delta", std::move(delta)},
                {"logprobs", top_n ? chat_logprobs(tok, d.tokens, d.logprobs, *top_n) : json()},
                {"finish_reason", d.finish_reason ? json(*d.finish_reason) : json()}};
            return json{{"id", id},
                        {"object", "chat.completion.chunk"},
                        {"created", created},
                        {"model", model},
                        {"choices", json::array({std::move(choice)})}};
          });
          const JobSummary summary = run_logged(*job, sink);
          if (include_usage) {
            send_usage_chunk(sink,
                             {{"id", id},
                              {"object", "chat.completion.chunk"},
                              {"created", created},
                              {"model", model}},
                             summary);
          }
          return sink.finish();
        });
    return;
  }

  CollectSink sink(peer, fields.n);
  const JobSummary summary = run_logged(*job, sink);
  if (std::optional<ApiError> e = sink.failure()) return send_error(res, *e);
  json choices = json::array();
  for (size_t i = 0; i < sink.choices().size(); ++i) {
    const CollectedChoice& c = sink.choices()[i];
    choices.push_back(
        {{"index", i},
         {"message", {{"role", "assistant"}, {"content", c.text}}},
         {"logprobs", top_n ? chat_logprobs(tok, c.tokens, c.logprobs, *top_n) : json()},
         {"finish_reason", c.finish_reason}});
  }
  send_json(res, 200,
            {{"id", id},
             {"object", "chat.completion"},
             {"created", created},
             {"model", model},
             {"choices", std::move(choices)},
             {"usage", usage_json(summary)}});
}

}  // namespace cellm::cli
