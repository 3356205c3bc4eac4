// `cellm perplexity`: the perplexity of a model over a text file, measured the way
// llama.cpp's llama-perplexity measures it so the two compare: the whole text is
// tokenized once (no special tokens), cut into consecutive chunks of --ctx-size
// tokens (the first token of each replaced by BOS when the tokenizer adds one),
// each chunk is fed as its own prompt, and the negative log-likelihood of each
// token in the second half of the chunk (positions ctx/2 + 1 .. ctx - 1, each
// predicted from all the tokens before it in its chunk) is averaged over all
// chunks. Prints the running estimate after each chunk and the final
// PPL = exp(mean NLL) with its standard error.
//
// The chunks run as concurrent sessions through the Runner (prompt scoring:
// GenConfig::score_prompt), --parallel at a time.
#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>

#include "args.h"
#include "cellm/engine.h"
#include "cellm/metrics.h"
#include "cellm/runner.h"
#include "cli.h"
#include "commands.h"

namespace cellm::cli {
namespace {

const std::vector<FlagSpec> kFlags = {
    {"model", "PATH",
     "Hugging Face model folder or .gguf file (default: the bundled models/kjv-small)"},
    {"file", "TEXT", "the text to measure (UTF-8)"},
    {"ctx-size", "N", "tokens per chunk (default 512; at most the model's context)"},
    {"chunks", "N", "measure at most N chunks (default: all the text holds)"},
    {"parallel", "M", "chunks evaluated at once (default 4)"},
    {"step-width", "W", "tokens per forward (default 512)"},
    {"threads", "N", "CPU threads; 0 = all (default 0)"},
    {"executor", "KIND", "cpu or cuda (default: cuda when a GPU is present, else cpu)"},
    weights_flag(),
    kv_dtype_flag(),
    activations_flag(),
};

struct ChunkResult {
  double nll_sum = 0;   // over the scored tokens
  double nll2_sum = 0;  // of the squares, for the standard error
  int64_t count = 0;    // tokens scored
  std::string error;    // set when the chunk failed
  bool done = false;
};

}  // namespace

int run_perplexity(int argc, const char* const* argv) {
  const std::string cmd = "cellm perplexity";
  if (wants_help(argc, argv)) {
    std::printf("%s", format_help("cellm perplexity --file TEXT [--model PATH] [options]",
                                  "Measures the model's perplexity over a text, chunk by chunk, "
                                  "with llama-perplexity's method (the second half of each "
                                  "chunk is scored).",
                                  kFlags)
                          .c_str());
    return 0;
  }
  Result<Args> args_or = Args::parse(argc, argv, 2, kFlags, cmd);
  if (!args_or.ok()) return fail(cmd, args_or.status());
  const Args& args = *args_or;
  const std::optional<std::string> file = args.get("file");
  if (!file) return fail(cmd, InvalidArgument("--file is required"));
  Result<int64_t> ctx = args.get_int("ctx-size", 512, 4, 1 << 20);
  Result<int64_t> max_chunks = args.get_int("chunks", -1, -1, 1 << 30);
  Result<int64_t> parallel = args.get_int("parallel", 4, 1, 256);
  Result<int64_t> step_width = args.get_int("step-width", 512, 1, 1 << 16);
  Result<int64_t> threads = args.get_int("threads", 0, 0, 1024);
  for (const Status* s : {&ctx.status(), &max_chunks.status(), &parallel.status(),
                          &step_width.status(), &threads.status()}) {
    if (!s->ok()) return fail(cmd, *s);
  }
  std::ifstream in(*file, std::ios::binary);
  if (!in) return fail(cmd, NotFound("--file: cannot open '" + *file + "'"));
  std::stringstream text;
  text << in.rdbuf();

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
  const int64_t context = model.weights->config().max_position_embeddings();
  if (*ctx > context) {
    return fail(cmd, InvalidArgument("--ctx-size " + std::to_string(*ctx) +
                                     " is past the model's context of " + std::to_string(context) +
                                     " tokens"));
  }

  const std::vector<Token> tokens = tok.encode(text.str(), /*add_special_tokens=*/false);
  const std::vector<Token> probe = tok.encode("a", /*add_special_tokens=*/true);
  const std::optional<Token> bos = tok.bos_id() && !probe.empty() && probe.front() == *tok.bos_id()
                                       ? tok.bos_id()
                                       : std::nullopt;
  const auto n_ctx = static_cast<size_t>(*ctx);
  size_t n_chunks = tokens.size() / n_ctx;
  if (*max_chunks >= 0) n_chunks = std::min(n_chunks, static_cast<size_t>(*max_chunks));
  if (n_chunks == 0) {
    return fail(cmd, InvalidArgument("'" + *file + "' holds " + std::to_string(tokens.size()) +
                                     " tokens: fewer than one chunk of --ctx-size " +
                                     std::to_string(n_ctx)));
  }
  const size_t first = n_ctx / 2;  // scored: the tokens at first + 1 .. n_ctx - 1

  ExecutorLimits& limits = options.limits;
  limits.max_sessions = static_cast<int32_t>(std::min<int64_t>(*parallel, n_chunks));
  limits.max_session_tokens = static_cast<int32_t>(n_ctx + 1);
  limits.step_width = static_cast<int32_t>(std::min<int64_t>(*step_width, n_ctx + 1));
  options.cpu.num_threads = static_cast<int32_t>(*threads);
  options.cpu.bf16_activations = *bf16_activations;
  Result<Engine> engine = Engine::create(*model_or, options);
  if (!engine.ok()) return fail(cmd, engine.status());
  std::fprintf(stderr, "%s: %zu tokens, %zu chunks of %zu (%s executor)\n", cmd.c_str(),
               tokens.size(), n_chunks, n_ctx, to_string(engine->executor_kind()));

  GenConfig config;
  config.max_new_tokens = 1;
  config.score_prompt = true;
  config.seed = 0;
  Runner& runner = engine->runner();
  std::mutex mu;
  std::condition_variable cv;
  std::vector<ChunkResult> results(n_chunks);
  std::vector<Session> sessions(n_chunks);
  std::vector<GenerationHandle> handles(n_chunks);
  const int64_t t0 = now_us();
  size_t started = 0, reported = 0;
  double nll_sum = 0, nll2_sum = 0;
  int64_t count = 0;
  while (reported < n_chunks) {
    // Keep --parallel chunks in flight.
    while (started < n_chunks && started - reported < static_cast<size_t>(limits.max_sessions)) {
      const size_t c = started++;
      std::optional<Session> session = runner.open_session_async().get();
      if (!session) {
        const Status init = runner.initialize_status();
        return fail(cmd, init.ok() ? Internal("the executor refused to open a session") : init);
      }
      sessions[c] = std::move(*session);
      std::vector<Token> chunk(tokens.begin() + static_cast<ptrdiff_t>(c * n_ctx),
                               tokens.begin() + static_cast<ptrdiff_t>((c + 1) * n_ctx));
      if (bos) chunk.front() = *bos;
      handles[c] =
          sessions[c].generate_async(std::move(chunk), config, [&, c](const GenerationUpdate& u) {
            std::lock_guard<std::mutex> lock(mu);
            ChunkResult& r = results[c];
            // prompt_logprobs[i] scores chunk token i + 1.
            for (size_t i = first; i < u.prompt_logprobs.size(); ++i) {
              const double nll = -static_cast<double>(u.prompt_logprobs[i].logprob);
              r.nll_sum += nll;
              r.nll2_sum += nll * nll;
              r.count++;
            }
            if (u.finish_reason) {
              if (*u.finish_reason == FinishReason::kFailed) r.error = u.error_message;
              r.done = true;
              cv.notify_all();
            }
          });
    }
    // Report chunks in order as they finish.
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return results[reported].done; });
    while (reported < n_chunks && results[reported].done) {
      const ChunkResult& r = results[reported];
      if (!r.error.empty()) {
        lock.unlock();
        return fail(cmd, Internal("chunk " + std::to_string(reported) + ": " + r.error));
      }
      nll_sum += r.nll_sum;
      nll2_sum += r.nll2_sum;
      count += r.count;
      std::printf("[%zu]%.4f%s", reported + 1, std::exp(nll_sum / static_cast<double>(count)),
                  reported + 1 == n_chunks ? "\n" : ",");
      std::fflush(stdout);
      lock.unlock();
      handles[reported].wait();
      sessions[reported] = Session();
      lock.lock();
      ++reported;
    }
  }
  const double seconds = static_cast<double>(now_us() - t0) * 1e-6;
  const double mean = nll_sum / static_cast<double>(count);
  const double var = nll2_sum / static_cast<double>(count) - mean * mean;
  const double ppl = std::exp(mean);
  const double err =
      count > 1 ? ppl * std::sqrt(std::max(0.0, var) / static_cast<double>(count - 1)) : 0.0;
  std::printf("Final estimate: PPL = %.4f +/- %.5f (%lld tokens scored, %.1f s, %.0f tokens/s)\n",
              ppl, err, static_cast<long long>(count), seconds,
              static_cast<double>(n_chunks * n_ctx) / seconds);
  return 0;
}

}  // namespace cellm::cli
