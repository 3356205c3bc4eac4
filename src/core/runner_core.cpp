#include "core/runner_core.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "cellm/sampler.h"
#include "cellm/status.h"

namespace cellm::detail {
namespace {

constexpr auto kIdleWait = std::chrono::milliseconds(20);
constexpr int64_t kMaxPosition = std::numeric_limits<Position>::max();

constexpr const char* kMsgBudget = "max_new_tokens must be greater than zero";
constexpr const char* kMsgEmptyDelta = "generation delta must not be empty";
constexpr const char* kMsgRange = "generation delta exceeds the session position range";
constexpr const char* kMsgPoisoned = "session cannot continue after an executor failure";
constexpr const char* kMsgActive = "session already has an active generation";
constexpr const char* kMsgNotOpen = "session is not open";
constexpr const char* kMsgRejected = "scheduler rejected generation tasks";
constexpr const char* kMsgExecuteFailed = "executor failed to execute the batch";
constexpr const char* kMsgIncomplete = "executor returned an incomplete batch output";
constexpr const char* kMsgInvalidOutput = "executor returned an invalid output";
constexpr const char* kMsgNoScoring =
    "this executor cannot score prompts (GenConfig::score_prompt: prompt log-probabilities)";

// The RunnerCore whose engine loop runs on this thread, if any.
thread_local const RunnerCore* tls_engine = nullptr;

void advance(SessionRecord& record, int64_t n_tokens) {
  record.position.store(static_cast<Position>(record.position.load() + n_tokens));
}

}  // namespace

RunnerCore::RunnerCore(Executor& executor, std::unique_ptr<Scheduler> scheduler,
                       const RunnerOptions& options)
    : executor_(executor), scheduler_(std::move(scheduler)), options_(options) {
  CELLM_CHECK_MSG(scheduler_ != nullptr, "Runner needs a scheduler");
}

RunnerCore::~RunnerCore() {
  CELLM_CHECK_MSG(!engine_.joinable(), "the engine thread was never joined");
}

void RunnerCore::start() {
  std::lock_guard<std::mutex> lock(join_mu_);
  engine_ = std::thread([this] { engine_main(); });
}

// ---------------------------------------------------------------------------
// Any thread.

template <typename C>
bool RunnerCore::enqueue(C& cmd) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_requested_.load(std::memory_order_relaxed)) return false;
    inbox_.emplace_back(std::move(cmd));
  }
  wake_cv_.notify_one();
  return true;
}

bool RunnerCore::on_engine_thread() const {
  return tls_engine == this;
}

void RunnerCore::request_stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_requested_.store(true, std::memory_order_release);
  }
  wake_cv_.notify_all();
}

std::future<std::optional<Session>> RunnerCore::open_session(std::vector<Token> prefix_of) {
  OpenCommand cmd;
  cmd.prefix_of = std::move(prefix_of);
  std::future<std::optional<Session>> reply = cmd.reply.get_future();
  if (!enqueue(cmd)) cmd.reply.set_value(std::nullopt);
  return reply;
}

void RunnerCore::close_session(std::shared_ptr<SessionRecord> record) {
  record->close_requested.store(true);
  CloseCommand cmd{std::move(record)};
  // Refused only once stopping, and the stop closes every open session itself.
  (void)enqueue(cmd);
}

GenerationHandle RunnerCore::start_generation(std::shared_ptr<SessionRecord> record,
                                              std::vector<Token> delta, const GenConfig& config,
                                              GenerationCallback callback, int64_t t_submit_us) {
  auto state = std::make_shared<GenerationState>();
  state->metrics.sid = record->sid;
  state->metrics.t_submit_us = t_submit_us;
  StartCommand cmd{std::move(record),   state,      std::move(delta), config,
                   std::move(callback), t_submit_us};
  if (!enqueue(cmd)) {
    complete_synchronously(state, cmd.callback, FinishReason::kCancelled, std::string());
  }
  return GenerationHandle(std::move(state));
}

std::future<std::optional<Session>> RunnerCore::clone_session(std::shared_ptr<SessionRecord> source,
                                                              Position upto) {
  CloneCommand cmd{std::move(source), upto, {}};
  std::future<std::optional<Session>> reply = cmd.reply.get_future();
  if (!enqueue(cmd)) cmd.reply.set_value(std::nullopt);
  return reply;
}

void RunnerCore::shutdown() {
  request_stop();
  if (on_engine_thread()) return;  // a callback: the engine stops after it returns
  std::lock_guard<std::mutex> lock(join_mu_);
  if (engine_.joinable()) engine_.join();
}

EngineMetrics RunnerCore::metrics() const {
  std::lock_guard<std::mutex> lock(mu_);
  return published_metrics_;
}

Status RunnerCore::initialize_status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return init_status_;
}

KvMetrics RunnerCore::kv_metrics() const {
  std::lock_guard<std::mutex> lock(mu_);
  return published_kv_;
}

KvBudget RunnerCore::kv_budget() const {
  std::lock_guard<std::mutex> lock(mu_);
  return published_budget_;
}

// ---------------------------------------------------------------------------
// Engine thread.

void RunnerCore::engine_main() {
  tls_engine = this;
  const int64_t t_init = now_us();
  Status init;
  try {
    init = executor_.initialize();
  } catch (const std::exception& e) {
    init = Internal(std::string("executor initialize() threw: ") + e.what());
  } catch (...) {
    init = Internal("executor initialize() threw");
  }
  metrics_.init_us = now_us() - t_init;
  initialized_ = init.ok();
  {
    // Published before any open is answered, so a refused open can read why.
    std::lock_guard<std::mutex> lock(mu_);
    init_status_ = std::move(init);
  }
  if (initialized_) resolve_policy();
  publish_engine_state(initialized_);
  if (!initialized_) request_stop();

  while (!stop_requested()) {
    ++loop_;
    const bool handled = process_commands_until_idle();
    if (stop_requested()) break;
    admit_waiting();
    const bool ran = execute_one_batch();
    // Commands change KV use too (a close frees cells): sample after either.
    publish_engine_state(ran || handled);
    if (!ran) wait_for_work();
  }
  stop();
  tls_engine = nullptr;
}

void RunnerCore::wait_for_work() {
  std::unique_lock<std::mutex> lock(mu_);
  wake_cv_.wait_for(lock, kIdleWait, [this] {
    return stop_requested_.load(std::memory_order_relaxed) || !inbox_.empty();
  });
}

void RunnerCore::publish_engine_state(bool sample_kv) {
  KvMetrics kv;
  KvBudget budget;
  if (sample_kv) {
    kv = executor_.kv_metrics();
    budget = executor_.kv_budget();
  }
  metrics_.generations_waiting = static_cast<int64_t>(waiting_.size());
  std::lock_guard<std::mutex> lock(mu_);
  published_metrics_ = metrics_;
  if (sample_kv) {
    published_kv_ = kv;
    published_budget_ = budget;
  }
}

// Commands queued by callbacks (terminal callbacks of rejected or reaped
// generations included) are processed before the next forward.
bool RunnerCore::process_commands_until_idle() {
  bool handled = false;
  while (!stop_requested()) {
    while (drain_inbox_once()) handled = true;
    reap_cancelled();
    std::lock_guard<std::mutex> lock(mu_);
    if (inbox_.empty()) return handled;
  }
  return handled;
}

bool RunnerCore::drain_inbox_once() {
  std::deque<Command> batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch.swap(inbox_);
  }
  if (batch.empty()) return false;
  for (Command& cmd : batch) {
    std::visit([this](auto& c) { handle(c); }, cmd);
  }
  return true;
}

SessionRecord* RunnerCore::find_open(SessionId sid) {
  auto it = sessions_.find(sid);
  return it == sessions_.end() ? nullptr : it->second.get();
}

Session RunnerCore::make_session(const std::shared_ptr<SessionRecord>& record) {
  return Session(shared_from_this(), record);
}

void RunnerCore::handle(OpenCommand& cmd) {
  if (stop_requested()) {
    cmd.reply.set_value(std::nullopt);
    return;
  }
  std::optional<SessionId> id;
  try {
    id = executor_.open_session();
  } catch (...) {
    id.reset();
  }
  if (!id) {
    metrics_.sessions_refused++;
    cmd.reply.set_value(std::nullopt);
    return;
  }
  CELLM_CHECK_MSG(ids_ever_opened_.insert(*id).second,
                  "executor reused session id " + std::to_string(*id));
  Position attached = 0;
  if (cmd.prefix_of.size() > 1) {
    // The last token is left to the first generation, so it gets a forward.
    const std::span<const Token> prefix(cmd.prefix_of.data(), cmd.prefix_of.size() - 1);
    attached = std::clamp<Position>(executor_.attach_prefix(*id, prefix), 0,
                                    static_cast<Position>(prefix.size()));
  }
  auto record = std::make_shared<SessionRecord>(*id, attached);
  if (policy_on()) record->history.assign(cmd.prefix_of.begin(), cmd.prefix_of.begin() + attached);
  sessions_.emplace(*id, record);
  cmd.reply.set_value(make_session(record));
}

void RunnerCore::handle(CloseCommand& cmd) {
  auto it = sessions_.find(cmd.record->sid);
  if (it == sessions_.end() || it->second != cmd.record) return;  // already retired
  std::shared_ptr<SessionRecord> record = std::move(it->second);
  sessions_.erase(it);
  retire(*record);
  executor_.close_session(record->sid);
}

// Marks the record closed, unqueues its tasks and cancels its generation.
void RunnerCore::retire(SessionRecord& record) {
  record.closed = true;
  (void)scheduler_->cancel(record.sid);
  if (record.active) finish(record, FinishReason::kCancelled, std::string());
}

void RunnerCore::handle(StartCommand& cmd) {
  metrics_.generations_started++;
  auto gen = std::make_unique<ActiveGeneration>();
  gen->state = cmd.state;
  gen->callback = std::move(cmd.callback);
  gen->metrics.sid = cmd.record->sid;
  gen->metrics.t_submit_us = cmd.t_submit_us;
  auto reject = [&](FinishReason reason, const char* message) {
    conclude(*gen, reason, message, {});
  };

  if (stop_requested() || cmd.state->cancel_requested.load()) {
    return reject(FinishReason::kCancelled, "");
  }
  SessionRecord* record = find_open(cmd.record->sid);
  if (record == nullptr || record != cmd.record.get()) {
    return reject(FinishReason::kFailed, kMsgNotOpen);
  }
  if (record->close_requested.load()) return reject(FinishReason::kCancelled, "");
  if (cmd.config.max_new_tokens <= 0) return reject(FinishReason::kFailed, kMsgBudget);
  if (cmd.delta.empty()) return reject(FinishReason::kFailed, kMsgEmptyDelta);
  if (Status s = validate_sampling(cmd.config.sampling); !s.ok()) {
    return conclude(*gen, FinishReason::kFailed, "invalid sampling: " + s.message(), {});
  }
  if (cmd.config.score_prompt && !executor_.supports_scoring()) {
    return reject(FinishReason::kFailed, kMsgNoScoring);
  }
  const int64_t n_pending = record->pending ? 1 : 0;
  const int64_t end =
      int64_t{record->position.load()} + n_pending + static_cast<int64_t>(cmd.delta.size());
  if (end > kMaxPosition) return reject(FinishReason::kFailed, kMsgRange);
  if (record->poisoned) return reject(FinishReason::kFailed, kMsgPoisoned);
  if (record->active) return reject(FinishReason::kFailed, kMsgActive);
  if (policy_on()) {
    if (std::optional<std::string> error =
            never_fits(*record, n_pending + static_cast<int64_t>(cmd.delta.size()),
                       cmd.config.max_new_tokens)) {
      return conclude(*gen, FinishReason::kFailed, std::move(*error), {});
    }
  }

  gen->metrics.n_prompt_tokens = static_cast<int64_t>(cmd.delta.size());
  metrics_.total_prompt_tokens += gen->metrics.n_prompt_tokens;
  auto buffer = std::make_shared<std::vector<Token>>();
  buffer->reserve(static_cast<size_t>(n_pending) + cmd.delta.size());
  if (record->pending) buffer->push_back(*record->pending);
  buffer->insert(buffer->end(), cmd.delta.begin(), cmd.delta.end());

  executor_.set_sampling(record->sid, cmd.config.sampling, cmd.config.seed);
  if (cmd.config.processor != nullptr &&
      !executor_.set_logits_processor(record->sid, cmd.config.processor)) {
    return conclude(*gen, FinishReason::kFailed,
                    "this executor cannot apply logits processors (penalties, logit_bias, "
                    "constrained decoding)",
                    {});
  }
  gen->stop_tokens = cmd.config.stop_tokens;
  gen->wants_logprobs = cmd.config.sampling.num_logprobs > 0;
  gen->score_prompt = cmd.config.score_prompt;
  gen->score_base = record->position.load();
  gen->score_count = buffer->size() - 1;
  gen->remaining_tokens = cmd.config.max_new_tokens;
  gen->feed = std::move(buffer);
  gen->feed_base = record->position.load();
  record->active = std::move(gen);
  n_active_++;

  if (policy_on()) {
    park(cmd.record);
  } else {
    submit_feed(*record);
  }
}

void RunnerCore::submit_feed(SessionRecord& record) {
  ActiveGeneration& gen = *record.active;
  gen.in_prefill = true;
  // Chunks share one buffer and one base position; only the last wants output.
  const size_t chunk = scheduler_->max_prefill_chunk_size();
  CELLM_CHECK_MSG(chunk > 0, "scheduler reports a zero chunk size");
  const std::shared_ptr<const std::vector<Token>>& tokens = gen.feed;
  std::vector<Task> tasks;
  for (size_t offset = 0; offset < tokens->size(); offset += chunk) {
    Task task;
    task.tid = next_tid_++;
    task.is_decode = false;
    task.input.sid = record.sid;
    task.input.offset = offset;
    task.input.size = std::min(chunk, tokens->size() - offset);
    task.input.produce_output = offset + task.input.size == tokens->size();
    task.input.score = gen.score_prompt;
    task.input.tokens = tokens;
    task.input.position = gen.feed_base;
    tasks.push_back(std::move(task));
  }
  if (!scheduler_->submit(std::move(tasks))) {
    finish(record, FinishReason::kFailed, kMsgRejected);
  }
}

void RunnerCore::handle(CloneCommand& cmd) {
  SessionRecord* source = stop_requested() ? nullptr : find_open(cmd.source->sid);
  if (source == nullptr || source != cmd.source.get() || source->poisoned || source->released ||
      cmd.upto < 0 || cmd.upto > source->position.load()) {
    cmd.reply.set_value(std::nullopt);
    return;
  }
  std::optional<SessionId> child;
  try {
    child = executor_.clone(source->sid, cmd.upto);
  } catch (...) {
    child.reset();
  }
  if (!child) {
    cmd.reply.set_value(std::nullopt);
    return;
  }
  CELLM_CHECK_MSG(ids_ever_opened_.insert(*child).second,
                  "executor reused session id " + std::to_string(*child));
  auto record = std::make_shared<SessionRecord>(*child, cmd.upto);
  if (policy_on()) {
    record->history.assign(source->history.begin(), source->history.begin() + cmd.upto);
  }
  sessions_.emplace(*child, record);
  cmd.reply.set_value(make_session(record));
}

void RunnerCore::reap_cancelled() {
  std::vector<SessionRecord*> victims;
  for (auto& [sid, record] : sessions_) {
    if (record->active &&
        (record->active->state->cancel_requested.load() || record->close_requested.load())) {
      victims.push_back(record.get());
    }
  }
  // Callbacks cannot erase records (closes are queued), so the pointers hold.
  for (SessionRecord* record : victims) {
    if (record->active) finish(*record, FinishReason::kCancelled, std::string());
  }
}

// ---------------------------------------------------------------------------
// One step.

namespace {

// One session's share of a step.
struct StepSession {
  SessionId sid = 0;
  bool decode = false;
  bool prefill = false;
  Position end = 0;  // furthest chunk end
};

}  // namespace

bool RunnerCore::execute_one_batch() {
  std::vector<Task> tasks = scheduler_->get_work();
  if (tasks.empty()) return false;
  if (policy_ == KvPolicy::kOvercommit && !preempt_for_step(tasks)) return true;

  std::vector<StepSession> step_sessions;
  std::unordered_map<SessionId, size_t> index;
  int64_t decode_tokens = 0;
  int64_t prefill_tokens = 0;
  for (const Task& task : tasks) {
    auto [it, inserted] = index.emplace(task.input.sid, step_sessions.size());
    if (inserted) step_sessions.push_back(StepSession{task.input.sid});
    StepSession& s = step_sessions[it->second];
    (task.is_decode ? s.decode : s.prefill) = true;
    (task.is_decode ? decode_tokens : prefill_tokens) += static_cast<int64_t>(task.input.size);
    s.end = std::max(s.end, task.input.end());
  }

  const int64_t t_start = now_us();
  if (metrics_.t_first_step_us == 0) metrics_.t_first_step_us = t_start;
  metrics_.ready_total += n_ready_;
  metrics_.peak_concurrent_generations = std::max(metrics_.peak_concurrent_generations, n_active_);
  for (const StepSession& s : step_sessions) {
    SessionRecord* record = find_open(s.sid);
    if (record == nullptr || !record->active) continue;
    GenerationMetrics& gm = record->active->metrics;
    if (gm.t_first_step_us == 0) gm.t_first_step_us = t_start;
    if (s.prefill) gm.n_prefill_steps++;
    if (s.decode) gm.n_decode_steps++;
  }

  BatchInput batch = to_batch_input(tasks);
  BatchOutput out;
  Status executed;
  try {
    executed = executor_.execute(batch, out);
  } catch (const std::exception& e) {
    executed = Internal(std::string("executor threw: ") + e.what());
  } catch (...) {
    executed = Internal("executor threw");
  }
  const int64_t t_end = now_us();
  const int64_t latency = t_end - t_start;

  const bool has_decode = decode_tokens > 0;
  const bool has_prefill = prefill_tokens > 0;
  int64_t n_decode_sessions = 0;
  int64_t n_prefill_sessions = 0;
  for (const StepSession& s : step_sessions) {
    n_decode_sessions += s.decode ? 1 : 0;
    n_prefill_sessions += s.prefill ? 1 : 0;
    metrics_.context_sum += s.end;
    metrics_.context_max = std::max(metrics_.context_max, int64_t{s.end});
  }
  metrics_.steps++;
  metrics_.t_last_step_us = t_end;
  metrics_.step_latency_sum_us += latency;
  metrics_.step_latency_max_us = std::max(metrics_.step_latency_max_us, latency);
  metrics_.decode_sessions_total += n_decode_sessions;
  metrics_.prefill_sessions_total += n_prefill_sessions;
  metrics_.decode_session_time_sum_us += latency * n_decode_sessions;
  if (has_decode) metrics_.steps_with_decode++;
  if (has_prefill) metrics_.steps_with_prefill++;
  if (has_decode && has_prefill) {
    metrics_.mixed_latency_sum_us += latency;
  } else if (has_decode) {
    metrics_.decode_only_latency_sum_us += latency;
  } else {
    metrics_.prefill_only_latency_sum_us += latency;
  }

  if (!executed.ok()) {
    metrics_.steps_failed++;
    // The executor's cause travels with the runner's message.
    fail_batch(batch, executed.message().empty()
                          ? std::string(kMsgExecuteFailed)
                          : std::string(kMsgExecuteFailed) + ": " + executed.message());
    return true;
  }
  if (out.outputs.size() != batch.inputs.size() ||
      (!out.scores.empty() && out.scores.size() != batch.inputs.size())) {
    metrics_.steps_failed++;
    fail_batch(batch, kMsgIncomplete);
    return true;
  }
  metrics_.decode_tokens_total += decode_tokens;
  metrics_.prefill_tokens_total += prefill_tokens;
  if (!has_prefill) metrics_.decode_only_tokens += decode_tokens;

  // Every session advances by what the executor consumed before any callback.
  for (const Input& input : batch.inputs) {
    SessionRecord* record = find_open(input.sid);
    if (record == nullptr) continue;
    if (policy_on()) note_input(*record, input);
    advance(*record, static_cast<int64_t>(input.size));
    record->pending.reset();  // a pending token always leads the next input
  }

  for (size_t i = 0; i < batch.inputs.size(); ++i) {
    if (stop_requested()) break;  // the stop cancels whatever is left
    const Input& input = batch.inputs[i];
    SessionRecord* record = find_open(input.sid);
    if (record == nullptr) continue;
    const std::optional<Output>& output = out.outputs[i];
    if (output.has_value() != input.produce_output) {
      poison_and_fail(*record, kMsgInvalidOutput);
      continue;
    }
    if (!record->active) continue;
    if (record->closed || record->close_requested.load() ||
        record->active->state->cancel_requested.load()) {
      finish(*record, FinishReason::kCancelled, std::string());
      continue;
    }
    if (input.score &&
        !take_scores(*record, input, out.scores.empty() ? nullptr : &out.scores[i])) {
      poison_and_fail(*record, kMsgInvalidOutput);
      continue;
    }
    if (input.produce_output) handle_output(*record, input, *output);
  }
  return true;
}

bool RunnerCore::take_scores(SessionRecord& record, const Input& input,
                             std::vector<TokenLogprobs>* scores) {
  ActiveGeneration& gen = *record.active;
  if (scores == nullptr) return false;
  const size_t expected = input.offset + input.size < input.tokens->size()
                              ? input.size
                              : input.size - 1;  // the buffer's last token: no successor
  if (scores->size() != expected) return false;
  // The entry for row j scores the token at input.start() + j + 1. A chunk fed again
  // (a generation resumed after preemption) repeats positions already scored.
  for (size_t j = 0; j < scores->size(); ++j) {
    const int64_t next =
        int64_t{gen.score_base} + 1 + static_cast<int64_t>(gen.prompt_scores.size());
    const int64_t scored = int64_t{input.start()} + static_cast<int64_t>(j) + 1;
    if (scored < next) continue;
    if (scored > next) return false;
    gen.prompt_scores.push_back(std::move((*scores)[j]));
  }
  return true;
}

void RunnerCore::fail_batch(const BatchInput& batch, const std::string& message) {
  for (const Input& input : batch.inputs) {
    SessionRecord* record = find_open(input.sid);
    if (record != nullptr) poison_and_fail(*record, message);
  }
}

void RunnerCore::poison_and_fail(SessionRecord& record, const std::string& message) {
  record.poisoned = true;
  if (record.active) finish(record, FinishReason::kFailed, message);
}

void RunnerCore::handle_output(SessionRecord& record, const Input& input, const Output& output) {
  ActiveGeneration& gen = *record.active;
  gen.in_prefill = false;  // the feed's output: from now on the generation decodes
  const int64_t room = kMaxPosition - int64_t{input.end()};
  // Logprobs are parallel to the tokens when the generation asked for them, and
  // absent otherwise.
  const size_t n_logprobs = gen.wants_logprobs ? output.tokens.size() : 0;
  if (output.sid != input.sid || output.tokens.empty() ||
      static_cast<int64_t>(output.tokens.size()) > room || output.logprobs.size() != n_logprobs) {
    poison_and_fail(record, kMsgInvalidOutput);
    return;
  }

  // A stop token ends the walk and is included; it wins over a budget that
  // runs out on the same token. Logprobs follow their tokens.
  Delivery delivery;
  if (gen.score_prompt) {
    // Every feed token after the first was scored once its chunks ran.
    if (gen.prompt_scores.size() != gen.score_count) {
      poison_and_fail(record, kMsgInvalidOutput);
      return;
    }
    delivery.prompt_logprobs = std::move(gen.prompt_scores);
    gen.prompt_scores.clear();
    gen.score_prompt = false;
  }
  std::vector<Token>& emitted = delivery.tokens;
  std::optional<FinishReason> reason;
  for (size_t i = 0; i < output.tokens.size(); ++i) {
    const Token token = output.tokens[i];
    emitted.push_back(token);
    if (gen.wants_logprobs) delivery.logprobs.push_back(output.logprobs[i]);
    gen.remaining_tokens--;
    if (std::find(gen.stop_tokens.begin(), gen.stop_tokens.end(), token) != gen.stop_tokens.end()) {
      reason = FinishReason::kStopToken;
      break;
    }
    if (gen.remaining_tokens == 0) {
      reason = FinishReason::kNewTokenLimit;
      break;
    }
  }
  // The executor committed all but the last output token; the session keeps
  // only the delivered ones (a suffix after a stop token is rewound later).
  const size_t committed = std::min(emitted.size(), output.tokens.size() - 1);
  if (policy_on()) {
    record.history.insert(record.history.end(), output.tokens.begin(),
                          output.tokens.begin() + static_cast<ptrdiff_t>(committed));
  }
  advance(record, static_cast<int64_t>(committed));
  record_delivery(gen, static_cast<int64_t>(emitted.size()), now_us());
  metrics_.total_generated_tokens += static_cast<int64_t>(emitted.size());

  if (reason) {
    if (emitted.size() == output.tokens.size()) {
      record.pending = emitted.back();
    } else {
      record.pending.reset();
    }
    finish(record, *reason, std::string(), std::move(delivery));
    return;
  }
  record.pending = output.tokens.back();
  if (!deliver(record, std::move(delivery))) return;
  if (stop_requested()) return;
  submit_continuation(record);
}

void RunnerCore::submit_continuation(SessionRecord& record) {
  Task task;
  task.tid = next_tid_++;
  task.is_decode = true;
  task.input.sid = record.sid;
  task.input.produce_output = true;
  task.input.offset = 0;
  task.input.size = 1;
  task.input.tokens = std::make_shared<const std::vector<Token>>(1, *record.pending);
  task.input.position = record.position.load();
  std::vector<Task> tasks;
  tasks.push_back(std::move(task));
  if (!scheduler_->submit(std::move(tasks))) {
    finish(record, FinishReason::kFailed, kMsgRejected);
  }
}

void RunnerCore::record_delivery(ActiveGeneration& gen, int64_t n_tokens, int64_t t_us) {
  GenerationMetrics& m = gen.metrics;
  m.n_generated_tokens += n_tokens;
  if (m.t_first_token_us == 0) {
    m.t_first_token_us = t_us;
    m.itl_count += n_tokens - 1;  // the rest of the first burst: zero-time samples
    if (n_tokens > 1) m.itl_min_us = 0;
    const int64_t ttft = t_us - m.t_submit_us;
    metrics_.ttft_count++;
    metrics_.ttft_sum_us += ttft;
    metrics_.ttft_min_us = std::min(metrics_.ttft_min_us, ttft);
    metrics_.ttft_max_us = std::max(metrics_.ttft_max_us, ttft);
    n_ready_++;
  } else {
    const int64_t gap = t_us - gen.t_last_delivery_us;
    m.itl_count += n_tokens;
    m.itl_sum_us += gap;
    m.itl_min_us = std::min(m.itl_min_us, n_tokens > 1 ? int64_t{0} : gap);
    m.itl_max_us = std::max(m.itl_max_us, gap);
  }
  gen.t_last_delivery_us = t_us;
}

bool RunnerCore::deliver(SessionRecord& record, Delivery delivery) {
  ActiveGeneration& gen = *record.active;
  gen.state->publish_metrics(gen.metrics);
  GenerationUpdate update;
  update.tokens = std::move(delivery.tokens);
  update.logprobs = std::move(delivery.logprobs);
  update.prompt_logprobs = std::move(delivery.prompt_logprobs);
  if (std::optional<std::string> error = invoke_callback(gen.callback, update)) {
    gen.callback_threw = true;
    finish(record, FinishReason::kFailed, std::move(*error));
    return false;
  }
  return true;
}

void RunnerCore::finish(SessionRecord& record, FinishReason reason, std::string message,
                        Delivery delivery) {
  std::unique_ptr<ActiveGeneration> gen = std::move(record.active);
  CELLM_CHECK_MSG(gen != nullptr, "finish() without an active generation");
  (void)scheduler_->cancel(record.sid);
  if (policy_on()) leave_kv(record, *gen);
  n_active_--;
  if (gen->metrics.t_first_token_us != 0) n_ready_--;
  conclude(*gen, reason, std::move(message), std::move(delivery));
}

void RunnerCore::conclude(ActiveGeneration& gen, FinishReason reason, std::string message,
                          Delivery delivery) {
  if (!gen.callback_threw) {
    GenerationUpdate update;
    update.tokens = std::move(delivery.tokens);
    update.logprobs = std::move(delivery.logprobs);
    update.prompt_logprobs = std::move(delivery.prompt_logprobs);
    update.finish_reason = reason;
    if (reason == FinishReason::kFailed) update.error_message = message;
    if (std::optional<std::string> error = invoke_callback(gen.callback, update)) {
      reason = FinishReason::kFailed;
      message = std::move(*error);
    }
  }
  if (reason != FinishReason::kFailed) message.clear();
  gen.metrics.t_end_us = now_us();
  metrics_.generations_completed++;
  switch (reason) {
    case FinishReason::kStopToken:
      metrics_.finished_stop_token++;
      break;
    case FinishReason::kNewTokenLimit:
      metrics_.finished_token_limit++;
      break;
    case FinishReason::kCancelled:
      metrics_.finished_cancelled++;
      break;
    case FinishReason::kFailed:
      metrics_.finished_failed++;
      break;
  }
  gen.state->publish_terminal(reason, std::move(message), gen.metrics);
}

// ---------------------------------------------------------------------------
// Stop.

void RunnerCore::stop() {
  // Every queued command is answered: opens and clones with nullopt,
  // generations as Cancelled; closes retire their sessions.
  while (drain_inbox_once()) {
  }
  (void)scheduler_->clear();

  // Retire every session first, so reentrant calls see them all closed.
  std::vector<std::shared_ptr<SessionRecord>> records;
  records.reserve(sessions_.size());
  for (auto& [sid, record] : sessions_) records.push_back(record);
  sessions_.clear();
  for (auto& record : records) record->closed = true;
  for (auto& record : records) {
    if (record->active) finish(*record, FinishReason::kCancelled, std::string());
  }
  for (auto& record : records) executor_.close_session(record->sid);
  publish_engine_state(initialized_);
}

}  // namespace cellm::detail
