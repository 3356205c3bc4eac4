// FakeExecutor: a scriptable Executor for runner tests. It keeps each
// session's committed history by the executor contract (rewind, append, gap
// fails the batch), produces deterministic tokens, records every call in
// order, and can be told to fail, answer malformed outputs, refuse capacity or
// clones, hold the engine inside execute(), or run a hook per call.
//
// Default tokens: the token produced for absolute position p of session s is
// token_at(s, p) (scripted tokens per session come first). With
// tokens_per_output n > 1 it answers n tokens (speculative) and commits all but
// the last. A session whose sampling asks for num_logprobs > 0 gets
// logprobs_for(token) beside each output token. Logits processors are refused
// unless set_accepts_processors(true); an installed one is told each output
// token (prepare, then accept) as a sampling executor would.
//
// Thread-safety: the Executor methods run on the runner's engine thread; every
// setter and observer may be called from any thread. Hooks run with no lock held.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cellm/executor.h"

namespace cellm::testing {

// One input as execute() saw it.
struct ExecutedInput {
  int64_t batch = 0;  // index of the execute() call, from 0
  SessionId sid = 0;
  Position position = 0;  // base of the backing buffer
  size_t offset = 0;
  size_t size = 0;
  bool produce_output = false;
  std::vector<Token> tokens;  // the slice
  Position start() const { return position + static_cast<Position>(offset); }
};

struct SamplingInstall {
  SamplingParams params;
  std::optional<uint64_t> seed;
};

enum class Malformation {
  kNone,
  kMissingOutput,     // nullopt where produce_output was set
  kUnexpectedOutput,  // an output for an input without produce_output
  kEmptyTokens,       // an output with no tokens
  kWrongSid,          // an output naming another session
  kShortBatch,        // one output fewer than inputs
  kExtraLogprobs,     // one more logprobs entry than tokens
  kMissingLogprobs,   // no logprobs, even where the session asked for them
};

class FakeExecutor : public Executor {
 public:
  static Token token_at(SessionId sid, Position p) { return static_cast<Token>(sid * 10000 + p); }
  // The logprobs reported beside `token`: logprob -token / 1024, top {token}.
  static TokenLogprobs logprobs_for(Token token) {
    const float logprob = -static_cast<float>(token) / 1024.0f;
    return TokenLogprobs{logprob, {{token, logprob}}};
  }

  // The error of a batch failed by fail_batches_from().
  static constexpr const char* kFailedBatchMessage = "FakeExecutor: the batch fails as configured";

  // --- configuration (any thread) ---
  // What initialize() returns (Ok by default).
  void set_initialize_result(Status result);
  void set_capacity(int max_open_sessions);  // counts clones too
  void set_clone_supported(bool supported);
  void set_clone_throws(bool throws);
  void set_tokens_per_output(int n);
  // Whether set_logits_processor() accepts processors (false by default).
  void set_accepts_processors(bool accepts);
  // Tokens produced for `sid`, in order, before the default rule applies.
  void script_tokens(SessionId sid, std::vector<Token> tokens);
  // execute() calls with index >= `index` fail with kFailedBatchMessage; -1 never.
  void fail_batches_from(int64_t index);
  // Malformed answers for execute() calls with index >= `from_batch`.
  void set_malformation(Malformation m, int64_t from_batch = 0);
  // Runs at the start of every execute() (engine thread, no lock held).
  void set_execute_hook(std::function<void(int64_t batch, const BatchInput&)> hook);
  // While held, execute() blocks after announcing itself (wait_in_execute).
  void hold();
  // While held, initialize() blocks.
  void hold_initialize();
  // Releases both holds.
  void release();
  // Waits until an execute() call is in progress; false after 5 s.
  bool wait_in_execute();
  // Waits until initialize() has been entered; false after 5 s.
  bool wait_in_initialize();

  // --- observations (any thread) ---
  std::vector<std::string> calls() const;  // "initialize", "open 1", "execute [1@0+3!]", ...
  std::vector<ExecutedInput> executed() const;
  std::vector<int> batch_sizes() const;   // inputs per execute() call
  std::vector<SessionId> opened() const;  // every id handed out (opens and clones), in order
  std::vector<SessionId> closed() const;  // every close_session() call, in order
  int open_count() const;                 // sessions open now
  // Waits until open_count() == n; false after 5 s.
  bool wait_open_count(int n) const;
  int initialize_calls() const;
  bool called_before_initialize() const;
  bool executed_without_sampling() const;
  std::optional<SamplingInstall> sampling(SessionId sid) const;
  // The session's installed processor; nullptr if none.
  std::shared_ptr<LogitsProcessor> logits_processor(SessionId sid) const;
  std::vector<Token> history(SessionId sid) const;  // committed tokens
  std::vector<std::string> violations() const;      // contract breaches by the runner
  // Threads that made Executor calls (the runner's engine thread only).
  std::set<std::thread::id> call_threads() const;

  // --- Executor ---
  Status initialize() override;
  std::optional<SessionId> open_session() override;
  void close_session(SessionId id) override;
  std::optional<SessionId> clone(SessionId source, Position upto) override;
  void set_sampling(SessionId id, const SamplingParams& params,
                    std::optional<uint64_t> seed) override;
  bool set_logits_processor(SessionId id, std::shared_ptr<LogitsProcessor> processor) override;
  Status execute(const BatchInput& batch, BatchOutput& out) override;
  KvMetrics kv_metrics() const override;

 private:
  void log(std::string call);                   // REQUIRES: mu_ held
  void note_call();                             // REQUIRES: mu_ held
  Token next_token(SessionId sid, Position p);  // REQUIRES: mu_ held

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  Status initialize_result_;
  int capacity_ = 1 << 20;
  bool clone_supported_ = true;
  bool clone_throws_ = false;
  int tokens_per_output_ = 1;
  int64_t fail_from_ = -1;
  Malformation malformation_ = Malformation::kNone;
  int64_t malformed_from_ = 0;
  std::function<void(int64_t, const BatchInput&)> execute_hook_;
  bool held_ = false;
  bool init_held_ = false;
  bool in_execute_ = false;
  bool initialize_entered_ = false;

  SessionId next_id_ = 1;
  std::map<SessionId, std::vector<Token>> sessions_;  // open sessions: committed tokens
  std::map<SessionId, std::deque<Token>> scripts_;
  std::map<SessionId, SamplingInstall> sampling_;
  bool accepts_processors_ = false;
  std::map<SessionId, std::shared_ptr<LogitsProcessor>> processors_;
  std::vector<std::string> calls_;
  std::vector<ExecutedInput> executed_;
  std::vector<int> batch_sizes_;
  std::vector<SessionId> opened_;
  std::vector<SessionId> closed_;
  std::vector<std::string> violations_;
  std::set<std::thread::id> call_threads_;
  int initialize_calls_ = 0;
  bool called_before_initialize_ = false;
  bool executed_without_sampling_ = false;
  int64_t n_batches_ = 0;
};

}  // namespace cellm::testing
