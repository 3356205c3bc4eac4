// What every `cellm` subcommand that runs a model shares: finding and loading a
// model (a Hugging Face folder or a random-weight preset), choosing and
// creating an executor, sizing the scheduler, and a load progress bar.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "args.h"
#include "cellm/cuda_executor.h"
#include "cellm/executor.h"
#include "cellm/model_weights.h"
#include "cellm/scheduler.h"
#include "cellm/status.h"
#include "cellm/tokenizer.h"
#include "cellm/types.h"

namespace cellm::cli {

struct LoadedModel {
  std::string name;  // folder path or "preset:<name>"
  std::shared_ptr<const ModelWeights> weights;
  std::optional<Tokenizer> tokenizer;  // absent for presets
  double load_seconds = 0;
};

// The bundled default model: models/kjv-small under the working directory, else
// under the source tree this binary was built from.
std::optional<std::string> find_default_model();

// Loads config.json + safetensors (and tokenizer.json when `with_tokenizer`),
// then touches every weight page once so the first step does not pay for page
// faults; draws a progress bar on stderr while doing so when it is a terminal.
Result<LoadedModel> load_model_dir(const std::string& dir, bool with_tokenizer);
// Random bf16 weights with a preset's real shapes ("110m", "1b", "8b").
Result<LoadedModel> load_preset(const std::string& name, uint64_t seed);

enum class ExecutorKind { kCpu, kCuda };
Result<ExecutorKind> parse_executor_kind(const std::string& text);
const char* to_string(ExecutorKind kind);
// The executor a command uses when --executor is not given.
ExecutorKind default_executor_kind();

struct EngineLimits {
  int32_t max_sessions = 8;
  int32_t max_session_tokens = 1024;
  int32_t step_width = 256;  // tokens per forward and per scheduler batch
  int32_t num_threads = 0;   // CPU kernel threads; 0 = all
  bool cuda_graphs = true;   // CUDA: replay decode steps from captured graphs
  bool time_steps = false;   // CUDA: measure host and device time per batch
  // CUDA: programmatic dependent launch of cellm's kernels (process-wide; see
  // CudaTuning::programmatic_launch).
  bool programmatic_launch = true;
  bool tune_gemm = true;  // CUDA: time the decode GEMMs' kernels at startup (tune_gemm)
  // CUDA: how the decode graphs are built (CudaTuning::early_triggers, ...).
  TimedChoice early_triggers = TimedChoice::kTimed;
  TimedChoice early_after_cublas = TimedChoice::kTimed;  // CUDA: (CudaTuning)
  TimedChoice l2_prefetch = TimedChoice::kTimed;         // CUDA: (CudaTuning)
  bool overlap_decode = true;          // CUDA: queue the next decode step early (overlap_decode)
  bool warm_prefill_gemms = true;      // CUDA: load the prefill GEMMs' kernels at startup
  bool attention_cluster_fold = true;  // CUDA: (CudaTuning)
  bool prefill_attention = true;       // CUDA: (CudaTuning)
};

// The sampling flags of the commands that generate (--temperature, --top-k, --top-p,
// --min-p; by default greedy, nothing cut), and their values read back and validated
// (cellm::validate_sampling): a flag that is not a number, or a value out of range, is an
// InvalidArgument that names it.
const std::vector<FlagSpec>& sampling_flags();
Result<SamplingParams> parse_sampling_flags(const Args& args);
// "greedy", or the policy in the flags' terms, e.g. "temperature 0.7, top-p 0.9".
std::string describe_sampling(const SamplingParams& params);

// "timed", "on" or "off", the value of --`option` (--early-triggers, --early-after-cublas);
// InvalidArgument naming the option and the value otherwise.
Result<TimedChoice> parse_timed_choice(const std::string& text, const std::string& option);

Result<std::unique_ptr<Executor>> make_executor(ExecutorKind kind,
                                                std::shared_ptr<const ModelWeights> weights,
                                                const EngineLimits& limits);

// Batched decode steps so far and their time, from an executor that measures it
// (the CUDA executor made with time_steps); nullopt otherwise.
struct StepTimeReport {
  int64_t decode_steps = 0;
  double wall_ms = 0, device_ms = 0;  // summed over the steps
  double startup_s = 0;  // initialize(): graph capture, GEMM tuning, prefill GEMMs' warm-up
  std::vector<std::string> graph_notes;       // CudaExecutor::decode_graph_notes()
  int64_t ahead_used = 0, ahead_dropped = 0;  // decode steps queued ahead (overlap_decode)
  int64_t warmed_prefill_kernels = 0;         // CudaExecutor::warmed_prefill_kernels()
};
std::optional<StepTimeReport> step_time_report(const Executor& executor);

// The GEMM shapes tuned so far in this process and the kernel each chose, one line
// each (describe_tuned_gemms); empty without CUDA.
std::vector<std::string> tuned_gemm_report();
// The device an executor of `kind` runs on, for benchmark logs (describe_cuda_device);
// empty for the CPU executor or without one.
std::string device_report(ExecutorKind kind);

// DecodeFirstScheduler sized for one forward per batch: a budget of step_width
// tokens, up to min(max_sessions, step_width / 2) decodes, and prefill chunks of
// the rest.
Result<std::unique_ptr<Scheduler>> make_scheduler(const EngineLimits& limits);

}  // namespace cellm::cli
