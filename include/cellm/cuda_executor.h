// CudaExecutor: runs a loaded model on one NVIDIA GPU behind the executor seam
// (the CUDA counterpart of CpuExecutor, driven unchanged by the same Runner and
// DecodeFirstScheduler).
//
// K/V live on the device in the cell layout: per layer K and V are
// [max_cells, n_kv_heads, head_dim], allocated once; a per-sequence cell table
// on the device (row = pool sequence, column = position) is updated in place by
// each step's K/V write, and a clone copies only its table prefix (cells are
// shared, never copied).
//
// execute() routes a batch of single-token decodes of distinct sessions to the
// batched `decode` method: one CUDA graph per batch-size bucket (1, 2, 4, 8, 16,
// 24, 32, then steps of 16 up to the decode cap), padded slots writing the
// scratch cell; the graphs are captured up front by initialize(). Any other
// batch is cut by plan_slices into eager `prefill` forwards of [min_prefill, W]
// tokens and lone-tail decodes. Each forward declares its tokens, runs, and
// samples its selected rows on the device; only token ids come back to the host.
//
// This header includes no CUDA header. Thread-safety: like every executor,
// driven by one thread (the runner's engine thread).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cellm/executor.h"
#include "cellm/model_weights.h"
#include "cellm/status.h"

namespace cellm {

enum class CudaPrecision {
  kBF16,  // weights, activations and K/V in bf16; f32 accumulation and residual
  kF32,   // everything f32 (no TF32): the exact-parity mode for tests
};

// A way of building the decode graphs that wins on some models and batches and loses on
// others (CudaExecutorOptions::early_triggers, early_after_cublas).
enum class TimedChoice {
  kTimed,  // capture each bucket's graph both ways, time a few replays, keep the faster
  kOff,
  kOn,
};

struct CudaExecutorOptions {
  int32_t max_sessions = 8;           // resident sessions: active, snapshots and clones
  int32_t max_session_tokens = 1024;  // per-session budget of positions
  int32_t max_cells = 0;              // 0 = max_sessions * max_session_tokens + 1
  int32_t step_width = 512;           // W: the widest prefill forward
  int32_t min_prefill = 2;            // narrower slices run as decodes
  int32_t max_decode_batch = 0;       // decode cap; 0 = min(max_sessions, 512)
  bool cuda_graph_for_decode = true;  // capture one graph per decode bucket
  // With graphs: warm and capture every bucket's graph in initialize(), before the
  // first request, so no decode step pays for a capture (as serving engines do at
  // startup); else each bucket is warmed and captured by its first two steps.
  bool capture_graphs_at_start = true;
  // In initialize(), before the first request: build the GEMM plan of every product a
  // prefill or mixed step of 1..max(step_width, decode cap) rows can run and run each
  // cuBLASLt kernel they name once. cuBLASLt loads a kernel's code at its first launch in
  // the process (~3.5 ms a kernel on the H200: an 8B's first 128-token prefill met four
  // and took 22 ms instead of 6), which would otherwise land on early requests' prefills.
  bool warm_prefill_gemms = true;
  // With graphs: time the GEMM kernels that could serve each decode bucket's products
  // (cuBLASLt's candidate algorithms and the GEMV) while the bucket warms, and run the
  // fastest; other shapes (prefill) take cuBLASLt's heuristic choice. Costs roughly a
  // tenth of a second per bucket for an 8B model, once per process: the choices are kept
  // process-wide, so later executors adopt them (and give the same bits). Another process
  // may choose differently, within the same accuracy (f32 accumulation). Off: the
  // heuristic's choice everywhere.
  bool tune_gemm = true;
  CudaPrecision precision = CudaPrecision::kBF16;
  int device = 0;           // CUDA device ordinal
  bool time_steps = false;  // measure each batch's host and device time (step_times())
  // Launch cellm's kernels with programmatic dependent launch on sm_90+ (each kernel's
  // launch overlaps the previous kernel's tail); off only to measure what it buys.
  // Process-wide: create() applies it to every executor of the process (the last
  // created wins), including graphs captured after that.
  bool programmatic_launch = true;
  // Where the small kernels (norms, RoPE/K/V write) and the attention of a decode graph
  // let the next kernel launch: before their own wait, so the GEMV behind them is resident
  // and streaming weights while the kernel before them finishes, or after it. Which wins
  // depends on the model and the batch (on the H200 early helps the 1B at one row and
  // costs the 8B), so kTimed captures each decode bucket's graph both ways, times a few
  // replays of each, and keeps the faster (decode_graph_notes() says which). Eager steps
  // always trigger after the wait (kOff). Needs programmatic_launch.
  TimedChoice early_triggers = TimedChoice::kTimed;
  // In decode graphs, a cellm kernel behind a cuBLASLt kernel launches once every block
  // of the cuBLASLt kernel has started (a launch-completion edge; cuda/graph_edges.h)
  // instead of once it has finished: it waits for the GEMM's results all the same, but
  // its launch and its weight loads overlap the GEMM's tail. On the H200 this wins ~2%
  // for the 8B at 64-256 rows and ties at 16; kTimed times each bucket's graph with and
  // without (with both trigger placements under early_triggers kTimed: four graphs).
  // Needs programmatic_launch.
  TimedChoice early_after_cublas = TimedChoice::kTimed;
  // In decode graphs of at most 8 rows, a side branch beside each layer's attention asks
  // the L2 for the first sixteenth of every gate_up weight row, so the gate_up product
  // reads those bytes from the L2 while the attention's few blocks would leave the HBM
  // idle. A hint: the same bits either way. On the H200 it wins ~1.2% for the 8B at one
  // row and loses for the 1B, so kTimed captures each such bucket's kept graph again with
  // it, times both, and keeps the faster (its note says which).
  TimedChoice l2_prefetch = TimedChoice::kTimed;
  // A decode step of a few rows whose attention splits its rows' context folds the
  // chunks' partials inside thread-block clusters (sm_90; AttentionParams::cluster_fold):
  // at most 8 chunks a row, merged through distributed shared memory. Off: through the
  // workspace in global memory, up to 16 chunks a row (for measuring what it buys).
  bool attention_cluster_fold = true;
  // The rows of a prompt's chunk in a prefill or mixed step run the prefill attention
  // (AttentionParams::row_runs): one block per few consecutive rows and kv head gathers
  // each key once for all of them, instead of once per row. Off: every row of every step
  // takes the split (decode) kernel (for measuring what it buys).
  bool prefill_attention = true;
  // A bf16 step of one row (a single session's decode) runs every layer in one
  // persistent kernel (cuda/kernels/decode_layers.h): each SM streams its share of the
  // weights through a shared-memory ring while the norms, RoPE and attention run, instead
  // of one launch per product and small kernel. Its sums run in another order than the
  // separate kernels', so its tokens agree with theirs within bf16 rounding, not bit for
  // bit; every one-row step takes it (eager or graph), so a process's one-row results do
  // not depend on which path ran. Shapes it cannot take (decode_layers_supported) keep the
  // separate kernels. Off by default: on the H200 it is still slower than the separate
  // kernels (docs/PERFORMANCE.md, session 23), an experiment being developed.
  bool persistent_decode = false;
  // With graphs: once a decode batch has run from its captured graph, queue the next
  // decode step of the same sessions before returning, each fed on the device with the
  // token just sampled for it, so the device runs it while the runner handles this step's
  // tokens and schedules the next batch (the host's share of a step leaves the device's
  // critical path). When the next batch is that step (its sessions, each continuing with
  // its token) it is already running. When it is part of it (a session finished, paused
  // or was closed) the step answers the others and the rows left out give their cells
  // back; the steps queued after it keep its graph, those rows padded, while the rest
  // still need its bucket. Otherwise (a session joined, took another token or position,
  // was cloned or given a new policy, a prefill arrived) its cells go back to the pool and
  // its tokens are dropped: each step's tokens are the same either way (sampling draws
  // depend on the seed and the position only). Not for sessions that ask for logprobs.
  // Off: every step waits for its batch.
  bool overlap_decode = true;
  // With overlap_decode: queue a step ahead only once the same sessions have decoded a
  // threshold of batches in a row; each dropped step doubles the threshold (from 2, up to
  // 64), each 8 steps used in a row halve it (cuda/step_ahead_policy.h). Batches that keep
  // changing then rarely cost a dropped step. Off: from the second batch of every run.
  bool overlap_adaptive = true;
};

namespace cuda {
class ExecutorImpl;
}

// True when this process can use a CUDA device.
bool cuda_device_available();

// Which GPU device `device` is, for benchmark logs: "NVIDIA H200, 132 SMs, 139.8 GiB,
// GPU-1a2b3c4d" (its name, SM count, memory, and the first 8 hex digits of its UUID,
// which tell apart machines of one kind); empty when there is no such device.
std::string describe_cuda_device(int device = 0);

// One line per GEMM shape tuned so far in this process (tune_gemm), for logs:
// "<gemm|swiglu+down> <types> m=M n=N k=K[ +bias]: <kernel> X us (heuristic Y us)".
std::vector<std::string> describe_tuned_gemms();

class CudaExecutor final : public Executor {
 public:
  // Validates, in order (messages start with "CudaExecutor: " and name the
  // numbers): a model is given (InvalidArgument); session limits positive with
  // their product below 2^31 (InvalidArgument); max_session_tokens <= the
  // model's context (InvalidArgument); 2 <= min_prefill <= W <= max_cells
  // (InvalidArgument); the capacity rule max_sessions * max_session_tokens <
  // max_cells (InvalidArgument: one cell is the scratch row of padded slots); a
  // usable CUDA device (NotSupported); the weights and the KV pool fit in device
  // memory (OutOfResources). Then uploads the weights and allocates everything.
  static Result<std::unique_ptr<CudaExecutor>> create(std::shared_ptr<const ModelWeights> weights,
                                                      const CudaExecutorOptions& options);
  ~CudaExecutor() override;

  // Captures the decode graphs when capture_graphs_at_start (see the options);
  // an Internal error naming the cause when that fails.
  Status initialize() override;
  size_t preferred_batch_tokens() const override;
  std::optional<SessionId> open_session() override;
  void close_session(SessionId id) override;
  std::optional<SessionId> clone(SessionId source, Position upto) override;
  void set_sampling(SessionId id, const SamplingParams& params,
                    std::optional<uint64_t> seed) override;
  Status execute(const BatchInput& batch, BatchOutput& out) override;
  KvMetrics kv_metrics() const override;

  const CudaExecutorOptions& options() const;
  // The message of the last failure (execute(), initialize() or a clone's copy), for
  // logs; empty if the last batch succeeded.
  const std::string& last_error() const;
  // Forwards run so far, by method: decode graph replays, eager decodes, prefills.
  struct MethodCalls {
    int64_t decode_graph_replays = 0;
    int64_t decode_graph_captures = 0;
    // overlap_decode: steps queued ahead that the next batch was or was part of (used)
    // or was not (dropped: their work is lost).
    int64_t decode_steps_ahead_used = 0;
    int64_t decode_steps_ahead_dropped = 0;
    int64_t decode_eager = 0;
    int64_t prefill = 0;
  };
  MethodCalls method_calls() const;
  // With options.time_steps: batches executed and their time, split into batched
  // decodes and the rest (prefill slices, lone decodes). wall: execute() from entry
  // to return (packing, placement, staging, the forwards and the wait for them);
  // device: from each forward's first to its last stream operation (CUDA events).
  // wall - device is the host's share of a step; with overlap_decode a batch whose step
  // was queued ahead started on the device before execute() was called, so its wall time
  // can be below its device time. All zero while time_steps is off.
  struct StepTimes {
    int64_t decode_batches = 0;
    double decode_wall_ms = 0, decode_device_ms = 0;
    int64_t other_batches = 0;
    double other_wall_ms = 0, other_device_ms = 0;
  };
  StepTimes step_times() const;
  // Wall-clock seconds the last initialize() took: capturing the decode graphs (with
  // tune_gemm, timing the decode GEMMs of shapes no executor of this process has tuned
  // yet) and warming the prefill GEMMs (always measured; 0 before initialize() or when it
  // does neither).
  double initialize_seconds() const;
  // How many cuBLASLt kernels initialize() ran to warm the prefill GEMMs
  // (warm_prefill_gemms); 0 before it or without it.
  int64_t warmed_prefill_kernels() const;
  // One line per decode graph captured so far, in capture order: its bucket, the trigger
  // placement and whether the edges after cuBLASLt kernels launch early; where either is
  // timed, every candidate's replay time and the one kept ("B=64: late 4.95 ms, early
  // 4.96 ms, late+edges 4.87 ms, early+edges 4.88 ms; 130 edges: kept late+edges").
  std::vector<std::string> decode_graph_notes() const;

 private:
  explicit CudaExecutor(std::unique_ptr<cuda::ExecutorImpl> impl);
  std::unique_ptr<cuda::ExecutorImpl> impl_;
};

}  // namespace cellm
