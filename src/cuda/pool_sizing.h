// How the CUDA executor resolves its ExecutorLimits and sizes its KV pool: the
// checks create() makes before touching a device, and the pool's size from a
// fraction of the free device memory (ExecutorLimits::kv_memory_fraction).
#pragma once

#include <cstddef>

#include "cellm/cuda_executor.h"
#include "cellm/executor.h"
#include "cellm/model_weights.h"
#include "cellm/status.h"
#include "cuda/cuda_forward.h"

namespace cellm::cuda {

// Device memory create() leaves free beside a pool sized by kv_memory_fraction, for
// cuBLASLt's workspaces and the graphs initialize() captures: at least this much.
inline constexpr size_t kMinHeadroomBytes = size_t{1} << 30;

// The checks that need no device, in the order CudaExecutor::create() documents
// (messages start with "CudaExecutor: "). Resolves max_session_tokens (the
// per-session cap) and, unless the pool is sized by memory (max_cells left 0),
// max_cells.
Result<ExecutorLimits> validate_limits(const ModelWeights* w, ExecutorLimits l,
                                       const CudaExecutorOptions& o);

// Sizes a pool by kv_memory_fraction f, for `l` as validate_limits left it (dims'
// max_cells is 0 on entry, its max_session_tokens the asked width): of the device
// memory free once the weights, the buffers and the cell table are counted (A), the
// pool takes min(f x A, A - kMinHeadroomBytes) in whole cells, capped at 2^31 - 2
// and at 16 x max_sessions x the width. In rule mode the rule must then hold; with
// the rule off a cap `given` explicitly must fit, else the width shrinks to
// max_cells - 1 when the pool is smaller than one context (the table and the
// attention workspace only shrink). Sets dims.max_cells and
// dims.max_session_tokens, l.max_cells and l.max_session_tokens. OutOfResources
// naming the sizes when the pool would hold fewer than max(2, step_width) cells or
// not the explicit cap.
Status size_pool_by_memory(const ModelWeights& w, const ExecutorLimits& given, ExecutorLimits& l,
                           ForwardDims& dims, const CudaExecutorOptions& o, size_t free_bytes);

}  // namespace cellm::cuda
