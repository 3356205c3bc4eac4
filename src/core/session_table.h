// SessionTable: the session logic every executor over a CellPool shares. Maps
// sessions to pool sequences, packs a batch onto one token axis, holds each
// session's sampling policy, and samples rows.
//
// With the prefix cache on, it also keeps each session's committed tokens and a
// RadixCache of the cells of closed and released sessions, which an empty
// session can attach (attach_prefix) instead of recomputing them. The pool's
// reclaimer then evicts from that cache when a step is short of cells.
//
// Thread-safety: none; owned by an executor and called on the engine thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "cellm/executor.h"
#include "cellm/metrics.h"
#include "cellm/sampler.h"
#include "cellm/status.h"
#include "cellm/types.h"
#include "core/cell_pool.h"
#include "core/radix_cache.h"

namespace cellm {

// A batch flattened onto one token axis, in input order.
struct PackedStep {
  std::vector<Token> tokens;        // [total]
  std::vector<Position> positions;  // [total] absolute position of each token
  std::vector<SeqId> seq_ids;       // [total] pool sequence of each token
  std::vector<SessionId> sids;      // [total] session of each token
  // [inputs] flat index of the input's last token if it produces output.
  std::vector<std::optional<int32_t>> output_rows;
};

// The rows of one forward [offset, offset + length) that must produce logits.
struct SliceRows {
  std::vector<int32_t> selector;  // row indices within the forward, ascending
  std::vector<int32_t> inputs;    // the batch input each selector row answers
};

// Keeps the wanted rows that fall in the slice, rebased to it. If none are
// wanted, returns {length - 1} with no inputs (a forward always yields a row).
SliceRows select_rows(const PackedStep& step, int32_t offset, int32_t length);

// Checks shared by every executor's create(), with InvalidArgument messages that
// start with "<who>: " and name the numbers. validate_session_limits: both
// limits positive, their product below 2^31 - 1, and max_session_tokens within
// the model's context. validate_capacity: the capacity rule max_sessions x
// max_session_tokens < max_cells, since one cell is a scratch row never handed
// out; every resident session can then fill its budget at once.
Status validate_session_limits(std::string_view who, int32_t max_sessions,
                               int32_t max_session_tokens, int64_t context_tokens);
Status validate_capacity(std::string_view who, int32_t max_sessions, int32_t max_session_tokens,
                         int64_t max_cells);

// InvalidArgument naming the token and its session if a packed token lies
// outside [0, vocab_size).
Status check_tokens_in_vocab(const PackedStep& step, int64_t vocab_size);

// A token sampled by SessionTable, with its log-probabilities when its session's
// policy asks for them (num_logprobs > 0).
struct SampledToken {
  Token token = 0;
  std::optional<TokenLogprobs> logprobs;
};

class SessionTable {
 public:
  // REQUIRES: max_sessions > 0, max_session_tokens > 0, vocab_size > 0.
  // prefix_cache turns on the history, the cache and the pool's reclaimer.
  SessionTable(CellPool& pool, int32_t max_sessions, int32_t max_session_tokens, int32_t vocab_size,
               bool prefix_cache = false);
  // Drops the cache's holds and the pool's reclaimer; the sessions' sequences
  // stay in the pool.
  ~SessionTable();
  SessionTable(const SessionTable&) = delete;
  SessionTable& operator=(const SessionTable&) = delete;

  // A new empty session; nullopt at max_sessions. Ids start at 1, never reused.
  std::optional<SessionId> open();
  // Removes the session's sequence; unknown ids are ignored. With the prefix
  // cache on, its committed tokens and their cells are cached first.
  void close(SessionId sid);
  // A new session holding src's committed [0, upto); nullopt if src is unknown,
  // upto is outside [0, min(pos(src), max_session_tokens)], or the table is full.
  std::optional<SessionId> clone(SessionId src, Position upto);
  // Installs the policy; nullopt seed draws a random one. Unknown ids ignored.
  // REQUIRES: validate_sampling(params).ok() (callers validate user requests).
  void set_sampling(SessionId sid, const SamplingParams& params, std::optional<uint64_t> seed);
  // Adds a logits processor to the session's policy (set_sampling drops it);
  // false if the session is unknown or has no policy.
  bool set_logits_processor(SessionId sid, std::shared_ptr<LogitsProcessor> processor);
  // The session's processor; nullptr if none.
  LogitsProcessor* logits_processor(SessionId sid) const;

  // Validates every input, then applies any rewinds, then flattens; with the
  // prefix cache on, the inputs' tokens then replace each session's history
  // from their start on. Errors:
  // InvalidArgument (unknown session, empty or out-of-buffer slice, a gap, an
  // overlap, a restart from 0), OutOfResources (a slice ending past
  // max_session_tokens). On error nothing changed. Does not declare cells.
  Result<PackedStep> pack(const BatchInput& batch);

  // Samples the session's next token from one row of logits; `position` is the
  // position the sampled token will take; the draw is
  // sampling_uniform(seed, position), so it does not depend on call order. With a
  // logits processor the row is adjusted first (prepare, apply, then accept of
  // the token; logits_processor.h). nullopt
  // if the session is unknown, has no sampling policy, or the row is not
  // vocab_size() wide.
  std::optional<Token> sample(SessionId sid, std::span<const float> logits_row, Position position);

  // sample(), plus the token's log-probabilities (token_logprobs over the raw row)
  // when the session's policy has num_logprobs > 0. nullopt as for sample().
  std::optional<SampledToken> sample_with_logprobs(SessionId sid, std::span<const float> logits_row,
                                                   Position position);

  // The log-probabilities of a token sampled elsewhere (on a device) from this raw
  // row: nullopt if the session is unknown, has no policy, its policy has
  // num_logprobs 0, or the row is not vocab_size() wide.
  // REQUIRES: 0 <= sampled < vocab_size().
  std::optional<TokenLogprobs> logprobs(SessionId sid, std::span<const float> logits_row,
                                        Token sampled);
  // True if the session's policy has num_logprobs > 0.
  bool wants_logprobs(SessionId sid) const;
  // The policy's num_logprobs; 0 without a policy.
  int32_t num_logprobs(SessionId sid) const;

  // Prefix cache verbs; without the cache they do nothing (attach_prefix
  // returns 0, release_cells only rewinds).
  //
  // Records that `token` was committed at `position` by a path that bypasses
  // pack() (a step run ahead); the history is cut there. A position past the
  // history's end taints the session.
  void note_committed(SessionId sid, Position position, Token token);
  // After a failed execute: none of the session's tokens will be cached.
  void taint(SessionId sid);
  // On an empty session: shares the cells of the longest cached prefix of
  // `tokens` (at most max_session_tokens, pinning at most max_pin cached-only
  // cells and never what the pool's reservations count on) and returns its
  // length, the position the session continues at. 0 if the session is
  // unknown or not empty.
  Position attach_prefix(SessionId sid, std::span<const Token> tokens, int64_t max_pin);
  // Caches the session's committed tokens, then rewinds it to 0: its cells go
  // to the cache (or back to the pool) while the id, the sampling policy and
  // its seed stay. Its reservation stays too. false if the session is unknown.
  bool release_cells(SessionId sid);
  // The committed tokens the cache would take from the session; empty if it is
  // unknown, tainted, or the cache is off.
  std::span<const Token> history(SessionId sid) const;
  // Reserves room for the session to grow by `cells` (CellPool::set_reservation;
  // 0 drops it). false (nothing changes) if unknown or refused.
  bool reserve(SessionId sid, int64_t cells);

  // attach_prefix calls with the cache on, those that attached something, and
  // the tokens they attached.
  struct PrefixStats {
    int64_t lookups = 0;
    int64_t hits = 0;
    int64_t hit_tokens = 0;
  };
  const PrefixStats& prefix_stats() const { return stats_; }
  // The pool's room (Executor::kv_budget); `in_flight` cells the pool counts as
  // used that no session owns yet (a step queued ahead) count as free.
  KvBudget kv_budget(int64_t in_flight = 0) const;
  // Fills KvMetrics' pool and cache fields: capacity, in use (owned by a
  // session: neither cache-only nor in flight), cached, reserved, used_end and
  // the prefix counters. The storage fields are the executor's.
  void fill_kv_metrics(KvMetrics& m, int64_t in_flight = 0) const;
  RadixCache* prefix_cache() { return cache_.get(); }
  const RadixCache* prefix_cache() const { return cache_.get(); }

  std::optional<SeqId> seq_of(SessionId sid) const;
  const SamplingPolicy* policy_of(SessionId sid) const;  // nullptr if none
  int32_t size() const { return static_cast<int32_t>(sessions_.size()); }
  int32_t max_sessions() const { return max_sessions_; }
  int32_t max_session_tokens() const { return max_session_tokens_; }
  int32_t vocab_size() const { return vocab_size_; }
  CellPool& pool() { return pool_; }
  const CellPool& pool() const { return pool_; }

 private:
  struct Entry {
    SeqId seq = 0;
    std::optional<SamplingPolicy> policy;
    std::vector<Token> tokens;  // committed history (prefix cache only)
    bool tainted = false;       // the history is unknown: cache nothing
  };

  // Inserts the entry's committed tokens [0, min(history, pos)) into the cache.
  void cache_history(const Entry& entry);

  CellPool& pool_;
  int32_t max_sessions_;
  int32_t max_session_tokens_;
  int32_t vocab_size_;
  SessionId next_sid_ = 1;
  std::unordered_map<SessionId, Entry> sessions_;
  std::unique_ptr<RadixCache> cache_;  // null when the prefix cache is off
  PrefixStats stats_;
  std::vector<float> sample_scratch_;
  std::vector<float> adjusted_row_;
  LogitAdjustments adjustments_;
  std::vector<float> logprob_scratch_;
};

}  // namespace cellm
