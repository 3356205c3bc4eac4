// The tensor-parallel branch of CudaExecutor::create() (cuda/tensor_parallel_setup.h).
#include "cuda/tensor_parallel_setup.h"

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "cellm/tensor_parallel.h"
#include "cuda/cuda_check.h"
#include "cuda/pool_sizing.h"
#include "cuda/tensor_parallel_engine.h"

namespace cellm::cuda {
namespace {

std::string prefixed(const std::string& m) {
  return "CudaExecutor: " + m;
}

}  // namespace

Status check_tensor_parallel(const ModelConfig& config, int degree) {
  const std::string flag = "--tensor-parallel " + std::to_string(degree);
  if (degree < 1) return InvalidArgument(prefixed(flag + ": the degree must be at least 1"));
  if (degree > kMaxVocabRanks) {
    return InvalidArgument(prefixed(flag) + ": at most " + std::to_string(kMaxVocabRanks) +
                           " GPUs are supported");
  }
  Result<ShardPlan> plan = plan_shard(config, 0, degree);
  if (!plan.ok()) {
    return InvalidArgument(prefixed(flag) + ": the model's " + std::to_string(config.num_heads()) +
                           " heads and " + std::to_string(config.num_kv_heads()) +
                           " kv heads do not split over " + std::to_string(degree) + " GPUs (" +
                           plan.status().message() + ")");
  }
  return Status::Ok();
}

Result<std::unique_ptr<ForwardEngine>> create_tensor_parallel_engine(
    const ModelWeights& weights, const ExecutorLimits& given, ExecutorLimits& l, ForwardDims& dims,
    const CudaExecutorOptions& o, CudaExecutor::KvSizing& sizing) {
  const int world = o.tensor_parallel;
  CELLM_RETURN_IF_ERROR(check_tensor_parallel(weights.config(), world));
  int visible = 0;
  CELLM_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&visible), "CudaExecutor: counting GPUs");
  if (o.device < 0 || o.device + world > visible) {
    return InvalidArgument(prefixed("--tensor-parallel " + std::to_string(world) + " from device " +
                                    std::to_string(o.device) + " needs " +
                                    std::to_string(o.device + world) + " GPUs, " +
                                    std::to_string(visible) + " are visible"));
  }
  std::vector<int> devices;
  for (int r = 0; r < world; ++r) devices.push_back(o.device + r);
  const ShardSource shards = [&weights](const ShardPlan& plan) { return weights.shard(plan); };
  CELLM_ASSIGN_OR_RETURN(TensorParallelEngine::Setup setup,
                         TensorParallelEngine::prepare(weights.config(), devices, shards, o));
  // What every rank can spare, as rank 0 would see it; size_pool_by_memory counts rank
  // 0's engine without its link buffers, so they come off first.
  const size_t link = setup.device_bytes(0, dims).buffers -
                      ForwardEngine::device_bytes(setup.shard(0), dims, o.precision).buffers;
  const size_t least = setup.planning_free_bytes(dims);
  const bool by_memory = l.max_cells == 0;
  if (by_memory) {
    CELLM_RETURN_IF_ERROR(
        size_pool_by_memory(setup.shard(0), given, l, dims, o, least > link ? least - link : 0));
  }
  const ForwardEngine::DeviceBytes bytes = setup.device_bytes(0, dims);
  if (bytes.total() > least) {
    return OutOfResources(
        prefixed("--tensor-parallel " + std::to_string(world) + ": each GPU needs " +
                 std::to_string(bytes.total() >> 20) + " MiB (its shard's weights, a KV pool of " +
                 std::to_string(l.max_cells) + " cells, buffers) but the fullest has only " +
                 std::to_string(least >> 20) + " MiB free"));
  }
  sizing.cells = l.max_cells;
  sizing.bytes_per_cell = static_cast<int64_t>(bytes.kv_per_cell);
  sizing.pool_bytes = static_cast<int64_t>(bytes.kv);
  sizing.table_bytes = static_cast<int64_t>(bytes.table);
  sizing.max_context = l.max_session_tokens;
  sizing.weights_bytes = static_cast<int64_t>(bytes.weights);
  sizing.buffer_bytes = static_cast<int64_t>(bytes.buffers);
  sizing.free_bytes = static_cast<int64_t>(least);
  sizing.by_memory = by_memory;
  CELLM_ASSIGN_OR_RETURN(std::unique_ptr<TensorParallelEngine> engine,
                         TensorParallelEngine::build(std::move(setup), dims));
  return std::unique_ptr<ForwardEngine>(std::move(engine));
}

}  // namespace cellm::cuda
