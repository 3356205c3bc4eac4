// CudaExecutor: runs a loaded model on one NVIDIA GPU behind the executor seam
// (the CUDA counterpart of CpuExecutor, driven unchanged by the same Runner and
// DecodeFirstScheduler).
//
// K/V live on the device in the cell layout: per layer K and V are
// [max_cells, n_kv_heads, head_dim], allocated once; a per-sequence cell table
// on the device (row = pool sequence, column = position) is updated in place by
// each step's K/V write, a clone copies only its table prefix, and a cached
// prefix attached to a session (ExecutorLimits::prefix_cache) is written into its
// row from the host (cells are shared, never copied).
//
// execute() routes a batch of single-token decodes of distinct sessions to the
// batched `decode` method: one CUDA graph per batch-size bucket (1, 2, 4, 8, 16,
// 24, 32, then steps of 16 up to the decode cap), padded slots writing the
// scratch cell; the graphs are captured up front by initialize(). Any other
// batch is cut by plan_slices into eager `prefill` forwards of [min_prefill, W]
// tokens and lone-tail decodes. Each forward declares its tokens, runs, and
// samples its selected rows on the device; only token ids come back to the host. A
// session's LogitsProcessor is applied on the device too (set_logits_processor).
//
// This header includes no CUDA header. Thread-safety: like every executor,
// driven by one thread (the runner's engine thread).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
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
// others (CudaTuning::early_triggers, early_after_cublas, l2_prefetch).
enum class TimedChoice {
  kTimed,  // capture each bucket's graph both ways, time a few replays, keep the faster
  kOff,
  kOn,
};

// Developer knobs: each turns off (or forces) one mechanism of the forward so a benchmark
// can measure what it buys (`cellm bench` flags). The defaults are the product's
// behaviour; nothing but benchmarks and tests sets them.
struct CudaTuning {
  // Launch cellm's kernels with programmatic dependent launch on sm_90+: each kernel's
  // launch overlaps the previous kernel's tail. Process-wide: create() applies it to every
  // executor of the process (the last created wins), including graphs captured after that.
  bool programmatic_launch = true;
  // Where the small kernels (norms, RoPE/K/V write) and the attention of a decode graph
  // let the next kernel launch: before their own wait, so the GEMV behind them is resident
  // and streaming weights while the kernel before them finishes, or after it. Which is
  // faster depends on the model and the batch, so kTimed captures each decode bucket's
  // graph both ways, times a few replays of each, and keeps the faster
  // (decode_graph_notes() says which). Eager steps always trigger after the wait (kOff).
  // Needs programmatic_launch.
  TimedChoice early_triggers = TimedChoice::kTimed;
  // In decode graphs, a cellm kernel behind a cuBLASLt kernel launches once every block
  // of the cuBLASLt kernel has started (a launch-completion edge; cuda/graph_edges.h)
  // instead of once it has finished: it waits for the GEMM's results all the same, but
  // its launch and its weight loads overlap the GEMM's tail. kTimed times each bucket's
  // graph with and without (with both trigger placements under early_triggers kTimed:
  // four graphs). Needs programmatic_launch.
  TimedChoice early_after_cublas = TimedChoice::kTimed;
  // In decode graphs of at most 8 rows, a side branch beside each layer's attention asks
  // the L2 for the first sixteenth of every gate_up weight row, so the gate_up product
  // reads those bytes from the L2 while the attention's few blocks would leave the memory
  // bus idle. A hint: the same bits either way. It helps large models at few rows and
  // costs small ones, so kTimed captures each such bucket's kept graph again with it,
  // times both, and keeps the faster (its note says which).
  TimedChoice l2_prefetch = TimedChoice::kTimed;
  // A decode step of a few rows whose attention splits its rows' context folds the
  // chunks' partials inside thread-block clusters (sm_90; AttentionParams::cluster_fold):
  // at most 8 chunks a row, merged through distributed shared memory. Off: through the
  // workspace in global memory, up to 16 chunks a row.
  bool attention_cluster_fold = true;
  // The rows of a prompt's chunk in a prefill or mixed step run the prefill attention
  // (AttentionParams::row_runs): one block per few consecutive rows and kv head gathers
  // each key once for all of them, instead of once per row. Off: every row of every step
  // takes the split (decode) kernel.
  bool prefill_attention = true;
  // A norm whose output feeds an FP8 product of more than 8 rows (qkv, gate_up) writes the
  // product's e4m3 rows and their scales itself (launch_add_rmsnorm_e4m3), instead of the
  // product quantizing the norm's bf16 rows in a kernel of its own. The same bits either
  // way. Off: the separate quantization.
  bool norm_quantizes_e4m3 = true;
  // With overlap_decode: queue a step ahead only once the same sessions have decoded a
  // threshold of batches in a row; each dropped step doubles the threshold (from 2, up to
  // 64), each 8 steps used in a row halve it (cuda/step_ahead_policy.h). Batches that keep
  // changing then rarely cost a dropped step. Off: from the second batch of every run.
  bool overlap_adaptive = true;
};

// What the CUDA executor does beyond the session geometry (ExecutorLimits, given to
// create() beside these).
struct CudaExecutorOptions {
  int32_t min_prefill = 2;       // prompt slices narrower than this run as decodes
  int32_t max_decode_batch = 0;  // rows of a batched decode; 0 = min(max_sessions, 512)
  CudaPrecision precision = CudaPrecision::kBF16;
  int device = 0;  // CUDA device ordinal
  // Replay each batched decode step from a CUDA graph captured once per batch-size bucket
  // (one launch instead of a few hundred). Off: every step runs eagerly.
  bool cuda_graph_for_decode = true;
  // With graphs: warm and capture every bucket's graph in initialize(), before the
  // first request, so no decode step pays for a capture (as serving engines do at
  // startup); else each bucket is warmed and captured by its first two steps.
  bool capture_graphs_at_start = true;
  // In initialize(), before the first request: build the GEMM plan of every product a
  // prefill or mixed step of 1..max(step_width, decode cap) rows can run and run each
  // cuBLASLt kernel they name once. cuBLASLt loads a kernel's code at its first launch in
  // the process (milliseconds a kernel), which would otherwise land on early requests'
  // prefills.
  bool warm_prefill_gemms = true;
  // With graphs: time the GEMM kernels that could serve each decode bucket's products
  // (cuBLASLt's candidate algorithms and the GEMV) while the bucket warms, and run the
  // fastest; other shapes (prefill) take cuBLASLt's heuristic choice. Costs roughly a
  // tenth of a second per bucket for an 8B model, once per process: the choices are kept
  // process-wide, so later executors adopt them (and give the same bits). Another process
  // may choose differently, within the same accuracy (f32 accumulation). Off: the
  // heuristic's choice everywhere.
  bool tune_gemm = true;
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
  // depend on the seed and the position only). Not for sessions that ask for logprobs
  // or have a logits processor (its prepare() must run before each of its tokens is
  // sampled, and only for tokens that are returned).
  // Off: every step waits for its batch.
  bool overlap_decode = true;
  bool time_steps = false;  // measure each batch's host and device time (step_times())
  CudaTuning tuning;        // developer knobs, for benchmarks
};

namespace cuda {
class ExecutorImpl;
}

// True when this process can use a CUDA device.
bool cuda_device_available();

// Which GPU device `device` is, for benchmark logs: "<device name>, 132 SMs, 139.8 GiB,
// GPU-1a2b3c4d" (its name, SM count, memory, and the first 8 hex digits of its UUID,
// which tell apart machines of one kind); empty when there is no such device.
std::string describe_cuda_device(int device = 0);

// One line per GEMM shape tuned so far in this process (tune_gemm), for logs:
// "<gemm|swiglu+down> <types> m=M n=N k=K[ +bias]: <kernel> X us (heuristic Y us)".
std::vector<std::string> describe_tuned_gemms();

class CudaExecutor final : public Executor {
 public:
  // Validates, in order (messages start with "CudaExecutor: " and name the
  // numbers): a model is given (InvalidArgument); max_sessions and the per-session
  // cap (max_session_tokens, or the model's context when 0) positive with their
  // product below 2^31 (InvalidArgument); the cap <= the model's context
  // (InvalidArgument); kv_memory_bytes >= 0 and kv_memory_fraction in [0, 1]
  // (InvalidArgument); the pool has a size: max_cells, kv_memory_fraction, or the
  // rule (InvalidArgument); 2 <= min_prefill <= W (step_width) <= max_cells
  // (InvalidArgument; max_cells when known here); in rule mode, max_sessions *
  // cap < max_cells (InvalidArgument: one cell is the scratch row of padded
  // slots); with the rule off, a cap given explicitly < max_cells
  // (InvalidArgument); max_decode_batch >= 0 (InvalidArgument); a usable CUDA
  // device (NotSupported); a pool sized by kv_memory_fraction holds at least
  // max(2, W) cells, and more than a cap given explicitly with the rule off
  // (OutOfResources); the weights and the KV pool fit in device memory
  // (OutOfResources). Then uploads the weights and allocates everything.
  //
  // Sizing by kv_memory_fraction f: with A = the device memory free at create()
  // less the weights, the step buffers and the cell table, the pool takes
  // min(f x A, A - 1 GiB) in whole cells (the rest stays free for cuBLASLt and
  // the decode graphs initialize() captures), capped at 2^31 - 2 and at 16 x
  // max_sessions x the table width. The cell table is dense: a row of width
  // max_session_tokens per resident session (and a scratch row), so its width is
  // the per-session cap (ExecutorLimits). kv_sizing() tells what was chosen.
  static Result<std::unique_ptr<CudaExecutor>> create(std::shared_ptr<const ModelWeights> weights,
                                                      const ExecutorLimits& limits,
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
  // Applied on the device: a step with processor rows queues its forward (the decode
  // graph, in a variant that stops at the logits, or the eager path), then runs each
  // such row's prepare() on the host while the device computes, copies the adjustments
  // and applies them to the rows' logits (the twin of apply_logit_adjustments), then
  // samples; each returned token is accept()ed before execute() returns. Log-probabilities
  // stay those of the raw rows. A step of sessions without processors runs as before.
  // Settles a step queued ahead that holds the session first.
  bool set_logits_processor(SessionId id, std::shared_ptr<LogitsProcessor> processor) override;
  // Scores prefill slices (Input::score): scored rows join the LM head's rows.
  bool supports_scoring() const override { return true; }
  Status execute(const BatchInput& batch, BatchOutput& out) override;
  KvMetrics kv_metrics() const override;
  KvBudget kv_budget() const override;
  // Shares a cached prefix's cells and writes them into the session's row of the
  // device cell table (waits for the stream: a step ahead finishes first).
  Position attach_prefix(SessionId id, std::span<const Token> tokens) override;
  // Both settle a step queued ahead that holds the session first.
  bool release_cells(SessionId id) override;
  bool reserve(SessionId id, int64_t cells) override;

  const CudaExecutorOptions& options() const;
  // The limits it was created with, every field resolved: max_cells never 0,
  // max_session_tokens the per-session cap and the cell table's width.
  const ExecutorLimits& limits() const;
  // How create() sized the device memory, for a start-up line.
  struct KvSizing {
    int64_t cells = 0;           // limits().max_cells; the last is the scratch cell
    int64_t bytes_per_cell = 0;  // one cell's K and V over every layer
    int64_t pool_bytes = 0;      // cells * bytes_per_cell
    // The dense cell table: (max_sessions + 1) rows of max_context int32 cell ids.
    int64_t table_bytes = 0;
    int64_t max_context = 0;  // limits().max_session_tokens
    int64_t weights_bytes = 0;
    int64_t buffer_bytes = 0;  // activations and workspaces
    int64_t free_bytes = 0;    // device memory free when create() began
    bool by_memory = false;    // cells from kv_memory_fraction
  };
  // Immutable after create(): any thread may read it.
  const KvSizing& kv_sizing() const;
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
    // Logits processors: decode graphs that stop at the logits (captured at a bucket's
    // first step with processors, per staging slot), and rows whose logits the device
    // adjusted before sampling.
    int64_t logits_graph_captures = 0;
    int64_t adjusted_rows = 0;
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
