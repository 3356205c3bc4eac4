#include "bench_load.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>

#include "cli.h"

namespace cellm::cli {
namespace {

// The mean of `v` (0 when empty).
double mean_of(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0.0 : sum / static_cast<double>(v.size());
}

// The nearest-rank percentile `q` of `v` (0 when empty): the smallest value at least
// q of the values do not exceed.
double percentile_of(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::max<size_t>(rank, 1) - 1];
}

// The mean latency of a step with prefill chunks (with decodes beside them or not).
double prefill_step_ms(const EngineMetrics& m) {
  return m.steps_with_prefill > 0
             ? static_cast<double>(m.mixed_latency_sum_us + m.prefill_only_latency_sum_us) / 1e3 /
                   static_cast<double>(m.steps_with_prefill)
             : 0.0;
}

// The share of the row's wall time the runner spent inside steps (the rest: no work
// queued, or the host between steps).
double busy_fraction(const LoadRow& r) {
  return r.t > 0 ? static_cast<double>(r.engine.step_latency_sum_us) / 1e6 / r.t : 0.0;
}

// One generation of a request: opens a session on `prompt`'s cached prefix, feeds the
// rest, generates, and returns the generated tokens (empty with `error` set on failure).
struct TurnResult {
  std::vector<Token> generated;
  GenerationMetrics metrics;
  Position cached = 0;
  std::string error;
};

TurnResult run_turn(Runner& runner, const std::vector<Token>& prompt, const GenConfig& config) {
  TurnResult r;
  std::optional<Session> session = runner.open_session_async(prompt).get();
  if (!session) {
    r.error = "the runner refused a session";
    return r;
  }
  r.cached = session->position();
  std::mutex mu;  // the callback runs on the engine thread
  GenerationHandle h = session->generate_async(
      std::vector<Token>(prompt.begin() + r.cached, prompt.end()), config,
      [&](const GenerationUpdate& u) {
        const std::lock_guard<std::mutex> lock(mu);
        r.generated.insert(r.generated.end(), u.tokens.begin(), u.tokens.end());
      });
  h.wait();
  const std::lock_guard<std::mutex> lock(mu);
  if (h.finish_reason() == FinishReason::kFailed) r.error = h.error_message();
  r.metrics = h.metrics();
  return r;
}

}  // namespace

EngineOptions options_for(EngineOptions options, int64_t b, int64_t tokens) {
  ExecutorLimits& limits = options.limits;
  limits.max_sessions = static_cast<int32_t>(b);
  limits.max_session_tokens = static_cast<int32_t>(tokens);
  // A forward never needs more cells than the pool has.
  limits.step_width = static_cast<int32_t>(std::min<int64_t>(
      limits.step_width, int64_t{limits.max_sessions} * limits.max_session_tokens));
  return options;
}

// `b` client threads take requests from one counter until `requests` have run.
// Request i's prompts and lengths come from an rng seeded with (seed, i), so a row is
// the same work whatever the order the clients take them in.
Result<LoadRow> load_one(const std::shared_ptr<const LoadedModel>& model,
                         const EngineOptions& options, const LoadSpec& spec) {
  const int64_t tg_min = std::max<int64_t>(1, spec.tg / 2), tg_max = spec.tg + spec.tg / 2;
  EngineOptions sized = options;
  if (spec.shared_pool) {
    sized.limits.capacity_rule = false;
    sized.limits.prefix_cache = spec.prefix_cache;
    sized.limits.max_sessions = static_cast<int32_t>(spec.b);
    sized.limits.max_session_tokens = 0;  // the model's context, capped by the pool
    sized.runner.policy = spec.policy;
  } else {
    // The executor and the scheduler both sized for b sessions (the scheduler decodes up
    // to max_sessions a step).
    sized = options_for(options, spec.b, spec.shared_prefix + spec.turns * (spec.pp + tg_max) + 2);
  }
  CELLM_ASSIGN_OR_RETURN(Engine engine, Engine::create(model, sized));
  // How the shared pool came out (cells, bytes, context), beside the table on stderr.
  if (spec.shared_pool) std::fprintf(stderr, "%s\n", describe_kv_pool(engine.kv_pool()).c_str());
  Runner& runner = engine.runner();
  const int64_t vocab = model->weights->config().vocab_size();
  LoadRow row;
  row.spec = spec;
  std::vector<Token> system_prompt(static_cast<size_t>(spec.shared_prefix));
  {
    std::mt19937_64 rng(spec.seed);
    std::uniform_int_distribution<Token> pick(0, static_cast<Token>(vocab - 1));
    for (Token& t : system_prompt) t = pick(rng);
  }
  std::atomic<int64_t> next{0};
  std::mutex mu;  // guards row's counts, its per-generation times and error
  std::string error;
  const auto client = [&] {
    for (int64_t i = next++; i < spec.requests; i = next++) {
      std::mt19937_64 rng(spec.seed ^ (0x9e3779b97f4a7c15ull * static_cast<uint64_t>(i + 1)));
      std::uniform_int_distribution<Token> pick(0, static_cast<Token>(vocab - 1));
      std::vector<Token> prompt = system_prompt;
      for (int64_t turn = 0; turn < spec.turns; ++turn) {
        for (int64_t k = 0; k < spec.pp; ++k) prompt.push_back(pick(rng));
        GenConfig config;  // no stop tokens
        config.sampling = spec.sampling;
        config.seed = spec.seed + static_cast<uint64_t>(i * spec.turns + turn);
        config.max_new_tokens =
            static_cast<int32_t>(std::uniform_int_distribution<int64_t>(tg_min, tg_max)(rng));
        TurnResult r = run_turn(runner, prompt, config);
        const std::lock_guard<std::mutex> lock(mu);
        if (!r.error.empty()) {
          if (error.empty()) error = "request " + std::to_string(i) + ": " + r.error;
          return;
        }
        row.prompt_tokens += static_cast<int64_t>(prompt.size());
        row.cached_tokens += r.cached;
        row.generated_tokens += r.metrics.n_generated_tokens;
        row.ttft_ms.push_back(static_cast<double>(r.metrics.ttft_us()) / 1e3);
        if (r.metrics.itl_count > 0) row.tpot_ms.push_back(r.metrics.itl_mean_us() / 1e3);
        prompt.insert(prompt.end(), r.generated.begin(), r.generated.end());
      }  // each turn's session closes before the next opens
    }
  };
  // The runner answers its first command once the executor is initialized (on CUDA, the
  // decode graphs captured and the GEMMs tuned: seconds): the clock starts after it.
  if (!runner.open_session_async().get()) {
    CELLM_RETURN_IF_ERROR(runner.initialize_status());
    return OutOfResources("the executor refused a session before the load");
  }
  const int64_t t0 = now_us();
  std::vector<std::thread> clients;
  for (int64_t c = 0; c < spec.b; ++c) clients.emplace_back(client);
  for (std::thread& c : clients) c.join();
  row.t = static_cast<double>(now_us() - t0) / 1e6;
  if (!error.empty()) return Internal("a request failed: " + error);
  row.engine = runner.metrics();
  row.steps = engine.step_time_report();
  runner.shutdown();
  return row;
}

void print_load_header(bool with_steps, bool with_cache) {
  std::printf(
      "|    PP |     TG |    B |  reqs |  prompt |  gen tok |      T s | S_GEN t/s |    S t/s |"
      " TTFT ms | p50 TTFT | p99 TTFT | TPOT ms | p99 TPOT |  steps | rows/dec | w/ prefill | "
      "pf ms | busy %% |%s%s\n",
      with_cache ? " prefix | turns | cache | hit % | preempt |" : "",
      with_steps ? " step ms |  dev ms | ahead used | dropped |" : "");
  std::printf(
      "|-------|--------|------|-------|---------|----------|----------|-----------|----------|"
      "---------|----------|----------|---------|----------|--------|----------|------------|------"
      "-"
      "|--------|%s%s\n",
      with_cache ? "--------|-------|-------|-------|---------|" : "",
      with_steps ? "---------|---------|------------|---------|" : "");
}

void print_load_row(const LoadRow& r, bool with_cache) {
  const LoadSpec& s = r.spec;
  std::printf("| %5lld | %6lld | %4lld | %5lld | %7lld | %8lld | %8.3f | %9.2f | %8.2f | %7.2f |",
              static_cast<long long>(s.pp), static_cast<long long>(s.tg),
              static_cast<long long>(s.b), static_cast<long long>(s.requests),
              static_cast<long long>(r.prompt_tokens), static_cast<long long>(r.generated_tokens),
              r.t, static_cast<double>(r.generated_tokens) / r.t,
              static_cast<double>(r.prompt_tokens + r.generated_tokens) / r.t, mean_of(r.ttft_ms));
  std::printf(" %8.2f | %8.2f | %7.3f | %8.3f |", percentile_of(r.ttft_ms, 0.5),
              percentile_of(r.ttft_ms, 0.99), mean_of(r.tpot_ms), percentile_of(r.tpot_ms, 0.99));
  std::printf(" %6lld | %8.2f | %10lld | %5.2f | %5.1f%% |", static_cast<long long>(r.engine.steps),
              r.engine.mean_admitted_decode_sessions(),
              static_cast<long long>(r.engine.steps_with_prefill), prefill_step_ms(r.engine),
              100.0 * busy_fraction(r));
  if (with_cache) {
    std::printf(" %6lld | %5lld | %5s | %4.1f%% | %7lld |", static_cast<long long>(s.shared_prefix),
                static_cast<long long>(s.turns), s.prefix_cache ? "on" : "off",
                r.prompt_tokens > 0 ? 100.0 * static_cast<double>(r.cached_tokens) /
                                          static_cast<double>(r.prompt_tokens)
                                    : 0.0,
                static_cast<long long>(r.engine.preemptions));
  }
  if (r.steps && r.steps->decode_steps > 0) {
    const auto n = static_cast<double>(r.steps->decode_steps);
    std::printf(" %7.3f | %7.3f | %10lld | %7lld |", r.steps->wall_ms / n, r.steps->device_ms / n,
                static_cast<long long>(r.steps->ahead_used),
                static_cast<long long>(r.steps->ahead_dropped));
  }
  std::printf("\n");
  std::fflush(stdout);
}

void add_step_json(nlohmann::json& j, const std::optional<StepTimeReport>& steps) {
  if (!steps || steps->decode_steps == 0) return;
  const auto n = static_cast<double>(steps->decode_steps);
  j["decode_steps"] = steps->decode_steps;
  j["decode_step_ms"] = steps->wall_ms / n;
  j["decode_device_ms"] = steps->device_ms / n;
  j["decode_steps_ahead_used"] = steps->ahead_used;
  j["decode_steps_ahead_dropped"] = steps->ahead_dropped;
  j["startup_s"] = steps->startup_s;
  j["warmed_prefill_kernels"] = steps->warmed_prefill_kernels;
}

void print_load_json(const LoadRow& r, const std::string& device) {
  const LoadSpec& s = r.spec;
  nlohmann::json j = {{"pp", s.pp},
                      {"tg", s.tg},
                      {"pl", s.b},
                      {"requests", s.requests},
                      {"prompt_tokens", r.prompt_tokens},
                      {"generated_tokens", r.generated_tokens},
                      {"t", r.t},
                      {"speed_gen", static_cast<double>(r.generated_tokens) / r.t},
                      {"speed", static_cast<double>(r.prompt_tokens + r.generated_tokens) / r.t},
                      {"ttft_ms", mean_of(r.ttft_ms)},
                      {"ttft_p50_ms", percentile_of(r.ttft_ms, 0.5)},
                      {"ttft_p99_ms", percentile_of(r.ttft_ms, 0.99)},
                      {"tpot_ms", mean_of(r.tpot_ms)},
                      {"tpot_p99_ms", percentile_of(r.tpot_ms, 0.99)},
                      {"steps", r.engine.steps},
                      {"decode_rows_per_step", r.engine.mean_admitted_decode_sessions()},
                      {"steps_with_prefill", r.engine.steps_with_prefill},
                      {"prefill_step_ms", prefill_step_ms(r.engine)},
                      {"busy_fraction", busy_fraction(r)},
                      {"sampling", describe_sampling(s.sampling)}};
  if (s.shared_pool) {
    j["shared_prefix"] = s.shared_prefix;
    j["turns"] = s.turns;
    j["prefix_cache"] = s.prefix_cache;
    j["cached_tokens"] = r.cached_tokens;
    j["kv_policy"] = to_string(s.policy);
    j["preemptions"] = r.engine.preemptions;
  }
  if (!device.empty()) j["device"] = device;
  add_step_json(j, r.steps);
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

}  // namespace cellm::cli
