// `cellm generate`: runs every prompt concurrently through the Runner and
// streams each generation's text; optionally writes a JSON report.
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "args.h"
#include "cellm/engine.h"
#include "cellm/runner.h"
#include "cellm/sampler.h"
#include "cli.h"
#include "commands.h"

namespace cellm::cli {
namespace {

// The flags: the model and prompts, the sampling flags every generating command shares
// (cli.h), then the rest.
const std::vector<FlagSpec> kFlags = [] {
  std::vector<FlagSpec> flags = {
      {"model", "DIR", "Hugging Face model folder (default: the bundled models/kjv-small)"},
      {"prompt", "TEXT", "a prompt (encoded with the model's BOS rules)", true},
      {"prompts-file", "FILE", "one prompt per line; \\n in a line is a newline"},
      {"prompt-tokens", "IDS", "a prompt as comma-separated token ids, fed as given", true},
      {"max-new-tokens", "N", "tokens to generate per prompt (default 64)"},
  };
  flags.insert(flags.end(), sampling_flags().begin(), sampling_flags().end());
  flags.insert(
      flags.end(),
      {
          {"seed", "S", "sampling seed; randomness is keyed by (seed, position) (default 42)"},
          {"logprobs", "N",
           "report each token's log-probability and the N most likely tokens' (raw logits, before "
           "temperature) in --report-json; 0 = off, at most 20 (default 0)"},
          {"ignore-eos", "", "keep generating past end-of-sequence tokens"},
          {"max-sessions", "M",
           "sessions resident at once (default: number of prompts, at most 64)"},
          {"max-session-tokens", "N", "positions per session (default 1024, at most the context)"},
          {"step-width", "W", "tokens per forward (default 256)"},
          {"threads", "N", "CPU threads; 0 = all (default 0)"},
          {"executor", "KIND", "cpu or cuda (default: cuda when a GPU is present, else cpu)"},
          weights_flag(),
          kv_dtype_flag(),
          activations_flag(),
          {"no-cuda-graphs", "", "CUDA: run decode steps eagerly instead of replaying graphs"},
          {"report-json", "FILE", "write a JSON report of generations, timing and metrics"},
      });
  return flags;
}();

std::string unescape_newlines(const std::string& line) {
  std::string out;
  for (size_t i = 0; i < line.size(); ++i) {
    if (line[i] == '\\' && i + 1 < line.size() && line[i + 1] == 'n') {
      out += '\n';
      ++i;
    } else {
      out += line[i];
    }
  }
  return out;
}

struct Prompt {
  std::string text;           // empty for --prompt-tokens
  std::vector<Token> tokens;  // what the session is fed
};

Result<std::vector<Prompt>> collect_prompts(const Args& args, const std::optional<Tokenizer>& tok) {
  std::vector<std::string> texts = args.get_all("prompt");
  if (auto file = args.get("prompts-file")) {
    std::ifstream in(*file);
    if (!in) return NotFound("--prompts-file: cannot open '" + *file + "'");
    for (std::string line; std::getline(in, line);) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (!line.empty()) texts.push_back(unescape_newlines(line));
    }
  }
  std::vector<Prompt> prompts;
  for (const std::string& t : texts) {
    Prompt p{t, tok->encode(t, /*add_special_tokens=*/true)};
    if (p.tokens.empty()) return InvalidArgument("prompt '" + t + "' encodes to no tokens");
    prompts.push_back(std::move(p));
  }
  for (const std::string& list : args.get_all("prompt-tokens")) {
    Prompt p;
    std::stringstream ss(list);
    for (std::string item; std::getline(ss, item, ',');) {
      try {
        size_t used = 0;
        const long v = std::stol(item, &used);
        if (used != item.size() || v < 0 || v > INT32_MAX) throw std::invalid_argument(item);
        p.tokens.push_back(static_cast<Token>(v));
      } catch (const std::exception&) {
        return InvalidArgument("--prompt-tokens expects comma-separated token ids, got '" + item +
                               "'");
      }
    }
    if (p.tokens.empty()) return InvalidArgument("--prompt-tokens got an empty list");
    prompts.push_back(std::move(p));
  }
  if (prompts.empty()) {
    return InvalidArgument("no prompt: give --prompt, --prompts-file or --prompt-tokens");
  }
  return prompts;
}

// Streams one generation's text. With a single prompt, text goes straight to
// stdout; with several, whole lines are printed as "[i] line" as they complete.
class TextStream {
 public:
  TextStream(size_t index, bool prefixed, const Tokenizer& tok, std::mutex& out_mu)
      : index_(index), prefixed_(prefixed), decoder_(tok), out_mu_(out_mu) {}

  void start(const std::string& prompt_text) { emit(prompt_text); }
  void feed(Token t) { emit(decoder_.feed(t)); }
  void finish() {
    std::string rest = decoder_.flush();
    emit(rest);
    std::lock_guard<std::mutex> lock(out_mu_);
    if (prefixed_) {
      if (!line_.empty()) std::printf("[%zu] %s\n", index_, line_.c_str());
    } else {
      std::printf("\n");
    }
    std::fflush(stdout);
  }
  const std::string& text() const { return text_; }

 private:
  void emit(const std::string& chunk) {
    if (chunk.empty()) return;
    std::lock_guard<std::mutex> lock(out_mu_);
    if (!prefixed_) {
      std::fwrite(chunk.data(), 1, chunk.size(), stdout);
      std::fflush(stdout);
    } else {
      line_ += chunk;
      for (size_t nl; (nl = line_.find('\n')) != std::string::npos;) {
        std::printf("[%zu] %s\n", index_, line_.substr(0, nl).c_str());
        line_.erase(0, nl + 1);
      }
    }
    if (started_) text_ += chunk;
    started_ = true;
  }

  size_t index_;
  bool prefixed_;
  IncrementalDecoder decoder_;
  std::mutex& out_mu_;
  std::string line_;
  std::string text_;  // the generated text (not the prompt)
  bool started_ = false;
};

// One token's logprobs as the report writes them:
// {"token": id, "logprob": x, "top": [[id, x], ...]} (-inf is written as null).
nlohmann::json logprobs_json(Token token, const TokenLogprobs& lp) {
  nlohmann::json top = nlohmann::json::array();
  for (const auto& [id, logprob] : lp.top) top.push_back({id, logprob});
  return {{"token", token}, {"logprob", lp.logprob}, {"top", std::move(top)}};
}

struct GenState {
  std::vector<Token> tokens;
  std::vector<TokenLogprobs> logprobs;  // parallel to tokens with --logprobs
  std::unique_ptr<TextStream> stream;
  GenerationHandle handle;
  Session session;
};

}  // namespace

int run_generate(int argc, const char* const* argv) {
  const std::string cmd = "cellm generate";
  const std::string usage =
      "cellm generate [--model DIR] --prompt TEXT [--prompt TEXT ...] [options]";
  if (wants_help(argc, argv)) {
    std::printf("%s",
                format_help(usage,
                            "Generates continuations of every prompt concurrently (continuous "
                            "batching through the Runner) and streams their text.",
                            kFlags)
                    .c_str());
    return 0;
  }
  Result<Args> args_or = Args::parse(argc, argv, 2, kFlags, cmd);
  if (!args_or.ok()) return fail(cmd, args_or.status());
  const Args& args = *args_or;

  // Sampling and limits first: bad flags fail before any loading.
  GenConfig gen;
  Result<SamplingParams> sampling = parse_sampling_flags(args);
  if (!sampling.ok()) return fail(cmd, sampling.status());
  SamplingParams& sp = gen.sampling;
  sp = *sampling;
  Result<int64_t> max_new = args.get_int("max-new-tokens", 64, 1, 1 << 24);
  Result<int64_t> seed = args.get_int("seed", 42, 0, INT64_MAX);
  Result<int64_t> max_session_tokens = args.get_int("max-session-tokens", 1024, 1, 1 << 24);
  Result<int64_t> step_width = args.get_int("step-width", 256, 1, 1 << 16);
  Result<int64_t> threads = args.get_int("threads", 0, 0, 1024);
  Result<int64_t> logprobs = args.get_int("logprobs", 0, 0, kMaxLogprobs);
  for (const Status* s : {&max_new.status(), &seed.status(), &max_session_tokens.status(),
                          &step_width.status(), &threads.status(), &logprobs.status()}) {
    if (!s->ok()) return fail(cmd, *s);
  }
  sp.num_logprobs = static_cast<int32_t>(*logprobs);
  if (Status s = validate_sampling(sp); !s.ok()) return fail(cmd, s);
  gen.max_new_tokens = static_cast<int32_t>(*max_new);
  gen.seed = static_cast<uint64_t>(*seed);
  EngineOptions options;
  Result<ExecutorKind> kind = parse_executor_flag(args);
  if (!kind.ok()) return fail(cmd, kind.status());
  options.executor = *kind;

  options.model.path = args.get("model").value_or("");
  Result<WeightFormat> weights = parse_weights_flag(args, options.executor);
  if (!weights.ok()) return fail(cmd, weights.status());
  options.model.weights = *weights;
  Result<KvDtype> kv_dtype = parse_kv_dtype_flag(args);
  if (!kv_dtype.ok()) return fail(cmd, kv_dtype.status());
  options.limits.kv_dtype = *kv_dtype;
  Result<bool> bf16_activations = parse_activations_flag(args);
  if (!bf16_activations.ok()) return fail(cmd, bf16_activations.status());
  Result<std::shared_ptr<const LoadedModel>> model_or =
      load_model(options.model, /*with_tokenizer=*/true);
  if (!model_or.ok()) return fail(cmd, model_or.status());
  const LoadedModel& model = **model_or;
  print_weights_summary(model);
  const Tokenizer& tok = *model.tokenizer;
  if (!args.has("ignore-eos")) gen.stop_tokens = tok.eos_ids();

  Result<std::vector<Prompt>> prompts_or = collect_prompts(args, model.tokenizer);
  if (!prompts_or.ok()) return fail(cmd, prompts_or.status());
  const std::vector<Prompt>& prompts = *prompts_or;

  ExecutorLimits& limits = options.limits;
  limits.max_session_tokens = static_cast<int32_t>(
      std::min<int64_t>(*max_session_tokens, model.weights->config().max_position_embeddings()));
  if (args.has("max-session-tokens"))
    limits.max_session_tokens = static_cast<int32_t>(*max_session_tokens);
  Result<int64_t> max_sessions = args.get_int(
      "max-sessions", std::min<int64_t>(static_cast<int64_t>(prompts.size()), 64), 1, 1 << 16);
  if (!max_sessions.ok()) return fail(cmd, max_sessions.status());
  limits.max_sessions = static_cast<int32_t>(*max_sessions);
  limits.step_width =
      static_cast<int32_t>(std::min<int64_t>(*step_width, limits.max_session_tokens));
  options.cpu.num_threads = static_cast<int32_t>(*threads);
  options.cpu.bf16_activations = *bf16_activations;
  options.cuda.cuda_graph_for_decode = !args.has("no-cuda-graphs");
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int64_t need = static_cast<int64_t>(prompts[i].tokens.size()) + gen.max_new_tokens;
    if (need > limits.max_session_tokens) {
      return fail(cmd, InvalidArgument(
                           "prompt " + std::to_string(i) + " has " +
                           std::to_string(prompts[i].tokens.size()) + " tokens; with " +
                           "--max-new-tokens " + std::to_string(gen.max_new_tokens) + " it needs " +
                           std::to_string(need) + " positions but a session holds " +
                           std::to_string(limits.max_session_tokens) + " (--max-session-tokens)"));
    }
    for (Token t : prompts[i].tokens) {
      if (t < 0 || t >= model.weights->config().vocab_size()) {
        return fail(cmd,
                    InvalidArgument("prompt " + std::to_string(i) + " has token id " +
                                    std::to_string(t) + " outside the vocabulary [0, " +
                                    std::to_string(model.weights->config().vocab_size()) + ")"));
      }
    }
  }

  Result<Engine> engine = Engine::create(*model_or, options);
  if (!engine.ok()) return fail(cmd, engine.status());

  const int64_t t0 = now_us();
  Runner& runner = engine->runner();
  std::mutex out_mu, done_mu;
  std::condition_variable done_cv;
  std::vector<size_t> finished;  // guarded by done_mu
  std::vector<GenState> gens(prompts.size());
  const bool prefixed = prompts.size() > 1;

  size_t next = 0, running = 0, completed = 0;
  std::optional<std::string> start_error;
  while (completed < prompts.size()) {
    // Open every session this round can start first, then start their
    // generations back to back, so they enter the engine together.
    std::vector<size_t> starting;
    while (next + starting.size() < prompts.size() &&
           running + starting.size() < static_cast<size_t>(limits.max_sessions)) {
      std::optional<Session> session = runner.open_session_async().get();
      if (!session) {
        const Status init = runner.initialize_status();
        start_error = init.ok() ? "the executor refused to open a session"
                                : "the executor failed to start: " + init.message();
        break;
      }
      const size_t i = next + starting.size();
      gens[i].session = std::move(*session);
      starting.push_back(i);
    }
    next += starting.size();
    for (const size_t i : starting) {
      GenState& g = gens[i];
      g.stream = std::make_unique<TextStream>(i, prefixed, tok, out_mu);
      g.stream->start(prompts[i].text);
      g.handle =
          g.session.generate_async(prompts[i].tokens, gen, [&, i](const GenerationUpdate& u) {
            GenState& s = gens[i];
            for (Token t : u.tokens) {
              s.tokens.push_back(t);
              s.stream->feed(t);
            }
            s.logprobs.insert(s.logprobs.end(), u.logprobs.begin(), u.logprobs.end());
            if (u.finish_reason) {
              s.stream->finish();
              std::lock_guard<std::mutex> lock(done_mu);
              finished.push_back(i);
              done_cv.notify_all();
            }
          });
      ++running;
    }
    if (start_error && running == 0) break;
    std::unique_lock<std::mutex> lock(done_mu);
    done_cv.wait(lock, [&] { return !finished.empty(); });
    while (!finished.empty()) {
      const size_t i = finished.back();
      finished.pop_back();
      lock.unlock();
      gens[i].handle.wait();
      gens[i].session = Session();  // closes it; frees its cells for the next prompt
      lock.lock();
      --running;
      ++completed;
    }
  }
  const int64_t t1 = now_us();
  runner.shutdown();
  if (start_error) return fail(cmd, Internal(*start_error));

  int failures = 0;
  int64_t generated = 0;
  for (const GenState& g : gens) {
    generated += static_cast<int64_t>(g.tokens.size());
    if (g.handle.finish_reason() == FinishReason::kFailed) {
      ++failures;
      std::fprintf(stderr, "cellm generate: generation failed: %s\n",
                   g.handle.error_message().c_str());
    }
  }
  const double seconds = static_cast<double>(t1 - t0) / 1e6;
  std::fprintf(stderr,
               "cellm generate: %zu prompts, %lld tokens in %.2f s (%.1f tok/s), %s executor\n",
               prompts.size(), static_cast<long long>(generated), seconds,
               seconds > 0 ? static_cast<double>(generated) / seconds : 0.0,
               to_string(engine->executor_kind()));

  if (auto path = args.get("report-json")) {
    nlohmann::json report;
    report["generations"] = nlohmann::json::array();
    for (size_t i = 0; i < gens.size(); ++i) {
      const GenState& g = gens[i];
      nlohmann::json j;
      j["prompt"] = prompts[i].text;
      j["prompt_tokens"] = prompts[i].tokens;
      j["tokens"] = g.tokens;
      j["text"] = g.stream->text();
      j["finish_reason"] = g.handle.finish_reason() ? to_string(*g.handle.finish_reason()) : "none";
      j["error"] = g.handle.error_message();
      if (sp.num_logprobs > 0) {
        j["logprobs"] = nlohmann::json::array();
        for (size_t k = 0; k < g.logprobs.size() && k < g.tokens.size(); ++k) {
          j["logprobs"].push_back(logprobs_json(g.tokens[k], g.logprobs[k]));
        }
      }
      j["metrics"] = nlohmann::json::parse(to_json(g.handle.metrics()));
      report["generations"].push_back(std::move(j));
    }
    report["timing"] = {
        {"load_seconds", model.load_seconds},
        {"generate_seconds", seconds},
        {"generated_tokens", generated},
        {"tokens_per_second", seconds > 0 ? static_cast<double>(generated) / seconds : 0.0}};
    report["engine"] = nlohmann::json::parse(to_json(runner.metrics()));
    report["kv"] = nlohmann::json::parse(to_json(runner.kv_metrics()));
    report["config"] = {{"model", model.name},
                        {"executor", to_string(engine->executor_kind())},
                        {"max_sessions", limits.max_sessions},
                        {"max_session_tokens", limits.max_session_tokens},
                        {"step_width", limits.step_width},
                        {"max_new_tokens", gen.max_new_tokens},
                        {"temperature", sp.temperature},
                        {"top_k", sp.top_k},
                        {"top_p", sp.top_p},
                        {"min_p", sp.min_p},
                        {"seed", *gen.seed},
                        {"logprobs", sp.num_logprobs},
                        {"ignore_eos", args.has("ignore-eos")}};
    std::ofstream out(*path);
    out << report.dump(2) << "\n";
    if (!out) return fail(cmd, IoError("--report-json: cannot write '" + *path + "'"));
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace cellm::cli
