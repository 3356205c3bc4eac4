// How CudaExecutor::create() makes a tensor-parallel engine (CudaExecutorOptions::
// tensor_parallel > 1): the checks that need no device, then the group, the shards,
// the KV pool sized for the GPU with the least memory to spare, and the engine.
#pragma once

#include <memory>

#include "cellm/cuda_executor.h"
#include "cellm/executor.h"
#include "cellm/model_weights.h"
#include "cellm/status.h"
#include "cuda/cuda_forward.h"

namespace cellm::cuda {

// The checks of a tensor-parallel degree that need no device: InvalidArgument for a
// degree below 1, above kMaxVocabRanks, or one plan_shard refuses for `config` (the
// message names --tensor-parallel, the degree and the heads).
Status check_tensor_parallel(const ModelConfig& config, int degree);

// The engine over GPUs [o.device, o.device + o.tensor_parallel), each rank's shard made
// by `weights.shard`. `l` and `dims` as CudaExecutor::create() leaves them before
// sizing the pool (dims.max_cells 0 when sized by memory; size_pool_by_memory then
// sizes it on rank 0's shard with the least memory any rank can spare). Fills `sizing`
// with rank 0's numbers. InvalidArgument when fewer GPUs are visible than asked for;
// NotSupported without NCCL; OutOfResources when a rank does not fit.
Result<std::unique_ptr<ForwardEngine>> create_tensor_parallel_engine(
    const ModelWeights& weights, const ExecutorLimits& given, ExecutorLimits& l, ForwardDims& dims,
    const CudaExecutorOptions& o, CudaExecutor::KvSizing& sizing);

}  // namespace cellm::cuda
