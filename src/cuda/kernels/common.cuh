// Device-side helpers shared by the kernel families (included by kernels/*.cu only):
// conversions between the activation type T (float or __nv_bfloat16) and f32, the SwiGLU
// activation, packed loads/stores of N consecutive elements, warp/block sums, and
// launch-shape helpers.
//
// Every kernel computes in f32: it widens T on load and rounds to T (nearest even) on
// store. Packed accesses are used only when the launcher has checked that the row width
// is a multiple of the pack and every base pointer is aligned to the pack's size
// (`packable`); otherwise the same kernel is instantiated with N = 1.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace cellm::cuda::detail {

__device__ __forceinline__ float to_float(float x) {
  return x;
}
__device__ __forceinline__ float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// silu(g) * up = g / (1 + e^-g) * up in f32: the SwiGLU activation. The one definition
// of launch_swiglu and of the GEMV that fuses it (kernels/gemv.cu), so the two compile to
// the same arithmetic and round alike bit for bit.
__device__ __forceinline__ float silu_mul(float g, float up) {
  return g / (1.0f + expf(-g)) * up;
}

// N consecutive elements moved as one access of sizeof(T) * N bytes.
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// out[i] = float(p[i]) for i in [0, N). REQUIRES: p aligned to sizeof(T) * N.
template <int N, typename T>
__device__ __forceinline__ void load_floats(const T* p, float (&out)[N]) {
  const Pack<T, N> pack = *reinterpret_cast<const Pack<T, N>*>(p);
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = to_float(pack.v[i]);
}

// p[i] = T(in[i]) for i in [0, N). REQUIRES: p aligned to sizeof(T) * N.
template <int N, typename T>
__device__ __forceinline__ void store_floats(T* p, const float (&in)[N]) {
  Pack<T, N> pack;
#pragma unroll
  for (int i = 0; i < N; ++i) pack.v[i] = from_float<T>(in[i]);
  *reinterpret_cast<Pack<T, N>*>(p) = pack;
}

// The sum of v over the 32 lanes of a full warp, in every lane.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// The sum of v over the block, in every thread. Call at most once per kernel, from every
// thread. REQUIRES: blockDim.x is a multiple of 32 and at most 1024; blockDim.y = z = 1.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float warp_partials[32];
  const unsigned lane = threadIdx.x & 31u;
  const unsigned warp = threadIdx.x >> 5;
  v = warp_sum(v);
  if (lane == 0) warp_partials[warp] = v;
  __syncthreads();
  const unsigned n_warps = blockDim.x >> 5;
  v = lane < n_warps ? warp_partials[lane] : 0.0f;
  return warp_sum(v);
}

// The maximum of the non-negative v (an absolute value) over the block; every thread gets
// it. Its own shared memory, so it may follow block_sum in a kernel.
__device__ __forceinline__ float block_amax(float v) {
  __shared__ float warp_partials[32];
  const unsigned lane = threadIdx.x & 31u;
  const unsigned warp = threadIdx.x >> 5;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  if (lane == 0) warp_partials[warp] = v;
  __syncthreads();
  const unsigned n_warps = blockDim.x >> 5;
  v = lane < n_warps ? warp_partials[lane] : 0.0f;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// Elements per packed access in the bandwidth-bound kernels (16 bytes of f32, 8 of bf16).
inline constexpr int kPack = 4;

// True when p is aligned to `bytes` (null counts as aligned: it is never dereferenced).
inline bool aligned_to(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Threads for a block that walks a row of `packs` packed accesses: a multiple of 32 in
// [32, max_threads].
inline int threads_for_row(int64_t packs, int max_threads) {
  const int64_t rounded = (packs + 31) / 32 * 32;
  return static_cast<int>(std::clamp<int64_t>(rounded, 32, max_threads));
}

// Blocks of `threads` for a grid-stride loop over `work` items (capped; the loop covers
// the rest). REQUIRES: work > 0.
inline unsigned blocks_for(int64_t work, int threads) {
  constexpr int64_t kMaxBlocks = 8192;
  return static_cast<unsigned>(std::min<int64_t>((work + threads - 1) / threads, kMaxBlocks));
}

}  // namespace cellm::cuda::detail
