// POST /v1/chat/completions: messages (with tool calls, tool results, content
// parts, reasoning), tools and chat_template_kwargs rendered with the model's
// chat template as transformers renders them (add_generation_prompt), then
// generated like a completion. Each choice's text goes through the reasoning
// parser (templates that use <think>) and the tool-call parser of the
// template's format (when tools are given and tool_choice is not "none"), so
// the answer carries reasoning_content, content and tool_calls; streaming sends
// OpenAI's chat.completion.chunk deltas of each (the first of a choice carries
// the assistant role). "required" and a named tool_choice constrain decoding to
// the format's calls (chat_tools.cpp).
#include "cellm/chat_template.h"

#include <memory>
#include <nlohmann/json.hpp>

#include "cellm/chat_output.h"
#include "serve/chat_request.h"
#include "serve/chat_tools.h"
#include "serve/connection.h"
#include "serve/endpoints.h"
#include "serve/http.h"
#include "serve/request.h"
#include "serve/streaming.h"
#include "serve/structured.h"

namespace cellm::cli {

struct ChatEndpoint {
  Result<ChatTemplate> chat_template;
  // The tool-call format: --tool-call-parser, else the template's markers.
  std::optional<serve::ToolCallFormat> tool_format;
  bool tool_format_from_flag = false;
  bool reasoning = false;  // the template uses <think> blocks
};

std::shared_ptr<const ChatEndpoint> make_chat_endpoint(
    const ChatTemplate* chat_template, const Status& status,
    std::optional<serve::ToolCallFormat> tool_call_parser) {
  auto e = std::make_shared<ChatEndpoint>(ChatEndpoint{chat_template != nullptr
                                                           ? Result<ChatTemplate>(*chat_template)
                                                           : Result<ChatTemplate>(status),
                                                       std::nullopt, false, false});
  e->tool_format_from_flag = tool_call_parser.has_value();
  if (e->chat_template.ok()) {
    const std::string& source = e->chat_template->source();
    e->tool_format = tool_call_parser ? tool_call_parser : serve::detect_tool_call_format(source);
    e->reasoning = serve::template_uses_reasoning(source);
  }
  return e;
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

json tool_call_json(const serve::ToolCallDelta& c) {
  return {{"index", c.index},
          {"id", c.id},
          {"type", "function"},
          {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
}

// OpenAI's finish reason once the calls are known: a generation that stopped
// (not one cut by length) after making calls finished with "tool_calls".
std::string final_reason(const std::string& reason, int calls) {
  return reason == "stop" && calls > 0 ? "tool_calls" : reason;
}

// The rendered prompt of a parsed conversation, as text and tokens.
struct RenderedPrompt {
  std::string text;
  std::vector<Token> tokens;
};

ApiResult<RenderedPrompt> render_conversation(const ServeContext& ctx, const ChatEndpoint& endpoint,
                                              const ChatConversation& conversation,
                                              bool add_generation_prompt) {
  if (!endpoint.chat_template.ok()) {
    return ApiError{400,
                    "this model has no usable chat template (" +
                        endpoint.chat_template.status().message() + "); use /v1/completions",
                    "invalid_request_error", "messages", "no_chat_template"};
  }
  nlohmann::ordered_json messages = conversation.messages;
  if (!endpoint.chat_template->reads_content_parts()) {
    // Templates that read content as a string get one: parts joined, and no content
    // (an assistant turn of tool calls, content null) as "", as vLLM passes them;
    // Qwen3's and others' templates fail on a missing content.
    if (Status s = ChatTemplate::join_text_parts(messages); !s.ok()) {
      return invalid_field("messages", s.message());
    }
    for (nlohmann::ordered_json& m : messages) {
      if (!m.contains("content")) m["content"] = "";
    }
  }
  Result<std::string> rendered = endpoint.chat_template->render(
      messages, conversation.tools, conversation.kwargs, add_generation_prompt);
  if (!rendered.ok()) {
    return invalid_field("messages",
                         "the chat template refused the messages: " + rendered.status().message());
  }
  // The template writes the special tokens (BOS included) itself.
  RenderedPrompt p{*rendered, ctx.tokenizer.encode(*rendered, /*add_special_tokens=*/false)};
  if (p.tokens.empty()) return invalid_field("messages", "the messages render to no tokens");
  return p;
}

}  // namespace

ApiResult<std::vector<Token>> chat_prompt(const ServeContext& ctx, const ChatEndpoint& endpoint,
                                          const std::string& body_text,
                                          bool add_generation_prompt) {
  ApiResult<ChatConversation> conversation = parse_chat_conversation(body_text);
  if (auto* e = std::get_if<ApiError>(&conversation)) return *e;
  ApiResult<RenderedPrompt> p = render_conversation(
      ctx, endpoint, std::get<ChatConversation>(conversation), add_generation_prompt);
  if (auto* e = std::get_if<ApiError>(&p)) return *e;
  return std::move(std::get<RenderedPrompt>(p).tokens);
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
  ApiResult<ChatConversation> conversation_or = parse_chat_conversation(req.body);
  if (auto* e = std::get_if<ApiError>(&conversation_or)) return send_error(res, *e);
  const ChatConversation& conversation = std::get<ChatConversation>(conversation_or);

  // Tool calls are parsed (and, for "required" or a named tool, enforced) in the
  // template's format; with "none" the template still sees the tools.
  const bool parse_calls = conversation.tool_choice != ToolChoice::kNone;
  if (parse_calls && !endpoint.tool_format) {
    return send_error(res, invalid_field("tools",
                                         "this model's chat template shows no tool-call format "
                                         "(hermes, llama3 or mistral); start the server with "
                                         "--tool-call-parser to use tools"));
  }
  ApiResult<RenderedPrompt> prompt_or =
      render_conversation(ctx, endpoint, conversation, /*add_generation_prompt=*/true);
  if (auto* e = std::get_if<ApiError>(&prompt_or)) return send_error(res, *e);
  RenderedPrompt rendered = std::move(std::get<RenderedPrompt>(prompt_or));
  std::vector<Token>& prompt = rendered.tokens;
  if (prompt.size() >= static_cast<size_t>(ctx.limits.max_session_tokens)) {
    return send_error(res, *check_session_budget(prompt.size(), 1, ctx.limits));
  }
  const int32_t max_tokens = fields.max_tokens.value_or(ctx.limits.max_session_tokens -
                                                        static_cast<int32_t>(prompt.size()));
  if (auto e = check_session_budget(prompt.size(), max_tokens, ctx.limits)) {
    return send_error(res, *e);
  }
  const serve::ChatOutputOptions parsing{
      endpoint.reasoning ? std::optional<bool>(serve::prompt_opens_reasoning(rendered.text))
                         : std::nullopt,
      parse_calls ? endpoint.tool_format : std::nullopt, conversation.parallel_tool_calls};
  ApiResult<std::optional<Grammar>> tool_grammar =
      tool_choice_grammar(ctx.tokenizer, conversation, endpoint.tool_format);
  if (auto* e = std::get_if<ApiError>(&tool_grammar)) return send_error(res, *e);
  const std::optional<Grammar>& grammar = std::get<std::optional<Grammar>>(tool_grammar);
  JobSpec spec = make_job_spec(ctx, fields, std::move(prompt), max_tokens);
  if (auto e =
          attach_logits_processing(ctx.tokenizer, fields, spec, grammar ? &*grammar : nullptr)) {
    return send_error(res, *e);
  }
  ApiResult<std::shared_ptr<Job>> started = admit_and_start(ctx, std::move(spec));
  if (auto* e = std::get_if<ApiError>(&started)) return send_error(res, *e);
  std::shared_ptr<Job> job = std::get<std::shared_ptr<Job>>(started);

  const std::string id = make_id("chatcmpl-");
  const int64_t created = unix_now();
  const std::optional<int32_t> top_n = fields.top_logprobs;
  const Tokenizer tok = ctx.tokenizer;
  const std::string model = ctx.model_id;
  const PeerWatch peer(req);
  const bool reasoning = endpoint.reasoning;

  if (fields.stream) {
    const bool include_usage = fields.include_usage;
    const int32_t n = fields.n;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream", [=](size_t, httplib::DataSink& data_sink) {
          std::vector<bool> role_sent(static_cast<size_t>(n), false);
          std::vector<serve::ChatOutputParser> parsers;
          for (int32_t i = 0; i < n; ++i) parsers.emplace_back(parsing);
          SseSink sink(data_sink, peer, [&](const ChoiceDelta& d) -> json {
            serve::ChatOutputParser& parser = parsers[static_cast<size_t>(d.index)];
            serve::ChatOutputParser::Output out = parser.push(d.text);
            if (d.finish_reason) out.append(parser.finish());
            json delta = json::object();
            if (!role_sent[static_cast<size_t>(d.index)]) {
              delta["role"] = "assistant";
              role_sent[static_cast<size_t>(d.index)] = true;
            }
            if (!out.reasoning.empty()) delta["reasoning_content"] = out.reasoning;
            if (!out.content.empty() || delta.contains("role")) delta["content"] = out.content;
            if (!out.calls.empty()) {
              json calls = json::array();
              for (const serve::ToolCallDelta& c : out.calls) calls.push_back(tool_call_json(c));
              delta["tool_calls"] = std::move(calls);
            }
            // Nothing to say yet (the parsers hold a possible marker): no chunk.
            if (delta.empty() && !d.finish_reason && (!top_n || d.tokens.empty())) return json();
            json choice = {
                {"index", d.index},
                {"delta", std::move(delta)},
                {"logprobs", top_n ? chat_logprobs(tok, d.tokens, d.logprobs, *top_n) : json()},
                {"finish_reason",
                 d.finish_reason ? json(final_reason(*d.finish_reason, parser.calls())) : json()}};
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
    serve::ChatOutputParser parser(parsing);
    serve::ChatOutputParser::Output out = parser.push(c.text);
    out.append(parser.finish());
    json message = {{"role", "assistant"}};
    message["content"] = out.content.empty() && !out.calls.empty() ? json() : json(out.content);
    if (reasoning)
      message["reasoning_content"] = out.reasoning.empty() ? json() : json(out.reasoning);
    if (!out.calls.empty()) {
      json calls = json::array();
      for (const serve::ToolCallDelta& call : out.calls) {
        json j = tool_call_json(call);
        j.erase("index");
        calls.push_back(std::move(j));
      }
      message["tool_calls"] = std::move(calls);
    }
    choices.push_back(
        {{"index", i},
         {"message", std::move(message)},
         {"logprobs", top_n ? chat_logprobs(tok, c.tokens, c.logprobs, *top_n) : json()},
         {"finish_reason", final_reason(c.finish_reason, parser.calls())}});
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
