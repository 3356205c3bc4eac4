// What the `cellm` subcommands share on the command line: the sampling flags of the
// commands that generate, --executor, and the timed/on/off choices of `cellm bench`.
#pragma once

#include <string>
#include <vector>

#include "args.h"
#include "cellm/cuda_executor.h"
#include "cellm/engine.h"
#include "cellm/status.h"
#include "cellm/types.h"

namespace cellm::cli {

// The sampling flags of the commands that generate (--temperature, --top-k, --top-p,
// --min-p; by default greedy, nothing cut), and their values read back and validated
// (cellm::validate_sampling): a flag that is not a number, or a value out of range, is an
// InvalidArgument that names it.
const std::vector<FlagSpec>& sampling_flags();
Result<SamplingParams> parse_sampling_flags(const Args& args);
// "greedy", or the policy in the flags' terms, e.g. "temperature 0.7, top-p 0.9".
std::string describe_sampling(const SamplingParams& params);

// The value of --executor ("cpu" or "cuda"); absent: the executor the engine picks by
// availability (Engine::default_executor_kind). InvalidArgument naming the flag otherwise.
Result<ExecutorKind> parse_executor_flag(const Args& args);

// --weights FORMAT (WeightFormat, engine.h) and its value: kAuto when absent;
// InvalidArgument naming the flag for a value that is not a format, or for a format the
// CUDA executor does not run (it runs bf16 and auto only) with --executor cuda, before
// anything loads. Without --executor, such a format sets `executor` to the CPU one.
FlagSpec weights_flag();
Result<WeightFormat> parse_weights_flag(const Args& args, ExecutorKind& executor);
// --kv-dtype TYPE (KvDtype, executor.h; ExecutorLimits::kv_dtype): kAuto when absent;
// InvalidArgument naming the flag and the accepted values otherwise. Whether the executor
// stores that type is its create()'s to say (NotSupported naming the flag).
FlagSpec kv_dtype_flag();
Result<KvDtype> parse_kv_dtype_flag(const Args& args);
// --activations bf16|f32: whether the CPU executor's products with bf16 weights round
// the activations to bf16 (CpuExecutorOptions::bf16_activations; the default, faster
// where the CPU has AVX-512 BF16) or keep them exact in f32. True for bf16;
// InvalidArgument naming the flag for another value.
FlagSpec activations_flag();
Result<bool> parse_activations_flag(const Args& args);
// Prints LoadedModel::weights_summary to stderr when --weights did something.
void print_weights_summary(const LoadedModel& model);

// "timed", "on" or "off", the value of --`option` (--early-triggers, --early-after-cublas);
// InvalidArgument naming the option and the value otherwise.
Result<TimedChoice> parse_timed_choice(const std::string& text, const std::string& option);

}  // namespace cellm::cli
