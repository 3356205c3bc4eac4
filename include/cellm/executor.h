// The executor seam: what the runner asks of anything that runs a model over
// many sessions. Implementations: the CPU executor (src/cpu), the CUDA executor
// (src/cuda) and test doubles.
//
// Threading: every call comes from the runner's engine thread, so an executor
// needs no locks; it must never call back into the runner (shutdown() joins the
// engine thread).
//
// Session state. A session is a sequence of committed tokens; its length is its
// position. Every input commits its slice; an input with produce_output also
// commits all but the last of its output tokens (placed right after the slice);
// the last output token is never committed (the runner feeds it back as the next
// input). An input that starts below the session length rewinds the session to
// its start; one that starts at the length appends; one that starts above it is
// a gap and fails the whole batch.
//
// Within one batch a session appears either once as a decode, or as consecutive,
// contiguous prefill chunks with at most one produce_output.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include "cellm/logits_processor.h"
#include "cellm/metrics.h"
#include "cellm/status.h"
#include "cellm/types.h"

namespace cellm {

// How an executor's KV pool stores K and V (`--kv-dtype`).
enum class KvDtype {
  kAuto,  // the executor's own: f32 on the CPU, the precision's (bf16 / f32) on CUDA
  kF32,   // where the executor stores f32 (CPU; CUDA in f32 precision)
  kBF16,  // where the executor stores bf16 (CUDA in bf16 precision)
  // e4m3 codes with one f32 scale per (cell, layer, kv head) row of head_dim values
  // (the smallest power of two >= the row's largest magnitude / 448): the CPU executor.
  kFp8,
};
// "auto", "f32", "bf16" or "fp8".
constexpr const char* to_string(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32:
      return "f32";
    case KvDtype::kBF16:
      return "bf16";
    case KvDtype::kFp8:
      return "fp8";
    case KvDtype::kAuto:
      break;
  }
  return "auto";
}

// The session geometry every executor is created with (its create() takes it beside
// its own options).
//
// Two modes. With capacity_rule on (the default), the pool is cut into fixed slots:
// max_sessions * max_session_tokens < max_cells, one cell staying free as the
// scratch row of padded slots, so every resident session can fill its budget at
// once and a batch never runs out of cells midway. With it off, sessions share the
// pool by need: each holds the cells of its own tokens, up to its cap, and
// max_sessions only bounds how many are resident; a step can then run short of
// cells (the runner's admission policy or the prefix cache's evictions answer it).
//
// Where max_cells comes from, in order: max_cells when given; else memory
// (kv_memory_bytes on the CPU executor, kv_memory_fraction on the CUDA executor;
// each executor reads its own field, validates both, and ignores the other's);
// else, in rule mode only, max_sessions * max_session_tokens + 1. A pool sized by
// memory is also capped at 2^31 - 2 cells and at 16 * max_sessions * the
// per-session cap (more could only ever hold cached prefixes, and costs host
// bookkeeping per cell).
//
// The per-session cap: max_session_tokens, or the model's context
// (max_position_embeddings) when 0. With the rule off, a cap of 0 becomes
// min(context, max_cells - 1); a cap given explicitly must fit the pool
// (max_session_tokens < max_cells) or create() refuses it. The executors' limits()
// report every field resolved.
struct ExecutorLimits {
  int32_t max_sessions = 8;           // resident sessions: active, snapshots and clones
  int32_t max_session_tokens = 1024;  // positions one session may hold; 0 = the model's context
  int32_t max_cells = 0;              // KV cells; 0 = from memory or the rule (above)
  int32_t step_width = 256;           // W: the most tokens one forward takes
  // Keep the cells of closed and released sessions in a prefix cache that
  // attach_prefix() can share with a new session. Cached cells nobody shares are
  // evicted when a step is short of cells, so the capacity rule still holds.
  bool prefix_cache = false;
  // The fixed-slot rule above; off = the pool is shared by need.
  bool capacity_rule = true;
  // CPU: a byte budget for the KV pool (K and V of every layer, at kv_dtype); 0 = unset.
  int64_t kv_memory_bytes = 0;
  // CUDA: the share of device memory, free once the weights, the step buffers and
  // the cell table are counted, that the KV pool takes, in (0, 1]; the rest (at
  // least 1 GiB) stays free for cuBLASLt and the decode graphs. 0 = unset.
  double kv_memory_fraction = 0;
  // How the pool stores K and V. A dtype the executor does not store is refused by its
  // create() (NotSupported naming --kv-dtype); its bytes per cell size a pool by memory.
  KvDtype kv_dtype = KvDtype::kAuto;
};

// What the KV pool can still give, for admission and preemption policies.
// capacity 0 = unknown (a test double): policies stay off.
struct KvBudget {
  int64_t capacity = 0;     // cells the pool may ever hand out
  int64_t free = 0;         // cells nobody owns (CUDA: with the step queued ahead's)
  int64_t cached = 0;       // cells only the prefix cache holds (reclaimable)
  int64_t reserved = 0;     // reserved cells not yet taken
  int64_t max_context = 0;  // positions one session may hold
};

class Executor {
 public:
  virtual ~Executor() = default;

  // One-time setup on the engine thread before anything else. An error: the runner
  // admits no work, every open is refused and Runner::initialize_status() holds it.
  virtual Status initialize() { return Status::Ok(); }

  // Tokens per step for one pass over the weights; 0 = no preference. Sizes the
  // scheduler's batch budget.
  virtual size_t preferred_batch_tokens() const { return 0; }

  // A new, empty session; nullopt at capacity. Ids are never reused.
  virtual std::optional<SessionId> open_session() = 0;

  // Frees everything the session holds. Unknown ids are ignored.
  virtual void close_session(SessionId id) = 0;

  // A new, independent session holding `source`'s committed [0, upto), with no
  // sampling policy; nullopt if unsupported or refused, leaving `source` as it was.
  virtual std::optional<SessionId> clone(SessionId source, Position upto) {
    (void)source;
    (void)upto;
    return std::nullopt;
  }

  // Installed before a generation's tasks run; lasts until the next call for the
  // session. Randomness comes from (seed, position); nullopt = a fresh random seed.
  virtual void set_sampling(SessionId id, const SamplingParams& params,
                            std::optional<uint64_t> seed) = 0;

  // Installs a logits processor for the session's generation (see
  // logits_processor.h for what the executor owes it); set_sampling() removes
  // it. false if the session is unknown or this executor cannot apply
  // processors (the default), leaving the session as it was.
  virtual bool set_logits_processor(SessionId id, std::shared_ptr<LogitsProcessor> processor) {
    (void)id;
    (void)processor;
    return false;
  }

  // Whether execute() answers inputs with `score` (BatchOutput::scores). The
  // default: no; the runner then refuses generations that ask for scores.
  virtual bool supports_scoring() const { return false; }

  // Runs one batch: resizes out.outputs to the input count and answers every
  // input (nullopt iff produce_output is unset). An error fails the whole batch;
  // its message becomes part of every affected generation's error.
  virtual Status execute(const BatchInput& batch, BatchOutput& out) = 0;

  // KV-cache occupancy; sampled by the runner on the engine thread after steps.
  virtual KvMetrics kv_metrics() const { return {}; }

  // The pool's room now; all zero when unknown.
  virtual KvBudget kv_budget() const { return {}; }

  // On an empty session: shares the cells of the longest cached prefix of
  // `tokens` (with the prefix cache on) and returns its length, the position the
  // session continues at; its sampling policy is untouched. 0 when nothing is
  // cached, the session is unknown or not empty, or there is no cache.
  virtual Position attach_prefix(SessionId id, std::span<const Token> tokens) {
    (void)id;
    (void)tokens;
    return 0;
  }

  // Preemption: caches the session's committed tokens (with the prefix cache on)
  // and empties it; the id, its sampling policy (seed included) and its
  // reservation stay. false if unknown or unsupported (the default: this
  // executor cannot preempt).
  virtual bool release_cells(SessionId id) {
    (void)id;
    return false;
  }

  // Reserves room for the session to grow by `cells` more cells, so no step of
  // it runs out; 0 drops the reservation. false (nothing changes) if the session
  // is unknown or the pool cannot promise that much. The default promises
  // nothing and refuses nothing.
  virtual bool reserve(SessionId id, int64_t cells) {
    (void)id;
    (void)cells;
    return true;
  }
};

}  // namespace cellm
