// Runner: one engine thread owns an Executor and a Scheduler and drives whole
// generations over many sessions (continuous batching).
//
// Session (move-only) owns one executor session; destroying it closes it
// asynchronously and cancels its generation. GenerationHandle (copyable,
// thread-safe, may outlive the runner) observes one generation.
//
// A generation splits its delta into chunks of the scheduler's chunk size (only
// the last wants output), prepends the token pending from the previous
// generation, installs sampling and submits; each output is walked (a stop
// token ends it and is included; the budget ends it), delivered on the engine
// thread after locks are released, and a one-token decode task continues it.
// An executor failure or a malformed output fails and poisons every session in
// the batch; a callback that throws fails only its generation.
//
// Callbacks run on the engine thread: they must not block on the runner (no
// wait(), no future.get()), but may start generations, clone, cancel, destroy
// sessions or request shutdown().
//
// KV policies (RunnerOptions::policy) share the executor's pool of KV cells
// among generations by need; with kNone (the default) every generation is
// submitted at once, as above. Under a policy (and an executor whose
// kv_budget() knows its capacity) a generation whose session would pass
// min(the model's context, the pool) is failed at once with a message naming
// the sizes; the others wait in one FIFO queue until they are admitted:
//   kReserve: when the pool can reserve cells for the whole generation (the
//     tokens it feeds plus max_new_tokens), so no step runs out of cells;
//   kOvercommit: when the tokens it feeds fit now (less one cell for each
//     running generation's next decode and the prompts they have yet to
//     feed). When a step would still run out of cells, the running generation
//     admitted most recently is preempted: its cells go back (to the
//     executor's prefix cache when it has one) and it waits at the head of
//     the queue, to resume by feeding its committed tokens again (those still
//     cached are attached, not recomputed). Its next token is sampled at the
//     same (seed, position) as without preemption, so its stream sees only a
//     delay. The oldest running generation is never preempted: if it alone
//     cannot fit, its step fails as under kNone. Idle sessions keep their
//     cells under both policies.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cellm/executor.h"
#include "cellm/logits_processor.h"
#include "cellm/metrics.h"
#include "cellm/scheduler.h"
#include "cellm/types.h"

namespace cellm {

// How generations share the executor's KV cells (see the header comment).
enum class KvPolicy { kNone, kReserve, kOvercommit };
// "none", "reserve", "overcommit".
const char* to_string(KvPolicy policy);

struct RunnerOptions {
  KvPolicy policy = KvPolicy::kNone;
};

enum class FinishReason { kStopToken, kNewTokenLimit, kCancelled, kFailed };
// "stop_token", "token_limit", "cancelled", "failed".
const char* to_string(FinishReason reason);

struct GenerationUpdate {
  std::vector<Token> tokens;                  // newly delivered tokens
  std::optional<FinishReason> finish_reason;  // present only on the last update
  std::string error_message;                  // set only for kFailed
  // With GenConfig::score_prompt, on the first update only: one entry per fed token
  // after the first, the log-probabilities of that token given the ones before it
  // (raw logits; sampling.num_logprobs alternatives).
  std::vector<TokenLogprobs> prompt_logprobs;
  // Parallel to tokens when the generation asked for logprobs
  // (sampling.num_logprobs > 0; see TokenLogprobs), cut with them by a stop
  // token or the budget; empty otherwise. An executor output whose logprobs are
  // not exactly that fails the generation ("executor returned an invalid output").
  std::vector<TokenLogprobs> logprobs;
};
using GenerationCallback = std::function<void(const GenerationUpdate&)>;

struct GenConfig {
  int32_t max_new_tokens = 256;
  SamplingParams sampling;
  std::vector<Token> stop_tokens;  // a produced stop token ends and is included
  std::optional<uint64_t> seed;    // nullopt = nondeterministic
  // Penalties, logit_bias, constrained decoding (logits_processor.h): this
  // generation's own, never shared with another. The executor must accept it
  // (Executor::set_logits_processor) or the generation fails naming that.
  std::shared_ptr<LogitsProcessor> processor;
  // Report the fed tokens' log-probabilities (GenerationUpdate::prompt_logprobs): prompt
  // log-probabilities and perplexity. Scores only what this generation feeds, so open the
  // session without a cached prefix. The executor must support scoring (the CPU
  // executor does) or the generation fails naming it.
  bool score_prompt = false;
};

namespace detail {
class RunnerCore;
struct GenerationState;
struct SessionRecord;
}  // namespace detail

class GenerationHandle {
 public:
  GenerationHandle() = default;
  bool valid() const { return state_ != nullptr; }
  // Ends the generation within one step (never interrupts a running execute).
  void cancel() const;
  // True once the terminal callback has returned.
  bool done() const;
  // Blocks until done(). Must not be called from a callback.
  void wait() const;
  std::optional<FinishReason> finish_reason() const;
  std::string error_message() const;
  // Complete once done().
  GenerationMetrics metrics() const;

 private:
  friend class Session;
  friend class detail::RunnerCore;
  explicit GenerationHandle(std::shared_ptr<detail::GenerationState> s) : state_(std::move(s)) {}
  std::shared_ptr<detail::GenerationState> state_;
};

class Session;

// A copyable, non-owning reference to a Session, for code that must clone a
// session it does not own (a prompt capture in a generation callback). It
// follows the session, not the Session wrapper: it stays valid when the
// wrapper is moved, reassigned or destroyed, and it keeps neither the session
// nor the runner alive. clone_async goes through the same runner path as
// Session::clone_async and is refused (settles as nullopt on the calling
// thread) once the session's close has been requested or the runner is gone.
// Thread-safe; callable from callbacks (never wait on the future there).
class SessionRef {
 public:
  SessionRef() = default;
  SessionId id() const { return sid_; }  // 0 for a default reference
  std::future<std::optional<Session>> clone_async(Position upto) const;

 private:
  friend class Session;
  SessionRef(std::weak_ptr<detail::RunnerCore> core, std::weak_ptr<detail::SessionRecord> rec,
             SessionId sid)
      : core_(std::move(core)), record_(std::move(rec)), sid_(sid) {}
  std::weak_ptr<detail::RunnerCore> core_;
  std::weak_ptr<detail::SessionRecord> record_;
  SessionId sid_ = 0;
};

class Session {
 public:
  Session() = default;
  Session(Session&&) noexcept;
  Session& operator=(Session&&) noexcept;
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  ~Session();  // queues an asynchronous close; cancels the active generation

  bool valid() const { return core_ != nullptr && record_ != nullptr; }
  SessionId id() const;  // 0 when invalid
  // Committed length, excluding a pending token. Readable from any thread.
  // While its generation is preempted this is the length it resumes at; when
  // it resumes, it drops to what the executor's cache still holds and grows
  // back as the rest is fed again.
  Position position() const;

  // A new session holding this one's committed [0, upto): idle, no pending
  // token, no sampling. nullopt if refused (unsupported, beyond the committed
  // position, capacity, poisoned, preempted, shutting down); the source is
  // unaffected.
  std::future<std::optional<Session>> clone_async(Position upto) const;

  // A non-owning reference to this session (default when invalid).
  SessionRef ref() const;

  // Starts a generation that feeds `delta` and then generates. Failures are
  // reported through the callback and the handle (kFailed with a message).
  GenerationHandle generate_async(std::vector<Token> delta, const GenConfig& config,
                                  GenerationCallback on_update);

 private:
  friend class detail::RunnerCore;
  Session(std::shared_ptr<detail::RunnerCore> core, std::shared_ptr<detail::SessionRecord> rec);
  void release();
  std::shared_ptr<detail::RunnerCore> core_;
  std::shared_ptr<detail::SessionRecord> record_;
};

class Runner {
 public:
  // Starts the engine thread, which calls executor.initialize() first.
  // The executor must outlive shutdown() (or the Runner).
  Runner(Executor& executor, std::unique_ptr<Scheduler> scheduler);
  Runner(Executor& executor, std::unique_ptr<Scheduler> scheduler, const RunnerOptions& options);
  ~Runner();  // shutdown()
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  // nullopt at capacity or when shutting down.
  std::future<std::optional<Session>> open_session_async();
  // Opens a session for a prompt that starts with `prefix_of`: the session
  // attaches the executor's longest cached prefix of prefix_of[0, n - 1), so
  // the last token is always fed (and gets a forward). Its position() is the
  // number of tokens attached; the caller's first generation feeds the rest,
  // prefix_of[position(), n) and beyond. With no prefix cache, as above.
  std::future<std::optional<Session>> open_session_async(std::vector<Token> prefix_of);

  // Idempotent. From outside the engine thread: blocks until the engine has
  // stopped, every generation has ended and every session is closed. From a
  // callback: only requests the stop.
  void shutdown();

  // Stable after shutdown(); a snapshot while running.
  EngineMetrics metrics() const;
  // The executor's KV metrics as sampled after the latest step.
  KvMetrics kv_metrics() const;
  // The executor's KV budget, sampled with kv_metrics().
  KvBudget kv_budget() const;
  // The executor's initialize() result: Ok while it runs and after it succeeds;
  // its error once it failed (every open is then refused, so a caller whose open
  // settled as nullopt reads the cause here).
  Status initialize_status() const;
  // Tasks queued in the scheduler now.
  size_t queued_tasks() const;

 private:
  std::shared_ptr<detail::RunnerCore> core_;
};

}  // namespace cellm
