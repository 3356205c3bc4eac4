// POST /v1/completions: OpenAI's legacy completions, with and without
// streaming. The prompt is text (encoded with the model's BOS rules) or a list
// of token ids (fed as given), or a batch of either: prompt k's choice i is the
// answer's choice k * n + i.
#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>

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

// The legacy logprobs object, empty; append_logprob adds one token to it.
json empty_logprobs() {
  return {{"tokens", json::array()},
          {"token_logprobs", json::array()},
          {"top_logprobs", json::array()},
          {"text_offset", json::array()}};
}

// -inf (a token the model rules out) as the finite number OpenAI's API sends.
double finite_logprob(float logprob) {
  return std::max(static_cast<double>(logprob), -9999.0);
}

// One token's entry, its text offset `offset` (advanced past it: offsets index the
// choice's text). Null `lp` (a
// prompt's first token, which nothing predicts) gives null log-probabilities. The
// alternatives are the top `top_n` and, as OpenAI's API, the chosen token too: up
// to top_n + 1 entries.
void append_logprob(const Tokenizer& tok, Token token, const TokenLogprobs* lp, int32_t top_n,
                    json& out, size_t& offset) {
  const std::string text = tok.decode(std::span<const Token>(&token, 1));
  out["tokens"].push_back(text);
  out["text_offset"].push_back(offset);
  // A special token (BOS, EOS) is named in `tokens` but takes no room in the text.
  if (!tok.is_special(token)) offset += text.size();
  if (lp == nullptr) {
    out["token_logprobs"].push_back(nullptr);
    out["top_logprobs"].push_back(nullptr);
    return;
  }
  out["token_logprobs"].push_back(finite_logprob(lp->logprob));
  json top = json::object();
  for (size_t k = 0; k < lp->top.size() && static_cast<int32_t>(k) < top_n; ++k) {
    const auto& [id, value] = lp->top[k];
    const std::string key = tok.decode(std::span<const Token>(&id, 1));
    if (!top.contains(key)) top[key] = finite_logprob(value);
  }
  if (!top.contains(text)) top[text] = finite_logprob(lp->logprob);
  out["top_logprobs"].push_back(std::move(top));
}

// Generated tokens with their log-probabilities (parallel when asked for).
void append_generated(const Tokenizer& tok, const std::vector<Token>& tokens,
                      const std::vector<TokenLogprobs>& logprobs, int32_t top_n, json& out,
                      size_t& offset) {
  for (size_t i = 0; i < tokens.size() && i < logprobs.size(); ++i) {
    append_logprob(tok, tokens[i], &logprobs[i], top_n, out, offset);
  }
}

// An echoed prompt's tokens: the first has none; token i > 0 has scores[i - 1].
void append_prompt(const Tokenizer& tok, const std::vector<Token>& prompt,
                   const std::vector<TokenLogprobs>& scores, int32_t top_n, json& out,
                   size_t& offset) {
  for (size_t i = 0; i < prompt.size(); ++i) {
    const TokenLogprobs* lp = i > 0 && i - 1 < scores.size() ? &scores[i - 1] : nullptr;
    append_logprob(tok, prompt[i], lp, top_n, out, offset);
  }
}

// Keeps each choice's prompt scores (on its first delta) and passes every delta on.
class ScoresSink final : public JobSink {
 public:
  ScoresSink(JobSink& inner, int32_t n_choices)
      : inner_(inner), scores_(static_cast<size_t>(n_choices)) {}
  bool deliver(const ChoiceDelta& delta) override {
    if (!delta.prompt_logprobs.empty()) {
      scores_[static_cast<size_t>(delta.index)] = delta.prompt_logprobs;
    }
    return inner_.deliver(delta);
  }
  bool alive() override { return inner_.alive(); }
  const std::vector<TokenLogprobs>& scores(int32_t index) const {
    return scores_[static_cast<size_t>(index)];
  }

 private:
  JobSink& inner_;
  std::vector<std::vector<TokenLogprobs>> scores_;
};

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
  // max_tokens 0 (with echo) answers with the prompt alone: one token is generated,
  // since every generation makes one, and dropped; the finish is "length".
  const bool echo_only = max_tokens == 0;
  const int32_t generate = std::max(max_tokens, 1);
  // echo with logprobs: the prompt's own log-probabilities, scored as it is fed.
  const bool score = r.echo && r.fields.top_logprobs.has_value();

  // Every prompt is encoded and checked before any of them starts.
  std::vector<std::vector<Token>> prompts;
  std::vector<std::string> echo_texts;
  for (const PromptInput& in : r.prompts) {
    std::vector<Token> prompt =
        in.text ? ctx.tokenizer.encode(*in.text, /*add_special_tokens=*/true) : in.tokens;
    if (prompt.empty())
      return send_error(res, invalid_field("prompt", "the prompt encodes to no tokens"));
    if (auto e = check_session_budget(prompt.size(), generate, ctx.limits)) {
      return send_error(res, *e);
    }
    echo_texts.push_back(
        !r.echo
            ? std::string()
            : (in.text ? *in.text : ctx.tokenizer.decode(prompt, /*skip_special_tokens=*/true)));
    prompts.push_back(std::move(prompt));
  }
  const std::vector<std::vector<Token>> prompt_ids = score ? prompts : decltype(prompts)();
  // Every spec (its constraint compiled, its penalties checked) before any job starts.
  std::vector<JobSpec> specs;
  for (std::vector<Token>& prompt : prompts) {
    specs.push_back(make_job_spec(ctx, r.fields, std::move(prompt), generate));
    specs.back().score_prompt = score;
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
  // Choice `index`'s logprobs object: the echoed prompt's (with `scores`), then
  // the generated tokens' unless max_tokens is 0.
  auto logprobs_of = [tok, prompt_ids, n, score, echo_only, top_n](
                         int32_t index, bool with_prompt, const std::vector<TokenLogprobs>& scores,
                         const std::vector<Token>& tokens,
                         const std::vector<TokenLogprobs>& logprobs, size_t& offset) -> json {
    if (!top_n) return nullptr;
    json out = empty_logprobs();
    if (score && with_prompt) {
      append_prompt(tok, prompt_ids[static_cast<size_t>(index / n)], scores, *top_n, out, offset);
    }
    if (!echo_only) append_generated(tok, tokens, logprobs, *top_n, out, offset);
    return out;
  };
  // A finish as the client sees it: with max_tokens 0 nothing was generated.
  auto finish_of = [echo_only](const std::string& reason) -> std::string {
    return echo_only && (reason == "stop" || reason == "length") ? "length" : reason;
  };

  if (r.fields.stream) {
    const bool include_usage = r.fields.include_usage;
    const std::string model = ctx.model_id;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream", [=](size_t, httplib::DataSink& data_sink) {
          std::vector<size_t> offsets(static_cast<size_t>(n_choices));
          std::vector<bool> started(static_cast<size_t>(n_choices));
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
          SseSink sink(data_sink, peer, [&](const ChoiceDelta& d) -> json {
            const auto c = static_cast<size_t>(d.index);
            // A choice's first chunk carries the echo (and the prompt's logprobs).
            const bool first = !started[c];
            started[c] = true;
            const std::string text =
                (first ? echo_of(d.index) : std::string()) + (echo_only ? std::string() : d.text);
            const json finish = d.finish_reason ? json(finish_of(*d.finish_reason)) : json();
            if (!first && echo_only && finish.is_null()) return nullptr;
            const json lp =
                logprobs_of(d.index, first, d.prompt_logprobs, d.tokens, d.logprobs, offsets[c]);
            return chunk(d.index, text, lp, finish);
          });
          JobSummary summary = sum_summaries(run_job_group(jobs, n, sink));
          if (echo_only) summary.completion_tokens = 0;
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

  CollectSink collect(peer, n_choices);
  ScoresSink sink(collect, n_choices);
  JobSummary summary = sum_summaries(run_job_group(jobs, n, sink));
  if (std::optional<ApiError> e = collect.failure()) return send_error(res, *e);
  if (echo_only) summary.completion_tokens = 0;
  json choices = json::array();
  for (int32_t i = 0; i < n_choices; ++i) {
    const CollectedChoice& c = collect.choices()[static_cast<size_t>(i)];
    size_t offset = 0;
    choices.push_back(
        {{"index", i},
         {"text", echo_of(i) + (echo_only ? std::string() : c.text)},
         {"logprobs", logprobs_of(i, true, sink.scores(i), c.tokens, c.logprobs, offset)},
         {"finish_reason", finish_of(c.finish_reason)}});
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
