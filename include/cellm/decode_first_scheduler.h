// DecodeFirstScheduler: the only Scheduler. Each batch takes first up to
// max_decode_sequences decodes in arrival order (one per session), then prefill
// passes while budget remains: each pass visits every session of the
// round-robin rotation at most once, takes its head chunk if it fits (else
// defers it) and skips sessions already decoding in this batch; deferred
// sessions go back to the front in order, served ones to the back.
//
// Thread-safety: every method may be called from any thread.
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

  bool submit(std::vector<Task> tasks) override;
  bool has_work() const override;
  std::vector<Task> get_work() override;
  std::vector<Task> cancel(SessionId sid) override;
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

  const size_t max_batch_tokens_;
  const size_t max_decode_sequences_;
  const size_t max_prefill_chunk_size_;

  mutable std::mutex mu_;
  std::deque<Task> decode_queue_;                                 // guarded by mu_
  std::unordered_map<SessionId, std::deque<Task>> prefill_;       // guarded by mu_
  std::deque<SessionId> rotation_;                                // guarded by mu_
  std::unordered_set<TaskId> pending_;                            // guarded by mu_
};

}  // namespace cellm
