// Engine (engine.h): the executor chosen by availability, created from the one function
// that wires the engine's options into it, the scheduler sized from the limits, and the
// reports tools print.
#include "cellm/engine.h"

#include <algorithm>
#include <utility>

#include "cellm/decode_first_scheduler.h"

namespace cellm {
namespace {

// Every executor option the engine sets, in one place: the executor of `kind` over
// `weights`, created with the options' limits and that executor's own options.
Result<std::unique_ptr<Executor>> make_executor(ExecutorKind kind,
                                                std::shared_ptr<const ModelWeights> weights,
                                                const EngineOptions& options,
                                                ExecutorLimits& limits) {
  limits = options.limits;
  if (kind == ExecutorKind::kCuda) {
#ifdef CELLM_HAVE_CUDA
    limits.step_width = std::max(2, limits.step_width);  // a prefill forward spans 2+ tokens
    CELLM_ASSIGN_OR_RETURN(std::unique_ptr<CudaExecutor> e,
                           CudaExecutor::create(std::move(weights), limits, options.cuda));
    return std::unique_ptr<Executor>(std::move(e));
#else
    return NotSupported(
        "this build of cellm has no CUDA executor (nvcc was not found); use "
        "--executor cpu");
#endif
  }
  CELLM_ASSIGN_OR_RETURN(std::unique_ptr<CpuExecutor> e,
                         CpuExecutor::create(std::move(weights), limits, options.cpu));
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
  CELLM_ASSIGN_OR_RETURN(engine.executor_,
                         make_executor(engine.kind_, model->weights, options, engine.limits_));
  CELLM_ASSIGN_OR_RETURN(std::unique_ptr<Scheduler> scheduler, make_scheduler(engine.limits_));
  engine.runner_ = std::make_unique<Runner>(*engine.executor_, std::move(scheduler));
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
