#include "cuda/kernels/quantize_e4m3.h"

#include <cooperative_groups.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <climits>

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/e4m3.cuh"
#include "cuda/kernels/launch.cuh"

namespace cellm::cuda {
namespace {

// bf16 elements per thread access (16 bytes of x, 8 bytes of x8).
constexpr int kQuantPack = 8;
// Packs a thread holds in registers: a block's slice of up to kQuantHeld x its threads
// packs is read once; a longer one is read twice (the second read mostly from L2).
constexpr int kQuantHeld = 4;
constexpr int kQuantMaxThreads = 512;
constexpr int kQuantMaxCluster = 8;

struct QuantizeParams {
  const __nv_bfloat16* x;  // [m, k] or [m, 2k]
  int64_t m, k;
  uint8_t* x8;    // [m, k]
  float* scale;   // [m]
  int64_t slice;  // packs of a row per block of its cluster
};

// x'[row, c .. c + 8): the input itself or the SwiGLU activation rounded to bf16, as f32.
template <GemvInput kInput>
__device__ __forceinline__ void load_input(const QuantizeParams& p, int64_t row, int64_t c,
                                           float (&v)[kQuantPack]) {
  if constexpr (kInput == GemvInput::kPlain) {
    detail::load_floats<kQuantPack>(p.x + row * p.k + c, v);
  } else {
    const __nv_bfloat16* gate = p.x + row * 2 * p.k + c;
    float g[kQuantPack], u[kQuantPack];
    detail::load_floats<kQuantPack>(gate, g);
    detail::load_floats<kQuantPack>(gate + p.k, u);
#pragma unroll
    for (int e = 0; e < kQuantPack; ++e) {
      v[e] = __bfloat162float(__float2bfloat16_rn(detail::silu_mul(g[e], u[e])));
    }
  }
}

// x8[row, c .. c + 8) = the codes of v / scale.
__device__ __forceinline__ void store_codes(const QuantizeParams& p, int64_t row, int64_t c,
                                            const float (&v)[kQuantPack], float scale) {
  const float(&lo)[4] = *reinterpret_cast<const float(*)[4]>(&v[0]);
  const float(&hi)[4] = *reinterpret_cast<const float(*)[4]>(&v[4]);
  *reinterpret_cast<uint2*>(p.x8 + row * p.k + c) =
      make_uint2(detail::e4m3x4(lo, scale), detail::e4m3x4(hi, scale));
}

// One cluster of blocks per row (one block per row where the launch has no clusters),
// block r of the cluster over packs [r slice, (r + 1) slice) of the row, each thread over
// packs threadIdx.x + j blockDim.x of that slice, kQuantHeld of them a round. The row's
// absolute maximum is folded over the block, then over the cluster (each block reads
// every block's maximum from its shared memory), then the codes: from the registers
// when the slice took one round, else from a second read of the input. The maximum does
// not depend on the order of the fold, so every launch shape gives the same bits.
template <GemvInput kInput>
__global__ void __launch_bounds__(kQuantMaxThreads)
    quantize_rows_e4m3_kernel(QuantizeParams p, bool early) {
  namespace cg = cooperative_groups;
  detail::wait_and_allow(early);
  const cg::cluster_group cluster = cg::this_cluster();
  const int64_t row = blockIdx.x / cluster.num_blocks();
  const int64_t packs = p.k / kQuantPack;
  const int64_t begin = int64_t{cluster.block_rank()} * p.slice;
  const int64_t end = min(packs, begin + p.slice);
  const int64_t per_round = int64_t{kQuantHeld} * blockDim.x;
  const int64_t rounds = (end - begin + per_round - 1) / per_round;  // the same in every block
  float v[kQuantHeld][kQuantPack];
  const auto pack_at = [&](int64_t r, int j) {
    return begin + r * per_round + j * blockDim.x + threadIdx.x;
  };
  const auto load_round = [&](int64_t r) {
#pragma unroll
    for (int j = 0; j < kQuantHeld; ++j) {
      const int64_t q = pack_at(r, j);
      if (q < end) load_input<kInput>(p, row, q * kQuantPack, v[j]);
    }
  };
  float amax = 0.0f;
  for (int64_t r = 0; r < rounds; ++r) {
    load_round(r);
#pragma unroll
    for (int j = 0; j < kQuantHeld; ++j) {
      if (pack_at(r, j) >= end) continue;
#pragma unroll
      for (int e = 0; e < kQuantPack; ++e) amax = fmaxf(amax, fabsf(v[j][e]));
    }
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  }
  __shared__ float warp_max[kQuantMaxThreads / 32];
  __shared__ float block_max;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (lane == 0) warp_max[warp] = amax;
  __syncthreads();
  if (threadIdx.x == 0) {
    float b = 0.0f;
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) b = fmaxf(b, warp_max[w]);
    block_max = b;
  }
  cluster.sync();
  amax = 0.0f;
  for (unsigned r = 0; r < cluster.num_blocks(); ++r) {
    amax = fmaxf(amax, *cluster.map_shared_rank(&block_max, r));
  }
  // No block leaves (and frees its block_max) before every block has read it.
  cluster.sync();
  const float scale = detail::e4m3_row_scale(amax);
  if (cluster.block_rank() == 0 && threadIdx.x == 0) p.scale[row] = scale;
  for (int64_t r = 0; r < rounds; ++r) {
    if (rounds > 1) load_round(r);
#pragma unroll
    for (int j = 0; j < kQuantHeld; ++j) {
      const int64_t q = pack_at(r, j);
      if (q < end) store_codes(p, row, q * kQuantPack, v[j], scale);
    }
  }
}

template <typename TOut>
struct ScaleParams {
  const float* acc;
  int64_t ld_acc, m, n;
  const float* x_scale;
  const float* w_scale;
  const __nv_bfloat16* bias;
  TOut* y;
};

template <typename TOut>
__global__ void scale_outer_kernel(ScaleParams<TOut> p, bool early) {
  detail::wait_and_allow(early);
  const int64_t total = p.m * p.n;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t e = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t i = e / p.n;
    const int64_t j = e % p.n;
    const float s = __fmul_rn(p.x_scale[i], p.w_scale[j]);
    const float b = p.bias == nullptr ? 0.0f : __bfloat162float(p.bias[j]);
    const float v = __fmaf_rn(p.acc[i * p.ld_acc + j], s, b);
    if constexpr (std::is_same_v<TOut, float>) {
      p.y[e] = v;
    } else {
      p.y[e] = __float2bfloat16_rn(v);
    }
  }
}

}  // namespace

bool quantize_rows_e4m3_supports(int64_t m, int64_t k, GemvInput input, const void* x,
                                 const void* x8, const void* scale) {
  return m >= 0 && m < (int64_t{1} << 31) && k > 0 && k < (int64_t{1} << 30) && k % 16 == 0 &&
         (input == GemvInput::kPlain || input == GemvInput::kSwiGLU) && x != nullptr &&
         x8 != nullptr && scale != nullptr && detail::aligned_to(x, 16) &&
         detail::aligned_to(x8, 16) && detail::aligned_to(scale, 4);
}

cudaError_t launch_quantize_rows_e4m3(const __nv_bfloat16* x, int64_t m, int64_t k, GemvInput input,
                                      uint8_t* x8, float* scale, cudaStream_t stream) {
  if (!quantize_rows_e4m3_supports(m, k, input, x, x8, scale)) return cudaErrorInvalidValue;
  if (m == 0) return cudaSuccess;
  // A block a row, or, for a few long rows, a cluster of 8 blocks a row where the grid
  // still fits the SMs once. A cluster's launch and barriers cost ~1.5 us, which only
  // rows of 1,024 values a block or more on an otherwise mostly idle GPU repay: 16 rows
  // then use 8 times the SMs; with more rows, or shorter ones, a block a row is already
  // enough to stream them (fp8_gemm_bench's quant column compares the two).
  int sms = 0;
  if (const cudaError_t e = detail::sm_count(&sms); e != cudaSuccess) return e;
  const int64_t packs = k / kQuantPack;
  const int64_t cluster =
      m * kQuantMaxCluster <= sms && packs / kQuantMaxCluster >= 128 ? kQuantMaxCluster : 1;
  const int64_t slice = (packs + cluster - 1) / cluster;
  // Threads: one pack each up to 256, more where that keeps the slice in registers.
  const int64_t held = (slice + kQuantHeld - 1) / kQuantHeld;
  const int threads = static_cast<int>(std::max(detail::threads_for_row(slice, 256),
                                                detail::threads_for_row(held, kQuantMaxThreads)));
  if (m * cluster > INT_MAX) return cudaErrorInvalidValue;
  const QuantizeParams p{x, m, k, x8, scale, slice};
  const dim3 grid(static_cast<unsigned>(m * cluster));
  const dim3 shape(static_cast<unsigned>(cluster));
  if (input == GemvInput::kPlain) {
    return detail::launch_kernel_in_clusters(quantize_rows_e4m3_kernel<GemvInput::kPlain>, grid,
                                             threads, 0, stream, shape, p,
                                             detail::early_triggers());
  }
  return detail::launch_kernel_in_clusters(quantize_rows_e4m3_kernel<GemvInput::kSwiGLU>, grid,
                                           threads, 0, stream, shape, p, detail::early_triggers());
}

template <typename TOut>
cudaError_t launch_scale_outer_e4m3(const float* acc, int64_t ld_acc, int64_t m, int64_t n,
                                    const float* x_scale, const float* w_scale,
                                    const __nv_bfloat16* bias, TOut* y, cudaStream_t stream) {
  if (m < 0 || n <= 0 || ld_acc < n) return cudaErrorInvalidValue;
  if (m == 0) return cudaSuccess;
  if (acc == nullptr || x_scale == nullptr || w_scale == nullptr || y == nullptr ||
      !detail::aligned_to(acc, 4) || !detail::aligned_to(x_scale, 4) ||
      !detail::aligned_to(w_scale, 4) || !detail::aligned_to(bias, 2) ||
      !detail::aligned_to(y, sizeof(TOut))) {
    return cudaErrorInvalidValue;
  }
  const ScaleParams<TOut> p{acc, ld_acc, m, n, x_scale, w_scale, bias, y};
  constexpr int kThreads = 256;
  return detail::launch_kernel(scale_outer_kernel<TOut>, detail::blocks_for(m * n, kThreads),
                               kThreads, 0, stream, p, detail::early_triggers());
}

template cudaError_t launch_scale_outer_e4m3<float>(const float*, int64_t, int64_t, int64_t,
                                                    const float*, const float*,
                                                    const __nv_bfloat16*, float*, cudaStream_t);
template cudaError_t launch_scale_outer_e4m3<__nv_bfloat16>(const float*, int64_t, int64_t, int64_t,
                                                            const float*, const float*,
                                                            const __nv_bfloat16*, __nv_bfloat16*,
                                                            cudaStream_t);

}  // namespace cellm::cuda
