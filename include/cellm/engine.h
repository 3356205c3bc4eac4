// Engine: the one way in. A model source and options become a loaded model (weights,
// tokenizer, chat template), an executor chosen by what this build and machine have, and
// a Runner driving it:
//
//   cellm::EngineOptions options;            // the bundled model, executor by availability
//   cellm::Result<cellm::Engine> engine = cellm::Engine::create(options);
//   cellm::Session s = *engine->runner().open_session_async().get();
//
// Loading reads config.json and the safetensors (and tokenizer.json and the chat template
// when asked), then touches every weight page once so the first step does not pay for page
// faults. The executor is the CPU one or, where this build has it and a device is present,
// the CUDA one; callers never name an executor class or test for CUDA themselves.
//
// Thread-safety: an Engine is built and destroyed on one thread; its Runner is
// thread-safe as documented in runner.h. The LoadedModel is immutable and may be shared
// by several engines (one per benchmark row, each sized differently).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cellm/chat_template.h"
#include "cellm/cpu_executor.h"
#include "cellm/cuda_executor.h"
#include "cellm/executor.h"
#include "cellm/gpu_power.h"
#include "cellm/model_config.h"
#include "cellm/model_weights.h"
#include "cellm/runner.h"
#include "cellm/status.h"
#include "cellm/tokenizer.h"

namespace cellm {

// How the linear layers' weights (q, k, v, o, gate, up, down of every layer) are held once
// loaded: `--weights`. kAuto keeps them as stored. kBF16 / kF32 convert float weights to
// that type. The block types quantize float weights as they load into the formats the CPU
// executor's quantized matmul runs (the weight quantizers of src/cpu/quant/weight_quant.h),
// keeping no full-precision copy resident. A weight whose rows are not whole blocks of a
// K-quant (256 weights) takes the 32-weight format of about the same size instead (q4_k ->
// q5_0, q5_k -> q5_1, q6_k -> q8_0); one whose rows are not whole 32-weight blocks stays as
// stored. The embedding, the norms, the biases and the LM head always stay as stored (the
// head is often tied to the embedding, and it is the weight most sensitive to rounding).
// Weights a GGUF file already holds in blocks are refused unless the format is theirs (no
// re-quantizing). The CUDA executor runs kAuto, kBF16 and the FP8 formats.
// kFp8 quantizes float linear weights to float8_e4m3fn with one f32 scale per output row
// (the row's largest magnitude / 448); kFp8Head ("fp8_head") does the same and quantizes
// an untied LM head too (a tied head stays the embedding's). A checkpoint already in FP8
// (quantization_config) keeps its weights under kAuto, kFp8 and kFp8Head; kBF16 / kF32
// dequantize them. Both executors compute with the e4m3 bytes (the CUDA executor in
// bf16; in f32 it dequantizes them exactly as it uploads them).
enum class WeightFormat {
  kAuto,
  kBF16,
  kF32,
  kQ8_0,
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kQ4_K,
  kQ5_K,
  kQ6_K,
  kFp8,
  kFp8Head,
};
// "auto", "bf16", "f32", "q8_0", ..., "q6_k", "fp8", "fp8_head".
const char* to_string(WeightFormat format);
// The format spelled `name` (as to_string spells it, any case); InvalidArgument naming the
// value and listing the formats otherwise.
Result<WeightFormat> parse_weight_format(std::string_view name);
// "auto, bf16, f32, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k, fp8, fp8_head": for help
// texts.
std::string weight_format_names();
// Whether the CUDA executor runs weights loaded as `format` (kAuto, kBF16, kFp8, kFp8Head).
bool cuda_runs_weight_format(WeightFormat format);

// Where the weights come from: a Hugging Face folder, the bundled default model, or random
// weights with a preset's real shapes.
struct ModelSource {
  // A folder holding config.json and *.safetensors (and tokenizer.json). Empty with no
  // preset: the bundled models/kjv-small, under the working directory or else under the
  // source tree cellm was built from.
  std::string path;
  // A random-weight preset ("110m", "1b", "8b"; ModelConfig::preset) instead of a folder.
  std::string preset;
  uint64_t seed = 0;  // the preset weights' seed
  // How the linear layers' weights are held (--weights); see WeightFormat.
  WeightFormat weights = WeightFormat::kAuto;
};

// Which executor runs the model.
enum class ExecutorKind {
  kAuto,  // CUDA when this build has it and a device is present, else CPU
  kCpu,
  kCuda,
};
// "auto", "cpu" or "cuda".
const char* to_string(ExecutorKind kind);

// The KV dtype spelled `name` (to_string(KvDtype): auto, f32, bf16, fp8); an
// InvalidArgument naming --kv-dtype and the accepted values otherwise.
Result<KvDtype> parse_kv_dtype(std::string_view name);

// Loading progress: bytes of weights touched so far and in all. Empty: a one-line bar on
// stderr when stderr is a terminal, nothing otherwise.
using LoadProgress = std::function<void(size_t done_bytes, size_t total_bytes)>;

// A loaded model. Immutable once loaded; shared by the engines built on it.
struct LoadedModel {
  std::string name;  // the folder as given, or "preset:<name>"
  std::string dir;   // the folder; empty for a preset
  std::shared_ptr<const ModelWeights> weights;
  std::optional<Tokenizer> tokenizer;  // when asked for; never for a preset
  // With the tokenizer: the folder's chat template (ChatTemplate::load), when it has a
  // usable one; chat_template_status says why not otherwise (NotFound: none; InvalidProgram:
  // it does not parse). A model without one still generates.
  std::optional<ChatTemplate> chat_template;
  Status chat_template_status = NotFound("no chat template was loaded");
  double load_seconds = 0;  // wall time of the whole load
  // The --weights the model was loaded with, and what it did: "" for kAuto, else e.g.
  // "q4_k: 8 linear weights as q4_k, 48 as q5_0 (rows not whole q4_k blocks)".
  WeightFormat weights_format = WeightFormat::kAuto;
  std::string weights_summary;
};

// The folder `source` names, or the bundled default when it names none. NotFound when the
// default is not found; InvalidArgument for a preset (it has no folder).
Result<std::string> resolve_model_folder(const ModelSource& source);

// The tokenizer of `path`: a model folder's tokenizer.json (Tokenizer::load), or a GGUF
// file's tokenizer.ggml.* metadata (Tokenizer::from_gguf).
Result<Tokenizer> load_tokenizer(const std::string& path);

// Loads `source`: the tokenizer first (with_tokenizer; a folder only), then the weights
// (touching every page, reporting `progress`), then the chat template. Errors name the
// file (ModelWeights::load, Tokenizer::load); a preset's unknown name is InvalidArgument.
Result<std::shared_ptr<const LoadedModel>> load_model(const ModelSource& source,
                                                      bool with_tokenizer,
                                                      const LoadProgress& progress = {});

// The CPU executor's default KV byte budget: a quarter of the machine's physical memory
// (sysconf), or 1 GiB where the system does not say.
int64_t default_cpu_kv_bytes();
// The CUDA executor's default share of the device memory left for the KV pool.
inline constexpr double kDefaultKvMemoryFraction = 0.90;

struct EngineOptions {
  ModelSource model;
  bool load_tokenizer = true;  // ignored for presets, which have none
  ExecutorKind executor = ExecutorKind::kAuto;
  // The session geometry. The scheduler is sized from it: a budget of step_width tokens a
  // step, up to min(max_sessions, step_width / 2) decodes, prefill chunks of the rest.
  //
  // The KV pool's size is part of it (ExecutorLimits): capacity_rule (fixed slots, the
  // default) or sharing by need; max_cells; kv_memory_bytes (CPU) and kv_memory_fraction
  // (CUDA), both of which may be set when the executor is kAuto, each executor reading
  // its own. With capacity_rule off and neither max_cells nor the executor's own memory
  // field set, the engine fills that field in: default_cpu_kv_bytes() for the CPU
  // executor, kDefaultKvMemoryFraction for the CUDA one.
  ExecutorLimits limits;
  CpuExecutorOptions cpu;    // used when the CPU executor runs the model
  CudaExecutorOptions cuda;  // used when the CUDA executor runs the model
  // How generations share the KV pool (runner.h): kNone keeps every generation
  // submitted at once, the policies admit by the cells they need.
  RunnerOptions runner;
  LoadProgress load_progress;
};

// How the executor sized its KV pool, for a start-up line (describe_kv_pool).
struct KvPoolReport {
  int64_t cells = 0;           // limits().max_cells, the scratch cell included
  int64_t bytes_per_cell = 0;  // one cell's K and V over every layer
  int64_t pool_bytes = 0;      // cells * bytes_per_cell (the CPU executor grows to it)
  int64_t table_bytes = 0;     // the CUDA executor's cell table; 0 on the CPU
  int64_t max_context = 0;     // positions one session may hold (limits().max_session_tokens)
  bool capacity_rule = true;   // fixed slots; false: shared by need
  bool by_memory = false;      // cells from kv_memory_bytes / kv_memory_fraction
};
// "KV pool: 420000 cells x 128.0 KiB = 51.3 GiB (by memory, shared by need), context
// 131072 tokens, cell table 256.0 MiB" (no table part on the CPU).
std::string describe_kv_pool(const KvPoolReport& report);

// A byte count for people: "12.0 KiB", "256.5 MiB", "51.3 GiB" ("512 bytes" below 1 KiB).
std::string bytes_text(int64_t bytes);

// Batched decode steps so far and their time, from an executor that measures them (the
// CUDA executor with time_steps).
struct StepTimeReport {
  int64_t decode_steps = 0;
  double wall_ms = 0, device_ms = 0;  // summed over the steps
  double startup_s = 0;  // initialize(): graph capture, GEMM tuning, prefill GEMMs' warm-up
  std::vector<std::string> graph_notes;       // one per decode graph captured
  int64_t ahead_used = 0, ahead_dropped = 0;  // decode steps queued ahead (overlap_decode)
  int64_t warmed_prefill_kernels = 0;         // prefill GEMM kernels run at startup
};

class Engine {
 public:
  // Loads options.model, then builds the executor and the runner as below.
  static Result<Engine> create(const EngineOptions& options);
  // An engine over a model already loaded (options.model and load_tokenizer are not used):
  // validates the executor options (the executor's create() errors, unchanged), creates
  // the executor and a Runner over it. NotSupported for kCuda in a build without CUDA.
  static Result<Engine> create(std::shared_ptr<const LoadedModel> model,
                               const EngineOptions& options);

  Engine(Engine&&) noexcept;
  Engine& operator=(Engine&&) noexcept;
  ~Engine();  // shuts the runner down, then frees the executor

  Runner& runner() { return *runner_; }
  const LoadedModel& model() const { return *model_; }
  const std::shared_ptr<const LoadedModel>& shared_model() const { return model_; }
  const ModelConfig& config() const { return model_->weights->config(); }
  // nullptr when not loaded (presets, load_tokenizer off).
  const Tokenizer* tokenizer() const;
  // nullptr when the model has no usable chat template (chat_template_status says why).
  const ChatTemplate* chat_template() const;
  const Status& chat_template_status() const { return model_->chat_template_status; }

  // The executor that runs the model: kCpu or kCuda, never kAuto.
  ExecutorKind executor_kind() const { return kind_; }
  // The geometry the executor was created with, every field resolved by it (max_cells,
  // max_session_tokens: the executor's limits()).
  const ExecutorLimits& limits() const { return limits_; }
  // How the KV pool was sized. Immutable once created: any thread may call it.
  const KvPoolReport& kv_pool() const { return kv_pool_; }

  // For logs. The device the executor runs on ("" for the CPU executor):
  // describe_cuda_device's text.
  std::string device_description() const;
  // Decode steps and their time, when the executor measures them; nullopt otherwise.
  std::optional<StepTimeReport> step_time_report() const;

  // The device an executor of `kind` would run on, as device_description() says it ("" for
  // the CPU executor), before any engine is built.
  static std::string describe_device(ExecutorKind kind, int device = 0);
  // The executor kAuto picks in this process.
  static ExecutorKind default_executor_kind();
  // One line per GEMM shape tuned so far in this process (describe_tuned_gemms); empty in
  // a build without CUDA.
  static std::vector<std::string> tuned_gemm_report();
  // Whether this build has the CUDA executor.
  static bool has_cuda_executor();

 private:
  Engine() = default;

  std::shared_ptr<const LoadedModel> model_;
  ExecutorKind kind_ = ExecutorKind::kCpu;
  ExecutorLimits limits_;
  KvPoolReport kv_pool_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<Runner> runner_;  // declared after executor_: destroyed first
};

// A CUDA device's clock and power through phases of work, for benchmark logs: a
// GpuPowerSampler where this build has the CUDA executor. Not thread-safe: one caller
// drives it.
class DevicePowerProbe {
 public:
  // GpuPowerSampler::create(device, period_ms)'s errors; NotSupported in a build without
  // CUDA.
  static Result<std::unique_ptr<DevicePowerProbe>> create(int device, int period_ms);
  ~DevicePowerProbe();
  DevicePowerProbe(const DevicePowerProbe&) = delete;
  DevicePowerProbe& operator=(const DevicePowerProbe&) = delete;

  void start();            // GpuPowerSampler::start
  GpuPowerSummary stop();  // GpuPowerSampler::stop

  struct Impl;

 private:
  explicit DevicePowerProbe(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cellm
