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
// ignored. With --json-schema, --grammar or --regex every generation is constrained
// (bench_grammar.h): it stops at EOS once its output is complete, and S_TG counts the
// tokens really generated (the gen column).
//
// With --requests N, a serving load instead: B clients send N requests in all, each
// client one after another. A request opens a session, prefills PP random tokens,
// generates between TG/2 and 3 TG/2 tokens (uniform, seeded per request) and closes the
// session, so sessions join and leave the decode batch as a server's do.
//   S_GEN = generated tokens / T   S = (prompt + generated tokens) / T
// with each request's time to first token (TTFT: mean and 99th percentile) and time per
// output token after it (TPOT, the mean gap between its tokens), and how the runner's
// steps ran: rows a decode step decoded, steps with prefill chunks and their latency,
// and the share of T inside steps. bench_load.h describes the load and its prefix-cache
// workloads (--shared-prefix, --turns).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "args.h"
#include "bench_grammar.h"
#include "bench_load.h"
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
          weights_flag(),
          kv_dtype_flag(),
          activations_flag(),
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
          {"no-norm-e4m3", "",
           "CUDA, FP8 weights: quantize a norm's rows for the qkv and gate_up products in a kernel "
           "of their own instead of in the norm (to measure what writing them in the norm buys)"},
          {"no-prefill-warm", "",
           "CUDA: skip loading the prefill GEMMs' kernels at startup (each then loads at its first "
           "prefill: to measure what the warm-up buys)"},
          {"requests", "N",
           "a serving load instead: B clients send N requests in all, each opening a session, "
           "prefilling PP tokens, generating TG/2 to 3 TG/2 tokens and closing it"},
          {"shared-prefix", "S",
           "--requests: every prompt starts with the same S tokens (a system prompt); the pool "
           "is shared by need and each row runs without and with the prefix cache"},
          {"turns", "T",
           "--requests: each request is a conversation of T turns (turn k's prompt: turn k-1's "
           "prompt, its reply and PP new tokens); the pool as with --shared-prefix"},
          {"kv-policy", "P",
           "--requests: share the KV pool by need, admitting by overcommit or reserve (default "
           "with --shared-prefix or --turns: overcommit; otherwise fixed slots)"},
          {"prefix-cache", "WHEN",
           "with a shared pool: on, off or both (default both: a row each)"},
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
  const std::vector<FlagSpec> constraint = constraint_flags();
  flags.insert(flags.end(), constraint.begin(), constraint.end());
  return flags;
}();

struct Row {
  int64_t pp = 0, tg = 0, b = 0, n_kv = 0;
  double t_pp = 0, t_tg = 0;
  std::optional<double> floor_fraction;  // of the TG phase
  std::optional<StepTimeReport> steps;   // the TG phase's decode steps (--step-times)
  std::optional<GpuPowerSummary> power;  // the TG phase's clock and power (--clocks)
  SamplingParams sampling;               // how every token was drawn
  // Under a constraint: the TG phase's tokens really generated (the EOS that ends a
  // complete output included) and its generations that ended complete.
  std::optional<int64_t> tg_tokens;
  int64_t tg_done = 0;
  std::string constraint;  // BenchConstraint::what(), or empty
};

// The TG phase's tokens: generated ones under a constraint, else B TG.
int64_t tg_tokens_of(const Row& r) {
  return r.tg_tokens.value_or(r.b * r.tg);
}

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

// What a phase's generations produced under a constraint: each session's tokens and
// processor.
struct PhaseOutputs {
  std::vector<std::vector<Token>> tokens;
  std::vector<std::shared_ptr<GrammarLogitsProcessor>> processors;
};

// Runs one generation of each session concurrently (session i draws with seed `seed` +
// i) and returns the wall time in seconds. With `constraint`, each generation gets its
// own processor, stops at the vocabulary's EOS ids, and `outputs` receives its tokens.
double run_phase(std::vector<Session>& sessions, const std::vector<std::vector<Token>>& deltas,
                 GenConfig config, uint64_t seed, std::string& error,
                 const BenchConstraint* constraint = nullptr, PhaseOutputs* outputs = nullptr) {
  const size_t n = sessions.size();
  if (outputs != nullptr) {
    outputs->tokens.assign(n, {});
    outputs->processors.assign(n, nullptr);
  }
  if (constraint != nullptr) config.stop_tokens = constraint->eos_ids();
  const int64_t t0 = now_us();
  std::vector<GenerationHandle> handles;
  handles.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    config.seed = seed + i;
    GenerationCallback on_update;
    if (constraint != nullptr) {
      std::shared_ptr<GrammarLogitsProcessor> processor = constraint->make_processor();
      config.processor = processor;
      if (outputs != nullptr) {
        outputs->processors[i] = processor;
        std::vector<Token>* tokens = &outputs->tokens[i];
        on_update = [tokens](const GenerationUpdate& u) {
          tokens->insert(tokens->end(), u.tokens.begin(), u.tokens.end());
        };
      }
    }
    handles.push_back(sessions[i].generate_async(deltas[i], config, std::move(on_update)));
  }
  for (GenerationHandle& h : handles) {
    h.wait();
    if (h.finish_reason() == FinishReason::kFailed && error.empty()) error = h.error_message();
  }
  return static_cast<double>(now_us() - t0) / 1e6;
}

// Appends the TG phase's generations of `row` to --outputs' file, one JSON line each.
Status write_outputs(const BenchConstraint& c, const Row& row, const PhaseOutputs& outputs) {
  if (c.outputs_path().empty()) return Status::Ok();
  std::ofstream out(c.outputs_path(), std::ios::app);
  for (size_t i = 0; i < outputs.tokens.size(); ++i) {
    const nlohmann::json line = {{"pp", row.pp},
                                 {"tg", row.tg},
                                 {"b", row.b},
                                 {"session", i},
                                 {"tokens", outputs.tokens[i].size()},
                                 {"done", BenchConstraint::ended(*outputs.processors[i])},
                                 {"text", c.text_of(outputs.tokens[i])}};
    // A generation cut by -ntg may end inside a UTF-8 sequence.
    out << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  if (!out) return IoError("--outputs: writing '" + c.outputs_path() + "' failed");
  return Status::Ok();
}

// Bytes one decode step must read: every weight but the embedding table (the
// LM head is read whole; when tied it is the embedding).
double weight_bytes_per_step(const ModelWeights& w) {
  double bytes = static_cast<double>(w.total_bytes());
  if (!w.config().tie_word_embeddings()) bytes -= static_cast<double>(w.embed_tokens().nbytes);
  return bytes;
}

// The weights' element types by bytes, largest first: "F8_E4M3 0.11 GB, BF16 0.16 GB"
// (block formats by their GGUF names).
std::string describe_weight_dtypes(const ModelWeights& w) {
  std::vector<std::pair<std::string, double>> types;  // name, bytes
  for (const TensorView* t : w.tensors()) {
    std::string name = to_string(t->dtype);
    if (t->block_type) {
      const std::optional<GgmlTypeInfo> info =
          ggml_type_info(static_cast<uint32_t>(*t->block_type));
      name = info ? info->name : "block";
    }
    auto it =
        std::find_if(types.begin(), types.end(), [&](const auto& e) { return e.first == name; });
    if (it == types.end()) it = types.insert(types.end(), {name, 0.0});
    it->second += static_cast<double>(t->nbytes);
  }
  std::sort(types.begin(), types.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string text;
  for (const auto& [name, bytes] : types) {
    char part[64];
    std::snprintf(part, sizeof(part), "%s%s %.2f GB", text.empty() ? "" : ", ", name.c_str(),
                  bytes / 1e9);
    text += part;
  }
  return text;
}

// The KV dtype the executor stores: --kv-dtype, or for auto the executor's own.
std::string kv_dtype_text(ExecutorKind kind, KvDtype dtype, const CudaExecutorOptions& cuda) {
  if (dtype != KvDtype::kAuto) return to_string(dtype);
  if (kind == ExecutorKind::kCuda) return cuda.precision == CudaPrecision::kF32 ? "f32" : "bf16";
  return "f32";
}

Result<Row> bench_one(const std::shared_ptr<const LoadedModel>& model, const EngineOptions& options,
                      int64_t pp, int64_t tg, int64_t b, uint64_t seed,
                      const SamplingParams& sampling, std::optional<double> peak_gbs,
                      PowerProbe* power, const BenchConstraint* constraint, bool warm_up = false) {
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
  Row row;
  row.pp = pp;
  row.tg = tg;
  row.b = b;
  row.n_kv = b * (pp + tg);
  row.sampling = sampling;
  config.max_new_tokens = 1;
  row.t_pp = run_phase(sessions, prompts, config, seed, error, constraint);
  config.max_new_tokens = static_cast<int32_t>(tg);
  PhaseOutputs outputs;
  if (power != nullptr) power->start();
  row.t_tg = run_phase(sessions, nexts, config, seed, error, constraint, &outputs);
  if (power != nullptr) row.power = power->stop();
  if (!error.empty()) return Internal("a generation failed: " + error);
  if (constraint != nullptr) {
    int64_t generated = 0;
    for (size_t i = 0; i < outputs.tokens.size(); ++i) {
      generated += static_cast<int64_t>(outputs.tokens[i].size());
      if (BenchConstraint::ended(*outputs.processors[i])) ++row.tg_done;
    }
    row.tg_tokens = generated;
    row.constraint = constraint->what();
    row.n_kv = b * pp + generated;
    if (!warm_up) CELLM_RETURN_IF_ERROR(write_outputs(*constraint, row, outputs));
  }
  row.steps = engine.step_time_report();
  if (peak_gbs) {
    // The floor of the TG phase: TG steps, each reading the weights once and
    // every session's KV (mean context ~ PP + TG/2) at the bytes a cell holds in the
    // pool's KV dtype (fp8: the codes and the scales).
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

void print_header(bool with_floor, bool with_steps, bool with_clocks, bool with_constraint) {
  std::printf(
      "|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |"
      "      T s |    S t/s |%s%s%s%s\n",
      with_constraint ? "    gen |  done |" : "", with_floor ? " TG_BW% |" : "",
      with_steps ? " step ms |  dev ms |" : "", with_clocks ? " TG MHz |   TG W | capped |" : "");
  std::printf(
      "|-------|--------|------|--------|----------|----------|----------|----------|"
      "----------|----------|%s%s%s%s\n",
      with_constraint ? "--------|-------|" : "", with_floor ? "--------|" : "",
      with_steps ? "---------|---------|" : "", with_clocks ? "--------|--------|--------|" : "");
}

void print_row(const Row& r) {
  const double t = r.t_pp + r.t_tg;
  std::printf("| %5lld | %6lld | %4lld | %6lld | %8.3f | %8.2f | %8.3f | %8.2f | %8.3f | %8.2f |",
              static_cast<long long>(r.pp), static_cast<long long>(r.tg),
              static_cast<long long>(r.b), static_cast<long long>(r.n_kv), r.t_pp,
              static_cast<double>(r.b * r.pp) / r.t_pp, r.t_tg,
              static_cast<double>(tg_tokens_of(r)) / r.t_tg, t, static_cast<double>(r.n_kv) / t);
  if (r.tg_tokens) {
    std::printf(" %6lld | %5lld |", static_cast<long long>(*r.tg_tokens),
                static_cast<long long>(r.tg_done));
  }
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
                      {"speed_tg", static_cast<double>(tg_tokens_of(r)) / r.t_tg},
                      {"t", t},
                      {"speed", static_cast<double>(r.n_kv) / t},
                      {"sampling", describe_sampling(r.sampling)}};
  if (!device.empty()) j["device"] = device;
  if (r.tg_tokens) {
    j["tg_tokens"] = *r.tg_tokens;
    j["tg_done"] = r.tg_done;
    j["constraint"] = r.constraint;
  }
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
  tuning.norm_quantizes_e4m3 = !args.has("no-norm-e4m3");
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
                                  "-npl 1,16,64 [--executor cpu|cuda] [--json] [--json-schema FILE "
                                  "--tokenizer DIR]",
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
  Result<int64_t> shared_prefix = args->get_int("shared-prefix", 0, 0, 1 << 24);
  Result<int64_t> turns = args->get_int("turns", 1, 1, 1 << 10);
  for (const Status* s :
       {&npp.status(), &ntg.status(), &npl.status(), &step_width.status(), &threads.status(),
        &seed.status(), &requests.status(), &shared_prefix.status(), &turns.status()}) {
    if (!s->ok()) return fail(cmd, *s);
  }
  // The serving load's pool: fixed slots, or shared by need under a policy.
  LoadSpec load;
  load.shared_prefix = *shared_prefix;
  load.turns = *turns;
  load.shared_pool = *shared_prefix > 0 || *turns > 1 || args->has("kv-policy");
  if (const std::optional<std::string> policy = args->get("kv-policy")) {
    if (*policy == "overcommit") {
      load.policy = KvPolicy::kOvercommit;
    } else if (*policy == "reserve") {
      load.policy = KvPolicy::kReserve;
    } else {
      return fail(
          cmd, InvalidArgument("--kv-policy must be overcommit or reserve, not '" + *policy + "'"));
    }
  }
  std::vector<bool> cache_modes = {false, true};
  if (const std::optional<std::string> when = args->get("prefix-cache")) {
    if (*when == "on") {
      cache_modes = {true};
    } else if (*when == "off") {
      cache_modes = {false};
    } else if (*when != "both") {
      return fail(cmd,
                  InvalidArgument("--prefix-cache must be on, off or both, not '" + *when + "'"));
    }
  }
  if ((load.shared_pool || args->has("prefix-cache")) && *requests == 0) {
    return fail(cmd, InvalidArgument("--shared-prefix, --turns, --kv-policy and --prefix-cache "
                                     "shape the serving load: give --requests N"));
  }
  if (args->has("prefix-cache") && !load.shared_pool) {
    return fail(cmd, InvalidArgument("--prefix-cache needs a shared pool: give --shared-prefix, "
                                     "--turns or --kv-policy"));
  }
  if (!load.shared_pool) cache_modes = {false};
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
  Result<WeightFormat> weights = parse_weights_flag(*args, *kind);
  if (!weights.ok()) return fail(cmd, weights.status());
  Result<KvDtype> kv_dtype = parse_kv_dtype_flag(*args);
  if (!kv_dtype.ok()) return fail(cmd, kv_dtype.status());
  Result<bool> bf16_activations = parse_activations_flag(*args);
  if (!bf16_activations.ok()) return fail(cmd, bf16_activations.status());
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
  options.model.weights = *weights;
  Result<std::shared_ptr<const LoadedModel>> model_or =
      load_model(options.model, options.load_tokenizer);
  if (!model_or.ok()) return fail(cmd, model_or.status());
  const std::shared_ptr<const LoadedModel> model = *model_or;
  print_weights_summary(*model);
  Result<std::optional<BenchConstraint>> constraint_or = BenchConstraint::from_flags(
      *args, args->get("model").value_or(""), model->weights->config().vocab_size());
  if (!constraint_or.ok()) return fail(cmd, constraint_or.status());
  const BenchConstraint* constraint = constraint_or->has_value() ? &**constraint_or : nullptr;

  options.limits.step_width = static_cast<int32_t>(*step_width);
  options.limits.kv_dtype = *kv_dtype;
  options.cpu.num_threads = static_cast<int32_t>(*threads);
  options.cpu.bf16_activations = *bf16_activations;
  if (Status s = read_cuda_flags(*args, options.cuda); !s.ok()) return fail(cmd, s);
  const bool json = args->has("json");
  // Which GPU ran (several devices of one kind differ by a percent or so).
  const std::string device = Engine::describe_device(*kind);
  if (!json) {
    const ModelConfig& c = model->weights->config();
    std::printf(
        "model %s: %lld layers, d %lld, %lld/%lld heads, ff %lld, vocab %lld, %.2f GB "
        "of weights (%s), KV %s; executor %s%s%s%s, step width %d; sampling %s\n\n",
        model->name.c_str(), static_cast<long long>(c.num_layers()),
        static_cast<long long>(c.hidden_size()), static_cast<long long>(c.num_heads()),
        static_cast<long long>(c.num_kv_heads()), static_cast<long long>(c.intermediate_size()),
        static_cast<long long>(c.vocab_size()),
        static_cast<double>(model->weights->total_bytes()) / 1e9,
        describe_weight_dtypes(*model->weights).c_str(),
        kv_dtype_text(*kind, options.limits.kv_dtype, options.cuda).c_str(), to_string(*kind),
        device.empty() ? "" : " on ", device.c_str(),
        *kind != ExecutorKind::kCpu    ? ""
        : options.cpu.bf16_activations ? " (bf16 activations for bf16 weights)"
                                       : " (f32 activations)",
        options.limits.step_width, describe_sampling(*sampling).c_str());
    if (constraint != nullptr) {
      // What every generation is held to, and the rules it compiled to.
      std::printf("constraint %s over the vocabulary of %s (%zu ids); grammar:\n%s\n",
                  constraint->what().c_str(), constraint->tokenizer_dir().c_str(),
                  constraint->vocab_size(), constraint->gbnf().c_str());
    }
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
  Result<Row> warm =
      bench_one(model, options, 8, 4, 1, 0, *sampling, std::nullopt, nullptr, constraint,
                /*warm_up=*/true);
  if (!warm.ok()) return fail(cmd, warm.status());
  note_startup("warm-up ", 1, *warm);
  const bool with_steps = options.cuda.time_steps && *kind == ExecutorKind::kCuda;
  if (*requests > 0) {
    if (!json) print_load_header(with_steps, load.shared_pool);
    for (int64_t pp : *npp) {
      for (int64_t tg : *ntg) {
        for (int64_t b : *npl) {
          for (bool cache : cache_modes) {
            LoadSpec spec = load;
            spec.pp = pp;
            spec.tg = tg;
            spec.b = b;
            spec.requests = *requests;
            spec.seed = static_cast<uint64_t>(*seed);
            spec.sampling = *sampling;
            spec.prefix_cache = cache;
            Result<LoadRow> row = load_one(model, options, spec);
            if (!row.ok()) return fail(cmd, row.status());
            if (json) {
              print_load_json(*row, device);
            } else {
              print_load_row(*row, load.shared_pool);
            }
          }
        }
      }
    }
    return 0;
  }
  if (!json) {
    print_header(peak_gbs.has_value(), with_steps, power != nullptr, constraint != nullptr);
  }
  double power_limit_w = 0;
  for (int64_t pp : *npp) {
    for (int64_t tg : *ntg) {
      for (int64_t b : *npl) {
        Result<Row> row = bench_one(model, options, pp, tg, b, static_cast<uint64_t>(*seed),
                                    *sampling, peak_gbs, power.get(), constraint);
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
