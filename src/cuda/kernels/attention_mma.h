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

#ifdef CELLM_ATTENTION_PHASES
// An experiment's instrument (built with -DCELLM_ATTENTION_PHASES=1; bench/attention_bench
// prints it): thread 0 of every block of the tensor-core kernel records where its time
// went, into a device table of kAttentionPhaseBlocks rows indexed by the block's linear
// id (blocks past it record nothing). Launches overwrite each other's rows: read them
// after a launch that ran alone.
inline constexpr int kAttentionPhaseBlocks = 4096;
struct AttentionPhases {
  // clock64() of the block's SM: at entry, after the wait for the kernels ahead, after
  // the tile loop (every warp's tiles folded), after thread 0's share of the output or
  // partials is stored, and after the fold (for the row's last block: the merge; for the others:
  // the arrival count). 0 where the block did not get there (a split past the row).
  long long entry, waited, tiles, stored, folded;
  long long start_ns, end_ns;  // %globaltimer at entry and at the end
  int32_t row, split, kv_head, active;
};
// Copies the first `blocks` rows of the table (every field 0 for a block that never ran
// since the last reset) and then zeroes them.
cudaError_t read_attention_phases(AttentionPhases* host, int blocks);
#endif

}  // namespace cellm::cuda::detail
