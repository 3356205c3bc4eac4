#include "engine_setup.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>

#include "cellm/cpu_executor.h"
#ifdef CELLM_HAVE_CUDA
#include "cellm/cuda_executor.h"
#endif
#include "cellm/decode_first_scheduler.h"
#include "cellm/sampler.h"

namespace cellm::cli {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A one-line bar on stderr: "loading weights [#####     ]  52% 1.2/2.3 GB".
class ProgressBar {
 public:
  explicit ProgressBar(size_t total_bytes)
      : total_(total_bytes), enabled_(isatty(STDERR_FILENO) != 0 && total_bytes > 0) {}
  void update(size_t done) {
    if (!enabled_) return;
    const int pct =
        static_cast<int>(100.0 * static_cast<double>(done) / static_cast<double>(total_));
    if (pct == last_pct_) return;
    last_pct_ = pct;
    const int width = 30, filled = pct * width / 100;
    std::fprintf(stderr, "\rloading weights [%s%s] %3d%% %.2f/%.2f GB",
                 std::string(static_cast<size_t>(filled), '#').c_str(),
                 std::string(static_cast<size_t>(width - filled), ' ').c_str(), pct,
                 static_cast<double>(done) / 1e9, static_cast<double>(total_) / 1e9);
    std::fflush(stderr);
  }
  ~ProgressBar() {
    if (enabled_) std::fprintf(stderr, "\n");
  }

 private:
  size_t total_;
  bool enabled_;
  int last_pct_ = -1;
};

// Reads one byte per page of every weight so the pages are resident.
void touch_weights(const ModelWeights& weights) {
  ProgressBar bar(weights.total_bytes());
  size_t done = 0;
  volatile unsigned char sink = 0;
  constexpr size_t kPage = 4096;
  for (const TensorView* t : weights.tensors()) {
    const auto* bytes = static_cast<const unsigned char*>(t->data);
    for (size_t off = 0; off < t->nbytes; off += kPage) {
      sink = static_cast<unsigned char>(sink ^ bytes[off]);
      if ((off & ((size_t{1} << 24) - 1)) == 0) bar.update(done + off);
    }
    done += t->nbytes;
    bar.update(done);
  }
  (void)sink;
}

}  // namespace

std::optional<std::string> find_default_model() {
  namespace fs = std::filesystem;
  for (const fs::path& p :
       {fs::path("models/kjv-small"), fs::path(CELLM_SOURCE_DIR) / "models" / "kjv-small"}) {
    std::error_code ec;
    if (fs::exists(p / "config.json", ec)) return p.string();
  }
  return std::nullopt;
}

Result<LoadedModel> load_model_dir(const std::string& dir, bool with_tokenizer) {
  const auto t0 = std::chrono::steady_clock::now();
  LoadedModel m;
  m.name = dir;
  if (with_tokenizer) {
    CELLM_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(dir));
    m.tokenizer = std::move(tok);
  }
  CELLM_ASSIGN_OR_RETURN(ModelWeights w, ModelWeights::load(dir));
  touch_weights(w);
  m.weights = std::make_shared<const ModelWeights>(std::move(w));
  m.load_seconds = seconds_since(t0);
  return m;
}

Result<LoadedModel> load_preset(const std::string& name, uint64_t seed) {
  const auto t0 = std::chrono::steady_clock::now();
  CELLM_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::preset(name));
  LoadedModel m;
  m.name = "preset:" + name;
  m.weights =
      std::make_shared<const ModelWeights>(ModelWeights::random(config, DType::kBF16, seed));
  m.load_seconds = seconds_since(t0);
  return m;
}

Result<ExecutorKind> parse_executor_kind(const std::string& text) {
  if (text == "cpu") return ExecutorKind::kCpu;
  if (text == "cuda") return ExecutorKind::kCuda;
  return InvalidArgument("--executor must be 'cpu' or 'cuda', got '" + text + "'");
}

const char* to_string(ExecutorKind kind) {
  return kind == ExecutorKind::kCpu ? "cpu" : "cuda";
}

ExecutorKind default_executor_kind() {
#ifdef CELLM_HAVE_CUDA
  if (cuda_device_available()) return ExecutorKind::kCuda;
#endif
  return ExecutorKind::kCpu;
}

Result<std::unique_ptr<Executor>> make_executor(ExecutorKind kind,
                                                std::shared_ptr<const ModelWeights> weights,
                                                const EngineLimits& limits) {
  if (kind == ExecutorKind::kCuda) {
#ifdef CELLM_HAVE_CUDA
    CudaExecutorOptions o;
    o.max_sessions = limits.max_sessions;
    o.max_session_tokens = limits.max_session_tokens;
    o.step_width = std::max(2, limits.step_width);
    o.cuda_graph_for_decode = limits.cuda_graphs;
    o.time_steps = limits.time_steps;
    o.programmatic_launch = limits.programmatic_launch;
    o.tune_gemm = limits.tune_gemm;
    o.early_triggers = limits.early_triggers;
    o.early_after_cublas = limits.early_after_cublas;
    o.l2_prefetch = limits.l2_prefetch;
    o.overlap_decode = limits.overlap_decode;
    o.warm_prefill_gemms = limits.warm_prefill_gemms;
    o.attention_cluster_fold = limits.attention_cluster_fold;
    o.prefill_attention = limits.prefill_attention;
    o.persistent_decode = limits.persistent_decode;
    CELLM_ASSIGN_OR_RETURN(std::unique_ptr<CudaExecutor> e,
                           CudaExecutor::create(std::move(weights), o));
    return std::unique_ptr<Executor>(std::move(e));
#else
    return NotSupported(
        "this build of cellm has no CUDA executor (nvcc was not found); use "
        "--executor cpu");
#endif
  }
  ExecutorLimits l;
  l.max_sessions = limits.max_sessions;
  l.max_session_tokens = limits.max_session_tokens;
  l.step_width = limits.step_width;
  CpuExecutorOptions o;
  o.num_threads = limits.num_threads;
  CELLM_ASSIGN_OR_RETURN(std::unique_ptr<CpuExecutor> e,
                         CpuExecutor::create(std::move(weights), l, o));
  return std::unique_ptr<Executor>(std::move(e));
}

std::optional<StepTimeReport> step_time_report(const Executor& executor) {
#ifdef CELLM_HAVE_CUDA
  if (const auto* cuda = dynamic_cast<const CudaExecutor*>(&executor)) {
    if (!cuda->options().time_steps) return std::nullopt;
    const CudaExecutor::StepTimes t = cuda->step_times();
    const CudaExecutor::MethodCalls calls = cuda->method_calls();
    return StepTimeReport{t.decode_batches,
                          t.decode_wall_ms,
                          t.decode_device_ms,
                          cuda->initialize_seconds(),
                          cuda->decode_graph_notes(),
                          calls.decode_steps_ahead_used,
                          calls.decode_steps_ahead_dropped,
                          cuda->warmed_prefill_kernels()};
  }
#else
  (void)executor;
#endif
  return std::nullopt;
}

const std::vector<FlagSpec>& sampling_flags() {
  static const std::vector<FlagSpec> flags = {
      {"temperature", "T", "0 = greedy (default 0)"},
      {"top-k", "K", "keep the K most probable tokens; 0 = off (default 0)"},
      {"top-p", "P", "nucleus sampling mass; 1 = off (default 1)"},
      {"min-p", "P", "drop tokens below P x the top probability; 0 = off (default 0)"},
  };
  return flags;
}

Result<SamplingParams> parse_sampling_flags(const Args& args) {
  SamplingParams sp;
  CELLM_ASSIGN_OR_RETURN(const double temperature, args.get_float("temperature", 0.0));
  CELLM_ASSIGN_OR_RETURN(const double top_p, args.get_float("top-p", 1.0));
  CELLM_ASSIGN_OR_RETURN(const double min_p, args.get_float("min-p", 0.0));
  CELLM_ASSIGN_OR_RETURN(const int64_t top_k, args.get_int("top-k", 0, 0, INT32_MAX));
  sp.temperature = static_cast<float>(temperature);
  sp.top_p = static_cast<float>(top_p);
  sp.min_p = static_cast<float>(min_p);
  sp.top_k = static_cast<int32_t>(top_k);
  CELLM_RETURN_IF_ERROR(validate_sampling(sp));
  return sp;
}

std::string describe_sampling(const SamplingParams& params) {
  if (params.temperature == 0.0f) return "greedy";
  const auto term = [](const char* name, double value) {
    char text[64];
    std::snprintf(text, sizeof(text), "%s %g", name, value);
    return std::string(text);
  };
  std::string text = term("temperature", params.temperature);
  if (params.top_k > 0) text += ", " + term("top-k", params.top_k);
  if (params.top_p < 1.0f) text += ", " + term("top-p", params.top_p);
  if (params.min_p > 0.0f) text += ", " + term("min-p", params.min_p);
  return text;
}

Result<TimedChoice> parse_timed_choice(const std::string& text, const std::string& option) {
  if (text == "timed") return TimedChoice::kTimed;
  if (text == "on") return TimedChoice::kOn;
  if (text == "off") return TimedChoice::kOff;
  return InvalidArgument("--" + option + " must be timed, on or off, not '" + text + "'");
}

std::vector<std::string> tuned_gemm_report() {
#ifdef CELLM_HAVE_CUDA
  return describe_tuned_gemms();
#else
  return {};
#endif
}

std::string device_report(ExecutorKind kind) {
#ifdef CELLM_HAVE_CUDA
  if (kind == ExecutorKind::kCuda) return describe_cuda_device(0);
#else
  (void)kind;
#endif
  return "";
}

Result<std::unique_ptr<Scheduler>> make_scheduler(const EngineLimits& limits) {
  const auto budget = static_cast<size_t>(std::max(2, limits.step_width));
  const size_t decodes =
      std::clamp<size_t>(static_cast<size_t>(limits.max_sessions), 1, budget / 2);
  CELLM_ASSIGN_OR_RETURN(std::unique_ptr<DecodeFirstScheduler> s,
                         DecodeFirstScheduler::create(budget, decodes, budget - decodes));
  return std::unique_ptr<Scheduler>(std::move(s));
}

}  // namespace cellm::cli
