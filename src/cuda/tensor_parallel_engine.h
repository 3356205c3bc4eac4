// TensorParallelEngine: the ForwardEngine (cuda/cuda_forward.h) of one model split over
// the GPUs of this process, Megatron-style (cellm/tensor_parallel.h): one CudaForward
// per GPU over its shard, linked by an NcclGroup (RankLink), each with a worker thread
// bound to its device (cudaSetDevice once). Every ForwardEngine call runs on every rank
// at once: the call is posted to each worker, the caller waits for all of them, and the
// first failing rank's error (in rank order) is the call's. The ranks run the same
// steps in the same order, so their collectives pair up, eagerly and inside their
// decode graphs (one graph launch per GPU a step).
//
// host() is rank 0's staging; a run first copies it to the other ranks' staging. Each
// rank gathers the whole logits and samples them with the same policy and seed, so
// every rank samples the same tokens: the tokens and logits read back are rank 0's. A
// run's logit adjustments (AdjustmentSource) are computed once, by whichever rank asks
// first, and applied on every rank.
//
// Thread-safety: none; one call at a time (the executor's engine thread).
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
#include "cellm/tensor_parallel.h"
#include "cuda/cuda_forward.h"

namespace cellm::cuda {

class NcclGroup;
class RankWorker;

// A rank's weights for its plan: ModelWeights::shard of a whole model, or
// ModelWeights::random_shard of a preset no host holds whole.
using ShardSource = std::function<Result<ModelWeights>(const ShardPlan&)>;

class TensorParallelEngine final : public ForwardEngine {
 public:
  // The group before its engines exist: the workers, the NCCL group and every rank's
  // shard on the host, with what each rank would allocate and finds free, so the caller
  // can size the KV pool before build(). InvalidArgument when plan_shard refuses the
  // split (naming the sizes) or `devices` is empty; NotSupported when NCCL cannot be
  // loaded; the shard source's errors.
  class Setup {
   public:
    ~Setup();
    Setup(Setup&&) noexcept;
    Setup& operator=(Setup&&) noexcept;

    int world() const;
    // Rank r's shard (its config: the rank's heads, kv heads, SwiGLU width).
    const ModelWeights& shard(int rank) const;
    // Device bytes of rank r at `dims` (its RankLink's buffers counted in buffers).
    DeviceBytes device_bytes(int rank, const ForwardDims& dims) const;
    // Free device memory of rank r's GPU when the setup was made.
    size_t free_bytes(int rank) const;
    // The memory rank 0 may plan with so that every rank fits: the least over the ranks
    // of free_bytes(r) less what rank r needs beyond rank 0 at `dims` (the shards differ
    // by o's bias and their vocabulary slices).
    size_t planning_free_bytes(const ForwardDims& dims) const;

   private:
    friend class TensorParallelEngine;
    struct State;
    explicit Setup(std::unique_ptr<State> state);
    std::unique_ptr<State> state_;
  };

  static Result<Setup> prepare(const ModelConfig& config, const std::vector<int>& devices,
                               const ShardSource& shards, const CudaExecutorOptions& options);
  // Creates every rank's engine at `dims` (each on its worker; the host shards are
  // released once uploaded).
  static Result<std::unique_ptr<TensorParallelEngine>> build(Setup setup, const ForwardDims& dims);

  ~TensorParallelEngine() override;

  int world() const;
  ForwardEngine& rank(int r);

  StepHost& host() override;
  const ForwardDims& dims() const override;
  Status run_eager(int32_t n, int32_t n_sel, std::span<const int32_t> logit_rows = {},
                   const AdjustmentSource* adjust = nullptr) override;
  Status run_decode_graph(int32_t bucket, std::span<const int32_t> logit_rows = {},
                          const AdjustmentSource* adjust = nullptr) override;
  bool has_decode_graph(int32_t bucket) const override;
  Status queue_decode_graph(int32_t bucket) override;
  Result<std::span<const int32_t>> wait_queued() override;
  std::span<const float> host_logits(size_t k) const override;
  Result<int64_t> warm_products() override;
  Status copy_table_prefix(int32_t dst, int32_t src, int32_t upto) override;
  Status write_table_row(int32_t seq, std::span<const int32_t> cells) override;
  Status set_timing(bool on) override;
  // The slowest rank's device time of the last run.
  double last_device_ms() const override;
  // Per GPU (each rank holds the cells of its own kv heads): rank 0's.
  int64_t kv_bytes_per_cell() const override;
  int64_t kv_allocated_bytes() const override;
  int64_t graph_captures() const override;
  int64_t graph_replays() const override;
  int64_t logits_graph_captures() const override;
  int64_t adjusted_rows() const override;
  const std::vector<std::string>& graph_notes() const override;

 private:
  explicit TensorParallelEngine(std::unique_ptr<Setup::State> state);
  // Runs fn(r, engine of r) on every rank's worker at once and waits for all; the first
  // failing rank's error.
  Status on_all(const std::function<Status(int, ForwardEngine&)>& fn);
  // Copies rank 0's staging (the step's first n rows, n_sel selected) to every rank.
  void share_staging(int32_t n, int32_t n_sel);

  std::unique_ptr<Setup::State> state_;
};

}  // namespace cellm::cuda
