// POST /v1/completions: OpenAI's legacy completions, with and without
// streaming. The prompt is text (encoded with the model's BOS rules) or a list
// of token ids (fed as given), or a batch of either: prompt k's choice i is the
// answer's choice k * n + i.
#include <memory>
#include <nlohmann/json.hpp>

#include "serve/connection.h"
#include "serve/endpoints.h"
#include "serve/http.h"
#include "serve/job_group.h"
#include "serve/request.h"
#include "serve/streaming.h"
#include "serve/structured.h"

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
  const int32_t max_tokens = r.fields.max_tokens.value_or(kDefaultMaxTokens);

  // Every prompt is encoded and checked before any of them starts.
  std::vector<std::vector<Token>> prompts;
  std::vector<std::string> echo_texts;
  for (const PromptInput& in : r.prompts) {
    std::vector<Token> prompt =
        in.text ? ctx.tokenizer.encode(*in.text, /*add_special_tokens=*/true) : in.tokens;
    if (prompt.empty())
      return send_error(res, invalid_field("prompt", "the prompt encodes to no tokens"));
    if (auto e = check_session_budget(prompt.size(), max_tokens, ctx.limits)) {
      return send_error(res, *e);
    }
    echo_texts.push_back(!r.echo ? std::string()
                                 : (in.text ? *in.text : ctx.tokenizer.decode(prompt)));
    prompts.push_back(std::move(prompt));
  }
  // Every spec (its constraint compiled, its penalties checked) before any job starts.
  std::vector<JobSpec> specs;
  for (std::vector<Token>& prompt : prompts) {
    specs.push_back(make_job_spec(ctx, r.fields, std::move(prompt), max_tokens));
    if (auto e = attach_logits_processing(ctx.tokenizer, r.fields, specs.back())) {
      return send_error(res, *e);
    }
  }
  int64_t prompt_tokens = 0;
  std::vector<std::shared_ptr<Job>> jobs;
  for (JobSpec& spec : specs) {
    prompt_tokens += static_cast<int64_t>(spec.prompt.size());
    ApiResult<std::shared_ptr<Job>> started = admit_and_start(ctx, std::move(spec));
    // The jobs already started end (cancelled) with their handles.
    if (auto* e = std::get_if<ApiError>(&started)) return send_error(res, *e);
    jobs.push_back(std::get<std::shared_ptr<Job>>(started));
  }
  request_log().prompt_tokens = prompt_tokens;

  const std::string id = make_id("cmpl-");
  const int64_t created = unix_now();
  const std::optional<int32_t> top_n = r.fields.top_logprobs;
  const Tokenizer tok = ctx.tokenizer;
  const PeerWatch peer(req);
  const int32_t n = r.fields.n;
  const auto n_choices = static_cast<int32_t>(jobs.size()) * n;
  // The echo of the prompt behind choice `index`.
  auto echo_of = [echo_texts, n](int32_t index) -> const std::string& {
    return echo_texts[static_cast<size_t>(index / n)];
  };

  if (r.fields.stream) {
    const bool include_usage = r.fields.include_usage;
    const std::string model = ctx.model_id;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream", [=](size_t, httplib::DataSink& data_sink) {
          std::vector<size_t> offsets(static_cast<size_t>(n_choices));
          std::vector<bool> echoed(static_cast<size_t>(n_choices));
          for (int32_t c = 0; c < n_choices; ++c) {
            offsets[static_cast<size_t>(c)] = echo_of(c).size();
            echoed[static_cast<size_t>(c)] = echo_of(c).empty();
          }
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
            const auto c = static_cast<size_t>(d.index);
            std::string text = d.text;
            if (!echoed[c]) {
              text = echo_of(d.index) + text;
              echoed[c] = true;
            }
            json lp = nullptr;
            if (top_n) lp = completion_logprobs(tok, d.tokens, d.logprobs, *top_n, offsets[c]);
            return chunk(d.index, text, lp, d.finish_reason ? json(*d.finish_reason) : json());
          });
          const JobSummary summary = sum_summaries(run_job_group(jobs, n, sink));
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

  CollectSink sink(peer, n_choices);
  const JobSummary summary = sum_summaries(run_job_group(jobs, n, sink));
  if (std::optional<ApiError> e = sink.failure()) return send_error(res, *e);
  json choices = json::array();
  for (int32_t i = 0; i < n_choices; ++i) {
    const CollectedChoice& c = sink.choices()[static_cast<size_t>(i)];
    json lp = nullptr;
    if (top_n) {
      size_t offset = echo_of(i).size();
      lp = completion_logprobs(tok, c.tokens, c.logprobs, *top_n, offset);
    }
    choices.push_back({{"index", i},
                       {"text", echo_of(i) + c.text},
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
