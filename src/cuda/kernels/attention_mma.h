// The tensor-core split kernel of launch_attention (internal to the attention
// launcher; see attention.h for the contract and attention_mma.cu for the design).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels/attention.h"

namespace cellm::cuda::detail {

// Enqueues the split kernel of `p` with n_splits = attention_num_splits(p's shape),
// with programmatic dependent launch: it writes `out` for rows of one chunk and the
// workspace partials of the others, which the last block of each (row, kv head) folds
// into `out`, exactly as the CUDA-core split kernel does.
// REQUIRES: p passed launch_attention's checks and attention_uses_tensor_cores(p).
// Warps per block (2, 4 or 8) of the tensor-core kernel when AttentionParams::block_warps
// is 0, for a launch of n_rows x n_splits x n_kv_heads blocks on `sm_count` SMs.
int attention_mma_block_warps(int64_t n_rows, int32_t n_splits, int64_t n_kv_heads, int sm_count);

cudaError_t launch_attention_split_mma(const AttentionParams<__nv_bfloat16>& p, int32_t n_splits,
                                       int32_t min_chunks, cudaStream_t stream);

}  // namespace cellm::cuda::detail
