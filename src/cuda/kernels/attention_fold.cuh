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
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/kernels/attention.h"

namespace cellm::cuda::detail {

inline constexpr int32_t kAttentionMaxSplits = 64;  // attention_num_splits() never exceeds it
inline constexpr int kFoldElemsPerThread = 4;       // outputs a folding thread merges at once
inline constexpr int kFoldChunksInFlight = 8;       // chunks whose partials it loads at once

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
  constexpr int kWarps = kBlockThreads / 32;
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
  float* s_w = scratch;                // [nh][active]: exp2(max - mx)
  float* s_sum = s_w + nh * active;    // [nh][active]: the chunks' sums
  float* s_inv = s_sum + nh * active;  // [nh]: 1 / the merged sum
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  // One warp per head: lanes take chunks, the max is a warp reduction (exact in any
  // order), the sum one lane's ascending chain (the order the combine kernel used).
  for (int h = warp; h < nh; h += kWarps) {
    const int64_t part0 = ws.part(r, h0 + h);
    float mx = -INFINITY;
    for (int32_t s = lane; s < active; s += 32) {
      const float m = __ldcg(ws.max + part0 + s);
      s_w[h * active + s] = m;
      s_sum[h * active + s] = __ldcg(ws.sum + part0 + s);
      mx = fmaxf(mx, m);
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

}  // namespace cellm::cuda::detail
