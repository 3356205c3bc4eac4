// The split workspace of launch_attention and the fold of a row's chunks (included by
// the attention*.cu files only): the CUDA-core and the tensor-core split kernels write
// the same partials in the same layout, and the block that finishes last among a
// row's chunks merges them, so both share this one layout and this one merge.
//
// Workspace (attention.h states the public contract), for a launch of n rows with S
// splits:
//   counters  int32 [kAttentionWorkspaceCounters] at byte 0: the arrival count of each
//             fold group (row, kv head, head tile), zero between launches
//   acc       f32 [n, n_heads, S, head_dim], after the counters
//   max       f32 [n, n_heads, S], log2 units
//   sum       f32 [n, n_heads, S]
// The counters sit at a fixed place, apart from the partials whose offsets depend on
// n and S, so no launch of any size ever writes a partial over another size's counter.
//
// The fold ("serial split-K"): every block of a row with `active` > 1 chunks writes its
// partials, fences, and counts itself in with one atomicAdd on its group's counter; the
// block that counts `active` (all the others are then done) fences again, reads every
// chunk's partials through L2, merges them into `out` and sets the counter back to 0.
// The tensor-core kernel's cluster fold (fold_in_cluster, below) merges the same way
// from the blocks' shared memory instead, when a row's chunks are one cluster.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/kernels/attention.h"

namespace cellm::cuda::detail {

inline constexpr int32_t kAttentionMaxSplits = 64;  // attention_num_splits() never exceeds it
inline constexpr int kFoldElemsPerThread = 4;       // outputs a folding thread merges at once
inline constexpr int kFoldChunksInFlight = 8;       // chunks whose partials it loads at once
// The most chunks of a row the cluster fold merges: a portable thread-block cluster.
inline constexpr int32_t kAttentionClusterSplits = 8;

template <typename T>
__device__ __forceinline__ T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return __float2bfloat16(x);  // round to nearest even
  }
}

// f32 of shared-memory scratch the fold of `heads` query heads over `n_splits`
// splits needs: weights and sums [heads][n_splits], then 1 / sum [heads].
__host__ __device__ constexpr int64_t fold_scratch_floats(int64_t heads, int64_t n_splits) {
  return heads * (2 * n_splits + 1);
}

// The workspace of one launch, carved as above.
struct SplitWorkspace {
  int32_t* counters;
  float* acc;
  float* max;
  float* sum;
  int64_t n_heads, head_dim;
  int32_t n_splits;

  __device__ __forceinline__ SplitWorkspace(float* workspace, int64_t n_rows, int64_t n_heads_,
                                            int64_t head_dim_, int32_t n_splits_)
      : counters(reinterpret_cast<int32_t*>(workspace)),
        acc(workspace + kAttentionWorkspaceCounters),
        max(acc + n_rows * n_heads_ * n_splits_ * head_dim_),
        sum(max + n_rows * n_heads_ * n_splits_),
        n_heads(n_heads_),
        head_dim(head_dim_),
        n_splits(n_splits_) {}

  // Index of (row r, query head `head`, chunk 0) in max and sum; chunk s is s further,
  // and its acc row starts at head_dim times that.
  __device__ __forceinline__ int64_t part(int64_t r, int64_t head) const {
    return (r * n_heads + head) * n_splits;
  }

  // The partial of chunk `split` of (r, head) at element d: acc always, max and sum
  // once per head (d == 0).
  __device__ __forceinline__ void store(int64_t r, int64_t head, int32_t split, int64_t d, float a,
                                        float mx, float l) const {
    const int64_t at = part(r, head) + split;
    acc[at * head_dim + d] = a;
    if (d == 0) {
      max[at] = mx;
      sum[at] = l;
    }
  }
};

// The merge's weights, shared by both folds: per head h < nh, one warp, lanes taking
// chunks: mx = max_s max[s] (a warp reduction, exact in any order), w_s = exp2(max[s] -
// mx) into scratch[h * active + s], and 1 / (fma over s ascending of w_s * sum[s]) (one
// lane's chain: the order the combine kernel used) into scratch[2 * nh * active + h].
// `max_sum(h, s)` loads chunk s's (max, sum) of head h. Ends with the block's barrier.
template <int kBlockThreads, typename MaxSum>
__device__ __forceinline__ void fold_weights(int nh, int32_t active, float* scratch,
                                             MaxSum max_sum) {
  constexpr int kWarps = kBlockThreads / 32;
  float* s_w = scratch;                // [nh][active]: exp2(max - mx)
  float* s_sum = s_w + nh * active;    // [nh][active]: the chunks' sums
  float* s_inv = s_sum + nh * active;  // [nh]: 1 / the merged sum
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  for (int h = warp; h < nh; h += kWarps) {
    float mx = -INFINITY;
    for (int32_t s = lane; s < active; s += 32) {
      const float2 ms = max_sum(h, s);
      s_w[h * active + s] = ms.x;
      s_sum[h * active + s] = ms.y;
      mx = fmaxf(mx, ms.x);
    }
    for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    for (int32_t s = lane; s < active; s += 32) {
      s_w[h * active + s] = exp2f(s_w[h * active + s] - mx);
    }
    __syncwarp();
    if (lane == 0) {
      float sum = 0.f;
      for (int32_t s = 0; s < active; ++s) {
        sum = fmaf(s_w[h * active + s], s_sum[h * active + s], sum);
      }
      s_inv[h] = 1.f / sum;
    }
  }
  __syncthreads();
}

// Called by every thread of a split block of row r (uniformly: all or none), after
// the block stored its partials for query heads [h0, h0 + nh) of the row's `active`
// (> 1) chunks; `counter` is the fold group's. Returns at once in every block but the
// last to arrive, which writes out[r, h0 .. h0 + nh) ([n_rows, n_heads * head_dim]) and
// zeroes the counter. The merge is the old combine kernel's, operation for operation:
// per head mx = max_s max[s]; w_s = exp2(max[s] - mx); sum = fma over s ascending of
// w_s * sum[s]; out = (fma over s ascending of w_s * acc[s]) * (1 / sum).
// `scratch`: fold_scratch_floats(nh, active) floats of shared memory that the block no
// longer reads (it may alias what the partials were merged from: the block syncs first).
template <typename T, int kBlockThreads>
__device__ __forceinline__ void fold_if_last(const SplitWorkspace& ws, int32_t* counter,
                                             int32_t active, int64_t r, int64_t h0, int nh,
                                             float* scratch, T* out) {
  static_assert(kBlockThreads % 32 == 0);
  constexpr int E = kFoldElemsPerThread;
  __shared__ int s_last;

  // Release: each thread's partials are visible device-wide before the block counts
  // itself in (the barrier orders every thread's fence before thread 0's atomic).
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int32_t arrived = atomicAdd(counter, 1);
    const bool last = arrived == active - 1;
    // Every other block of the group has counted in: nobody else touches the counter
    // in this launch, and the next launch reads it only after this one completes.
    if (last) *counter = 0;
    s_last = last;
  }
  __syncthreads();
  if (!s_last) return;
  // Acquire: the other blocks' partials (fenced before their atomics, which precede
  // ours) are read after this fence, and through L2 (__ldcg): L1 is not coherent.
  __threadfence();

  const int64_t hd = ws.head_dim;
  const float* s_w = scratch;
  const float* s_inv = scratch + 2 * nh * active;
  fold_weights<kBlockThreads>(nh, active, scratch, [&](int h, int32_t s) {
    const int64_t at = ws.part(r, h0 + h) + s;
    return float2{__ldcg(ws.max + at), __ldcg(ws.sum + at)};
  });

  // Outputs o = h * head_dim + d, E per thread at a time so their loads overlap.
  const int64_t n_out = int64_t{nh} * hd;
  for (int64_t o0 = threadIdx.x; o0 < n_out; o0 += int64_t{E} * kBlockThreads) {
    int h[E];
    int64_t d[E];
    const float* src[E];
    float a[E];
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int64_t o = min(o0 + int64_t{e} * kBlockThreads, n_out - 1);  // clamped: in range
      h[e] = static_cast<int>(o / hd);
      d[e] = o % hd;
      src[e] = ws.acc + ws.part(r, h0 + h[e]) * hd + d[e];
      a[e] = 0.f;
    }
    // kFoldChunksInFlight chunks' loads are issued before their FMAs, which keep the
    // ascending order: one L2 round trip per that many chunks instead of one per chunk.
    constexpr int U = kFoldChunksInFlight;
    for (int32_t s0 = 0; s0 < active; s0 += U) {
      float v[U][E];
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int e = 0; e < E; ++e) {
          v[u][e] = s0 + u < active ? __ldcg(src[e] + int64_t{s0 + u} * hd) : 0.f;
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (s0 + u < active) {
#pragma unroll
          for (int e = 0; e < E; ++e) a[e] = fmaf(s_w[h[e] * active + s0 + u], v[u][e], a[e]);
        }
      }
    }
#pragma unroll
    for (int e = 0; e < E; ++e) {
      if (o0 + int64_t{e} * kBlockThreads < n_out) {
        out[(r * ws.n_heads + h0 + h[e]) * hd + d[e]] = from_float<T>(a[e] * s_inv[h[e]]);
      }
    }
  }
}

// f32 of shared memory a block's partial takes in the cluster fold, for up to
// `heads` query heads: max and sum [heads], then acc [heads][head_dim].
__host__ __device__ constexpr int64_t cluster_partial_floats(int64_t heads, int64_t head_dim) {
  return heads * (head_dim + 2);
}

// The fold without the workspace, for a launch whose blocks of a (row, kv head) are one
// thread-block cluster along its splits (rank = split, at most kAttentionClusterSplits;
// sm_90): every block of the cluster calls it (uniformly, all its threads; blocks past
// the row's `active` > 1 chunks too), after writing its partial of query heads [h0, h0 +
// nh) into `partial` (its own shared memory: max [max_heads], sum [max_heads], acc
// [max_heads][head_dim]; a block past the row writes nothing). After the cluster's
// barrier each block merges its share of the row's nh * head_dim outputs, reading the
// chunks' partials from their blocks' shared memory, with the same operations in the
// same order as fold_if_last (the same bits), into out (the row's output of head h0);
// a second barrier keeps every block's shared memory alive until the others have read
// it. `scratch`: fold_scratch_floats(nh, active) floats of shared memory apart from
// `partial`. No fence, no counter, no L2 round trip: DSMEM loads (~200 cycles) instead.
template <typename T, int kBlockThreads>
__device__ __forceinline__ void fold_in_cluster(float* partial, int max_heads, int64_t head_dim,
                                                int nh, int32_t active, float* scratch, T* out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  constexpr int C = kAttentionClusterSplits;
  const cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // release / acquire: every chunk's partial is in its block's memory
  const float* part[C];
#pragma unroll
  for (int s = 0; s < C; ++s) {
    part[s] = s < active ? cluster.map_shared_rank(partial, static_cast<unsigned>(s)) : partial;
  }
  const float* s_w = scratch;
  const float* s_inv = scratch + 2 * nh * active;
  fold_weights<kBlockThreads>(nh, active, scratch, [&](int h, int32_t s) {
    const float* p = part[0];
#pragma unroll
    for (int c = 1; c < C; ++c) p = s == c ? part[c] : p;
    return float2{p[h], p[max_heads + h]};
  });

  // This block's share of the outputs o = h * head_dim + d: every chunk's load issued
  // before the first FMA, the FMAs in ascending order.
  const int64_t n_out = int64_t{nh} * head_dim;
  const int64_t share = (n_out + cluster.num_blocks() - 1) / cluster.num_blocks();
  const int64_t begin = int64_t{cluster.block_rank()} * share;
  const int64_t end = min(n_out, begin + share);
  const int64_t acc_at = 2 * int64_t{max_heads};
  for (int64_t o = begin + threadIdx.x; o < end; o += kBlockThreads) {
    const int h = static_cast<int>(o / head_dim);
    float v[C];
#pragma unroll
    for (int s = 0; s < C; ++s) v[s] = s < active ? part[s][acc_at + o] : 0.f;
    float a = 0.f;
#pragma unroll
    for (int s = 0; s < C; ++s) {
      if (s < active) a = fmaf(s_w[h * active + s], v[s], a);
    }
    out[o] = from_float<T>(a * s_inv[h]);
  }
  cluster.sync();  // no block leaves while another may still read its shared memory
#else
  (void)partial, (void)max_heads, (void)head_dim, (void)nh, (void)active, (void)scratch, (void)out;
  __trap();  // launch_attention_split_mma launches clusters on sm_90 and newer only
#endif
}

}  // namespace cellm::cuda::detail
