#include "cuda/kernels/attention.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <type_traits>

namespace cellm::cuda {
namespace {

constexpr int kThreads = 128;  // threads of every attention block
constexpr int kWarp = 32;
constexpr int kMaxHeadsPerBlock = 8;       // query heads of one kv head folded by one block
constexpr int kMaxElemsPerLane = 8;        // head_dim elements a lane holds per head
constexpr int32_t kMinSplitTokens = 256;   // a split covers at least this many positions
constexpr int64_t kTargetRowSplits = 512;  // rows x splits the split count aims for
constexpr int32_t kMaxSplits = 256;
constexpr float kLog2e = 1.4426950408889634f;

// How a launch cuts the work; computed once on the host.
struct Geometry {
  int32_t n_splits = 1;       // context chunks per row
  int32_t chunk = 0;          // positions per chunk; the last chunk also takes any rest
  int32_t group = 1;          // query heads per kv head
  int32_t head_tiles = 1;     // blocks per kv head: ceil(group / heads per block)
  int32_t lanes_per_key = 1;  // power of two <= 32: lanes that share one key's dot product
  int32_t n_vecs = 0;         // head_dim / elements per vector
};

__device__ __forceinline__ float to_float(float x) {
  return x;
}
__device__ __forceinline__ float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename T>
__device__ __forceinline__ T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return __float2bfloat16(x);  // round to nearest even
  }
}

// out = the VEC elements at p as floats; p is 16-byte aligned when VEC > 1.
template <typename T, int VEC>
__device__ __forceinline__ void load_vec(const T* p, float (&out)[VEC]) {
  if constexpr (VEC == 1) {
    out[0] = to_float(*p);
  } else if constexpr (std::is_same_v<T, float>) {
    static_assert(VEC == 4);
    const float4 v = __ldg(reinterpret_cast<const float4*>(p));
    out[0] = v.x;
    out[1] = v.y;
    out[2] = v.z;
    out[3] = v.w;
  } else {
    static_assert(VEC == 8);
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      __nv_bfloat162 pair;
      static_assert(sizeof(pair) == sizeof(uint32_t));
      memcpy(&pair, &words[i], sizeof(pair));
      const float2 f = __bfloat1622float2(pair);
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  }
}

// The positions a row attends, [lo, hi), and the splits [first, last] that hold
// any of them. The split kernel and the combine kernel both use this, so they
// agree on which partials exist.
struct RowSpan {
  int64_t lo, hi;
  int32_t first, last;
};

__device__ __forceinline__ RowSpan row_span(int32_t pos, int32_t window, const Geometry& g) {
  RowSpan s;
  s.hi = int64_t{pos} + 1;
  s.lo = window > 0 ? max(int64_t{0}, s.hi - window) : 0;
  s.first = static_cast<int32_t>(min(s.lo / g.chunk, int64_t{g.n_splits - 1}));
  s.last = static_cast<int32_t>(min((s.hi - 1) / g.chunk, int64_t{g.n_splits - 1}));
  return s;
}

// One block per (row, split, kv head x head tile). Lanes work in groups of
// lanes_per_key; each group ("slot") takes every n_slots-th position of the split's
// part of [lo, hi), loads the key and value rows through the table, and keeps an
// online softmax (log2 domain) per query head. The slots' states are merged in
// shared memory; the result goes to `out` (one split) or to the workspace.
// Lane li of a group holds vectors li, li + lanes_per_key, ... of each head row.
template <typename T, int VEC, int HT>
__global__ void __launch_bounds__(kThreads)
    attention_split_kernel(const AttentionParams<T> p, const Geometry g) {
  constexpr int NV = kMaxElemsPerLane / VEC;
  extern __shared__ float smem[];

  const int64_t r = blockIdx.x;
  const int32_t split = static_cast<int32_t>(blockIdx.y);
  const RowSpan span = row_span(p.positions[r], p.window, g);
  if (split < span.first || split > span.last) return;  // chunk outside [lo, hi)
  const int64_t begin = max(span.lo, int64_t{split} * g.chunk);
  const int64_t end =
      split == g.n_splits - 1 ? span.hi : min(span.hi, int64_t{split + 1} * g.chunk);

  const int64_t hd = p.head_dim;
  const int kv_head = static_cast<int>(blockIdx.z) / g.head_tiles;
  const int tile = static_cast<int>(blockIdx.z) % g.head_tiles;
  const int64_t h0 = int64_t{kv_head} * g.group + int64_t{tile} * HT;  // first query head
  const int nh = min(HT, g.group - tile * HT);
  const int lpk = g.lanes_per_key;
  const int li = static_cast<int>(threadIdx.x) % lpk;
  const int slot = static_cast<int>(threadIdx.x) / lpk;
  const int n_slots = kThreads / lpk;
  const int slots_per_warp = kWarp / lpk;
  const int warp = static_cast<int>(threadIdx.x) / kWarp;

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
  // jb is the same for every lane of a warp, so the warp stays converged for the
  // shuffles; lanes past `end` compute on zeros and skip the update.
  for (int64_t jb = begin + int64_t{warp} * slots_per_warp; jb < end; jb += n_slots) {
    const int64_t j = jb + (static_cast<int>(threadIdx.x) % kWarp) / lpk;
    const bool valid = j < end;
    float kf[NV][VEC], vf[NV][VEC];
    const int64_t cell = valid ? int64_t{cells[j]} : 0;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int vi = li + k * lpk;
      if (valid && vi < g.n_vecs) {
        load_vec<T, VEC>(k_base + cell * cell_stride + vi * VEC, kf[k]);
        load_vec<T, VEC>(v_base + cell * cell_stride + vi * VEC, vf[k]);
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) kf[k][e] = vf[k][e] = 0.f;
      }
    }
#pragma unroll
    for (int h = 0; h < HT; ++h) {
      float s = 0.f;
#pragma unroll
      for (int k = 0; k < NV; ++k) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) s = fmaf(q[h][k][e], kf[k][e], s);
      }
      for (int off = lpk / 2; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
      if (valid) {
        const float m_new = fmaxf(m[h], s);
        const float correction = exp2f(m[h] - m_new);  // 0 while m[h] is -inf
        const float weight = exp2f(s - m_new);
        l[h] = l[h] * correction + weight;
        m[h] = m_new;
#pragma unroll
        for (int k = 0; k < NV; ++k) {
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            acc[h][k][e] = fmaf(weight, vf[k][e], acc[h][k][e] * correction);
          }
        }
      }
    }
  }

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
  float* ws_acc = p.workspace;
  float* ws_max = ws_acc + p.n_rows * p.n_heads * g.n_splits * hd;
  float* ws_sum = ws_max + p.n_rows * p.n_heads * g.n_splits;
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
    const int64_t head = h0 + h;
    if (g.n_splits == 1) {
      p.out[(r * p.n_heads + head) * hd + d] = from_float<T>(a / sum);
    } else {
      const int64_t part = (r * p.n_heads + head) * g.n_splits + split;
      ws_acc[part * hd + d] = a;
      if (d == 0) {
        ws_max[part] = mx;
        ws_sum[part] = sum;
      }
    }
  }
}

// One block per (row, head): merges the partials of the splits [first, last] that
// hold the row's positions (the same splits the split kernel filled).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    attention_combine_kernel(const AttentionParams<T> p, const Geometry g) {
  const int64_t r = blockIdx.x;
  const int64_t head = blockIdx.y;
  const int64_t hd = p.head_dim;
  const RowSpan span = row_span(p.positions[r], p.window, g);
  const float* ws_acc = p.workspace;
  const float* ws_max = ws_acc + p.n_rows * p.n_heads * g.n_splits * hd;
  const float* ws_sum = ws_max + p.n_rows * p.n_heads * g.n_splits;
  const int64_t part0 = (r * p.n_heads + head) * g.n_splits;
  float mx = -INFINITY;
  for (int32_t s = span.first; s <= span.last; ++s) mx = fmaxf(mx, ws_max[part0 + s]);
  float sum = 0.f;
  for (int32_t s = span.first; s <= span.last; ++s) {
    sum = fmaf(exp2f(ws_max[part0 + s] - mx), ws_sum[part0 + s], sum);
  }
  const float inv = 1.f / sum;
  for (int64_t d = threadIdx.x; d < hd; d += kThreads) {
    float a = 0.f;
    for (int32_t s = span.first; s <= span.last; ++s) {
      a = fmaf(exp2f(ws_max[part0 + s] - mx), ws_acc[(part0 + s) * hd + d], a);
    }
    p.out[(r * p.n_heads + head) * hd + d] = from_float<T>(a * inv);
  }
}

int32_t next_pow2(int64_t x) {
  int32_t v = 1;
  while (v < x) v *= 2;
  return v;
}

bool aligned16(const void* ptr) {
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
}

template <typename T, int VEC, int HT>
cudaError_t launch_split(const AttentionParams<T>& p, const Geometry& g, cudaStream_t stream) {
  const int n_slots = kThreads / g.lanes_per_key;
  // n_slots * head_dim <= kThreads * kMaxElemsPerLane, so this stays under 48 KB.
  const size_t smem_bytes =
      sizeof(float) * static_cast<size_t>(n_slots) * HT * static_cast<size_t>(p.head_dim + 2);
  const dim3 grid(static_cast<unsigned>(p.n_rows), static_cast<unsigned>(g.n_splits),
                  static_cast<unsigned>(p.n_kv_heads * g.head_tiles));
  attention_split_kernel<T, VEC, HT><<<grid, kThreads, smem_bytes, stream>>>(p, g);
  return cudaGetLastError();
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

}  // namespace

int32_t attention_num_splits(int64_t n_rows, int32_t max_context) {
  if (n_rows <= 0 || max_context <= kMinSplitTokens) return 1;
  const int64_t by_context = (int64_t{max_context} + kMinSplitTokens - 1) / kMinSplitTokens;
  const int64_t by_rows = std::max<int64_t>(1, kTargetRowSplits / n_rows);
  return static_cast<int32_t>(std::min({by_context, by_rows, int64_t{kMaxSplits}}));
}

size_t attention_workspace_bytes(int64_t n_rows, int64_t n_heads, int64_t head_dim,
                                 int32_t max_context) {
  const int32_t n_splits = attention_num_splits(n_rows, max_context);
  if (n_splits == 1 || n_rows <= 0 || n_heads <= 0 || head_dim <= 0) return 0;
  return sizeof(float) * static_cast<size_t>(n_rows * n_heads * n_splits * (head_dim + 2));
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
  Geometry g;
  g.n_splits = attention_num_splits(p.n_rows, p.max_context);
  g.chunk = (p.max_context + g.n_splits - 1) / g.n_splits;
  if (g.n_splits > 1 && p.workspace == nullptr) return cudaErrorInvalidValue;
  g.group = static_cast<int32_t>(p.n_heads / p.n_kv_heads);
  const int heads = g.group >= kMaxHeadsPerBlock ? kMaxHeadsPerBlock : next_pow2(g.group);
  g.head_tiles = (g.group + heads - 1) / heads;
  if (p.n_kv_heads * g.head_tiles > 65535) return cudaErrorInvalidValue;

  constexpr int kVec = 16 / sizeof(T);
  const bool vec = p.head_dim % 8 == 0 && p.row_stride % kVec == 0 && p.q_offset % kVec == 0 &&
                   aligned16(p.qkv) && aligned16(p.k_pool) && aligned16(p.v_pool);
  const int vec_elems = vec ? kVec : 1;
  g.n_vecs = static_cast<int32_t>(p.head_dim / vec_elems);
  g.lanes_per_key = std::min(kWarp, next_pow2(g.n_vecs));
  // Every vector must have a lane: n_vecs <= lanes_per_key * (kMaxElemsPerLane / vec_elems).
  if (g.n_vecs > g.lanes_per_key * (kMaxElemsPerLane / vec_elems)) return cudaErrorInvalidValue;

  const cudaError_t err = vec ? launch_split_heads<T, kVec>(p, g, heads, stream)
                              : launch_split_heads<T, 1>(p, g, heads, stream);
  if (err != cudaSuccess || g.n_splits == 1) return err;
  const dim3 grid(static_cast<unsigned>(p.n_rows), static_cast<unsigned>(p.n_heads));
  attention_combine_kernel<T><<<grid, kThreads, 0, stream>>>(p, g);
  return cudaGetLastError();
}

template cudaError_t launch_attention<float>(const AttentionParams<float>&, cudaStream_t);
template cudaError_t launch_attention<__nv_bfloat16>(const AttentionParams<__nv_bfloat16>&,
                                                     cudaStream_t);

}  // namespace cellm::cuda
