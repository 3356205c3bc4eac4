#include "cuda/kernels/kv_e4m3.h"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace cellm::cuda {
namespace {

constexpr int kWriteThreads = 256;
constexpr int kMaxHalf = static_cast<int>(kMaxKvE4m3HeadDim / 2);
constexpr int kWarpsPerBlock = 4;  // attention: one per task
constexpr int kGroupLanes = 8;     // attention: lanes that share one key
constexpr unsigned kFullMask = 0xffffffffu;

template <typename T>
__device__ __forceinline__ float to_float(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return __bfloat162float(x);
  }
}

template <typename T>
__device__ __forceinline__ T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return __float2bfloat16_rn(x);
  }
}

// cpu::kv_scale_e4m3: the smallest power of two >= amax / 448, 1 for amax 0.
__device__ __forceinline__ float kv_scale_e4m3(float amax) {
  const float ratio = __fdiv_rn(amax, 448.0f);
  if (!(ratio > 0.0f) || isinf(ratio)) return amax > 0.0f ? ratio : 1.0f;
  int e = 0;
  const float m = frexpf(ratio, &e);
  return ldexpf(1.0f, m == 0.5f ? e - 1 : e);
}

// The value of an e4m3 code (exact: every e4m3 value is a half).
__device__ __forceinline__ float decode_e4m3(uint8_t code) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3)));
}

__device__ __forceinline__ float warp_max(float x) {
  for (int o = 16; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, o));
  return x;
}

// The values of the four codes of `w`, first byte first.
__device__ __forceinline__ void decode_e4m3x4(uint32_t w, float* out) {
  const __half2 lo(
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xffffu), __NV_E4M3));
  const __half2 hi(
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), __NV_E4M3));
  const float2 a = __half22float2(lo);
  const float2 b = __half22float2(hi);
  out[0] = a.x;
  out[1] = a.y;
  out[2] = b.x;
  out[3] = b.y;
}

// The values of a lane's E codes of one head row, src pointing at its first: 8-byte loads
// when the lanes tile the row exactly (`full`: head_dim == 8 E, E a multiple of 8, so
// every lane's share is 8-byte aligned), else one byte at a time, 0 past head_dim.
template <int E>
__device__ __forceinline__ void load_codes(const uint8_t* src, int64_t d0, int64_t hd, bool full,
                                           float* out) {
  if constexpr (E % 8 == 0) {
    if (full) {
      const auto* words = reinterpret_cast<const uint2*>(src);
#pragma unroll
      for (int e = 0; e < E / 8; ++e) {
        const uint2 w = words[e];
        decode_e4m3x4(w.x, out + 8 * e);
        decode_e4m3x4(w.y, out + 8 * e + 4);
      }
      return;
    }
  }
#pragma unroll
  for (int e = 0; e < E; ++e) out[e] = d0 + e < hd ? decode_e4m3(src[e]) : 0.0f;
}

// One block per row: the angles, then q and k rotated in place (rope.cu's arithmetic),
// then one warp per k or v head row: its amax, scale and codes.
template <typename T>
__global__ void __launch_bounds__(kWriteThreads)
    rope_kv_write_e4m3_kernel(const RopeKvWriteE4m3Params<T> p) {
  __shared__ float cos_j[kMaxHalf];
  __shared__ float sin_j[kMaxHalf];
  const int64_t r = blockIdx.x;
  const int tid = static_cast<int>(threadIdx.x);
  const int half = static_cast<int>(p.head_dim / 2);
  if (tid < half) {
    const float angle = static_cast<float>(p.positions[r]) * p.inv_freq[tid];
    cos_j[tid] = cosf(angle);
    sin_j[tid] = sinf(angle);
  }
  if (p.table != nullptr && tid == 0) {
    p.table[int64_t{p.row_seq[r]} * p.table_stride + p.positions[r]] = p.cells[r];
  }
  __syncthreads();
  T* row = p.qkv + r * p.row_stride;
  const int units = static_cast<int>(p.n_heads + p.n_kv_heads) * half;
  for (int u = tid; u < units; u += kWriteThreads) {
    const int head = u / half;
    const int j = u - head * half;
    const int64_t start = head >= p.n_heads ? p.k_offset + (head - p.n_heads) * p.head_dim
                                            : p.q_offset + int64_t{head} * p.head_dim;
    T* x = row + start;
    const float a = to_float(x[j]);
    const float b = to_float(x[j + half]);
    const float c = cos_j[j];
    const float s = sin_j[j];
    x[j] = from_float<T>(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)));
    x[j + half] = from_float<T>(__fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s)));
  }
  __syncthreads();  // the rotated k, as qkv holds it, is what gets quantized

  const int warp = tid / 32;
  const int lane = tid % 32;
  const int64_t cell = p.cells[r];
  const int64_t hd = p.head_dim;
  for (int64_t h = warp; h < 2 * p.n_kv_heads; h += kWriteThreads / 32) {
    const bool is_v = h >= p.n_kv_heads;
    const int64_t g = is_v ? h - p.n_kv_heads : h;
    const T* src = row + (is_v ? p.v_offset : p.k_offset) + g * hd;
    float amax = 0.0f;
    for (int64_t i = lane; i < hd; i += 32) amax = fmaxf(amax, fabsf(to_float(src[i])));
    const float scale = kv_scale_e4m3(warp_max(amax));
    uint8_t* dst = (is_v ? p.v_codes : p.k_codes) + (cell * p.n_kv_heads + g) * hd;
    for (int64_t i = lane; i < hd; i += 32) {
      dst[i] = static_cast<uint8_t>(
          __nv_cvt_float_to_fp8(__fdiv_rn(to_float(src[i]), scale), __NV_SATFINITE, __NV_E4M3));
    }
    if (lane == 0) (is_v ? p.v_scales : p.k_scales)[cell * p.n_kv_heads + g] = scale;
  }
}

// One warp per (row, head), four keys at a time: the warp's lanes form four groups of
// eight (kGroupLanes), group s takes keys j0 + 4i + s, and lane l of a group holds head
// elements [l E, l E + E). A group's dot product is summed over its eight lanes (three
// shuffles) and kept in that group's own online softmax (running max, denominator, E
// output elements a lane); the four groups' states are merged at the end. The cells
// and scales of 32 keys are read at once, one per lane, and handed to the groups by
// shuffles, so a key's code loads wait on no load of its own cell id.
template <typename T, int E>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    attention_decode_e4m3_kernel(const AttentionE4m3Params<T> p, float sm_scale) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int group = lane / kGroupLanes;
  const int gl = lane % kGroupLanes;
  const int64_t task = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;
  if (task >= p.n_rows * p.n_heads) return;  // whole warps: the shuffles stay converged
  const int64_t r = task / p.n_heads;
  const int64_t h = task % p.n_heads;
  const int64_t g = h / (p.n_heads / p.n_kv_heads);
  const int64_t hd = p.head_dim;
  const int64_t q_stride = p.q_row_stride > 0 ? p.q_row_stride : p.n_heads * hd;
  const int64_t d0 = int64_t{gl} * E;  // this lane's first head element
  const bool full = hd == int64_t{kGroupLanes} * E;
  float q[E];
  float acc[E];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    q[e] = d0 + e < hd ? to_float(p.q[r * q_stride + h * hd + d0 + e]) : 0.0f;
    acc[e] = 0.0f;
  }
  const int32_t pos = p.positions[r];
  const int64_t lo = p.window > 0 ? max(int64_t{0}, int64_t{pos} - p.window + 1) : 0;
  const int32_t* cells = p.table + int64_t{p.row_seq[r]} * p.table_stride;
  float running_max = -INFINITY;
  float denom = 0.0f;
  for (int64_t j0 = lo; j0 <= pos; j0 += 32) {
    // Lane l reads key j0 + l's cell and scales (none past pos).
    const int64_t mine = j0 + lane;
    int64_t at_l = 0;
    float ks_l = 0.0f, vs_l = 0.0f;
    if (mine <= pos) {
      at_l = int64_t{cells[mine]} * p.n_kv_heads + g;
      ks_l = p.k_scales[at_l];
      vs_l = p.v_scales[at_l];
    }
#pragma unroll 2
    for (int i = 0; i < 8; ++i) {
      const int src = 4 * i + group;
      const bool valid = j0 + src <= pos;
      const auto at =
          static_cast<int64_t>(__shfl_sync(kFullMask, static_cast<long long>(at_l), src));
      const float kscale = __shfl_sync(kFullMask, ks_l, src);
      const float vscale = __shfl_sync(kFullMask, vs_l, src);
      float kv[E];
      load_codes<E>(p.k_codes + at * hd + d0, d0, hd, full, kv);
      float dot = 0.0f;
#pragma unroll
      for (int e = 0; e < E; ++e) dot = fmaf(q[e], kv[e], dot);
#pragma unroll
      for (int o = kGroupLanes / 2; o > 0; o /= 2) dot += __shfl_xor_sync(kFullMask, dot, o);
      if (!valid) continue;  // a group's lanes agree on it
      const float score = dot * kscale * sm_scale;
      const float new_max = fmaxf(running_max, score);
      const float correction = expf(running_max - new_max);  // 0 on the group's first key
      const float weight = expf(score - new_max);
      denom = denom * correction + weight;
      const float vw = weight * vscale;
      load_codes<E>(p.v_codes + at * hd + d0, d0, hd, full, kv);
#pragma unroll
      for (int e = 0; e < E; ++e) acc[e] = fmaf(vw, kv[e], acc[e] * correction);
      running_max = new_max;
    }
  }
  // Merge the four groups' states (lanes l, l ^ 8, l ^ 16, l ^ 24 hold the same elements).
#pragma unroll
  for (int o = kGroupLanes; o < 32; o *= 2) {
    const float other_max = __shfl_xor_sync(kFullMask, running_max, o);
    const float other_denom = __shfl_xor_sync(kFullMask, denom, o);
    const float new_max = fmaxf(running_max, other_max);
    // A group that saw no key has max -inf and denominator 0: its factor is 0.
    const float mine_f = running_max == -INFINITY ? 0.0f : expf(running_max - new_max);
    const float other_f = other_max == -INFINITY ? 0.0f : expf(other_max - new_max);
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const float other_acc = __shfl_xor_sync(kFullMask, acc[e], o);
      acc[e] = acc[e] * mine_f + other_acc * other_f;
    }
    denom = denom * mine_f + other_denom * other_f;
    running_max = new_max;
  }
  if (group != 0) return;
  const float inv = 1.0f / denom;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    if (d0 + e < hd) p.out[(r * p.n_heads + h) * hd + d0 + e] = from_float<T>(acc[e] * inv);
  }
}

bool overlap(int64_t a, int64_t a_len, int64_t b, int64_t b_len) {
  return a_len > 0 && b_len > 0 && a < b + b_len && b < a + a_len;
}

}  // namespace

template <typename T>
cudaError_t launch_rope_kv_write_e4m3(const RopeKvWriteE4m3Params<T>& p, cudaStream_t stream) {
  const int64_t hd = p.head_dim;
  if (p.n_rows < 0 || p.n_heads < 0 || p.n_kv_heads < 1 || hd < 2 || hd % 2 != 0 ||
      hd > kMaxKvE4m3HeadDim || p.row_stride < 0 || p.q_offset < 0 || p.k_offset < 0 ||
      p.v_offset < 0 || p.n_heads + p.n_kv_heads > std::numeric_limits<int32_t>::max() / hd) {
    return cudaErrorInvalidValue;
  }
  const int64_t q_len = p.n_heads * hd;
  const int64_t kv_len = p.n_kv_heads * hd;
  if (p.q_offset + q_len > p.row_stride || p.k_offset + kv_len > p.row_stride ||
      p.v_offset + kv_len > p.row_stride || overlap(p.q_offset, q_len, p.k_offset, kv_len) ||
      overlap(p.q_offset, q_len, p.v_offset, kv_len) ||
      overlap(p.k_offset, kv_len, p.v_offset, kv_len)) {
    return cudaErrorInvalidValue;
  }
  if (p.n_rows == 0) return cudaSuccess;
  if (p.n_rows > std::numeric_limits<int32_t>::max() || p.qkv == nullptr ||
      p.positions == nullptr || p.inv_freq == nullptr || p.cells == nullptr ||
      p.k_codes == nullptr || p.v_codes == nullptr || p.k_scales == nullptr ||
      p.v_scales == nullptr ||
      (p.table != nullptr && (p.row_seq == nullptr || p.table_stride <= 0))) {
    return cudaErrorInvalidValue;
  }
  rope_kv_write_e4m3_kernel<T><<<static_cast<unsigned>(p.n_rows), kWriteThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_attention_decode_e4m3(const AttentionE4m3Params<T>& p, cudaStream_t stream) {
  if (p.n_rows < 0 || p.n_heads < 1 || p.n_kv_heads < 1 || p.n_heads % p.n_kv_heads != 0 ||
      p.head_dim < 1 || p.head_dim > kMaxKvE4m3HeadDim || p.window < 0 ||
      (p.q_row_stride != 0 && p.q_row_stride < p.n_heads * p.head_dim)) {
    return cudaErrorInvalidValue;
  }
  if (p.n_rows == 0) return cudaSuccess;
  const int64_t blocks = (p.n_rows * p.n_heads + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > std::numeric_limits<int32_t>::max() || p.q == nullptr || p.out == nullptr ||
      p.k_codes == nullptr || p.v_codes == nullptr || p.k_scales == nullptr ||
      p.v_scales == nullptr || p.table == nullptr || p.table_stride <= 0 || p.row_seq == nullptr ||
      p.positions == nullptr) {
    return cudaErrorInvalidValue;
  }
  // As cpu::attention: 1 / sqrt(head_dim) in double, rounded once.
  const auto sm_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.head_dim)));
  // Head elements a lane holds: head_dim / 8 rounded up to a power of two.
  const dim3 grid(static_cast<unsigned>(blocks)), block(kWarpsPerBlock * 32);
  if (p.head_dim <= 8 * 4) {
    attention_decode_e4m3_kernel<T, 4><<<grid, block, 0, stream>>>(p, sm_scale);
  } else if (p.head_dim <= 8 * 8) {
    attention_decode_e4m3_kernel<T, 8><<<grid, block, 0, stream>>>(p, sm_scale);
  } else if (p.head_dim <= 8 * 16) {
    attention_decode_e4m3_kernel<T, 16><<<grid, block, 0, stream>>>(p, sm_scale);
  } else {
    static_assert(8 * 32 >= kMaxKvE4m3HeadDim, "the widest lane share covers every head");
    attention_decode_e4m3_kernel<T, 32><<<grid, block, 0, stream>>>(p, sm_scale);
  }
  return cudaGetLastError();
}

template cudaError_t launch_rope_kv_write_e4m3<float>(const RopeKvWriteE4m3Params<float>&,
                                                      cudaStream_t);
template cudaError_t launch_rope_kv_write_e4m3<__nv_bfloat16>(
    const RopeKvWriteE4m3Params<__nv_bfloat16>&, cudaStream_t);
template cudaError_t launch_attention_decode_e4m3<float>(const AttentionE4m3Params<float>&,
                                                         cudaStream_t);
template cudaError_t launch_attention_decode_e4m3<__nv_bfloat16>(
    const AttentionE4m3Params<__nv_bfloat16>&, cudaStream_t);

}  // namespace cellm::cuda
