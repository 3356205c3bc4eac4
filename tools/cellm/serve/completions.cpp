// POST /v1/completions: OpenAI's legacy completions, with and without
// streaming. The prompt is text (encoded with the model's BOS rules) or a list
// of token ids (fed as given).
#include <memory>
#include <nlohmann/json.hpp>

#include "serve/connection.h"
#include "serve/endpoints.h"
#include "serve/http.h"
#include "serve/request.h"
#include "serve/streaming.h"

namespace cellm::cli {
namespace {

using nlohmann::json;

constexpr int32_t kDefaultMaxTokens = 16;  // OpenAI's default for completions

// The legacy logprobs object for `tokens`, text offsets counted from `offset`
// (advanced past them).
json completion_logprobs(const Tokenizer& tok, const std::vector<Token>& tokens,
                         const std::vector<TokenLogprobs>& logprobs, int32_t top_n,
                         size_t& offset) {
  json out = {{"tokens", json::array()},
              {"token_logprobs", json::array()},
              {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
  for (size_t i = 0; i < tokens.size() && i < logprobs.size(); ++i) {
    const std::string text = tok.decode(std::span<const Token>(&tokens[i], 1));
    out["tokens"].push_back(text);
    out["token_logprobs"].push_back(logprobs[i].logprob);
    json top = json::object();
    for (size_t k = 0; k < logprobs[i].top.size() && static_cast<int32_t>(k) < top_n; ++k) {
      const auto& [id, lp] = logprobs[i].top[k];
      top[tok.decode(std::span<const Token>(&id, 1))] = lp;
    }
    out["top_logprobs"].push_back(std::move(top));
    out["text_offset"].push_back(offset);
    offset += text.size();
  }
  return out;
}

}  // namespace

void handle_completions(const ServeContext& ctx, const httplib::Request& req,
                        httplib::Response& res) {
  ApiResult<json> body = parse_json_body(req.body);
  if (auto* e = std::get_if<ApiError>(&body)) return send_error(res, *e);
  ApiResult<CompletionRequest> parsed = parse_completion_request(std::get<json>(body), ctx.limits);
  if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
  const CompletionRequest& r = std::get<CompletionRequest>(parsed);
  if (auto e = check_model(ctx, r.fields.model)) return send_error(res, *e);

  std::vector<Token> prompt =
      r.prompt_text ? ctx.tokenizer.encode(*r.prompt_text, /*add_special_tokens=*/true)
                    : r.prompt_tokens;
  if (prompt.empty())
    return send_error(res, invalid_field("prompt", "the prompt encodes to no tokens"));
  const int32_t max_tokens = r.fields.max_tokens.value_or(kDefaultMaxTokens);
  if (auto e = check_session_budget(prompt.size(), max_tokens, ctx.limits)) {
    return send_error(res, *e);
  }
  const std::string echo_text =
      !r.echo ? std::string() : (r.prompt_text ? *r.prompt_text : ctx.tokenizer.decode(prompt));
  ApiResult<std::shared_ptr<Job>> started =
      admit_and_start(ctx, make_job_spec(ctx, r.fields, std::move(prompt), max_tokens));
  if (auto* e = std::get_if<ApiError>(&started)) return send_error(res, *e);
  std::shared_ptr<Job> job = std::get<std::shared_ptr<Job>>(started);

  const std::string id = make_id("cmpl-");
  const int64_t created = unix_now();
  const std::optional<int32_t> top_n = r.fields.top_logprobs;
  const Tokenizer tok = ctx.tokenizer;
  const PeerWatch peer(req);

  if (r.fields.stream) {
    const bool include_usage = r.fields.include_usage;
    const int32_t n = r.fields.n;
    const std::string model = ctx.model_id;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider("text/event-stream", [=](size_t,
                                                              httplib::DataSink& data_sink) {
      auto offsets =
          std::make_shared<std::vector<size_t>>(static_cast<size_t>(n), echo_text.size());
      auto echoed = std::make_shared<std::vector<bool>>(static_cast<size_t>(n), echo_text.empty());
      auto chunk = [&](int32_t index, const std::string& text, const json& logprobs,
                       const json& finish) {
        return json{{"id", id},
                    {"object", "text_completion"},
                    {"created", created},
                    {"model", model},
                    {"choices", json::array({{{"index", index},
                                              {"text", text},
                                              {"logprobs", logprobs},
                                              {"finish_reason", finish}}})}};
      };
      SseSink sink(data_sink, peer, [&](const ChoiceDelta& d) {
        std::string text = d.text;
        if (!(*echoed)[static_cast<size_t>(d.index)]) {
          text = echo_text + text;
          (*echoed)[static_cast<size_t>(d.index)] = true;
        }
        json lp = nullptr;
        if (top_n) {
          lp = completion_logprobs(tok, d.tokens, d.logprobs, *top_n,
                                   (*offsets)[static_cast<size_t>(d.index)]);
        }
        return chunk(d.index, text, lp, d.finish_reason ? json(*d.finish_reason) : json());
      });
      const JobSummary summary = run_logged(*job, sink);
      if (include_usage) {
        send_usage_chunk(
            sink,
            {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model}},
            summary);
      }
      return sink.finish();
    });
    return;
  }

  CollectSink sink(peer, r.fields.n);
  const JobSummary summary = run_logged(*job, sink);
  if (std::optional<ApiError> e = sink.failure()) return send_error(res, *e);
  json choices = json::array();
  for (size_t i = 0; i < sink.choices().size(); ++i) {
    const CollectedChoice& c = sink.choices()[i];
    json lp = nullptr;
    if (top_n) {
      size_t offset = echo_text.size();
      lp = completion_logprobs(tok, c.tokens, c.logprobs, *top_n, offset);
    }
    choices.push_back({{"index", i},
                       {"text", echo_text + c.text},
                       {"logprobs", lp},
                       {"finish_reason", c.finish_reason}});
  }
  send_json(res, 200,
            {{"id", id},
             {"object", "text_completion"},
             {"created", created},
             {"model", ctx.model_id},
             {"choices", std::move(choices)},
             {"usage", usage_json(summary)}});
}

}  // namespace cellm::cli
