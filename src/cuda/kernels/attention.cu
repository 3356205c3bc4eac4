#include "cuda/kernels/attention.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <type_traits>

#include "cuda/kernels/attention_fold.cuh"
#include "cuda/kernels/attention_mma.h"
#include "cuda/kernels/attention_span.cuh"
#include "cuda/kernels/launch.cuh"

namespace cellm::cuda {
namespace {

using detail::from_float;
using detail::kAttentionMaxSplits;
using detail::kLog2e;
using detail::row_span;
using detail::RowSpan;
using detail::SplitWorkspace;

constexpr int kThreads = 128;       // threads of every attention block
constexpr int kMinBlocksPerSm = 4;  // 16 warps per SM (128 registers): measured faster than 3
constexpr int kWarp = 32;
constexpr int kMaxTensorCoreGroup = 16;  // query heads per kv head the mma kernel takes
constexpr int kMaxHeadsPerBlock = 8;     // query heads of one kv head folded by one block
constexpr int kMaxElemsPerLane = 8;      // head_dim elements a lane holds per head
constexpr int kKeysPerSlot = 4;          // keys a slot loads before it folds any of them
constexpr int32_t kMinSplitTokens = 32;  // the budget gives at most one split per this many
// A launch splits only while it has fewer than its target blocks per split, so its
// (row, kv head, head tile) fold groups fit the workspace's counters.
static_assert(kAttentionTargetBlocks <= kAttentionWorkspaceCounters);

// How a launch cuts the work; computed once on the host.
struct Geometry {
  int32_t n_splits = 1;       // blocks along a row's context (its chunks are cut on the device)
  int32_t min_chunks = 1;     // attention_min_chunks: the least chunks of a long row
  int32_t group = 1;          // query heads per kv head
  int32_t head_tiles = 1;     // blocks per kv head: ceil(group / heads per block)
  int32_t lanes_per_key = 1;  // power of two <= 32: lanes that share one key's dot product
  int32_t n_vecs = 0;         // head_dim / elements per vector
  bool early = false;         // trigger before the wait (launch.cuh: early triggers)
};

__device__ __forceinline__ float to_float(float x) {
  return x;
}
__device__ __forceinline__ float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

// VEC elements of T as loaded from memory, still packed: a 16-byte vector when
// VEC > 1 (8 bf16 or 4 f32), else one element. Keys and values stay packed until
// they are used, which halves the registers a batch of bf16 rows holds.
template <typename T, int VEC>
struct RawVec {
  using type = std::conditional_t<(VEC > 1), uint4, T>;
};
template <typename T, int VEC>
using Raw = typename RawVec<T, VEC>::type;

// The VEC elements at p, packed; p is 16-byte aligned when VEC > 1.
template <typename T, int VEC>
__device__ __forceinline__ Raw<T, VEC> load_raw(const T* p) {
  if constexpr (VEC == 1) {
    return *p;
  } else {
    static_assert(VEC * sizeof(T) == 16);
    return __ldg(reinterpret_cast<const uint4*>(p));
  }
}

// out = the packed elements as floats.
template <typename T, int VEC>
__device__ __forceinline__ void unpack(const Raw<T, VEC>& raw, float (&out)[VEC]) {
  if constexpr (VEC == 1) {
    out[0] = to_float(raw);
  } else {
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
    if constexpr (std::is_same_v<T, float>) {
#pragma unroll
      for (int i = 0; i < 4; ++i) out[i] = __uint_as_float(words[i]);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        // bf16 -> f32 is exact: the 16 bits become the high half of the float.
        out[2 * i] = __uint_as_float(words[i] << 16);
        out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
      }
    }
  }
}

// out = the VEC elements at p as floats; p is 16-byte aligned when VEC > 1.
template <typename T, int VEC>
__device__ __forceinline__ void load_vec(const T* p, float (&out)[VEC]) {
  unpack<T, VEC>(load_raw<T, VEC>(p), out);
}

// One block per (row, split, kv head x head tile). Lanes work in groups of
// lanes_per_key; each group ("slot") takes kKeysPerSlot positions of every
// n_slots * kKeysPerSlot run of the chunk, loads all their key and value rows
// through the table before it uses any (so a slot keeps that many row loads in
// flight), and folds them into an online softmax (log2 domain) per query head
// with one rescale per batch of keys. The table entries of the next batch are
// loaded while the current one is folded. The slots' states are merged in shared
// memory; the result goes to `out` (when the row has one chunk) or to the
// workspace, and the last of the row's blocks to finish folds the workspace into
// `out`. Lane li of a group holds vectors li, li + lanes_per_key, ... of each head
// row.
template <typename T, int VEC, int HT>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    attention_split_kernel(const AttentionParams<T> p, const Geometry g) {
  constexpr int NV = kMaxElemsPerLane / VEC;
  constexpr int U = kKeysPerSlot;
  extern __shared__ float smem[];

  // Every buffer comes from earlier kernels of the stream (programmatic launch).
  if (g.early) detail::allow_dependent_grids();
  detail::wait_for_prior_grids();
  const int64_t r = blockIdx.x;
  const int32_t split = static_cast<int32_t>(blockIdx.y);
  const RowSpan span = row_span(p.positions[r], p.window, g.n_splits, g.min_chunks);
  if (split >= span.active) return;  // the row is shorter than this split's chunk
  const int64_t begin = span.lo + int64_t{split} * span.chunk;
  const int64_t end = min(span.hi, begin + span.chunk);

  const int64_t hd = p.head_dim;
  const int kv_head = static_cast<int>(blockIdx.z) / g.head_tiles;
  const int tile = static_cast<int>(blockIdx.z) % g.head_tiles;
  const int64_t h0 = int64_t{kv_head} * g.group + int64_t{tile} * HT;  // first query head
  const int nh = min(HT, g.group - tile * HT);
  const int lpk = g.lanes_per_key;
  const int li = static_cast<int>(threadIdx.x) % lpk;
  const int slot = static_cast<int>(threadIdx.x) / lpk;
  const int n_slots = kThreads / lpk;

  // Queries, pre-scaled so that scores come out in log2 units.
  const float q_scale = p.scale * kLog2e;
  const T* q_row = p.qkv + r * p.row_stride + p.q_offset + h0 * hd;
  float q[HT][NV][VEC];
#pragma unroll
  for (int h = 0; h < HT; ++h) {
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int vi = li + k * lpk;
      if (h < nh && vi < g.n_vecs) {
        load_vec<T, VEC>(q_row + h * hd + vi * VEC, q[h][k]);
#pragma unroll
        for (int e = 0; e < VEC; ++e) q[h][k][e] *= q_scale;
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) q[h][k][e] = 0.f;
      }
    }
  }

  float m[HT], l[HT], acc[HT][NV][VEC];
#pragma unroll
  for (int h = 0; h < HT; ++h) {
    m[h] = -INFINITY;
    l[h] = 0.f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) acc[h][k][e] = 0.f;
    }
  }

  const int32_t* cells = p.table + int64_t{p.row_seq[r]} * p.table_stride;
  const int64_t cell_stride = p.n_kv_heads * hd;
  const T* k_base = p.k_pool + int64_t{kv_head} * hd;
  const T* v_base = p.v_pool + int64_t{kv_head} * hd;
  const int64_t batch = int64_t{n_slots} * U;  // positions the block folds per iteration
  // Key u of this slot in the batch starting at jb: jb + u * n_slots + slot.
  int32_t next_cell[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t j = begin + u * n_slots + slot;
    next_cell[u] = j < end ? cells[j] : -1;
  }
  // jb is the same for every thread, so the warp stays converged for the shuffles;
  // lanes past `end` compute on zeros and fold nothing.
  for (int64_t jb = begin; jb < end; jb += batch) {
    int32_t cell[U];
#pragma unroll
    for (int u = 0; u < U; ++u) cell[u] = next_cell[u];
    Raw<T, VEC> kr[U][NV], vr[U][NV];
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        const int vi = li + k * lpk;
        if (cell[u] >= 0 && vi < g.n_vecs) {
          kr[u][k] = load_raw<T, VEC>(k_base + int64_t{cell[u]} * cell_stride + vi * VEC);
          vr[u][k] = load_raw<T, VEC>(v_base + int64_t{cell[u]} * cell_stride + vi * VEC);
        } else {
          kr[u][k] = vr[u][k] = Raw<T, VEC>{};  // zeros: a finite dot, a zero weight
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t j = jb + batch + u * n_slots + slot;
      next_cell[u] = j < end ? cells[j] : -1;
    }
    // Scores of the batch: each key is unpacked once and dotted with every head.
    float sc[HT][U];
#pragma unroll
    for (int h = 0; h < HT; ++h) {
#pragma unroll
      for (int u = 0; u < U; ++u) sc[h][u] = 0.f;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        float kf[VEC];
        unpack<T, VEC>(kr[u][k], kf);
#pragma unroll
        for (int h = 0; h < HT; ++h) {
#pragma unroll
          for (int e = 0; e < VEC; ++e) sc[h][u] = fmaf(q[h][k][e], kf[e], sc[h][u]);
        }
      }
    }
    // Per head: sum the lanes' parts, then one rescale for the whole batch.
#pragma unroll
    for (int h = 0; h < HT; ++h) {
      float m_new = m[h];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        for (int off = lpk / 2; off > 0; off /= 2) {
          sc[h][u] += __shfl_xor_sync(0xffffffffu, sc[h][u], off);
        }
        sc[h][u] = cell[u] >= 0 ? sc[h][u] : -INFINITY;
        m_new = fmaxf(m_new, sc[h][u]);
      }
      // While the slot has seen no key m_new is -inf: nothing to fold or rescale.
      const bool any = m_new != -INFINITY;
      const float correction = any ? exp2f(m[h] - m_new) : 1.f;  // 0 while m[h] is -inf
      m[h] = m_new;
      l[h] *= correction;
#pragma unroll
      for (int k = 0; k < NV; ++k) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[h][k][e] *= correction;
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        sc[h][u] = any ? exp2f(sc[h][u] - m_new) : 0.f;  // the weight; 0 past `end`
        l[h] += sc[h][u];
      }
    }
    // Values: each is unpacked once and added to every head with its weight.
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        float vf[VEC];
        unpack<T, VEC>(vr[u][k], vf);
#pragma unroll
        for (int h = 0; h < HT; ++h) {
#pragma unroll
          for (int e = 0; e < VEC; ++e) acc[h][k][e] = fmaf(sc[h][u], vf[e], acc[h][k][e]);
        }
      }
    }
  }
  if (!g.early) detail::allow_dependent_grids();

  // Shared memory: acc [n_slots][HT][head_dim], then max and sum [n_slots][HT].
  float* s_acc = smem;
  float* s_max = s_acc + int64_t{n_slots} * HT * hd;
  float* s_sum = s_max + n_slots * HT;
#pragma unroll
  for (int h = 0; h < HT; ++h) {
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int vi = li + k * lpk;
      if (vi < g.n_vecs) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) s_acc[(slot * HT + h) * hd + vi * VEC + e] = acc[h][k][e];
      }
    }
    if (li == 0) {
      s_max[slot * HT + h] = m[h];
      s_sum[slot * HT + h] = l[h];
    }
  }
  __syncthreads();

  // Slot 0 always saw position `begin`, so each head's merged max is finite.
  const SplitWorkspace ws(p.workspace, p.n_rows, p.n_heads, hd, g.n_splits);
  for (int64_t o = threadIdx.x; o < nh * hd; o += kThreads) {
    const int h = static_cast<int>(o / hd);
    const int64_t d = o % hd;
    float mx = -INFINITY;
    for (int s = 0; s < n_slots; ++s) mx = fmaxf(mx, s_max[s * HT + h]);
    float sum = 0.f, a = 0.f;
    for (int s = 0; s < n_slots; ++s) {
      const float ms = s_max[s * HT + h];
      const float w = ms == -INFINITY ? 0.f : exp2f(ms - mx);
      sum = fmaf(w, s_sum[s * HT + h], sum);
      a = fmaf(w, s_acc[(s * HT + h) * hd + d], a);
    }
    if (span.active == 1) {
      p.out[(r * p.n_heads + h0 + h) * hd + d] = from_float<T>(a / sum);
    } else {
      ws.store(r, h0 + h, split, d, a, mx, sum);
    }
  }
  if (span.active == 1) return;
  // The merge region is free once every thread passed the fold's barrier.
  detail::fold_if_last<T, kThreads>(ws,
                                    ws.counters + r * (p.n_kv_heads * g.head_tiles) + blockIdx.z,
                                    span.active, r, h0, nh, smem, p.out);
}

int32_t next_pow2(int64_t x) {
  int32_t v = 1;
  while (v < x) v *= 2;
  return v;
}

// Query heads one block folds for a kv head with `group` query heads (an
// instantiated tile size), and the blocks per kv head that takes.
int heads_per_block(int64_t group) {
  return group >= kMaxHeadsPerBlock ? kMaxHeadsPerBlock : next_pow2(group);
}
int32_t head_tiles_of(int64_t group) {
  const int heads = heads_per_block(group);
  return static_cast<int32_t>((group + heads - 1) / heads);
}

bool aligned16(const void* ptr) {
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
}

template <typename T, int VEC, int HT>
cudaError_t launch_split(const AttentionParams<T>& p, const Geometry& g, cudaStream_t stream) {
  const int n_slots = kThreads / g.lanes_per_key;
  // The slots' states, then (reusing them) the fold's scratch. n_slots * head_dim <=
  // kThreads * kMaxElemsPerLane and the scratch is at most 8 * 129 floats, so this
  // stays under 48 KB.
  const int64_t merge_floats = int64_t{n_slots} * HT * (p.head_dim + 2);
  const int64_t fold_floats = g.n_splits > 1 ? detail::fold_scratch_floats(HT, g.n_splits) : 0;
  const size_t smem_bytes =
      sizeof(float) * static_cast<size_t>(std::max(merge_floats, fold_floats));
  const dim3 grid(static_cast<unsigned>(p.n_rows), static_cast<unsigned>(g.n_splits),
                  static_cast<unsigned>(p.n_kv_heads * g.head_tiles));
  return detail::launch_kernel(attention_split_kernel<T, VEC, HT>, grid, dim3(kThreads), smem_bytes,
                               stream, p, g);
}

template <typename T, int VEC>
cudaError_t launch_split_heads(const AttentionParams<T>& p, const Geometry& g, int heads,
                               cudaStream_t stream) {
  switch (heads) {
    case 1:
      return launch_split<T, VEC, 1>(p, g, stream);
    case 2:
      return launch_split<T, VEC, 2>(p, g, stream);
    case 4:
      return launch_split<T, VEC, 4>(p, g, stream);
    default:
      return launch_split<T, VEC, kMaxHeadsPerBlock>(p, g, stream);
  }
}

// The CUDA-core split kernel: vector width and lanes per key from the shape.
template <typename T>
cudaError_t launch_cuda_cores(const AttentionParams<T>& p, Geometry* g, int heads,
                              cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = p.head_dim % 8 == 0 && p.row_stride % kVec == 0 && p.q_offset % kVec == 0 &&
                   aligned16(p.qkv) && aligned16(p.k_pool) && aligned16(p.v_pool);
  const int vec_elems = vec ? kVec : 1;
  g->n_vecs = static_cast<int32_t>(p.head_dim / vec_elems);
  g->lanes_per_key = std::min(kWarp, next_pow2(g->n_vecs));
  // Every vector must have a lane: n_vecs <= lanes_per_key * (kMaxElemsPerLane / vec_elems).
  if (g->n_vecs > g->lanes_per_key * (kMaxElemsPerLane / vec_elems)) return cudaErrorInvalidValue;
  return vec ? launch_split_heads<T, kVec>(p, *g, heads, stream)
             : launch_split_heads<T, 1>(p, *g, heads, stream);
}

}  // namespace

int32_t attention_num_splits(int64_t n_rows, int64_t n_heads, int64_t n_kv_heads,
                             int32_t max_context, int64_t target_blocks, int64_t min_blocks) {
  if (n_rows <= 0 || n_kv_heads <= 0 || n_heads < n_kv_heads || max_context <= kMinSplitTokens ||
      target_blocks <= 0) {
    return 1;
  }
  target_blocks = std::min(target_blocks, kAttentionWorkspaceCounters);
  const int64_t blocks_per_split = n_rows * n_kv_heads * head_tiles_of(n_heads / n_kv_heads);
  const int64_t by_blocks = (target_blocks + blocks_per_split - 1) / blocks_per_split;
  const int64_t by_context = (int64_t{max_context} + kMinSplitTokens - 1) / kMinSplitTokens;
  // No row takes more chunks than max(the minimum's, budget / positions per chunk): the
  // splits beyond would never run (attention_span.cuh).
  const int64_t by_use = std::max((min_blocks + blocks_per_split - 1) / blocks_per_split,
                                  int64_t{max_context} / detail::kAttentionPositionsPerChunk);
  return static_cast<int32_t>(std::max<int64_t>(
      1, std::min({by_blocks, by_context, by_use, int64_t{kAttentionMaxSplits}})));
}

int32_t attention_min_chunks(int64_t n_rows, int64_t n_heads, int64_t n_kv_heads, int32_t n_splits,
                             int64_t min_blocks) {
  if (n_splits <= 1 || n_rows <= 0 || n_kv_heads <= 0 || n_heads < n_kv_heads || min_blocks <= 0) {
    return 1;
  }
  const int64_t blocks_per_split = n_rows * n_kv_heads * head_tiles_of(n_heads / n_kv_heads);
  const int64_t chunks = (min_blocks + blocks_per_split - 1) / blocks_per_split;
  return static_cast<int32_t>(std::clamp<int64_t>(chunks, 1, n_splits));
}

size_t attention_workspace_bytes(int64_t max_rows, int64_t n_heads, int64_t n_kv_heads,
                                 int64_t head_dim, int32_t max_context, int64_t target_blocks,
                                 int64_t min_blocks) {
  if (max_rows <= 0 || n_heads <= 0 || head_dim <= 0) return 0;
  // rows x splits is not monotonic in rows (fewer rows get more splits): take the
  // largest over every launch size the buffer must serve.
  int64_t parts = 0;
  for (int64_t rows = 1; rows <= max_rows; ++rows) {
    const int32_t splits =
        attention_num_splits(rows, n_heads, n_kv_heads, max_context, target_blocks, min_blocks);
    if (splits > 1) parts = std::max(parts, rows * splits);
  }
  if (parts == 0) return 0;
  return sizeof(int32_t) * static_cast<size_t>(kAttentionWorkspaceCounters) +
         sizeof(float) * static_cast<size_t>(parts * n_heads * (head_dim + 2));
}

template <typename T>
bool attention_uses_tensor_cores(const AttentionParams<T>& p) {
  if constexpr (!std::is_same_v<T, __nv_bfloat16>) {
    return false;
  } else {
    return p.path == AttentionPath::kAuto && (p.head_dim == 64 || p.head_dim == 128) &&
           p.n_kv_heads > 0 && p.n_heads % p.n_kv_heads == 0 &&
           p.n_heads / p.n_kv_heads <= kMaxTensorCoreGroup && p.row_stride % 8 == 0 &&
           p.q_offset % 8 == 0 && aligned16(p.qkv) && aligned16(p.k_pool) && aligned16(p.v_pool);
  }
}

template <typename T>
cudaError_t launch_attention(const AttentionParams<T>& p, cudaStream_t stream) {
  if (p.n_rows < 0) return cudaErrorInvalidValue;
  if (p.n_rows == 0) return cudaSuccess;
  if (p.n_rows > 0x7fffffff || p.n_heads <= 0 || p.n_kv_heads <= 0 ||
      p.n_heads % p.n_kv_heads != 0 || p.head_dim <= 0 || p.head_dim > kMaxAttentionHeadDimCuda ||
      p.window < 0 || p.max_context <= 0 || p.table_stride <= 0 || p.q_offset < 0 ||
      p.q_offset + p.n_heads * p.head_dim > p.row_stride) {
    return cudaErrorInvalidValue;
  }
  if (p.qkv == nullptr || p.k_pool == nullptr || p.v_pool == nullptr || p.table == nullptr ||
      p.row_seq == nullptr || p.positions == nullptr || p.out == nullptr) {
    return cudaErrorInvalidValue;
  }
  const bool warps_ok =
      p.block_warps == 0 || p.block_warps == 2 || p.block_warps == 4 || p.block_warps == 8;
  if (p.target_blocks < 0 || p.target_blocks > kAttentionWorkspaceCounters || p.min_blocks < 0 ||
      p.fresh_positions < 0 || !warps_ok) {
    return cudaErrorInvalidValue;
  }
  if (p.row_runs && attention_uses_tensor_cores(p) &&
      detail::attention_prefill_takes_group(p.n_heads / p.n_kv_heads)) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      return detail::launch_attention_prefill_mma(p, stream);
    }
  }
  Geometry g;
  g.early = detail::early_triggers();
  const int64_t min_blocks = p.min_blocks == 0 ? kAttentionMinBlocks : p.min_blocks;
  g.n_splits = attention_num_splits(p.n_rows, p.n_heads, p.n_kv_heads, p.max_context,
                                    p.target_blocks == 0 ? kAttentionTargetBlocks : p.target_blocks,
                                    min_blocks);
  if (g.n_splits > 1 && p.workspace == nullptr) return cudaErrorInvalidValue;
  g.min_chunks = attention_min_chunks(p.n_rows, p.n_heads, p.n_kv_heads, g.n_splits, min_blocks);
  g.group = static_cast<int32_t>(p.n_heads / p.n_kv_heads);
  const int heads = heads_per_block(g.group);
  g.head_tiles = head_tiles_of(g.group);
  if (p.n_kv_heads * g.head_tiles > 65535) return cudaErrorInvalidValue;
  // Every fold group of a split launch has a counter (the target's bound guarantees it).
  if (g.n_splits > 1 && p.n_rows * p.n_kv_heads * g.head_tiles > kAttentionWorkspaceCounters) {
    return cudaErrorInvalidValue;
  }

  if (attention_uses_tensor_cores(p)) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      return detail::launch_attention_split_mma(p, g.n_splits, g.min_chunks, stream);
    }
  }
  return launch_cuda_cores(p, &g, heads, stream);
}

std::vector<AttentionRowRange> attention_row_ranges(std::span<const int32_t> row_seq,
                                                    int64_t min_run) {
  std::vector<AttentionRowRange> ranges;
  const int64_t n = static_cast<int64_t>(row_seq.size());
  for (int64_t begin = 0; begin < n;) {
    int64_t end = begin + 1;
    while (end < n && row_seq[static_cast<size_t>(end)] == row_seq[static_cast<size_t>(begin)]) {
      ++end;
    }
    const bool runs = end - begin >= min_run;
    if (!ranges.empty() && ranges.back().runs == runs) {
      ranges.back().end = end;
    } else {
      ranges.push_back({begin, end, runs});
    }
    begin = end;
  }
  return ranges;
}

template cudaError_t launch_attention<float>(const AttentionParams<float>&, cudaStream_t);
template cudaError_t launch_attention<__nv_bfloat16>(const AttentionParams<__nv_bfloat16>&,
                                                     cudaStream_t);
template bool attention_uses_tensor_cores<float>(const AttentionParams<float>&);
template bool attention_uses_tensor_cores<__nv_bfloat16>(const AttentionParams<__nv_bfloat16>&);

}  // namespace cellm::cuda
