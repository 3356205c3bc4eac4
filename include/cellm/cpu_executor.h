// CpuExecutor: runs a loaded model on the CPU behind the executor seam. One
// forward covers a packed, mixed batch (any sessions, any positions); K/V live
// off-graph in the cell layout (per layer [max_cells, n_kv_heads, head_dim] f32, or
// with kv_dtype kFp8 e4m3 codes plus one f32 scale per (cell, kv head)),
// each query attends only its own sequence's cells (narrowed by the layer's
// sliding window), and logits are computed only for the rows that produce output.
// Weights stay in their stored 16-bit form; every product accumulates in f32.
//
// Thread-safety: like every executor, driven by one thread (the runner's engine
// thread); it runs its kernels on its own thread pool.
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

class CellPool;
class SessionTable;
struct PackedStep;

namespace cpu {
class CpuForward;
class KvStore;
class ThreadPool;
}  // namespace cpu

// The CPU executor's own options; the session geometry is ExecutorLimits.
struct CpuExecutorOptions {
  int32_t initial_cells = 256;  // KV rows allocated at first; grows geometrically
  int32_t num_threads = 0;      // kernel threads; 0 = every hardware thread
  // bf16 weights: round each product's activations to bf16 and use AVX-512 BF16 dot
  // products where the CPU has them (llama.cpp's numerics, faster); false keeps every
  // product exact in f32 (see cpu/cpu_forward.h).
  bool bf16_activations = false;
};

class CpuExecutor final : public Executor {
 public:
  // Validates, in order (InvalidArgument; messages start with "CpuExecutor: "
  // and name the numbers): a model is given; kv_dtype is one it stores (auto, f32,
  // fp8; bf16 is NotSupported naming --kv-dtype); max_sessions and the per-session
  // cap (max_session_tokens, or the model's context when 0) are positive and
  // their product fits int32; the cap <= the model's context
  // (max_position_embeddings); step_width and initial_cells are positive;
  // max_cells >= 0, kv_memory_bytes >= 0, kv_memory_fraction in [0, 1]; the pool
  // has a size (max_cells, else kv_memory_bytes / kv_bytes_per_cell(), else, in
  // rule mode, max_sessions * cap + 1); it holds at least 2 cells and step_width
  // <= max_cells; in rule mode, max_sessions * cap < max_cells (one cell stays a
  // scratch row); with the rule off, a cap given explicitly is below max_cells;
  // num_threads >= 0. See ExecutorLimits for how each field resolves. The K/V
  // storage grows on demand up to max_cells, so a large byte budget costs memory
  // only as sessions fill it.
  static Result<std::unique_ptr<CpuExecutor>> create(std::shared_ptr<const ModelWeights> weights,
                                                     const ExecutorLimits& limits,
                                                     const CpuExecutorOptions& options);
  ~CpuExecutor() override;

  size_t preferred_batch_tokens() const override;
  std::optional<SessionId> open_session() override;
  void close_session(SessionId id) override;
  std::optional<SessionId> clone(SessionId source, Position upto) override;
  void set_sampling(SessionId id, const SamplingParams& params,
                    std::optional<uint64_t> seed) override;
  bool set_logits_processor(SessionId id, std::shared_ptr<LogitsProcessor> processor) override;
  bool supports_scoring() const override { return true; }
  // Errors start with "CpuExecutor: " and name the cause (a malformed batch, a
  // token outside the vocabulary, a full cell pool).
  Status execute(const BatchInput& batch, BatchOutput& out) override;
  KvMetrics kv_metrics() const override;
  KvBudget kv_budget() const override;
  Position attach_prefix(SessionId id, std::span<const Token> tokens) override;
  bool release_cells(SessionId id) override;
  bool reserve(SessionId id, int64_t cells) override;

  // Every field resolved: max_cells never 0, max_session_tokens the per-session
  // cap (never 0). Immutable after create(): any thread may read it.
  const ExecutorLimits& limits() const { return limits_; }
  // One cell's K and V over every layer at the limits' kv_dtype (f32: 8 x kv_dim bytes a
  // layer; fp8: 2 x (kv_dim + 4 x n_kv_heads)): what kv_memory_bytes is divided by.
  // Immutable after create(): any thread may call it.
  int64_t kv_bytes_per_cell() const;
  // The same for `config` at `dtype` (kAuto and kF32: f32) before an executor exists.
  static int64_t cell_bytes(const ModelConfig& config, KvDtype dtype);
  // initial_cells clamped to max_cells.
  const CpuExecutorOptions& options() const { return options_; }
  const ModelConfig& config() const { return weights_->config(); }

 private:
  CpuExecutor(std::shared_ptr<const ModelWeights> weights, const ExecutorLimits& limits,
              const CpuExecutorOptions& options);
  // execute() after a successful pack.
  Status run_packed(const BatchInput& batch, const PackedStep& packed, BatchOutput& out);

  std::shared_ptr<const ModelWeights> weights_;
  ExecutorLimits limits_;
  CpuExecutorOptions options_;
  std::unique_ptr<CellPool> pool_;
  std::unique_ptr<SessionTable> sessions_;
  std::unique_ptr<cpu::ThreadPool> threads_;
  std::unique_ptr<cpu::KvStore> kv_;
  std::unique_ptr<cpu::CpuForward> forward_;
  std::vector<float> logits_;  // [selected rows, vocab] of the current forward
  std::vector<float> score_scratch_;
};

}  // namespace cellm
