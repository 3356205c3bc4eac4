// The tensor-core kernels of launch_attention (internal to the attention launcher; see
// attention.h for the contract, attention_mma.cu and attention_prefill.cu for the designs).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels/attention.h"

namespace cellm::cuda::detail {

// Enqueues the split kernel of `p` with n_splits = attention_num_splits(p's shape),
// with programmatic dependent launch: it writes `out` for rows of one chunk and the
// workspace partials of the others, which the last block of each (row, kv head) folds
// into `out`, exactly as the CUDA-core split kernel does; or, for a few rows
// (attention_mma_cluster_splits), at most 8 splits whose blocks fold in a cluster.
// REQUIRES: p passed launch_attention's checks and attention_uses_tensor_cores(p).
// Warps per block (2, 4 or 8) of the tensor-core kernel when AttentionParams::block_warps
// is 0, for a launch of n_rows x n_splits x n_kv_heads blocks on `sm_count` SMs.
int attention_mma_block_warps(int64_t n_rows, int32_t n_splits, int64_t n_kv_heads, int sm_count);
// The split count of a launch of n_rows x n_splits x n_kv_heads blocks that folds in
// clusters (AttentionParams::cluster_fold): min(n_splits, 8) when that launch's blocks
// are 8-warp ones (each an SM of its own) and its n_rows x n_kv_heads clusters all fit
// at once (`max_clusters`, cudaOccupancyMaxActiveClusters); 0 = the workspace's fold.
int32_t attention_mma_cluster_splits(int64_t n_rows, int32_t n_splits, int64_t n_kv_heads,
                                     int sm_count, int max_clusters);

cudaError_t launch_attention_split_mma(const AttentionParams<__nv_bfloat16>& p, int32_t n_splits,
                                       int32_t min_chunks, cudaStream_t stream);

// The prefill kernel (attention_prefill.cu) takes kv heads of 1, 2, 4, 8 or 16 query
// heads (16 / group rows of a block's warp).
bool attention_prefill_takes_group(int64_t group);
// Enqueues the prefill kernel of `p` (AttentionParams::row_runs), with programmatic
// dependent launch: one block per 64 / group consecutive rows and kv head, no split, no
// workspace. REQUIRES: p passed launch_attention's checks, attention_uses_tensor_cores(p)
// and attention_prefill_takes_group(its group).
cudaError_t launch_attention_prefill_mma(const AttentionParams<__nv_bfloat16>& p,
                                         cudaStream_t stream);

}  // namespace cellm::cuda::detail
