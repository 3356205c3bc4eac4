// HistoryExecutor: a deterministic fake model over the REAL CellPool and
// SessionTable, for tests where a wrong KV restore must be visible (prefix
// cache, clones, seeded sampling under batching).
//
// It runs the production bookkeeping path of an executor: SessionTable::pack
// flattens the batch (rewinds, gaps, overruns), plan_slices cuts it into
// forwards of at most step_width tokens, each forward is declared to the pool
// (all or nothing), and every placed token is written into its cell. The
// "KV storage" is a side array of one token per cell, [capacity], indexed by
// CellId. A selected row of a session at position q gets a logits row [vocab]
// derived from a hash of the session's whole committed history [0, q], read
// back through pool.cells_of(seq) and the per-cell tokens, so any lost,
// repeated, misplaced or wrongly shared token changes the prediction. The row
// is sampled with SessionTable::sample_with_logprobs (seeded draws keyed by
// (seed, position); logprobs of the raw row when the policy asks for them),
// after the session's logits processor, if one is set, adjusted the row.
//
// logits_for() and greedy_continuation() compute the same predictions from a
// plain token list: the oracle a test compares a runner's output against.
//
// Any int32 token is accepted (the hash reads all 32 bits); vocab_size only
// sets the width of the logits row and hence the range of produced tokens.
//
// hold()/release() park the engine inside execute() so a test can start
// several generations that are then batched together.
//
// Failure injection: refuse the next n clones, refuse clones of one source,
// throw std::bad_alloc from the next n clones (an allocation failure), or only
// allow clones within a retention window of the source's tip (an executor
// whose sliding-window state is lost as decode advances). Capacity: the
// table's max_sessions counts open sessions, clones and snapshots.
//
// Thread-safety: the Executor methods run on the runner's engine thread; every
// setter and observer may be called from any thread (one mutex).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "cellm/executor.h"
#include "core/cell_pool.h"
#include "core/session_table.h"

namespace cellm::testing {

struct HistoryExecutorOptions {
  int32_t max_sessions = 16;         // open sessions, clones and snapshots together
  int32_t max_session_tokens = 256;  // per session
  int32_t vocab_size = 64;           // width of a logits row
  int32_t step_width = 8;            // tokens per forward (plan_slices' W)
  int32_t min_prefill_tokens = 2;    // shorter pieces run as one-token decodes
  // Cells in the pool; 0 = max_sessions * max_session_tokens + 1 (the capacity
  // rule). One cell stays a scratch row, as in the real executors.
  int32_t max_cells = 0;
  // The SessionTable's prefix cache (attach_prefix, release_cells keep cells).
  bool prefix_cache = false;
};

// One input as execute() saw it.
struct HistoryInput {
  int64_t batch = 0;  // index of the execute() call, from 0
  SessionId sid = 0;
  Position start = 0;  // absolute position of the slice's first token
  std::vector<Token> tokens;
  bool produce_output = false;
};

// One clone() call and its answer.
struct HistoryClone {
  SessionId source = 0;
  Position upto = 0;
  std::optional<SessionId> child;  // nullopt: refused (or threw)
};

class HistoryExecutor : public Executor {
 public:
  explicit HistoryExecutor(const HistoryExecutorOptions& options = {});

  // --- the oracle (pure functions of a token list) ---
  // The logits row [vocab_size] predicted after `history`.
  static std::vector<float> logits_for(std::span<const Token> history, int32_t vocab_size);
  // `n` greedy tokens after `history` (each fed back, as the runner does).
  std::vector<Token> greedy_continuation(std::vector<Token> history, int n) const;

  // --- failure injection (any thread) ---
  void refuse_next_clones(int n);
  void refuse_clones_of(SessionId source, bool refuse);
  void fail_next_clone_allocations(int n);  // clone() throws std::bad_alloc
  // Clones must keep at least pos(source) - window tokens; nullopt = no limit.
  void set_retention_window(std::optional<Position> window);

  // While held, execute() waits before running its batch (commands pile up in
  // the runner, so the next batches mix every session started meanwhile).
  void hold();
  void release();
  // Waits until execute() is parked by hold(); false after 5 s. Commands a
  // test queues after this all reach the engine in one drain.
  bool wait_parked() const;

  // --- observations (any thread) ---
  int open_count() const;
  // Waits until open_count() == n; false after 5 s (closes are asynchronous).
  bool wait_open_count(int n) const;
  bool is_open(SessionId sid) const;
  // Waits until `sid` is not open; false after 5 s.
  bool wait_closed(SessionId sid) const;
  std::vector<Token> history(SessionId sid) const;  // committed tokens; empty if unknown
  std::vector<HistoryInput> inputs() const;
  std::vector<HistoryInput> inputs_of(SessionId sid) const;
  std::vector<std::vector<SessionId>> batches() const;  // sessions of each execute()
  std::vector<HistoryClone> clones() const;
  std::vector<std::string> errors() const;  // why execute() failed, in order
  int32_t cells_in_use() const;

  // --- Executor ---
  size_t preferred_batch_tokens() const override;
  std::optional<SessionId> open_session() override;
  void close_session(SessionId id) override;
  std::optional<SessionId> clone(SessionId source, Position upto) override;
  void set_sampling(SessionId id, const SamplingParams& params,
                    std::optional<uint64_t> seed) override;
  bool set_logits_processor(SessionId id, std::shared_ptr<LogitsProcessor> processor) override;
  Status execute(const BatchInput& batch, BatchOutput& out) override;
  KvMetrics kv_metrics() const override;
  KvBudget kv_budget() const override;
  Position attach_prefix(SessionId id, std::span<const Token> tokens) override;
  bool release_cells(SessionId id) override;
  bool reserve(SessionId id, int64_t cells) override;

 private:
  Status fail(std::string message);  // REQUIRES: mu_ held
  // Committed tokens of `seq` at positions [0, end). REQUIRES: mu_ held.
  std::vector<Token> read_history(SeqId seq, Position end) const;

  const HistoryExecutorOptions options_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  CellPool pool_;                  // guarded by mu_
  SessionTable table_;             // guarded by mu_
  std::vector<Token> cell_token_;  // [pool capacity] token held by each cell; guarded by mu_

  int refuse_next_ = 0;
  std::set<SessionId> refused_sources_;
  int fail_allocations_ = 0;
  std::optional<Position> retention_window_;
  bool held_ = false;
  bool parked_ = false;  // execute() waits in hold()

  int64_t n_batches_ = 0;
  std::vector<HistoryInput> inputs_;
  std::vector<std::vector<SessionId>> batches_;
  std::vector<HistoryClone> clones_;
  std::vector<std::string> errors_;
};

}  // namespace cellm::testing
