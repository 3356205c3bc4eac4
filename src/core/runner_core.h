// RunnerCore: the engine behind Runner, Session and GenerationHandle.
//
// One engine thread owns the executor. Every other thread talks to it through
// the command inbox (Open, Close, Start, Clone); the engine drains the inbox,
// reaps cancelled generations, runs one batch, and otherwise waits up to 20 ms
// for stop, a command or work. Callbacks run on the engine thread with no lock
// held, so they may queue commands (start, clone, close) or request shutdown;
// commands a callback queues run before the next forward.
//
// Thread-safety. Fields marked "engine only" are touched only by the engine
// thread (no lock). The inbox, the stop flag and the published metrics are
// guarded by mu_. GenerationState is shared with handles and guarded by its own
// mutex; SessionRecord::position and ::close_requested are atomics.
//
// Lifetime. Sessions and handles hold shared pointers, so they may outlive the
// Runner: after shutdown the inbox refuses everything and each call settles on
// the caller's thread (opens and clones as nullopt, generations as Cancelled).
//
// KV policies (runner_kv.cpp). Under a policy a started generation keeps its
// feed (the tokens to submit) and waits in waiting_; admit_waiting(), once per
// loop before the step, admits the head while the pool has room, strictly in
// FIFO order. Admitted generations are running_. Each record keeps its
// committed tokens (history). A `released` session holds no executor cells:
// its history [0, position) and its feed (at position) are fed again, less
// what the executor's cache still attaches, when it is admitted. Waiting
// sessions are released only when nothing runs and their cells keep the
// head out, or (kOvercommit) by preempt_for_step(): before a step that would
// run out of cells it preempts the running generations admitted most
// recently (admit_seq, stamped at the first admission), and puts them back at
// the head of the queue.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <variant>
#include <vector>

#include "cellm/executor.h"
#include "cellm/metrics.h"
#include "cellm/runner.h"
#include "cellm/scheduler.h"
#include "cellm/types.h"

namespace cellm::detail {

// What a GenerationHandle observes. Terminal state (reason, message, metrics) is
// published together, after the terminal callback has returned.
struct GenerationState {
  std::atomic<bool> cancel_requested{false};

  mutable std::mutex mu;
  std::condition_variable done_cv;
  bool done = false;                   // guarded by mu
  std::optional<FinishReason> reason;  // guarded by mu; set together with done
  std::string error_message;           // guarded by mu
  GenerationMetrics metrics;           // guarded by mu; complete once done

  // Publishes the terminal state and wakes every waiter.
  void publish_terminal(FinishReason r, std::string message, const GenerationMetrics& m);
  void publish_metrics(const GenerationMetrics& m);
};

// Runs `callback` with `update`; returns the exception's message if it threw
// (a fallback text for a non-standard exception), nullopt otherwise.
std::optional<std::string> invoke_callback(const GenerationCallback& callback,
                                           const GenerationUpdate& update);

// Ends a generation that never reached the engine, on the calling thread: one
// terminal callback (an exception in it turns the result into kFailed), then
// publication.
void complete_synchronously(const std::shared_ptr<GenerationState>& state,
                            const GenerationCallback& callback, FinishReason reason,
                            std::string message);

// Tokens for one callback, with their logprobs (parallel) when the generation
// asked for them.
struct Delivery {
  std::vector<Token> tokens;
  std::vector<TokenLogprobs> logprobs;         // [tokens] or empty
  std::vector<TokenLogprobs> prompt_logprobs;  // GenConfig::score_prompt, first delivery
};

// Engine-only bookkeeping of a generation in progress.
struct ActiveGeneration {
  std::shared_ptr<GenerationState> state;
  GenerationCallback callback;
  std::vector<Token> stop_tokens;
  bool wants_logprobs = false;  // sampling.num_logprobs > 0: outputs carry them
  bool score_prompt = false;    // GenConfig::score_prompt: the feed's chunks are scored
  // The scores so far of the tokens the generation feeds after its first: positions
  // score_base + 1 on; score_count of them in all. (The feed and its base change when
  // a preempted generation resumes; these do not.)
  std::vector<TokenLogprobs> prompt_scores;
  Position score_base = 0;
  size_t score_count = 0;
  int64_t remaining_tokens = 0;  // budget left
  GenerationMetrics metrics;
  int64_t t_last_delivery_us = 0;
  bool callback_threw = false;  // the callback is never called again

  // Submission. feed holds the tokens submitted (or to submit on admission) as
  // prefill chunks, the first at position feed_base; in_prefill until its
  // output arrives (then the generation decodes its pending token).
  std::shared_ptr<const std::vector<Token>> feed;
  Position feed_base = 0;
  bool in_prefill = true;

  // KV policies (engine only).
  bool admitted = false;    // running: in RunnerCore::running_
  bool reserved = false;    // holds an executor reservation (kReserve)
  int64_t admit_seq = 0;    // order of the first admission (0 = never admitted)
  int64_t t_parked_us = 0;  // when it started waiting for its first admission
  int64_t parked_loop = 0;  // the engine loop that parked it
};

struct SessionRecord {
  SessionRecord(SessionId id, Position start) : sid(id), position(start) {}

  const SessionId sid;
  // Committed length, excluding a pending token. Written by the engine only.
  std::atomic<Position> position;
  // Set by ~Session (any thread) before its close is queued.
  std::atomic<bool> close_requested{false};

  // Engine only.
  std::optional<Token> pending;  // delivered but not yet fed back
  bool poisoned = false;         // an executor failure touched this session
  bool closed = false;           // retired: executor session closed or closing
  std::unique_ptr<ActiveGeneration> active;
  // Under a KV policy: the committed tokens [0, position).
  std::vector<Token> history;
  bool released = false;  // the executor holds none of its cells (see RunnerCore)
};

struct OpenCommand {
  std::promise<std::optional<Session>> reply;
  std::vector<Token> prefix_of;  // attach a cached prefix of [0, n - 1)
};
struct CloseCommand {
  std::shared_ptr<SessionRecord> record;
};
struct StartCommand {
  std::shared_ptr<SessionRecord> record;
  std::shared_ptr<GenerationState> state;
  std::vector<Token> delta;
  GenConfig config;
  GenerationCallback callback;
  int64_t t_submit_us = 0;
};
struct CloneCommand {
  std::shared_ptr<SessionRecord> source;
  Position upto = 0;
  std::promise<std::optional<Session>> reply;
};
using Command = std::variant<OpenCommand, CloseCommand, StartCommand, CloneCommand>;

class RunnerCore : public std::enable_shared_from_this<RunnerCore> {
 public:
  RunnerCore(Executor& executor, std::unique_ptr<Scheduler> scheduler,
             const RunnerOptions& options = {});
  ~RunnerCore();
  RunnerCore(const RunnerCore&) = delete;
  RunnerCore& operator=(const RunnerCore&) = delete;

  // Starts the engine thread. Called once, right after construction.
  void start();

  // Public API entry points; callable from any thread, callbacks included.
  std::future<std::optional<Session>> open_session(std::vector<Token> prefix_of = {});
  void close_session(std::shared_ptr<SessionRecord> record);
  GenerationHandle start_generation(std::shared_ptr<SessionRecord> record, std::vector<Token> delta,
                                    const GenConfig& config, GenerationCallback callback,
                                    int64_t t_submit_us);
  std::future<std::optional<Session>> clone_session(std::shared_ptr<SessionRecord> source,
                                                    Position upto);
  void shutdown();

  EngineMetrics metrics() const;
  KvMetrics kv_metrics() const;
  KvBudget kv_budget() const;
  Status initialize_status() const;
  size_t queued_tasks() const { return scheduler_->num_queued(); }

 private:
  // Queues `cmd` unless a stop was requested; false leaves `cmd` untouched.
  template <typename C>
  bool enqueue(C& cmd);
  void request_stop();
  bool stop_requested() const { return stop_requested_.load(std::memory_order_acquire); }
  bool on_engine_thread() const;

  // Engine thread.
  void engine_main();
  // True if it handled at least one command.
  bool process_commands_until_idle();
  bool drain_inbox_once();
  void handle(OpenCommand& cmd);
  void handle(CloseCommand& cmd);
  void handle(StartCommand& cmd);
  void handle(CloneCommand& cmd);
  void reap_cancelled();
  bool execute_one_batch();
  void handle_output(SessionRecord& record, const Input& input, const Output& output);
  // Keeps a scored input's new entries (GenConfig::score_prompt); false when they are
  // malformed (absent, miscounted, or leaving a gap).
  bool take_scores(SessionRecord& record, const Input& input, std::vector<TokenLogprobs>* scores);
  void fail_batch(const BatchInput& batch, const std::string& message);
  void poison_and_fail(SessionRecord& record, const std::string& message);
  void submit_continuation(SessionRecord& record);
  // Submits the active generation's feed as prefill chunks at feed_base (only
  // the last wants output); a refusal fails the generation.
  void submit_feed(SessionRecord& record);

  // KV policies (runner_kv.cpp).
  bool policy_on() const { return policy_ != KvPolicy::kNone; }
  // After initialize(): the policy in force (kNone when the executor's
  // capacity is unknown).
  void resolve_policy();
  // An error message if the generation can never fit; nullopt otherwise.
  std::optional<std::string> never_fits(const SessionRecord& record, int64_t feed,
                                        int32_t max_new_tokens) const;
  // Parks the record's (new) active generation at the back of the queue.
  void park(const std::shared_ptr<SessionRecord>& record);
  // Admits waiting generations from the head while the pool has room. When
  // nothing runs and the head does not fit, the cells of waiting sessions
  // behind it are released (newest first) until it does.
  void admit_waiting();
  // Admits the head `record` if the pool has room for it now (kReserve:
  // reserves its cells); false leaves it waiting.
  bool try_admit(std::shared_ptr<SessionRecord> record);  // a copy: it leaves waiting_
  // A released session attaches what the cache still holds of its history;
  // the rest of the history goes before its feed.
  void reattach(SessionRecord& record);
  // Releases the cells of the newest waiting session (not the head) that
  // holds any; false if none could.
  bool release_a_waiting_session();
  // kOvercommit: cells the running generations will take before the next
  // admission could: one decode each, plus the feed they have yet to submit.
  int64_t promised_cells() const;
  // Before a step under kOvercommit: preempts the most recently admitted
  // running generations while the step's tokens exceed the pool's room, and
  // drops their tasks. False if that emptied the step.
  bool preempt_for_step(std::vector<Task>& tasks);
  // Takes the running generation's cells back and requeues it at the head;
  // false (nothing changes) if the executor cannot release them.
  bool preempt(const std::shared_ptr<SessionRecord>& record);
  // Leaves the queue or the running set; drops a reservation.
  void leave_kv(SessionRecord& record, ActiveGeneration& gen);
  // Keeps history equal to the committed tokens when an input commits.
  void note_input(SessionRecord& record, const Input& input);
  void retire(SessionRecord& record);
  void stop();
  void wait_for_work();
  // Copies the engine metrics (and, after init or a step, the executor's KV
  // metrics) where Runner::metrics() and kv_metrics() read them.
  void publish_engine_state(bool sample_kv);
  SessionRecord* find_open(SessionId sid);

  // Delivers a non-terminal update; false if the callback threw, which ended
  // the generation as kFailed.
  bool deliver(SessionRecord& record, Delivery delivery);
  // Ends the record's active generation: unqueues its tasks, then concludes it.
  void finish(SessionRecord& record, FinishReason reason, std::string message,
              Delivery delivery = {});
  // Runs the terminal callback (unless the callback already threw; a throw now
  // turns the result into kFailed), counts the completion and publishes it.
  void conclude(ActiveGeneration& gen, FinishReason reason, std::string message, Delivery delivery);
  // Records a delivery of `n_tokens` at `t_us` (first token, ITL, TTFT).
  void record_delivery(ActiveGeneration& gen, int64_t n_tokens, int64_t t_us);

  Session make_session(const std::shared_ptr<SessionRecord>& record);

  Executor& executor_;
  const std::unique_ptr<Scheduler> scheduler_;

  mutable std::mutex mu_;
  std::condition_variable wake_cv_;
  std::deque<Command> inbox_;                // guarded by mu_
  std::atomic<bool> stop_requested_{false};  // written under mu_
  EngineMetrics published_metrics_;          // guarded by mu_
  KvMetrics published_kv_;                   // guarded by mu_
  KvBudget published_budget_;                // guarded by mu_
  Status init_status_;                       // guarded by mu_; the executor's initialize()

  std::mutex join_mu_;  // serializes external shutdown() callers
  std::thread engine_;  // guarded by join_mu_ after start()

  // Engine only.
  std::unordered_map<SessionId, std::shared_ptr<SessionRecord>> sessions_;
  std::unordered_set<SessionId> ids_ever_opened_;
  TaskId next_tid_ = 1;
  int64_t n_active_ = 0;  // generations installed and not yet finished
  int64_t n_ready_ = 0;   // of those, the ones past their first token
  bool initialized_ = false;
  EngineMetrics metrics_;

  // KV policies (engine only).
  const RunnerOptions options_;
  KvPolicy policy_ = KvPolicy::kNone;
  std::deque<std::shared_ptr<SessionRecord>> waiting_;
  std::vector<std::shared_ptr<SessionRecord>> running_;
  int64_t next_admit_seq_ = 1;
  int64_t loop_ = 0;  // engine loop iterations
};

}  // namespace cellm::detail
