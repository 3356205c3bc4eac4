#include "cuda/kernels/skinny_gemm.h"

#include <algorithm>
#include <climits>

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/mma.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "skinny_gemm.cu needs sm_80 or newer (bf16 mma.sync, cp.async, ldmatrix)"
#endif

namespace cellm::cuda {
namespace {

using bf16 = __nv_bfloat16;
using detail::cp_async16;
using detail::cp_async_commit;
using detail::cp_async_wait;
using detail::ldmatrix_x4;
using detail::mma_16816;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kBlockRows = 16 * kWarps;  // weight rows of a block: warp w owns 16 of them
constexpr int kKStep = static_cast<int>(kSkinnyKStep);
constexpr int kStages = 5;             // ring slots; kStages - 1 stages in flight
constexpr int kRowElems = kKStep + 8;  // bf16 a shared row: 36 words, so the 8 rows an
                                       // ldmatrix phase reads start in distinct banks
constexpr int kChunks = kKStep / 8;    // 16-byte copies a stage row

// A stage: kBlockRows weight rows, then 8 MT x rows, kRowElems bf16 each.
template <int MT>
constexpr int stage_elems() {
  return (kBlockRows + 8 * MT) * kRowElems;
}
template <int MT>
constexpr size_t smem_bytes() {
  return sizeof(bf16) * static_cast<size_t>(stage_elems<MT>()) * kStages;
}

template <typename TOut>
struct SkinnyParams {
  const bf16* x;     // [m, k]
  const bf16* w;     // [n, k]
  const bf16* bias;  // [n] or null
  TOut* y;           // [m, n]
  int m;
  int k;
  int64_t n;
  int splits;        // blocks along k per row tile (gridDim.y)
  int split_stages;  // stages of k a split covers (the last split may cover fewer)
  int32_t* counters;
  float* partials;  // [splits, m, n] when splits > 1
};

// MT: x rows in tiles of 8 (m <= 8 MT), the MMA's N. Fragments as in attention_mma.cu
// (PTX ISA, "Matrix Fragments for mma.m16n8k16"): lane = 4 g + q.
//   A = 16 weight rows x 16 columns: ldmatrix.x4 of blocks (rows 0-7, cols +0), (rows
//     8-15, +0), (rows 0-7, +8), (rows 8-15, +8) gives a0..a3.
//   B[c][t] = x[t][c] for 8 x rows t: ldmatrix.x4 (no transpose) of blocks (rows 0-7,
//     cols +0), (rows 0-7, +8), (rows 8-15, +0), (rows 8-15, +8) gives b0, b1 of x tile
//     2 t2, then of tile 2 t2 + 1.
//   C[r][t] = acc[tile][c]: c0, c1 = (row g, x rows 2q, 2q + 1), c2, c3 = row g + 8.
template <int MT, typename TOut>
__global__ void __launch_bounds__(kThreads) skinny_gemm_kernel(const SkinnyParams<TOut> p) {
  static_assert(MT % 2 == 0, "x tiles go to ldmatrix in pairs");
  constexpr int kTokens = 8 * MT;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* smem = reinterpret_cast<bf16*>(smem_raw);
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int q = lane % 4;
  const int64_t tile = blockIdx.x;
  const int split = static_cast<int>(blockIdx.y);
  const int64_t row0 = tile * kBlockRows;
  const int first = split * p.split_stages;  // first stage of k of this split
  const int n_stages = min(p.split_stages, p.k / kKStep - first);

  auto w_stage = [&](int stage) { return smem + (stage % kStages) * stage_elems<MT>(); };
  auto x_stage = [&](int stage) { return w_stage(stage) + kBlockRows * kRowElems; };
  // Copy c of a stage is row c / kChunks, 16-byte chunk c % kChunks; rows past n or m
  // are zero (source size 0: nothing read).
  auto load_w = [&](int stage) {
    bf16* dst = w_stage(stage);
    const int64_t col = int64_t{first + stage} * kKStep;
#pragma unroll
    for (int i = 0; i < kBlockRows * kChunks / kThreads; ++i) {
      const int c = tid + i * kThreads;
      const int r = c / kChunks;
      const int ch = c % kChunks;
      const bool ok = row0 + r < p.n;
      cp_async16(dst + r * kRowElems + ch * 8, p.w + (ok ? row0 + r : 0) * p.k + col + ch * 8, ok);
    }
  };
  auto load_x = [&](int stage) {
    bf16* dst = x_stage(stage);
    const int64_t col = int64_t{first + stage} * kKStep;
    for (int c = tid; c < kTokens * kChunks; c += kThreads) {
      const int r = c / kChunks;
      const int ch = c % kChunks;
      const bool ok = r < p.m;
      cp_async16(dst + r * kRowElems + ch * 8, p.x + int64_t{ok ? r : 0} * p.k + col + ch * 8, ok);
    }
  };

  // The weights of the first stages go in flight before the wait (no step writes them);
  // x, the counters and the partials come from the kernels before this one. Stage s's
  // group holds x of stage s (group 0 also every early weight load).
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_stages) load_w(s);
  }
  detail::wait_for_prior_grids();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_stages) load_x(s);
    cp_async_commit();
  }

  float acc[MT][4];
#pragma unroll
  for (int t = 0; t < MT; ++t) {
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[t][c] = 0.f;
  }
  const int a_off = (warp * 16 + lane % 8 + ((lane / 8) % 2) * 8) * kRowElems + (lane / 16) * 8;
  const int b_off = ((lane / 16) * 8 + lane % 8) * kRowElems + ((lane / 8) % 2) * 8;
  for (int s = 0; s < n_stages; ++s) {
    // Stage s has landed (its group and every earlier one), and every warp is done with
    // the slot the refill below overwrites (stage s - 1's).
    cp_async_wait<kStages - 2>();
    __syncthreads();
    if (s + kStages - 1 < n_stages) {
      load_w(s + kStages - 1);
      load_x(s + kStages - 1);
    }
    cp_async_commit();  // an empty group keeps the count uniform
    const bf16* ws = w_stage(s);
    const bf16* xs = x_stage(s);
#pragma unroll
    for (int kk = 0; kk < kKStep / 16; ++kk) {
      uint32_t a[4];
      ldmatrix_x4(a, ws + a_off + kk * 16);
#pragma unroll
      for (int t2 = 0; t2 < MT / 2; ++t2) {
        uint32_t b[4];
        ldmatrix_x4(b, xs + b_off + t2 * 16 * kRowElems + kk * 16);
        mma_16816(acc[2 * t2], a, b[0], b[1]);
        mma_16816(acc[2 * t2 + 1], a, b[2], b[3]);
      }
    }
  }
  detail::allow_dependent_grids();
  cp_async_wait<0>();

  // f(i, row, value) for each of this thread's sums inside y: element c of tile t is
  // weight row row0 + 16 warp + g + 8 (c / 2), x row 8 t + 2q + c % 2.
  const auto for_each_sum = [&](auto&& f) {
#pragma unroll
    for (int t = 0; t < MT; ++t) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int64_t row = row0 + warp * 16 + g + 8 * (c / 2);
        const int i = 8 * t + 2 * q + c % 2;
        if (i < p.m && row < p.n) f(i, row, acc[t][c]);
      }
    }
  };
  if (p.splits == 1) {
    for_each_sum([&](int i, int64_t row, float v) {
      if (p.bias != nullptr) v += detail::to_float(p.bias[row]);
      p.y[int64_t{i} * p.n + row] = detail::from_float<TOut>(v);
    });
    return;
  }

  // A split: the partials, then the last block of the row tile adds them up.
  float* part = p.partials + int64_t{split} * p.m * p.n;
  for_each_sum([&](int i, int64_t row, float v) { part[int64_t{i} * p.n + row] = v; });
  // Release (each thread's partials before thread 0's arrival), as attention_fold.cuh.
  __threadfence();
  __syncthreads();
  __shared__ int s_last;
  if (tid == 0) {
    const int32_t arrived = atomicAdd(p.counters + tile, 1);
    const bool last = arrived == p.splits - 1;
    if (last) p.counters[tile] = 0;  // every other block of the tile has counted in
    s_last = last;
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();  // acquire: the other blocks' partials, read through L2 (__ldcg)
  const int rows = static_cast<int>(min(int64_t{kBlockRows}, p.n - row0));
  for (int o = tid; o < p.m * rows; o += kThreads) {
    const int i = o / rows;
    const int64_t row = row0 + o % rows;
    float v = 0.f;
    for (int s = 0; s < p.splits; ++s) {
      v += __ldcg(p.partials + (int64_t{s} * p.m + i) * p.n + row);
    }
    if (p.bias != nullptr) v += detail::to_float(p.bias[row]);
    p.y[int64_t{i} * p.n + row] = detail::from_float<TOut>(v);
  }
}

template <int MT, typename TOut>
cudaError_t launch_tiles(SkinnyParams<TOut> p, int64_t tiles, int64_t stages, size_t partial_bytes,
                         cudaStream_t stream) {
  constexpr size_t bytes = smem_bytes<MT>();
  auto* kernel = skinny_gemm_kernel<MT, TOut>;
  if constexpr (bytes > 48 * 1024) {
    // Not a stream operation: capture-safe.
    if (const cudaError_t e = cudaFuncSetAttribute(
            kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
        e != cudaSuccess) {
      return e;
    }
  }
  int device = 0, sms = 0, per_sm = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  if (const cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
      e != cudaSuccess) {
    return e;
  }
  if (const cudaError_t e =
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, bytes);
      e != cudaSuccess) {
    return e;
  }
  const int32_t splits =
      p.counters == nullptr
          ? 1
          : skinny_gemm_splits(p.m, p.n, p.k, sms, std::max(per_sm, 1), partial_bytes);
  p.split_stages = static_cast<int>((stages + splits - 1) / splits);
  p.splits = static_cast<int>((stages + p.split_stages - 1) / p.split_stages);  // with work
  return detail::launch_kernel(kernel,
                               dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(p.splits)),
                               dim3(kThreads), bytes, stream, p);
}

}  // namespace

bool skinny_gemm_supports(int64_t m, int64_t n, int64_t k, const void* x, const void* w) {
  return m >= kSkinnyMinRows && m <= kSkinnyMaxRows && n >= 1 && k > 0 && k % kSkinnyKStep == 0 &&
         k < (int64_t{1} << 24) && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

int32_t skinny_gemm_splits(int64_t m, int64_t n, int64_t k, int sm_count, int blocks_per_sm,
                           size_t partial_bytes) {
  // Doubled from 1 while the doubled grid still fits one wave, each split keeps at least
  // kStages stages (the ring fills), the row tiles have counters, and the partials fit.
  const int64_t tiles = (n + kBlockRows - 1) / kBlockRows;
  const int64_t stages = k / kSkinnyKStep;
  const int64_t slots = int64_t{sm_count} * blocks_per_sm;
  int32_t splits = 1;
  while (splits < 16 && tiles <= kSkinnyCounters && tiles * 2 * splits <= slots &&
         stages >= int64_t{2} * splits * kStages &&
         sizeof(float) * static_cast<size_t>(2 * splits * m * n) <= partial_bytes) {
    splits *= 2;
  }
  return splits;
}

template <typename TOut>
cudaError_t launch_skinny_gemm(const bf16* x, int64_t m, int64_t k, const bf16* w, int64_t n,
                               const bf16* bias, TOut* y, int32_t* counters, float* partials,
                               size_t partial_bytes, cudaStream_t stream) {
  if (!skinny_gemm_supports(m, n, k, x, w) || y == nullptr) return cudaErrorInvalidValue;
  if (partial_bytes > 0 && (partials == nullptr || counters == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const int64_t tiles = (n + kBlockRows - 1) / kBlockRows;
  if (tiles > INT_MAX) return cudaErrorInvalidValue;
  SkinnyParams<TOut> p{x,
                       w,
                       bias,
                       y,
                       static_cast<int>(m),
                       static_cast<int>(k),
                       n,
                       1,
                       0,
                       partial_bytes > 0 ? counters : nullptr,
                       partials};
  const int64_t stages = k / kSkinnyKStep;
  if (m <= 16) return launch_tiles<2>(p, tiles, stages, partial_bytes, stream);
  if (m <= 32) return launch_tiles<4>(p, tiles, stages, partial_bytes, stream);
  return launch_tiles<8>(p, tiles, stages, partial_bytes, stream);
}

template cudaError_t launch_skinny_gemm<__nv_bfloat16>(const bf16*, int64_t, int64_t, const bf16*,
                                                       int64_t, const bf16*, __nv_bfloat16*,
                                                       int32_t*, float*, size_t, cudaStream_t);
template cudaError_t launch_skinny_gemm<float>(const bf16*, int64_t, int64_t, const bf16*, int64_t,
                                               const bf16*, float*, int32_t*, float*, size_t,
                                               cudaStream_t);

}  // namespace cellm::cuda
