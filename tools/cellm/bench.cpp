// `cellm bench`: prefill and decode throughput through the whole Runner path,
// reported with exactly the columns of llama.cpp's llama-batched-bench.
//
// For each (PP, TG, B): B sessions each prefill PP random tokens (one
// generation of one token each, all concurrent: the PP phase), then each
// continues for TG tokens (the TG phase). The TG phase's generations are fed
// one extra token so every session has a non-empty delta; its first step is
// therefore a 2-token prefill per session, the remaining TG - 1 are decodes.
//   N_KV = B (PP + TG)   S_PP = B PP / T_PP   S_TG = B TG / T_TG   S = N_KV / T
// Greedy unless the sampling flags say otherwise (--temperature, --top-k, --top-p,
// --min-p, as `cellm generate` takes them; session i draws with seed S + i); stop tokens
// ignored.
//
// With --requests N, a serving load instead: B clients send N requests in all, each
// client one after another. A request opens a session, prefills PP random tokens,
// generates between TG/2 and 3 TG/2 tokens (uniform, seeded per request) and closes the
// session, so sessions join and leave the decode batch as a server's do.
//   S_GEN = generated tokens / T   S = (prompt + generated tokens) / T
// with each request's time to first token (TTFT: mean and 99th percentile) and time per
// output token after it (TPOT, the mean gap between its tokens), and how the runner's
// steps ran: rows a decode step decoded, steps with prefill chunks and their latency,
// and the share of T inside steps.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "args.h"
#include "cellm/engine.h"
#include "cellm/gpu_power.h"
#include "cellm/runner.h"
#include "cli.h"
#include "commands.h"

namespace cellm::cli {
namespace {

// The flags: the model and the rows, the sampling flags (cli.h), then the rest.
const std::vector<FlagSpec> kFlags = [] {
  std::vector<FlagSpec> flags = {
      {"model", "DIR", "Hugging Face model folder"},
      {"preset", "NAME", "random weights with real shapes: 110m, 1b or 8b"},
      {"npp", "LIST", "prompt lengths, comma-separated (default 128)"},
      {"ntg", "LIST", "generated tokens per session (default 128)"},
      {"npl", "LIST", "sessions in parallel (default 1)"},
  };
  flags.insert(flags.end(), sampling_flags().begin(), sampling_flags().end());
  flags.insert(
      flags.end(),
      {
          {"executor", "KIND", "cpu or cuda (default: cuda when a GPU is present, else cpu)"},
          {"no-cuda-graphs", "", "CUDA: run decode steps eagerly instead of replaying graphs"},
          {"no-pdl", "",
           "CUDA: launch kernels without programmatic dependent launch (to measure what it buys)"},
          {"no-gemm-tuning", "",
           "CUDA: use cuBLASLt's heuristic for every GEMM instead of timing the decode GEMMs' "
           "kernels"},
          {"early-triggers", "WHEN",
           "CUDA: let the next kernel launch before the wait of the decode graphs' norms, RoPE and "
           "attention: timed (capture both ways, keep the faster; default), on or off"},
          {"early-after-cublas", "WHEN",
           "CUDA: in decode graphs, launch a cellm kernel behind a cuBLASLt kernel once all of "
           "that kernel's blocks have started (it still waits for the results): timed (default), "
           "on or off"},
          {"l2-prefetch", "WHEN",
           "CUDA: in decode graphs of up to 8 rows, prefetch the head of each layer's gate_up rows "
           "into the L2 beside the attention: timed (default), on or off"},
          {"no-overlap", "",
           "CUDA: wait for each decode step before queueing the next (to measure what queueing the "
           "next step during the host's work buys)"},
          {"no-cluster-fold", "",
           "CUDA: fold a few rows' attention chunks through the workspace in global memory instead "
           "of inside thread-block clusters (to measure what the cluster fold buys)"},
          {"no-prefill-attention", "",
           "CUDA: run a prompt chunk's attention one row at a time (the decode kernel) instead of "
           "in blocks of consecutive rows that share each key's gather (to measure what it buys)"},
          {"no-prefill-warm", "",
           "CUDA: skip loading the prefill GEMMs' kernels at startup (each then loads at its first "
           "prefill: to measure what the warm-up buys)"},
          {"requests", "N",
           "a serving load instead: B clients send N requests in all, each opening a session, "
           "prefilling PP tokens, generating TG/2 to 3 TG/2 tokens and closing it"},
          {"step-width", "W", "tokens per forward (default 512)"},
          {"threads", "N", "CPU threads; 0 = all (default 0)"},
          {"seed", "S",
           "seed of the random prompts and preset weights, and (S + i) of session i's draws "
           "(default 1)"},
          {"peak-bandwidth", "GB/s",
           "memory bandwidth; adds TG_BW%: the TG phase's fraction of the bandwidth floor"},
          {"step-times", "",
           "CUDA: add the mean wall and device time of a decode step (host share = the "
           "difference), and list the kernel each tuned GEMM shape chose"},
          {"clocks", "",
           "CUDA: read the GPU's SM clock, power and power-cap state every 20 ms (NVML) through "
           "each row's TG phase; adds TG MHz and TG W (their medians) and capped (the share of "
           "readings with the clock held down by the power limit)"},
          {"json", "", "print one JSON object per row instead of the table"},
      });
  return flags;
}();

struct Row {
  int64_t pp = 0, tg = 0, b = 0, n_kv = 0;
  double t_pp = 0, t_tg = 0;
  std::optional<double> floor_fraction;  // of the TG phase
  std::optional<StepTimeReport> steps;   // the TG phase's decode steps (--step-times)
  std::optional<GpuPowerSummary> power;  // the TG phase's clock and power (--clocks)
  SamplingParams sampling;               // how every token was drawn
};

// --clocks: the CUDA device's clock and power through a row's TG phase.
class PowerProbe {
 public:
  static Result<std::unique_ptr<PowerProbe>> create(ExecutorKind kind) {
    if (kind != ExecutorKind::kCuda) {
      return InvalidArgument("--clocks reads a CUDA device's clock: give --executor cuda");
    }
    if (!Engine::has_cuda_executor()) {
      return NotSupported("--clocks needs cellm built with its CUDA executor");
    }
    CELLM_ASSIGN_OR_RETURN(std::unique_ptr<DevicePowerProbe> device,
                           DevicePowerProbe::create(/*device=*/0, /*period_ms=*/20));
    auto probe = std::make_unique<PowerProbe>();
    probe->device_ = std::move(device);
    return probe;
  }
  void start() { device_->start(); }
  GpuPowerSummary stop() { return device_->stop(); }

 private:
  std::unique_ptr<DevicePowerProbe> device_;
};

// One row of the serving load (--requests).
struct LoadRow {
  int64_t pp = 0, tg = 0, b = 0, requests = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0;
  double t = 0;  // seconds, first request sent to last one done
  // Per request: time to first token, and time per output token after it (the mean gap
  // between its tokens; requests of one token have none).
  std::vector<double> ttft_ms, tpot_ms;
  EngineMetrics engine;  // the runner's steps: how the batches formed
  std::optional<StepTimeReport> steps;
  SamplingParams sampling;  // how every token was drawn
};

// Runs one generation of each session concurrently (session i draws with seed `seed` +
// i) and returns the wall time in seconds.
double run_phase(std::vector<Session>& sessions, const std::vector<std::vector<Token>>& deltas,
                 GenConfig config, uint64_t seed, std::string& error) {
  const int64_t t0 = now_us();
  std::vector<GenerationHandle> handles;
  handles.reserve(sessions.size());
  for (size_t i = 0; i < sessions.size(); ++i) {
    config.seed = seed + i;
    handles.push_back(sessions[i].generate_async(deltas[i], config, nullptr));
  }
  for (GenerationHandle& h : handles) {
    h.wait();
    if (h.finish_reason() == FinishReason::kFailed && error.empty()) error = h.error_message();
  }
  return static_cast<double>(now_us() - t0) / 1e6;
}

// Bytes one decode step must read: every weight but the embedding table (the
// LM head is read whole; when tied it is the embedding).
double weight_bytes_per_step(const ModelWeights& w) {
  double bytes = static_cast<double>(w.total_bytes());
  if (!w.config().tie_word_embeddings()) bytes -= static_cast<double>(w.embed_tokens().nbytes);
  return bytes;
}

// Sizes an engine for `b` sessions of up to `tokens` positions each.
EngineOptions options_for(EngineOptions options, int64_t b, int64_t tokens) {
  ExecutorLimits& limits = options.limits;
  limits.max_sessions = static_cast<int32_t>(b);
  limits.max_session_tokens = static_cast<int32_t>(tokens);
  // A forward never needs more cells than the pool has.
  limits.step_width = static_cast<int32_t>(std::min<int64_t>(
      limits.step_width, int64_t{limits.max_sessions} * limits.max_session_tokens));
  return options;
}

Result<Row> bench_one(const std::shared_ptr<const LoadedModel>& model, const EngineOptions& options,
                      int64_t pp, int64_t tg, int64_t b, uint64_t seed,
                      const SamplingParams& sampling, std::optional<double> peak_gbs,
                      PowerProbe* power) {
  CELLM_ASSIGN_OR_RETURN(Engine engine,
                         Engine::create(model, options_for(options, b, pp + tg + 2)));
  Runner& runner = engine.runner();
  std::vector<Session> sessions;
  for (int64_t i = 0; i < b; ++i) {
    std::optional<Session> s = runner.open_session_async().get();
    if (!s) {
      CELLM_RETURN_IF_ERROR(runner.initialize_status());
      return OutOfResources("the executor refused session " + std::to_string(i));
    }
    sessions.push_back(std::move(*s));
  }
  std::mt19937_64 rng(seed);
  const int64_t vocab = model->weights->config().vocab_size();
  std::uniform_int_distribution<Token> pick(0, static_cast<Token>(vocab - 1));
  std::vector<std::vector<Token>> prompts(static_cast<size_t>(b)), nexts(static_cast<size_t>(b));
  for (int64_t i = 0; i < b; ++i) {
    for (int64_t t = 0; t < pp; ++t) prompts[static_cast<size_t>(i)].push_back(pick(rng));
    nexts[static_cast<size_t>(i)] = {pick(rng)};
  }
  GenConfig config;  // no stop tokens
  config.sampling = sampling;
  std::string error;
  Row row{pp, tg, b, b * (pp + tg), 0, 0, std::nullopt, std::nullopt, std::nullopt, sampling};
  config.max_new_tokens = 1;
  row.t_pp = run_phase(sessions, prompts, config, seed, error);
  config.max_new_tokens = static_cast<int32_t>(tg);
  if (power != nullptr) power->start();
  row.t_tg = run_phase(sessions, nexts, config, seed, error);
  if (power != nullptr) row.power = power->stop();
  if (!error.empty()) return Internal("a generation failed: " + error);
  row.steps = engine.step_time_report();
  if (peak_gbs) {
    // The floor of the TG phase: TG steps, each reading the weights once and
    // every session's KV (mean context ~ PP + TG/2).
    const KvMetrics kv = runner.kv_metrics();
    const double kv_bytes = static_cast<double>(b) * (static_cast<double>(pp) + tg / 2.0) *
                            static_cast<double>(kv.bytes_per_cell);
    const double floor_s = static_cast<double>(tg) *
                           (weight_bytes_per_step(*model->weights) + kv_bytes) / (*peak_gbs * 1e9);
    row.floor_fraction = floor_s / row.t_tg;
  }
  runner.shutdown();
  return row;
}

// The serving load: `b` client threads take requests from one counter until `requests`
// have run. Request i's prompt and length come from an rng seeded with (seed, i), so a
// row is the same work whatever the order the clients take them in.
Result<LoadRow> load_one(const std::shared_ptr<const LoadedModel>& model,
                         const EngineOptions& options, int64_t pp, int64_t tg, int64_t b,
                         int64_t requests, uint64_t seed, const SamplingParams& sampling) {
  const int64_t tg_min = std::max<int64_t>(1, tg / 2), tg_max = tg + tg / 2;
  // The executor and the scheduler both sized for b sessions (the scheduler decodes up to
  // max_sessions a step).
  CELLM_ASSIGN_OR_RETURN(Engine engine,
                         Engine::create(model, options_for(options, b, pp + tg_max + 2)));
  Runner& runner = engine.runner();
  const int64_t vocab = model->weights->config().vocab_size();
  LoadRow row{pp, tg, b, requests, 0, 0, 0, {}, {}, {}, std::nullopt, sampling};
  std::atomic<int64_t> next{0};
  std::mutex mu;  // guards row's counts, its per-request times and error
  std::string error;
  const auto client = [&] {
    for (int64_t i = next++; i < requests; i = next++) {
      std::mt19937_64 rng(seed ^ (0x9e3779b97f4a7c15ull * static_cast<uint64_t>(i + 1)));
      std::uniform_int_distribution<Token> pick(0, static_cast<Token>(vocab - 1));
      std::vector<Token> prompt(static_cast<size_t>(pp));
      for (Token& t : prompt) t = pick(rng);
      GenConfig config;  // no stop tokens
      config.sampling = sampling;
      config.seed = seed + static_cast<uint64_t>(i);
      config.max_new_tokens =
          static_cast<int32_t>(std::uniform_int_distribution<int64_t>(tg_min, tg_max)(rng));
      std::optional<Session> session = runner.open_session_async().get();
      if (!session) {
        const std::lock_guard<std::mutex> lock(mu);
        if (error.empty()) error = "the runner refused the session of request " + std::to_string(i);
        return;
      }
      GenerationHandle h = session->generate_async(std::move(prompt), config, nullptr);
      h.wait();
      const GenerationMetrics m = h.metrics();
      const std::lock_guard<std::mutex> lock(mu);
      if (h.finish_reason() == FinishReason::kFailed && error.empty()) error = h.error_message();
      row.prompt_tokens += m.n_prompt_tokens;
      row.generated_tokens += m.n_generated_tokens;
      row.ttft_ms.push_back(static_cast<double>(m.ttft_us()) / 1e3);
      if (m.itl_count > 0) row.tpot_ms.push_back(m.itl_mean_us() / 1e3);
    }  // the session closes here, before this client opens the next
  };
  // The runner answers its first command once the executor is initialized (on CUDA, the
  // decode graphs captured and the GEMMs tuned: seconds): the clock starts after it.
  if (!runner.open_session_async().get()) {
    CELLM_RETURN_IF_ERROR(runner.initialize_status());
    return OutOfResources("the executor refused a session before the load");
  }
  const int64_t t0 = now_us();
  std::vector<std::thread> clients;
  for (int64_t c = 0; c < b; ++c) clients.emplace_back(client);
  for (std::thread& c : clients) c.join();
  row.t = static_cast<double>(now_us() - t0) / 1e6;
  if (!error.empty()) return Internal("a request failed: " + error);
  row.engine = runner.metrics();
  row.steps = engine.step_time_report();
  runner.shutdown();
  return row;
}

void print_load_header(bool with_steps) {
  std::printf(
      "|    PP |     TG |    B |  reqs |  prompt |  gen tok |      T s | S_GEN t/s |    S t/s |"
      " TTFT ms | p99 TTFT | TPOT ms | p99 TPOT |  steps | rows/dec | w/ prefill | pf ms | busy %% "
      "|%s\n",
      with_steps ? " step ms |  dev ms | ahead used | dropped |" : "");
  std::printf(
      "|-------|--------|------|-------|---------|----------|----------|-----------|----------|"
      "---------|----------|---------|----------|--------|----------|------------|-------|--------|"
      "%s\n",
      with_steps ? "---------|---------|------------|---------|" : "");
}

// The mean of `v` (0 when empty).
double mean_of(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0.0 : sum / static_cast<double>(v.size());
}

// The nearest-rank 99th percentile of `v` (0 when empty): the smallest value at least 99%
// of the values do not exceed.
double p99_of(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<size_t>(std::ceil(0.99 * static_cast<double>(v.size())));
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

void print_load_row(const LoadRow& r) {
  std::printf("| %5lld | %6lld | %4lld | %5lld | %7lld | %8lld | %8.3f | %9.2f | %8.2f | %7.2f |",
              static_cast<long long>(r.pp), static_cast<long long>(r.tg),
              static_cast<long long>(r.b), static_cast<long long>(r.requests),
              static_cast<long long>(r.prompt_tokens), static_cast<long long>(r.generated_tokens),
              r.t, static_cast<double>(r.generated_tokens) / r.t,
              static_cast<double>(r.prompt_tokens + r.generated_tokens) / r.t, mean_of(r.ttft_ms));
  std::printf(" %8.2f | %7.3f | %8.3f |", p99_of(r.ttft_ms), mean_of(r.tpot_ms), p99_of(r.tpot_ms));
  std::printf(" %6lld | %8.2f | %10lld | %5.2f | %5.1f%% |", static_cast<long long>(r.engine.steps),
              r.engine.mean_admitted_decode_sessions(),
              static_cast<long long>(r.engine.steps_with_prefill), prefill_step_ms(r.engine),
              100.0 * busy_fraction(r));
  if (r.steps && r.steps->decode_steps > 0) {
    const auto n = static_cast<double>(r.steps->decode_steps);
    std::printf(" %7.3f | %7.3f | %10lld | %7lld |", r.steps->wall_ms / n, r.steps->device_ms / n,
                static_cast<long long>(r.steps->ahead_used),
                static_cast<long long>(r.steps->ahead_dropped));
  }
  std::printf("\n");
  std::fflush(stdout);
}

// The decode steps' columns of a JSON row (--step-times on the CUDA executor).
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
  nlohmann::json j = {{"pp", r.pp},
                      {"tg", r.tg},
                      {"pl", r.b},
                      {"requests", r.requests},
                      {"prompt_tokens", r.prompt_tokens},
                      {"generated_tokens", r.generated_tokens},
                      {"t", r.t},
                      {"speed_gen", static_cast<double>(r.generated_tokens) / r.t},
                      {"speed", static_cast<double>(r.prompt_tokens + r.generated_tokens) / r.t},
                      {"ttft_ms", mean_of(r.ttft_ms)},
                      {"ttft_p99_ms", p99_of(r.ttft_ms)},
                      {"tpot_ms", mean_of(r.tpot_ms)},
                      {"tpot_p99_ms", p99_of(r.tpot_ms)},
                      {"steps", r.engine.steps},
                      {"decode_rows_per_step", r.engine.mean_admitted_decode_sessions()},
                      {"steps_with_prefill", r.engine.steps_with_prefill},
                      {"prefill_step_ms", prefill_step_ms(r.engine)},
                      {"busy_fraction", busy_fraction(r)},
                      {"sampling", describe_sampling(r.sampling)}};
  if (!device.empty()) j["device"] = device;
  add_step_json(j, r.steps);
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

void print_header(bool with_floor, bool with_steps, bool with_clocks) {
  std::printf(
      "|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |"
      "      T s |    S t/s |%s%s%s\n",
      with_floor ? " TG_BW% |" : "", with_steps ? " step ms |  dev ms |" : "",
      with_clocks ? " TG MHz |   TG W | capped |" : "");
  std::printf(
      "|-------|--------|------|--------|----------|----------|----------|----------|"
      "----------|----------|%s%s%s\n",
      with_floor ? "--------|" : "", with_steps ? "---------|---------|" : "",
      with_clocks ? "--------|--------|--------|" : "");
}

void print_row(const Row& r) {
  const double t = r.t_pp + r.t_tg;
  std::printf("| %5lld | %6lld | %4lld | %6lld | %8.3f | %8.2f | %8.3f | %8.2f | %8.3f | %8.2f |",
              static_cast<long long>(r.pp), static_cast<long long>(r.tg),
              static_cast<long long>(r.b), static_cast<long long>(r.n_kv), r.t_pp,
              static_cast<double>(r.b * r.pp) / r.t_pp, r.t_tg,
              static_cast<double>(r.b * r.tg) / r.t_tg, t, static_cast<double>(r.n_kv) / t);
  if (r.floor_fraction) std::printf(" %5.1f%% |", 100.0 * *r.floor_fraction);
  if (r.steps && r.steps->decode_steps > 0) {
    const auto n = static_cast<double>(r.steps->decode_steps);
    std::printf(" %7.3f | %7.3f |", r.steps->wall_ms / n, r.steps->device_ms / n);
  }
  if (r.power) {
    std::printf(" %6.0f | %6.0f | %5.0f%% |", r.power->sm_mhz_median, r.power->watts_median,
                100.0 * r.power->power_capped);
  }
  std::printf("\n");
  std::fflush(stdout);
}

// `device`: describe_cuda_device's text, or empty (the CPU executor).
void print_json(const Row& r, const std::string& device) {
  const double t = r.t_pp + r.t_tg;
  nlohmann::json j = {{"pp", r.pp},
                      {"tg", r.tg},
                      {"pl", r.b},
                      {"n_kv", r.n_kv},
                      {"t_pp", r.t_pp},
                      {"speed_pp", static_cast<double>(r.b * r.pp) / r.t_pp},
                      {"t_tg", r.t_tg},
                      {"speed_tg", static_cast<double>(r.b * r.tg) / r.t_tg},
                      {"t", t},
                      {"speed", static_cast<double>(r.n_kv) / t},
                      {"sampling", describe_sampling(r.sampling)}};
  if (!device.empty()) j["device"] = device;
  if (r.floor_fraction) j["tg_floor_fraction"] = *r.floor_fraction;
  add_step_json(j, r.steps);
  if (r.power) {
    j["tg_power_samples"] = r.power->samples;
    j["tg_sm_mhz"] = r.power->sm_mhz_median;
    j["tg_sm_mhz_min"] = r.power->sm_mhz_min;
    j["tg_power_w"] = r.power->watts_median;
    j["tg_power_w_max"] = r.power->watts_max;
    j["tg_power_capped"] = r.power->power_capped;
    j["power_limit_w"] = r.power->power_limit_watts;
  }
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

// The CUDA executor's options from the flags (the CPU executor ignores them).
Status read_cuda_flags(const Args& args, CudaExecutorOptions& cuda) {
  cuda.cuda_graph_for_decode = !args.has("no-cuda-graphs");
  cuda.time_steps = args.has("step-times");
  cuda.tune_gemm = !args.has("no-gemm-tuning");
  cuda.overlap_decode = !args.has("no-overlap");
  cuda.warm_prefill_gemms = !args.has("no-prefill-warm");
  CudaTuning& tuning = cuda.tuning;  // the knobs that measure what a feature buys
  tuning.programmatic_launch = !args.has("no-pdl");
  tuning.attention_cluster_fold = !args.has("no-cluster-fold");
  tuning.prefill_attention = !args.has("no-prefill-attention");
  for (const auto& [option, choice] : {std::pair{"early-triggers", &tuning.early_triggers},
                                       std::pair{"early-after-cublas", &tuning.early_after_cublas},
                                       std::pair{"l2-prefetch", &tuning.l2_prefetch}}) {
    CELLM_ASSIGN_OR_RETURN(*choice, parse_timed_choice(args.get(option).value_or("timed"), option));
  }
  return Status::Ok();
}

}  // namespace

int run_bench(int argc, const char* const* argv) {
  const std::string cmd = "cellm bench";
  if (wants_help(argc, argv)) {
    std::printf("%s", format_help("cellm bench (--model DIR | --preset NAME) -npp 128,512 -ntg 128 "
                                  "-npl 1,16,64 [--executor cpu|cuda] [--json]",
                                  "Measures prefill (PP) and decode (TG) throughput with B "
                                  "concurrent sessions through the Runner, with the columns of "
                                  "llama.cpp's llama-batched-bench.",
                                  kFlags)
                          .c_str());
    return 0;
  }
  Result<Args> args = Args::parse(argc, argv, 2, kFlags, cmd);
  if (!args.ok()) return fail(cmd, args.status());
  Result<std::vector<int64_t>> npp = args->get_int_list("npp", {128}, 1, 1 << 20);
  Result<std::vector<int64_t>> ntg = args->get_int_list("ntg", {128}, 1, 1 << 20);
  Result<std::vector<int64_t>> npl = args->get_int_list("npl", {1}, 1, 1 << 16);
  Result<int64_t> step_width = args->get_int("step-width", 512, 1, 1 << 16);
  Result<int64_t> threads = args->get_int("threads", 0, 0, 1024);
  Result<int64_t> seed = args->get_int("seed", 1, 0, INT64_MAX);
  Result<int64_t> requests = args->get_int("requests", 0, 1, 1 << 24);
  for (const Status* s : {&npp.status(), &ntg.status(), &npl.status(), &step_width.status(),
                          &threads.status(), &seed.status(), &requests.status()}) {
    if (!s->ok()) return fail(cmd, *s);
  }
  Result<SamplingParams> sampling = parse_sampling_flags(*args);
  if (!sampling.ok()) return fail(cmd, sampling.status());
  std::optional<double> peak_gbs;
  if (args->has("peak-bandwidth")) {
    Result<double> v = args->get_float("peak-bandwidth", 0);
    if (!v.ok()) return fail(cmd, v.status());
    if (*v <= 0) return fail(cmd, InvalidArgument("--peak-bandwidth must be positive"));
    peak_gbs = *v;
  }
  Result<ExecutorKind> kind = parse_executor_flag(*args);
  if (!kind.ok()) return fail(cmd, kind.status());
  std::unique_ptr<PowerProbe> power;
  if (args->has("clocks")) {
    if (*requests > 0) {
      return fail(cmd, InvalidArgument("--clocks reads the clock through a row's TG phase; the "
                                       "serving load (--requests) has none"));
    }
    Result<std::unique_ptr<PowerProbe>> probe = PowerProbe::create(*kind);
    if (!probe.ok()) return fail(cmd, probe.status());
    power = std::move(*probe);
  }
  if (args->has("model") == args->has("preset")) {
    return fail(cmd, InvalidArgument("give exactly one of --model DIR or --preset NAME"));
  }
  EngineOptions options;
  options.executor = *kind;
  options.load_tokenizer = false;
  options.model.path = args->get("model").value_or("");
  options.model.preset = args->get("preset").value_or("");
  options.model.seed = static_cast<uint64_t>(*seed);
  Result<std::shared_ptr<const LoadedModel>> model_or =
      load_model(options.model, options.load_tokenizer);
  if (!model_or.ok()) return fail(cmd, model_or.status());
  const std::shared_ptr<const LoadedModel> model = *model_or;

  options.limits.step_width = static_cast<int32_t>(*step_width);
  options.cpu.num_threads = static_cast<int32_t>(*threads);
  if (Status s = read_cuda_flags(*args, options.cuda); !s.ok()) return fail(cmd, s);
  const bool json = args->has("json");
  // Which GPU ran (several devices of one kind differ by a percent or so).
  const std::string device = Engine::describe_device(*kind);
  if (!json) {
    const ModelConfig& c = model->weights->config();
    std::printf(
        "model %s: %lld layers, d %lld, %lld/%lld heads, ff %lld, vocab %lld, %.2f GB "
        "of weights; executor %s%s%s, step width %d; sampling %s\n\n",
        model->name.c_str(), static_cast<long long>(c.num_layers()),
        static_cast<long long>(c.hidden_size()), static_cast<long long>(c.num_heads()),
        static_cast<long long>(c.num_kv_heads()), static_cast<long long>(c.intermediate_size()),
        static_cast<long long>(c.vocab_size()),
        static_cast<double>(model->weights->total_bytes()) / 1e9, to_string(*kind),
        device.empty() ? "" : " on ", device.c_str(), options.limits.step_width,
        describe_sampling(*sampling).c_str());
  }
  std::vector<std::string> startups;  // per executor: "B=b x.x s"
  const auto note_startup = [&](const char* what, int64_t b, const Row& row) {
    if (!row.steps) return;
    char text[96];
    std::snprintf(text, sizeof(text), "%sB=%lld %.2f s, %lld prefill GEMM kernels warmed", what,
                  static_cast<long long>(b), row.steps->startup_s,
                  static_cast<long long>(row.steps->warmed_prefill_kernels));
    std::string note = text;
    // How the graph the row's decode steps replay was built (triggers, edges).
    const std::string bucket = "B=" + std::to_string(b) + ": ";
    for (const std::string& g : row.steps->graph_notes) {
      if (g.rfind(bucket, 0) == 0) note += " (" + g.substr(bucket.size()) + ")";
    }
    startups.push_back(note);
  };
  // Warm-up: threads, page faults, allocator (and, on CUDA, the B = 1 GEMMs' tuning).
  Result<Row> warm = bench_one(model, options, 8, 4, 1, 0, *sampling, std::nullopt, nullptr);
  if (!warm.ok()) return fail(cmd, warm.status());
  note_startup("warm-up ", 1, *warm);
  const bool with_steps = options.cuda.time_steps && *kind == ExecutorKind::kCuda;
  if (*requests > 0) {
    if (!json) print_load_header(with_steps);
    for (int64_t pp : *npp) {
      for (int64_t tg : *ntg) {
        for (int64_t b : *npl) {
          Result<LoadRow> row = load_one(model, options, pp, tg, b, *requests,
                                         static_cast<uint64_t>(*seed), *sampling);
          if (!row.ok()) return fail(cmd, row.status());
          if (json) {
            print_load_json(*row, device);
          } else {
            print_load_row(*row);
          }
        }
      }
    }
    return 0;
  }
  if (!json) print_header(peak_gbs.has_value(), with_steps, power != nullptr);
  double power_limit_w = 0;
  for (int64_t pp : *npp) {
    for (int64_t tg : *ntg) {
      for (int64_t b : *npl) {
        Result<Row> row = bench_one(model, options, pp, tg, b, static_cast<uint64_t>(*seed),
                                    *sampling, peak_gbs, power.get());
        if (!row.ok()) return fail(cmd, row.status());
        note_startup("", b, *row);
        if (row->power) power_limit_w = row->power->power_limit_watts;
        if (json) {
          print_json(*row, device);
        } else {
          print_row(*row);
        }
      }
    }
  }
  if (power && !json) {
    std::printf(
        "\nclocks: NVML read every 20 ms through each row's TG phase: the medians of the SM "
        "clock and the board power, and the share of readings with the clock held down by the "
        "%.0f W power limit\n",
        power_limit_w);
  }
  if (options.cuda.time_steps && !json) {
    if (!startups.empty()) {
      // Each row's executor captures its decode graphs at start; the first to meet a
      // GEMM shape times its kernels (later executors of the process adopt the choice).
      std::printf(
          "\nstartup (decode graphs captured, with their triggers and edges; new GEMM shapes "
          "tuned; prefill GEMMs warmed):");
      for (const std::string& s : startups) std::printf(" %s;", s.c_str());
      std::printf("\n");
    }
    const std::vector<std::string> tuned = Engine::tuned_gemm_report();
    if (!tuned.empty()) std::printf("\ntuned GEMMs:\n");
    for (const std::string& line : tuned) std::printf("  %s\n", line.c_str());
  }
  return 0;
}

}  // namespace cellm::cli
