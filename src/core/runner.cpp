// The public face of the runner: GenerationHandle, Session and Runner forward
// to RunnerCore (runner_core.h), which owns the engine thread.
#include "cellm/runner.h"

#include <exception>
#include <utility>

#include "core/runner_core.h"

namespace cellm {

const char* to_string(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStopToken:
      return "stop_token";
    case FinishReason::kNewTokenLimit:
      return "token_limit";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kFailed:
      return "failed";
  }
  return "unknown";
}

namespace detail {

void GenerationState::publish_terminal(FinishReason r, std::string message,
                                       const GenerationMetrics& m) {
  {
    std::lock_guard<std::mutex> lock(mu);
    reason = r;
    error_message = std::move(message);
    metrics = m;
    done = true;
  }
  done_cv.notify_all();
}

void GenerationState::publish_metrics(const GenerationMetrics& m) {
  std::lock_guard<std::mutex> lock(mu);
  metrics = m;
}

std::optional<std::string> invoke_callback(const GenerationCallback& callback,
                                           const GenerationUpdate& update) {
  if (!callback) return std::nullopt;
  try {
    callback(update);
  } catch (const std::exception& e) {
    return std::string(e.what());
  } catch (...) {
    return std::string("generation callback threw a non-standard exception");
  }
  return std::nullopt;
}

void complete_synchronously(const std::shared_ptr<GenerationState>& state,
                            const GenerationCallback& callback, FinishReason reason,
                            std::string message) {
  GenerationUpdate update;
  update.finish_reason = reason;
  if (reason == FinishReason::kFailed) update.error_message = message;
  if (std::optional<std::string> error = invoke_callback(callback, update)) {
    reason = FinishReason::kFailed;
    message = std::move(*error);
  }
  if (reason != FinishReason::kFailed) message.clear();
  GenerationMetrics m;
  {
    std::lock_guard<std::mutex> lock(state->mu);
    m = state->metrics;
  }
  m.t_end_us = now_us();
  state->publish_terminal(reason, std::move(message), m);
}

}  // namespace detail

// ---------------------------------------------------------------------------
// GenerationHandle

void GenerationHandle::cancel() const {
  if (state_) state_->cancel_requested.store(true);
}

bool GenerationHandle::done() const {
  if (!state_) return false;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done;
}

void GenerationHandle::wait() const {
  if (!state_) return;
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->done_cv.wait(lock, [this] { return state_->done; });
}

std::optional<FinishReason> GenerationHandle::finish_reason() const {
  if (!state_) return std::nullopt;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done ? state_->reason : std::nullopt;
}

std::string GenerationHandle::error_message() const {
  if (!state_) return {};
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->error_message;
}

GenerationMetrics GenerationHandle::metrics() const {
  if (!state_) return {};
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->metrics;
}

// ---------------------------------------------------------------------------
// Session

Session::Session(std::shared_ptr<detail::RunnerCore> core,
                 std::shared_ptr<detail::SessionRecord> rec)
    : core_(std::move(core)), record_(std::move(rec)) {}

Session::Session(Session&& other) noexcept
    : core_(std::move(other.core_)), record_(std::move(other.record_)) {}

Session& Session::operator=(Session&& other) noexcept {
  if (this != &other) {
    release();
    core_ = std::move(other.core_);
    record_ = std::move(other.record_);
  }
  return *this;
}

Session::~Session() {
  release();
}

void Session::release() {
  if (valid()) core_->close_session(record_);
  core_.reset();
  record_.reset();
}

SessionId Session::id() const {
  return record_ ? record_->sid : 0;
}

Position Session::position() const {
  return record_ ? record_->position.load() : 0;
}

std::future<std::optional<Session>> Session::clone_async(Position upto) const {
  if (!valid()) {
    std::promise<std::optional<Session>> refused;
    refused.set_value(std::nullopt);
    return refused.get_future();
  }
  return core_->clone_session(record_, upto);
}

SessionRef Session::ref() const {
  if (!valid()) return SessionRef();
  return SessionRef(core_, record_, record_->sid);
}

// ---------------------------------------------------------------------------
// SessionRef

std::future<std::optional<Session>> SessionRef::clone_async(Position upto) const {
  std::shared_ptr<detail::RunnerCore> core = core_.lock();
  std::shared_ptr<detail::SessionRecord> record = record_.lock();
  // A close requested before this call is queued before this clone, so the
  // engine would refuse it anyway; refusing here spares the round trip.
  if (!core || !record || record->close_requested.load()) {
    std::promise<std::optional<Session>> refused;
    refused.set_value(std::nullopt);
    return refused.get_future();
  }
  return core->clone_session(std::move(record), upto);
}

GenerationHandle Session::generate_async(std::vector<Token> delta, const GenConfig& config,
                                         GenerationCallback on_update) {
  const int64_t t_submit = now_us();
  if (!valid()) {
    auto state = std::make_shared<detail::GenerationState>();
    state->metrics.t_submit_us = t_submit;
    detail::complete_synchronously(state, on_update, FinishReason::kFailed,
                                   "session is not initialized");
    return GenerationHandle(std::move(state));
  }
  return core_->start_generation(record_, std::move(delta), config, std::move(on_update), t_submit);
}

// ---------------------------------------------------------------------------
// Runner

Runner::Runner(Executor& executor, std::unique_ptr<Scheduler> scheduler)
    : Runner(executor, std::move(scheduler), RunnerOptions{}) {}

Runner::Runner(Executor& executor, std::unique_ptr<Scheduler> scheduler,
               const RunnerOptions& options)
    : core_(std::make_shared<detail::RunnerCore>(executor, std::move(scheduler), options)) {
  core_->start();
}

Runner::~Runner() {
  shutdown();
}

std::future<std::optional<Session>> Runner::open_session_async() {
  return core_->open_session();
}

std::future<std::optional<Session>> Runner::open_session_async(std::vector<Token> prefix_of) {
  return core_->open_session(std::move(prefix_of));
}

void Runner::shutdown() {
  core_->shutdown();
}

EngineMetrics Runner::metrics() const {
  return core_->metrics();
}

KvMetrics Runner::kv_metrics() const {
  return core_->kv_metrics();
}

KvBudget Runner::kv_budget() const {
  return core_->kv_budget();
}

Status Runner::initialize_status() const {
  return core_->initialize_status();
}

size_t Runner::queued_tasks() const {
  return core_->queued_tasks();
}

}  // namespace cellm
