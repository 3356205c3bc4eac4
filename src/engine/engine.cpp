// Engine (engine.h): the executor chosen by availability, created from the one function
// that wires the engine's options into it, the scheduler sized from the limits, and the
// reports tools print.
#include "cellm/engine.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <string>
#include <utility>

#include "cellm/decode_first_scheduler.h"
#include "engine/weight_formats.h"

namespace cellm {
namespace {

// Every executor option the engine sets, in one place: the executor of `kind` over
// `weights`, created with the options' limits (the memory defaults filled in) and that
// executor's own options. Sets `limits` to the executor's resolved limits and `pool` to
// how it sized the KV pool.
Result<std::unique_ptr<Executor>> make_executor(ExecutorKind kind,
                                                std::shared_ptr<const ModelWeights> weights,
                                                const EngineOptions& options,
                                                ExecutorLimits& limits, KvPoolReport& pool) {
  limits = options.limits;
  const bool fill_memory = !limits.capacity_rule && limits.max_cells == 0;
  pool.capacity_rule = limits.capacity_rule;
  if (kind == ExecutorKind::kCuda) {
#ifdef CELLM_HAVE_CUDA
    limits.step_width = std::max(2, limits.step_width);  // a prefill forward spans 2+ tokens
    if (fill_memory && limits.kv_memory_fraction == 0) {
      limits.kv_memory_fraction = kDefaultKvMemoryFraction;
    }
    // The device kernels read elements: a GGUF's block-format tensors go up as bf16. FP8
    // weights go up as they are: the bf16 forward's FP8 products read the codes, the f32
    // forward dequantizes them exactly as it uploads them (cuda/device_model.h).
    CELLM_ASSIGN_OR_RETURN(weights, dequantize_blocks_to_bf16(std::move(weights), true));
    CELLM_ASSIGN_OR_RETURN(std::unique_ptr<CudaExecutor> e,
                           CudaExecutor::create(std::move(weights), limits, options.cuda));
    limits = e->limits();
    const CudaExecutor::KvSizing& sizing = e->kv_sizing();
    pool.cells = sizing.cells;
    pool.bytes_per_cell = sizing.bytes_per_cell;
    pool.pool_bytes = sizing.pool_bytes;
    pool.table_bytes = sizing.table_bytes;
    pool.max_context = sizing.max_context;
    pool.by_memory = sizing.by_memory;
    return std::unique_ptr<Executor>(std::move(e));
#else
    return NotSupported(
        "this build of cellm has no CUDA executor (nvcc was not found); use "
        "--executor cpu");
#endif
  }
  if (fill_memory && limits.kv_memory_bytes == 0) limits.kv_memory_bytes = default_cpu_kv_bytes();
  pool.by_memory = limits.max_cells == 0 && limits.kv_memory_bytes > 0;
  CELLM_ASSIGN_OR_RETURN(std::unique_ptr<CpuExecutor> e,
                         CpuExecutor::create(std::move(weights), limits, options.cpu));
  limits = e->limits();
  pool.cells = limits.max_cells;
  pool.bytes_per_cell = e->kv_bytes_per_cell();
  pool.pool_bytes = pool.cells * pool.bytes_per_cell;
  pool.max_context = limits.max_session_tokens;
  return std::unique_ptr<Executor>(std::move(e));
}

// DecodeFirstScheduler sized for one forward per batch: a budget of step_width tokens, up
// to min(max_sessions, step_width / 2) decodes, and prefill chunks of the rest.
Result<std::unique_ptr<Scheduler>> make_scheduler(const ExecutorLimits& limits) {
  const auto budget = static_cast<size_t>(std::max(2, limits.step_width));
  const size_t decodes =
      std::clamp<size_t>(static_cast<size_t>(limits.max_sessions), 1, budget / 2);
  CELLM_ASSIGN_OR_RETURN(std::unique_ptr<DecodeFirstScheduler> s,
                         DecodeFirstScheduler::create(budget, decodes, budget - decodes));
  return std::unique_ptr<Scheduler>(std::move(s));
}

}  // namespace

std::string bytes_text(int64_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB"};
  auto value = static_cast<double>(bytes);
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(units)) {
    value /= 1024;
    ++unit;
  }
  char text[48];
  if (unit == 0) {
    std::snprintf(text, sizeof(text), "%lld bytes", static_cast<long long>(bytes));
  } else {
    std::snprintf(text, sizeof(text), "%.1f %s", value, units[unit]);
  }
  return text;
}

const char* to_string(ExecutorKind kind) {
  switch (kind) {
    case ExecutorKind::kAuto:
      return "auto";
    case ExecutorKind::kCpu:
      return "cpu";
    case ExecutorKind::kCuda:
      return "cuda";
  }
  return "auto";
}

Result<KvDtype> parse_kv_dtype(std::string_view name) {
  for (const KvDtype d : {KvDtype::kAuto, KvDtype::kF32, KvDtype::kBF16, KvDtype::kFp8}) {
    if (name == to_string(d)) return d;
  }
  return InvalidArgument("--kv-dtype must be auto, f32, bf16 or fp8, got '" + std::string(name) +
                         "'");
}

int64_t default_cpu_kv_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_bytes = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_bytes <= 0) return int64_t{1} << 30;
  return int64_t{pages} * int64_t{page_bytes} / 4;
}

std::string describe_kv_pool(const KvPoolReport& r) {
  std::string text = "KV pool: " + std::to_string(r.cells) + " cells x " +
                     bytes_text(r.bytes_per_cell) + " = " + bytes_text(r.pool_bytes) + " (" +
                     (r.by_memory ? "by memory, " : "") +
                     (r.capacity_rule ? "fixed slots" : "shared by need") + "), context " +
                     std::to_string(r.max_context) + " tokens";
  if (r.table_bytes > 0) text += ", cell table " + bytes_text(r.table_bytes);
  return text;
}

Result<Engine> Engine::create(const EngineOptions& options) {
  CELLM_ASSIGN_OR_RETURN(std::shared_ptr<const LoadedModel> model,
                         load_model(options.model, options.load_tokenizer, options.load_progress));
  return create(std::move(model), options);
}

Result<Engine> Engine::create(std::shared_ptr<const LoadedModel> model,
                              const EngineOptions& options) {
  if (model == nullptr || model->weights == nullptr) {
    return InvalidArgument("Engine: no model given");
  }
  Engine engine;
  engine.kind_ =
      options.executor == ExecutorKind::kAuto ? default_executor_kind() : options.executor;
  if (engine.kind_ == ExecutorKind::kCuda && !cuda_runs_weight_format(model->weights_format)) {
    return NotSupported(std::string("--weights ") + to_string(model->weights_format) +
                        " quantizes for the CPU executor; the CUDA executor runs --weights bf16 "
                        "or auto (give --executor cpu)");
  }
  CELLM_ASSIGN_OR_RETURN(engine.executor_, make_executor(engine.kind_, model->weights, options,
                                                         engine.limits_, engine.kv_pool_));
  CELLM_ASSIGN_OR_RETURN(std::unique_ptr<Scheduler> scheduler, make_scheduler(engine.limits_));
  engine.runner_ =
      std::make_unique<Runner>(*engine.executor_, std::move(scheduler), options.runner);
  engine.model_ = std::move(model);
  return engine;
}

// Members go in reverse order of declaration: the runner before the executor it drives.
Engine::Engine(Engine&& other) noexcept = default;
Engine::~Engine() = default;

Engine& Engine::operator=(Engine&& other) noexcept {
  if (this != &other) {
    runner_.reset();  // the runner drives the executor: it goes first
    executor_ = std::move(other.executor_);
    runner_ = std::move(other.runner_);
    model_ = std::move(other.model_);
    kind_ = other.kind_;
    limits_ = other.limits_;
    kv_pool_ = other.kv_pool_;
  }
  return *this;
}

const Tokenizer* Engine::tokenizer() const {
  return model_->tokenizer ? &*model_->tokenizer : nullptr;
}

const ChatTemplate* Engine::chat_template() const {
  return model_->chat_template ? &*model_->chat_template : nullptr;
}

ExecutorKind Engine::default_executor_kind() {
#ifdef CELLM_HAVE_CUDA
  if (cuda_device_available()) return ExecutorKind::kCuda;
#endif
  return ExecutorKind::kCpu;
}

bool Engine::has_cuda_executor() {
#ifdef CELLM_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

std::string Engine::device_description() const {
#ifdef CELLM_HAVE_CUDA
  if (kind_ == ExecutorKind::kCuda) {
    return describe_device(kind_, static_cast<const CudaExecutor&>(*executor_).options().device);
  }
#endif
  return describe_device(kind_);
}

std::string Engine::describe_device(ExecutorKind kind, int device) {
  if (kind == ExecutorKind::kAuto) kind = default_executor_kind();
#ifdef CELLM_HAVE_CUDA
  if (kind == ExecutorKind::kCuda) return describe_cuda_device(device);
#else
  (void)device;
#endif
  return "";
}

std::optional<StepTimeReport> Engine::step_time_report() const {
#ifdef CELLM_HAVE_CUDA
  if (kind_ == ExecutorKind::kCuda) {
    const auto& cuda = static_cast<const CudaExecutor&>(*executor_);
    if (!cuda.options().time_steps) return std::nullopt;
    const CudaExecutor::StepTimes t = cuda.step_times();
    const CudaExecutor::MethodCalls calls = cuda.method_calls();
    return StepTimeReport{t.decode_batches,
                          t.decode_wall_ms,
                          t.decode_device_ms,
                          cuda.initialize_seconds(),
                          cuda.decode_graph_notes(),
                          calls.decode_steps_ahead_used,
                          calls.decode_steps_ahead_dropped,
                          cuda.warmed_prefill_kernels()};
  }
#endif
  return std::nullopt;
}

std::vector<std::string> Engine::tuned_gemm_report() {
#ifdef CELLM_HAVE_CUDA
  return describe_tuned_gemms();
#else
  return {};
#endif
}

}  // namespace cellm
