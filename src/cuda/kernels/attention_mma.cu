#include "cuda/kernels/attention_mma.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <utility>

#include "cuda/kernels/attention_fold.cuh"
#include "cuda/kernels/attention_span.cuh"
#include "cuda/kernels/attention_tile.cuh"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/mma.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "attention_mma.cu needs sm_80 or newer (bf16 mma.sync, cp.async, ldmatrix)"
#endif

namespace cellm::cuda::detail {

namespace {

// FlashDecoding with grouped-query heads on tensor cores. One block of W warps
// (W = 2, 4 or 8, below) per (row, chunk, kv head). The kv head's query heads (<= 16) are
// the M = 16 rows of mma.m16n8k16 (missing heads are zero rows whose results are
// dropped), so one key's K and V rows, read once, serve every head: per 16 keys and 128
// dims a warp issues 16 MMAs for the scores, 16 for P·V and ~40 instructions of
// softmax, against ~90 instructions per key of the CUDA-core kernel.
//
// Keys go in tiles of 16 positions; warp w takes tiles w, w + W, ... of the chunk and
// gathers each tile's K and V rows (cell = table[seq][pos], head_dim bf16 contiguous
// per row) into its own shared-memory stage with cp.async, two stages, so tile t + W
// loads while tile t is folded. Positions past the chunk load nothing: cp.async with
// source size 0 writes zeros (never a NaN of a stale or spare cell), and their scores
// are masked to -inf (weight exactly 0). Each warp keeps an online softmax (log2
// domain) per head row; the warps' (max, sum, acc) meet in shared memory at the end
// and go to `out` or the workspace, and the row's last block folds the workspace into
// `out`, as in the CUDA-core kernel.
//
// Before it waits for the kernels ahead of it (programmatic launch), a block reads
// what the step's host upload and earlier steps wrote: the row's position and table
// row, and, when AttentionParams::fresh_positions allows, the cells and K/V of its
// warps' first tiles (each tile wholly older than the step's writes). Its loads are
// then in flight while the RoPE/K/V-write kernel before it finishes.
//
// The fragments and the 16-key step of the online softmax: attention_tile.cuh.
//
// Shared memory: per warp and stage, K then V, [16 keys][head_dim + 8] bf16 (the
// padding: attention_tile.cuh). head_dim 128: 17 KB per warp, so 68 KB for a block of 4 warps
// (opt-in above 48 KB) and 3 blocks per SM, or 34 KB for 2 warps and 6 blocks per SM:
// 12 warps per SM either way (168 registers), but a launch of 512 (row, kv head) blocks
// fits 132 SMs in one wave of 2-warp blocks and needs 1.3 waves of 4-warp
// ones. A launch of no more blocks than SMs (a few rows) takes 8-warp blocks, 136 KB,
// one an SM (up to 255 registers: 205 used). The merge, then the fold, reuse the stages.
constexpr int kWarpsPerSm = 12;  // 168 registers a thread; head_dim 128's smem allows 12 too
constexpr int kStages = 2;
constexpr int kMaxGroup = 16;
// Tiles of its own a warp loads before the wait when they are settled, by head_dim: the
// second tile's latency then leaves the chain after the wait, but the loads a kernel
// queues before its wait delay the one it launched during (RoPE + K/V write). Two pay
// for head_dim 128 (8 KB a tile); for head_dim 64 the delay outweighs them.
template <int HD>
constexpr int kPrewaitTiles = HD >= 128 ? 2 : 1;

template <int HD>
constexpr int row_elems() {
  return HD + kKvRowPad;
}
template <int HD>
constexpr size_t stage_bytes() {  // K and V of one tile
  return sizeof(__nv_bfloat16) * 2 * kTileKeys * row_elems<HD>();
}
// The merge's acc rows are HD + 8 floats apart: a warp's float2 stores of C fragments
// (rows g = 0..7, columns 2q, 2q + 1) then fill each half-warp's 32 banks once (row g at
// bank 8 g) instead of all 8 rows at the same banks: 8-way conflicts, which took an 8-warp
// block ~1.7 us from its tiles to its stores (one row of 192 keys: 4.45 us, 3.81 padded).
template <int HD>
constexpr int acc_stride() {
  return HD + 8;
}
template <int HD, int W>
constexpr size_t merge_bytes() {  // acc [W][16][acc_stride], max and sum [W][16], f32
  return sizeof(float) * W * kMaxGroup * (acc_stride<HD>() + 2);
}
template <int HD, int W>
constexpr size_t smem_bytes() {
  const size_t pipeline = stage_bytes<HD>() * kStages * W;
  return pipeline > merge_bytes<HD, W>() ? pipeline : merge_bytes<HD, W>();
}
template <int HD, int W>
constexpr bool fold_fits() {  // the fold's scratch of the largest group and split count
  return smem_bytes<HD, W>() >= sizeof(float) * fold_scratch_floats(kMaxGroup, kAttentionMaxSplits);
}
// The cluster fold's partial sits after the merge region (the scratch reuses that region).
template <int HD, int W>
constexpr bool cluster_fold_fits() {
  return smem_bytes<HD, W>() >=
             merge_bytes<HD, W>() + sizeof(float) * cluster_partial_floats(kMaxGroup, HD) &&
         merge_bytes<HD, W>() >=
             sizeof(float) * fold_scratch_floats(kMaxGroup, kAttentionClusterSplits);
}

template <int HD, int W>
__global__ void __launch_bounds__(W * 32, kWarpsPerSm / W)
    attention_mma_kernel(const AttentionParams<__nv_bfloat16> p, const int32_t n_splits,
                         const int32_t min_chunks, const bool early, const bool cluster_fold) {
  using bf16 = __nv_bfloat16;
  constexpr int kThreads = W * 32;
  constexpr int KS = HD / 16;                        // k-steps of Q·Kᵀ
  constexpr int ND = HD / 8;                         // 8-dim column blocks of O
  constexpr int RE = row_elems<HD>();                // bf16 per shared K/V row
  constexpr int kChunksPerRow = HD / 8;              // 16-byte cp.async chunks per K/V row
  constexpr int kRowsPerPass = 32 / kChunksPerRow;   // rows a warp's 32 copies cover
  constexpr int kPasses = kTileKeys / kRowsPerPass;  // copies per lane per tile, K and V each
  static_assert(HD == 64 || HD == 128);
  static_assert(W == 2 || W == 4 || W == 8);
  static_assert(fold_fits<HD, W>());
  static_assert(cluster_fold_fits<HD, W>());
  extern __shared__ __align__(16) unsigned char smem[];

  // Before the wait (programmatic launch) only what the step's upload and earlier
  // steps wrote: positions, row_seq and the table's older entries, older K/V.
  const int64_t r = blockIdx.x;
  const int32_t split = static_cast<int32_t>(blockIdx.y);
  const RowSpan span = row_span(p.positions[r], p.window, n_splits, min_chunks, W * kTileKeys);
  // A split past the row (shorter than its chunk) has nothing to do, except in the
  // barriers of a cluster fold: it then runs through with no tile.
  const bool in_cluster = cluster_fold && span.active > 1;
  if (split >= span.active && !in_cluster) return;
  const int64_t begin = span.lo + int64_t{split} * span.chunk;
  const int64_t end = min(span.hi, begin + span.chunk);
  // Positions below `settled` were written before this launch's predecessors ran.
  const int64_t settled = p.fresh_positions > 0 ? span.hi - p.fresh_positions : span.lo;

  const int kv_head = static_cast<int>(blockIdx.z);
  const int group = static_cast<int>(p.n_heads / p.n_kv_heads);
  const int64_t h0 = int64_t{kv_head} * group;  // first query head
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4;
  const int q = lane % 4;

  const float q_scale = p.scale * kLog2e;  // scores in log2 units

  TileState<HD> st;  // the online softmax of head rows g and g + 8

  const int32_t* cells = p.table + int64_t{p.row_seq[r]} * p.table_stride;
  const int64_t cell_stride = p.n_kv_heads * HD;
  const bf16* k_base = p.k_pool + int64_t{kv_head} * HD;
  const bf16* v_base = p.v_pool + int64_t{kv_head} * HD;
  bf16* warp_smem = reinterpret_cast<bf16*>(smem) + warp * kStages * 2 * kTileKeys * RE;
  // Stage s of this warp: K rows at stage_k(s), V rows kTileKeys * RE further.
  auto stage_k = [&](int s) { return warp_smem + s * 2 * kTileKeys * RE; };

  // Lane l < 16 (and l - 16) holds the cell of position j0 + l % 16, -1 past `end`.
  auto cell_of = [&](int64_t j0) {
    const int64_t j = j0 + lane % 16;
    return j < end ? cells[j] : -1;
  };
  // Copies of lane l: row (key) pass * kRowsPerPass + l / kChunksPerRow, 16-byte
  // chunk l % kChunksPerRow, for K and V.
  const int copy_row = lane / kChunksPerRow;
  const int copy_col = (lane % kChunksPerRow) * 8;
  auto load_tile = [&](int32_t cell_lane, int s) {
    bf16* ks = stage_k(s);
    bf16* vs = ks + kTileKeys * RE;
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int key = pass * kRowsPerPass + copy_row;
      const int32_t cell = __shfl_sync(0xffffffffu, cell_lane, key);
      const bool ok = cell >= 0;
      const int64_t off = int64_t{ok ? cell : 0} * cell_stride + copy_col;
      cp_async16(ks + key * RE + copy_col, k_base + off, ok);
      cp_async16(vs + key * RE + copy_col, v_base + off, ok);
    }
  };

  const int k_lane_off = k_lane_offset(lane, RE);
  const int v_lane_off = v_lane_offset(lane, RE);

  const int64_t n_tiles = (end - begin + kTileKeys - 1) / kTileKeys;
  // t is the same for the whole warp: the loop and its shuffles stay converged.
  int64_t t = warp;
  // Whether every position of tile u lies below `settled`: its cells and K/V may be
  // read before the wait.
  auto settled_tile = [&](int64_t u) { return min(end, begin + (u + 1) * kTileKeys) <= settled; };
  const bool first_early = t < n_tiles && settled_tile(t);
  if (first_early) load_tile(cell_of(begin + t * kTileKeys), 0);
  const bool next_early = t + W < n_tiles && settled_tile(t + W);
  int32_t next_cells = next_early ? cell_of(begin + (t + W) * kTileKeys) : -1;
  // With kPrewaitTiles 2 the warp's second tile, when it is settled too (then so is
  // the first), goes into stage 1 before the wait as well: its group is committed
  // right after the wait, and the loop's first round skips it.
  bool second_loaded = false;
  static_assert(kPrewaitTiles<HD> == 1 || kPrewaitTiles<HD> == 2);
  if constexpr (kPrewaitTiles<HD> >= 2) {
    if (next_early) {
      cp_async_commit();  // tile t's group
      load_tile(next_cells, 1);
      second_loaded = true;
    }
  }

  // Q, this step's K/V and table entries, and the workspace come from the kernels
  // ahead of this one.
  if (early) allow_dependent_grids();
  wait_for_prior_grids();
  if (!first_early && t < n_tiles) load_tile(cell_of(begin + t * kTileKeys), 0);
  cp_async_commit();  // tile t's group (or, second_loaded, tile t + W's)
  if (!next_early && t + W < n_tiles) next_cells = cell_of(begin + (t + W) * kTileKeys);

  // Q as A fragments for the whole block: rows g and g + 8 are heads h0 + g, h0 + g + 8
  // (zero past the group). Unscaled bf16 as stored; scores are scaled in f32.
  uint32_t qa[KS][4];
  {
    const bf16* q_row = p.qkv + r * p.row_stride + p.q_offset + h0 * HD;
    const bool lo_ok = g < group, hi_ok = g + 8 < group;
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
      const bf16* lo = q_row + int64_t{g} * HD + kk * 16 + 2 * q;
      const bf16* hi = lo + 8 * HD;
      qa[kk][0] = lo_ok ? *reinterpret_cast<const uint32_t*>(lo) : 0u;
      qa[kk][1] = hi_ok ? *reinterpret_cast<const uint32_t*>(hi) : 0u;
      qa[kk][2] = lo_ok ? *reinterpret_cast<const uint32_t*>(lo + 8) : 0u;
      qa[kk][3] = hi_ok ? *reinterpret_cast<const uint32_t*>(hi + 8) : 0u;
    }
  }
  for (int s = 0; t < n_tiles; t += W, s ^= 1) {
    // Start the warp's next tile, and the table read of the one after, before
    // waiting for this one. An empty group keeps the wait count uniform.
    if (second_loaded) {
      second_loaded = false;  // in flight since before the wait, its group committed
    } else {
      if (t + W < n_tiles) load_tile(next_cells, s ^ 1);
      cp_async_commit();
    }
    if (t + 2 * W < n_tiles) next_cells = cell_of(begin + (t + 2 * W) * kTileKeys);
    cp_async_wait<1>();
    __syncwarp();  // every lane's copies of this tile are visible to the warp

    const bf16* ks = stage_k(s);
    const bf16* vs = ks + kTileKeys * RE;
    // Key 8 nb + 2q + (c & 1) of the tile counts when it lies before `end`; the tile
    // holds at least one such position, so every head row's max is finite.
    const int64_t j0 = begin + t * kTileKeys;
    fold_tile<HD, false>(qa, ks, vs, k_lane_off, v_lane_off, q_scale, st,
                         [&](int nb, int c) { return j0 + nb * 8 + 2 * q + (c & 1) < end; });
    __syncwarp();  // the stage is read before the next iteration refills it
  }
  if (!early) allow_dependent_grids();
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the stages: reuse them for the merge

  // Shared memory: acc [W][16][AS], then max and sum [W][16]. A warp that
  // got no tile holds max -inf, sum 0, acc 0.
  float* s_acc = reinterpret_cast<float*>(smem);
  constexpr int AS = acc_stride<HD>();
  float* s_max = s_acc + W * kMaxGroup * AS;
  float* s_sum = s_max + W * kMaxGroup;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = warp * kMaxGroup + g + 8 * i;
    const float sum = quad_sum(st.l[i]);
    if (q == 0) {
      s_max[row] = st.m[i];
      s_sum[row] = sum;
    }
#pragma unroll
    for (int nd = 0; nd < ND; ++nd) {
      float2* dst = reinterpret_cast<float2*>(s_acc + row * AS + nd * 8 + 2 * q);
      *dst = make_float2(st.o[nd][2 * i], st.o[nd][2 * i + 1]);
    }
  }
  __syncthreads();

  // Warp 0 of a split within the row saw position `begin`, so each head's merged max is
  // finite (a cluster's block past the row merges nothing and stores nothing).
  const SplitWorkspace ws(p.workspace, p.n_rows, p.n_heads, HD, n_splits);
  float* c_part = s_sum + W * kMaxGroup;  // cluster fold: max, sum [16], acc [16][HD]
  for (int o_idx = static_cast<int>(threadIdx.x); o_idx < group * HD; o_idx += kThreads) {
    const int h = o_idx / HD;
    const int d = o_idx % HD;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < W; ++w) mx = fmaxf(mx, s_max[w * kMaxGroup + h]);
    float sum = 0.f, a = 0.f;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      const float mw = s_max[w * kMaxGroup + h];
      const float wt = mw == -INFINITY ? 0.f : exp2f(mw - mx);
      sum = fmaf(wt, s_sum[w * kMaxGroup + h], sum);
      a = fmaf(wt, s_acc[(w * kMaxGroup + h) * AS + d], a);
    }
    if (span.active == 1) {
      p.out[(r * p.n_heads + h0 + h) * HD + d] = from_float<bf16>(a / sum);
    } else if (in_cluster) {
      if (split < span.active) {
        c_part[2 * kMaxGroup + o_idx] = a;
        if (d == 0) {
          c_part[h] = mx;
          c_part[kMaxGroup + h] = sum;
        }
      }
    } else {
      ws.store(r, h0 + h, split, d, a, mx, sum);
    }
  }
  if (span.active == 1) return;
  // The merge region is free once every thread passed the fold's barrier.
  if (in_cluster) {
    fold_in_cluster<bf16, W * 32>(c_part, kMaxGroup, HD, group, span.active,
                                  reinterpret_cast<float*>(smem),
                                  p.out + (r * p.n_heads + h0) * HD);
  } else {
    fold_if_last<bf16, W * 32>(ws, ws.counters + r * p.n_kv_heads + kv_head, span.active, r, h0,
                               group, reinterpret_cast<float*>(smem), p.out);
  }
}

template <int HD, int W>
cudaError_t set_smem() {
  constexpr size_t bytes = smem_bytes<HD, W>();
  // Above 48 KB a kernel must opt in; not a stream operation, so capture-safe.
  if constexpr (bytes > 48 * 1024) {
    return cudaFuncSetAttribute(attention_mma_kernel<HD, W>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(bytes));
  }
  return cudaSuccess;
}

// Launches with the cluster fold when `cluster` (each (row, kv head)'s n_splits blocks
// one cluster), else with the workspace's.
template <int HD, int W>
cudaError_t launch_mma(const AttentionParams<__nv_bfloat16>& p, int32_t n_splits,
                       int32_t min_chunks, bool cluster, cudaStream_t stream) {
  if (const cudaError_t err = set_smem<HD, W>(); err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(p.n_rows), static_cast<unsigned>(n_splits),
                  static_cast<unsigned>(p.n_kv_heads));
  const dim3 cluster_dims(1, cluster ? static_cast<unsigned>(n_splits) : 1u, 1);
  return launch_kernel_in_clusters(attention_mma_kernel<HD, W>, grid, dim3(W * 32),
                                   smem_bytes<HD, W>(), stream, cluster_dims, p, n_splits,
                                   min_chunks, early_triggers(), cluster);
}

template <int HD>
cudaError_t launch_mma_warps(const AttentionParams<__nv_bfloat16>& p, int32_t n_splits,
                             int32_t min_chunks, int warps, bool cluster, cudaStream_t stream) {
  if (warps == 2) return launch_mma<HD, 2>(p, n_splits, min_chunks, cluster, stream);
  if (warps == 8) return launch_mma<HD, 8>(p, n_splits, min_chunks, cluster, stream);
  return launch_mma<HD, 4>(p, n_splits, min_chunks, cluster, stream);
}

// How many clusters of `splits` 8-warp blocks of the head_dim HD kernel the device
// holds at once (clusters stay inside a GPC: fewer than SMs / splits), once per device
// and split count (not a stream operation: capture-safe); 0 where clusters cannot launch.
template <int HD>
int max_clusters_of(int device, int32_t splits) {
  static std::mutex mutex;
  static std::map<std::pair<int, int32_t>, int> known;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(device, splits);
  if (const auto it = known.find(key); it != known.end()) return it->second;
  int clusters = 0;
  int can_launch = 0;
  if (cudaDeviceGetAttribute(&can_launch, cudaDevAttrClusterLaunch, device) == cudaSuccess &&
      can_launch != 0 && set_smem<HD, 8>() == cudaSuccess) {
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(1, static_cast<unsigned>(splits));
    config.blockDim = dim3(8 * 32);
    config.dynamicSmemBytes = smem_bytes<HD, 8>();
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = 1;
    attribute.val.clusterDim.y = static_cast<unsigned>(splits);
    attribute.val.clusterDim.z = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
    if (cudaOccupancyMaxActiveClusters(&clusters, attention_mma_kernel<HD, 8>, &config) !=
        cudaSuccess) {
      clusters = 0;
    }
  }
  cudaGetLastError();  // a refused query leaves no sticky error behind
  known.emplace(key, clusters);
  return clusters;
}

}  // namespace

int32_t attention_mma_cluster_splits(int64_t n_rows, int32_t n_splits, int64_t n_kv_heads,
                                     int sm_count, int max_clusters) {
  if (n_splits <= 1) return 0;
  const int32_t splits = std::min(n_splits, kAttentionClusterSplits);
  if (attention_mma_block_warps(n_rows, splits, n_kv_heads, sm_count) != 8) return 0;
  return n_rows * n_kv_heads <= max_clusters ? splits : 0;
}

int attention_mma_block_warps(int64_t n_rows, int32_t n_splits, int64_t n_kv_heads, int sm_count) {
  // 2-warp blocks when a launch that does not split overflows one wave of 4-warp blocks
  // but fits one wave of 2-warp ones (the same warps per SM, in units half as large):
  // 64 rows x 8 kv heads on 132 SMs, 512 blocks, take 18 us at 192 keys
  // instead of 21 (bench/attention_bench). A launch that splits cut its rows to reach
  // its target blocks, and its chunks are often fewer than its splits; there, and
  // beyond one wave, 4-warp blocks measured faster.
  // 8-warp blocks when every block has an SM of its own (a few rows: one row is 8 blocks
  // over 8 kv heads, or its splits): each warp then walks half the tiles of a 4-warp
  // block's, and the latency of a short row's chain of tile loads halves.
  const int64_t blocks = n_rows * n_splits * n_kv_heads;
  if (blocks <= sm_count) return 8;
  const int64_t wave4 = int64_t{kWarpsPerSm / 4} * sm_count;
  const int64_t wave2 = int64_t{kWarpsPerSm / 2} * sm_count;
  return n_splits == 1 && blocks > wave4 && blocks <= wave2 ? 2 : 4;
}

cudaError_t launch_attention_split_mma(const AttentionParams<__nv_bfloat16>& p, int32_t n_splits,
                                       int32_t min_chunks, cudaStream_t stream) {
  if (p.n_kv_heads > 65535 || p.n_heads / p.n_kv_heads > kMaxGroup) return cudaErrorInvalidValue;
  if (p.block_warps != 0 && p.block_warps != 2 && p.block_warps != 4 && p.block_warps != 8) {
    return cudaErrorInvalidValue;
  }
  if (p.head_dim != 64 && p.head_dim != 128) return cudaErrorInvalidValue;
  int device = 0, sm_count = 0;
  if (const cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  if (const cudaError_t err =
          cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device);
      err != cudaSuccess) {
    return err;
  }
  // The cluster fold, where the launch allows it: n_splits (and the chunks a row takes
  // at least) come down to the cluster's blocks.
  int32_t cluster = 0;
  if (p.cluster_fold && (p.block_warps == 0 || p.block_warps == 8) && n_splits > 1) {
    const int32_t splits = std::min(n_splits, kAttentionClusterSplits);
    const int max_clusters = p.head_dim == 64 ? max_clusters_of<64>(device, splits)
                                              : max_clusters_of<128>(device, splits);
    cluster =
        attention_mma_cluster_splits(p.n_rows, n_splits, p.n_kv_heads, sm_count, max_clusters);
  }
  if (cluster > 0) {
    n_splits = cluster;
    min_chunks = std::min(min_chunks, cluster);
  }
  const int warps = cluster > 0 ? 8
                    : p.block_warps != 0
                        ? p.block_warps
                        : attention_mma_block_warps(p.n_rows, n_splits, p.n_kv_heads, sm_count);
  return p.head_dim == 64
             ? launch_mma_warps<64>(p, n_splits, min_chunks, warps, cluster > 0, stream)
             : launch_mma_warps<128>(p, n_splits, min_chunks, warps, cluster > 0, stream);
}

}  // namespace cellm::cuda::detail
