// POST /tokenize and POST /detokenize: the model's tokenizer over HTTP, with the
// bodies vLLM's server takes, so clients can count tokens before they send.
#include <nlohmann/json.hpp>

#include "serve/endpoints.h"
#include "serve/http.h"
#include "serve/request.h"

namespace cellm::cli {
namespace {

using nlohmann::json;

// 400 naming the first field outside `allowed`.
std::optional<ApiError> refuse_other_fields(const json& body,
                                            std::initializer_list<const char*> allowed) {
  for (const auto& [name, value] : body.items()) {
    bool known = false;
    for (const char* a : allowed) known = known || name == a;
    if (!known) return invalid_field(name, "'" + name + "' is not supported by this endpoint");
  }
  return std::nullopt;
}

ApiResult<bool> read_flag(const json& body, const char* name, bool fallback) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    return invalid_field(name, std::string("'") + name + "' must be a boolean");
  }
  return it->get<bool>();
}

ApiResult<std::optional<std::string>> read_model(const ServeContext& ctx, const json& body) {
  auto it = body.find("model");
  if (it == body.end() || it->is_null()) return std::optional<std::string>();
  if (!it->is_string()) return invalid_field("model", "'model' must be a string");
  std::optional<std::string> model = it->get<std::string>();
  if (auto e = check_model(ctx, model)) return *e;
  return model;
}

}  // namespace

void handle_tokenize(const ServeContext& ctx, const ChatEndpoint& endpoint,
                     const httplib::Request& req, httplib::Response& res) {
  ApiResult<json> body_or = parse_json_body(req.body);
  if (auto* e = std::get_if<ApiError>(&body_or)) return send_error(res, *e);
  const json& body = std::get<json>(body_or);
  if (auto e =
          refuse_other_fields(body, {"model", "prompt", "messages", "add_special_tokens",
                                     "add_generation_prompt", "tools", "chat_template_kwargs"})) {
    return send_error(res, *e);
  }
  if (auto m = read_model(ctx, body); std::holds_alternative<ApiError>(m)) {
    return send_error(res, std::get<ApiError>(m));
  }
  const bool has_prompt = body.contains("prompt");
  if (has_prompt == body.contains("messages")) {
    return send_error(res, invalid_field("prompt", "give exactly one of 'prompt' and 'messages'"));
  }
  std::vector<Token> tokens;
  if (has_prompt) {
    if (!body["prompt"].is_string()) {
      return send_error(res, invalid_field("prompt", "'prompt' must be a string"));
    }
    if (body.contains("add_generation_prompt")) {
      return send_error(res, invalid_field("add_generation_prompt",
                                           "'add_generation_prompt' goes with 'messages'"));
    }
    ApiResult<bool> special = read_flag(body, "add_special_tokens", true);
    if (auto* e = std::get_if<ApiError>(&special)) return send_error(res, *e);
    tokens = ctx.tokenizer.encode(body["prompt"].get<std::string>(), std::get<bool>(special));
  } else {
    if (body.contains("add_special_tokens")) {
      return send_error(res, invalid_field("add_special_tokens",
                                           "'add_special_tokens' goes with 'prompt' (the chat "
                                           "template writes the special tokens itself)"));
    }
    ApiResult<bool> add_generation_prompt = read_flag(body, "add_generation_prompt", true);
    if (auto* e = std::get_if<ApiError>(&add_generation_prompt)) return send_error(res, *e);
    ApiResult<std::vector<Token>> prompt =
        chat_prompt(ctx, endpoint, req.body, std::get<bool>(add_generation_prompt));
    if (auto* e = std::get_if<ApiError>(&prompt)) return send_error(res, *e);
    tokens = std::move(std::get<std::vector<Token>>(prompt));
  }
  send_json(res, 200,
            {{"count", tokens.size()},
             {"max_model_len", ctx.limits.max_session_tokens},
             {"tokens", tokens}});
}

void handle_detokenize(const ServeContext& ctx, const httplib::Request& req,
                       httplib::Response& res) {
  ApiResult<json> body_or = parse_json_body(req.body);
  if (auto* e = std::get_if<ApiError>(&body_or)) return send_error(res, *e);
  const json& body = std::get<json>(body_or);
  if (auto e = refuse_other_fields(body, {"model", "tokens"})) return send_error(res, *e);
  if (auto m = read_model(ctx, body); std::holds_alternative<ApiError>(m)) {
    return send_error(res, std::get<ApiError>(m));
  }
  auto it = body.find("tokens");
  if (it == body.end() || !it->is_array()) {
    return send_error(res, invalid_field("tokens", "'tokens' must be a list of token ids"));
  }
  std::vector<Token> tokens;
  for (const json& t : *it) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
        t.get<int64_t>() >= ctx.limits.vocab_size ||
        (t.is_number_unsigned() &&
         t.get<uint64_t>() >= static_cast<uint64_t>(ctx.limits.vocab_size))) {
      return send_error(res,
                        invalid_field("tokens", "'tokens' must be integers in [0, " +
                                                    std::to_string(ctx.limits.vocab_size) + ")"));
    }
    tokens.push_back(static_cast<Token>(t.get<int64_t>()));
  }
  send_json(res, 200, {{"prompt", ctx.tokenizer.decode(tokens)}});
}

}  // namespace cellm::cli
