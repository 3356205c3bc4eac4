// DecodeFirstScheduler: the only Scheduler. Each batch takes first up to
// max_decode_sequences decodes in arrival order (one per session), then prefill
// passes while budget remains: each pass visits every session of the
// round-robin rotation at most once, takes its head chunk if it fits (else
// defers it) and skips sessions already owed an output in this batch (by a
// decode or by a chunk with produce_output); deferred sessions go back to the
// front in order, served ones to the back. Passes repeat while one of them takes
// a chunk, so a lone session may take several consecutive chunks of a batch and
// two sessions interleave A, B, A, B.
//
// Owns the queued tasks: a FIFO of decodes, a FIFO of prefill chunks per
// session, and the rotation of sessions that have a prefill FIFO. A session
// joins the rotation exactly when its FIFO is created and leaves it exactly when
// a pass finds the FIFO empty, so the two always agree. cancel() empties a
// session's FIFO at once (the queues never hold a cancelled task); the empty
// FIFO and its rotation slot retire together at the next pass.
//
// Thread-safety: every method may be called from any thread; one mutex guards
// all state. Every call does bounded work and no I/O.
#pragma once

#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cellm/scheduler.h"
#include "cellm/status.h"

namespace cellm {

class DecodeFirstScheduler final : public Scheduler {
 public:
  // Refuses (InvalidArgument, naming the numbers) zero limits,
  // max_decode_sequences >= max_batch_tokens, and a chunk that cannot fit beside
  // a full decode batch (max_prefill_chunk_size > max_batch_tokens -
  // max_decode_sequences).
  static Result<std::unique_ptr<DecodeFirstScheduler>> create(size_t max_batch_tokens = 544,
                                                              size_t max_decode_sequences = 32,
                                                              size_t max_prefill_chunk_size = 256);

  // Also refuses (false, nothing queued) a group holding an empty task, a decode
  // whose size is not 1, a prefill chunk over max_prefill_chunk_size, a task
  // already marked cancelled, or a tid that is queued or repeated in `tasks`.
  bool submit(std::vector<Task> tasks) override;
  bool has_work() const override;
  // Decodes first (in arrival order), then prefill chunks in the order taken.
  std::vector<Task> get_work() override;
  // The session's queued prefill chunks in order, then its queued decodes in
  // arrival order.
  std::vector<Task> cancel(SessionId sid) override;
  // Every queued decode in arrival order, then each session's prefill chunks.
  std::vector<Task> clear() override;
  size_t num_queued() const override;
  size_t max_prefill_chunk_size() const override { return max_prefill_chunk_size_; }

  size_t max_batch_tokens() const { return max_batch_tokens_; }
  size_t max_decode_sequences() const { return max_decode_sequences_; }

  // Aborts if the queues, the rotation and the pending-id set disagree.
  void check_invariants() const;

 private:
  DecodeFirstScheduler(size_t max_batch_tokens, size_t max_decode_sequences,
                       size_t max_prefill_chunk_size);

  // REQUIRES: mu_ held. Moves up to max_decode_sequences_ decodes, at most one
  // per session, from decode_queue_ to `batch`; records their sessions in
  // `owing_output`. Returns the tokens spent (one per decode).
  size_t take_decodes(std::vector<Task>& batch, std::unordered_set<SessionId>& owing_output);

  // REQUIRES: mu_ held; spent_tokens < max_batch_tokens_. Runs prefill passes
  // over rotation_ until the budget is spent or a pass takes nothing.
  void take_prefill_chunks(std::vector<Task>& batch, std::unordered_set<SessionId>& owing_output,
                           size_t spent_tokens);

  const size_t max_batch_tokens_;
  const size_t max_decode_sequences_;
  const size_t max_prefill_chunk_size_;

  mutable std::mutex mu_;
  std::deque<Task> decode_queue_;                            // guarded by mu_; arrival order
  std::unordered_map<SessionId, std::deque<Task>> prefill_;  // guarded by mu_; may be empty
  std::deque<SessionId> rotation_;      // guarded by mu_; exactly the keys of prefill_
  std::unordered_set<TaskId> pending_;  // guarded by mu_; tids of every queued task
};

}  // namespace cellm
