// ForwardEngine: the CUDA forward of a Llama-family model over one step of a
// packed batch, with the step's metadata, buffers, KV pool and cell table all at
// fixed device addresses so a decode step can be captured in a CUDA graph once
// per batch-size bucket and replayed for any mix of sessions.
//
// The caller fills the pinned host staging (StepHost) for n rows, n_sel of them
// selected for sampling, then calls run(). One run is:
//   H2D copy of the step metadata -> embedding -> per layer:
//     h = rmsnorm(residual (+ previous delta)); qkv = h Wqkvᵀ (+b)
//     [q/k norm]; rope(q, k) and K/V -> cells (+ cell table on layer 0), one kernel
//     attn = attention over each row's sequence cells; delta = attn Woᵀ (+b)
//     h = rmsnorm(residual += delta); delta = down(swiglu(h Wgateupᵀ)) (at small
//     batch the GEMMs are GEMVs, the swiglu fused into the down GEMV's input)
//   -> residual += delta -> gather selected rows -> final norm -> logits
//   -> sample on the device -> D2H copy of the sampled tokens
//   (with logit adjustments, a LogitsProcessor's: the forward, then the raw logits'
//   copies, then the adjustments uploaded and applied, then the sampling and the copy)
//   [-> D2H copy of the raw logits of the rows asked for, one copy per row,
//       after the forward or graph replay and outside any graph].
// There are two staging slots, and a decode graph per bucket and slot, so that a step
// can be queued while the one before it runs (queue_decode_graph).
//
// Thread-safety: none; one step at a time (the executor's engine thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cellm/cuda_executor.h"
#include "cellm/model_weights.h"
#include "cellm/status.h"
#include "cuda/kernels/sampling.h"
#include "cuda/logit_adjuster.h"

namespace cellm::cuda {

// Sizes the engine is built for.
struct ForwardDims {
  int32_t max_rows = 0;            // C: widest step (max of W and the decode cap)
  int32_t max_cells = 0;           // KV pool rows; the last is the scratch cell
  int32_t max_seqs = 0;            // cell-table rows for live sequences; one more is scratch
  int32_t max_session_tokens = 0;  // cell-table row width
  // K/V held as e4m3 codes with one f32 scale per (cell, layer, kv head) (--kv-dtype fp8,
  // kernels/kv_e4m3.h) instead of the compute type.
  bool kv_e4m3 = false;
};

// The pinned host side of a step. Arrays hold max_rows entries.
struct StepHost {
  // [n] token ids; kFedToken (cuda/kernels/embedding.h) takes the token the step before
  // on the stream sampled for the same row (queue_decode_graph).
  int32_t* tokens = nullptr;
  int32_t* positions = nullptr;     // [n] absolute positions
  int32_t* row_seq = nullptr;       // [n] cell-table row (pool sequence) of each token
  int32_t* cells = nullptr;         // [n] the cell each token's K/V goes to
  int32_t* selected = nullptr;      // [n_sel] rows to sample, ascending
  SamplingRow* sampling = nullptr;  // [n_sel] policy of each selected row
  int32_t* out_tokens = nullptr;    // [n_sel] sampled tokens, after run()
};

// A run's logit adjustments (a LogitsProcessor's masks and edits): called by the run
// once its forward is queued, before its sampling is (so the host work it does overlaps
// the device's forward); returns the adjusted selected rows, each row an index into the
// run's selection [0, n_sel), the adjustments valid until the run returns.
using AdjustmentSource = std::function<std::span<const RowAdjustments>()>;

class ForwardEngine {
 public:
  virtual ~ForwardEngine() = default;

  // Uploads the weights in options.precision and allocates every buffer. The engine keeps
  // a copy of `options` and chooses its kernels by it (precision, tune_gemm, tuning); the
  // executor's other options (graphs, overlap, warm-ups) are the executor's to act on.
  static Result<std::unique_ptr<ForwardEngine>> create(const ModelWeights& weights,
                                                       const ForwardDims& dims,
                                                       const CudaExecutorOptions& options);
  // Device bytes create() would allocate, by part (the executor sizes the KV pool
  // from them).
  struct DeviceBytes {
    size_t weights = 0;      // the weight slab
    size_t buffers = 0;      // activations and workspaces for max_rows rows
    size_t table = 0;        // the cell table, (max_seqs + 1) x max_session_tokens int32
    size_t kv_per_cell = 0;  // one cell's K and V over every layer
    size_t kv = 0;           // the KV pool: max_cells cells
    size_t total() const { return weights + buffers + table + kv; }
  };
  static DeviceBytes device_bytes(const ModelWeights& weights, const ForwardDims& dims,
                                  CudaPrecision precision);

  virtual StepHost& host() = 0;
  virtual const ForwardDims& dims() const = 0;
  // The scratch cell and cell-table row padded decode slots use.
  int32_t scratch_cell() const { return dims().max_cells - 1; }
  int32_t scratch_seq() const { return dims().max_seqs; }

  // Runs the step eagerly and waits for its tokens. `logit_rows` lists selected
  // rows (indices into the step's selection, [0, n_sel)) whose raw logits are
  // also copied to the host, where host_logits(k) reads logit_rows[k]'s.
  // With `adjust`: the forward is queued, then the raw logits' copies, then adjust() is
  // called and its rows' logits adjusted on the device (LogitAdjuster), then sampled:
  // the tokens come from the adjusted rows, the copied logits are the raw ones.
  // REQUIRES: 0 < n <= max_rows, 0 <= n_sel <= n, every logit row < n_sel.
  virtual Status run_eager(int32_t n, int32_t n_sel, std::span<const int32_t> logit_rows = {},
                           const AdjustmentSource* adjust = nullptr) = 0;
  // Runs a decode step of `bucket` rows, all selected in order (host().selected[r]
  // == r; an InvalidArgument error otherwise), from the bucket's CUDA
  // graph: the first call of a bucket runs eagerly (warming cuBLASLt; with
  // tune_gemm also timing the GEMM candidates of the bucket's shapes, which
  // synchronises the stream a few hundred times), the second captures, later
  // ones replay. Waits for the tokens. `logit_rows` as
  // for run_eager; their copies follow the replay, outside the graph. Under
  // TimedChoice::kTimed (early_triggers, early_after_cublas) the capture makes the graph
  // each way and replays each a few times (every replay of a step computes the same bits)
  // before keeping the fastest.
  // With `adjust` (as for run_eager), a captured bucket replays a variant of its graph
  // that stops at the logits (captured from the kept way at the first such step of the
  // bucket and staging slot), then copies the raw logits, adjusts and samples eagerly:
  // steps without adjustments keep replaying the whole graph.
  // REQUIRES: every logit row < bucket.
  virtual Status run_decode_graph(int32_t bucket, std::span<const int32_t> logit_rows = {},
                                  const AdjustmentSource* adjust = nullptr) = 0;
  // The overlapped decode path (CudaExecutor's step ahead, CudaExecutorOptions::
  // overlap_decode). has_decode_graph: the bucket's graph is captured.
  // queue_decode_graph queues a replay of it from host(), as run_decode_graph does,
  // without waiting, then switches host() to the other of two staging slots (each slot
  // has its own replay of the graph, whose copies name it); a row whose host token is
  // kFedToken takes the token the step before it on the stream sampled for the same row.
  // wait_queued waits for the oldest queued step and returns its sampled tokens (row r's
  // at [r]), valid until the step after next is queued. No logits are copied.
  // REQUIRES (queue): fewer than two steps queued. REQUIRES (wait): a step queued.
  virtual bool has_decode_graph(int32_t bucket) const = 0;
  virtual Status queue_decode_graph(int32_t bucket) = 0;
  virtual Result<std::span<const int32_t>> wait_queued() = 0;
  // After a run: the host copy of the raw logits of the run's logit_rows[k],
  // [vocab] f32 in pinned memory, valid until the next run.
  // REQUIRES: k < the last run's logit_rows.size().
  virtual std::span<const float> host_logits(size_t k) const = 0;
  // Prepares the GEMM kernels of the eager steps (prefills, mixed steps), so that no
  // request pays for cuBLASLt's first launch of a kernel (Gemm::warm): builds the plan of
  // every product a step of 1..max_rows rows runs (the LM head's for 1..max_rows selected
  // rows) and runs, on the step buffers, each cuBLASLt kernel those plans name that this
  // engine has not run in a warm-up yet; waits for them. Writes only scratch activations
  // (no residual, cell, table or sampled token). Returns how many kernels it ran.
  virtual Result<int64_t> warm_products() = 0;
  // Copies the cell-table prefix [0, upto) of row `src` into row `dst` (clone).
  virtual Status copy_table_prefix(int32_t dst, int32_t src, int32_t upto) = 0;
  // Writes `cells` into the cell-table row `seq` at positions [0, cells.size()) (a
  // cached prefix attached to a session) through pinned staging, in stream order
  // after every step queued before it, and waits for it.
  // REQUIRES: cells.size() <= max_session_tokens.
  virtual Status write_table_row(int32_t seq, std::span<const int32_t> cells) = 0;

  // Device-time measurement: when on, each run records an event before its first
  // and after its last stream operation, and last_device_ms() is the time between
  // them for the last run (0 while off). Costs two event records per run.
  virtual Status set_timing(bool on) = 0;
  virtual double last_device_ms() const = 0;

  virtual int64_t kv_bytes_per_cell() const = 0;
  virtual int64_t kv_allocated_bytes() const = 0;
  virtual int64_t graph_captures() const = 0;
  virtual int64_t graph_replays() const = 0;
  // Decode graphs that stop at the logits (run_decode_graph with adjustments) captured so
  // far, and the rows the device adjusted over every run.
  virtual int64_t logits_graph_captures() const = 0;
  virtual int64_t adjusted_rows() const = 0;
  // One line per captured decode graph (CudaExecutor::decode_graph_notes).
  virtual const std::vector<std::string>& graph_notes() const = 0;
};

}  // namespace cellm::cuda
