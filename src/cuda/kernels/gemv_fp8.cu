#include "cuda/kernels/gemv_fp8.h"

#include <climits>

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/launch.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "gemv_fp8.cu needs sm_80 or newer (bf16 mma.sync)"
#endif

namespace cellm::cuda {
namespace {

// The bf16 GEMV's kTensorCores walk (kernels/gemv.cu) with one byte per weight. A warp
// owns a tile of 16 weight rows times all m (<= 8) rows of x: bf16 mma.m16n8k16 (A = the
// 16 weight rows decoded to bf16, B = the 8 x rows, D in f32).
//
// Fragments. Lane = 4 g + q. A warp step covers 4 kLaneBytes consecutive columns of k from
// c0: lane (g, q) loads the kLaneBytes columns [c0 + kLaneBytes q, + kLaneBytes) of weight
// rows g and g + 8 (16-byte loads: uint4 lo, hi) and of x row g (two 16-byte loads per 16
// columns), and feeds each 16 of them to four MMAs. Word t of lo (columns +4t..4t+3)
// decodes to two bf16 pairs L(2t) (columns +4t, +4t+1) and L(2t+1) (+4t+2, +4t+3); likewise
// hi to H. MMA t takes
//   A = {L(2t), H(2t), L(2t+1), H(2t+1)},  B = {x pair 2t, x pair 2t+1}
// (the MMA's k index reaches a lane only through q, in A and B alike, so this is a valid
// order of the dot product). The accumulators hold D[g][2q], D[g][2q+1], D[g+8][2q],
// D[g+8][2q+1], D[r][i] = sum for y[i, tile row r]. x rows >= m are zero and dropped.
//
// Lane width. One row of x reads 32 contiguous bytes of each weight row a lane a step (two
// loads), more rows 16: at one row the longer runs stream 5-10% faster on the 8B's shapes,
// at 4-8 rows the shorter ones are as fast or faster (bench/gemv_fp8_bench).
//
// Split k. split_k warps (a power of two, <= kMaxSplitK) share a tile: warp kw of the tile
// takes the steps s with s % split_k == kw, kUnroll of them per iteration: 128 bytes of
// weights per lane (256 columns a warp) in flight, each step's loads issued one iteration
// ahead of its MMAs, as soon as the step before it in the registers is multiplied; the
// partial sums meet in shared memory and are added in warp order. split_k follows (n, k,
// the SM count) only, and an iteration covers 256 columns at either width.
//
// kSwiGLU. The block stages x' for the columns of one iteration (split_k * kIterCols <=
// 2048) in shared memory with launch_swiglu's arithmetic, and reads its B fragments there;
// the next iteration's weight loads are issued before the staging and its barriers.
constexpr int kTileRows = 16;   // weight rows per tile: the MMA's M
constexpr int kIterCols = 256;  // columns of k per warp per iteration: 128 bytes a lane
// Half the bf16 GEMV's 16: a step has twice its columns, so the staged x' of an iteration
// (kGemvMaxRows rows of kStageCols bf16) still fits the 48 KB of static shared memory.
constexpr int kMaxSplitK = 8;
constexpr int kPlainWarps = 16;  // kPlain block: 512 threads, 2 blocks per SM
// kSwiGLU block: 512 threads too, so the 8B's down projection (256 tiles of 8 warps) spans
// 128 SMs rather than 64 blocks of 32 warps on half of them; each block stages all of x'
// once over its iterations, cheap beside its share of the weights.
constexpr int kSwigluWarps = 16;
constexpr int kStageCols = kMaxSplitK * kIterCols;  // 2048
// Each staged row is padded by 16 bytes, so a quarter-warp's 16-byte reads (rows g and
// g + 1, four lanes each 32 bytes apart) fall in eight different groups of 4 banks.
constexpr int kStageStride = kStageCols + 8;  // elements per staged row
static_assert(kStageStride * 2 % 128 == 16, "rows g and g + 1 start 16 bytes apart mod 128");

template <typename TOut>
struct GemvFp8Params {
  const __nv_bfloat16* x;     // [m, k] (kPlain) or [m, 2k] gate | up (kSwiGLU)
  const uint8_t* w;           // [n, k] e4m3 codes
  const float* scale;         // [n]
  const __nv_bfloat16* bias;  // [n] or null
  TOut* y;                    // [m, n]
  int m;                      // rows of x and y, in [1, kGemvMaxRows]
  int k;                      // columns of x' and w, a multiple of 16, < 2^24
  int64_t n;                  // rows of w, columns of y
  int split_k;                // warps per tile
};

// 16 e4m3 weights, streamed past L1 (which keeps x); a weak volatile load, as the bf16
// GEMV's (ptxas would sink a .nc load below the kSwiGLU staging's barriers).
__device__ __forceinline__ uint4 load_weights(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// The bf16 pair of e4m3 bytes `sel` of word w, exactly (e4m3_is_nan codes give ±480).
// prmt puts each byte b in the low byte of a 16-bit half and its sign replicated in the
// high byte (the half is b sign-extended); shifted left by 4, the half holds the sign at
// bit 15 and b's exponent and mantissa at bits 10..4, which the mask keeps. Read as bf16
// that is s · 2^(e-127) · (1 + m/8) for e > 0 and s · 2^-126 · m/8 (a bf16 subnormal) for
// e = 0: the e4m3 value times 2^-120 in both cases, so a multiply by 2^120 (exact: a power
// of two with a normal result; bf16 arithmetic keeps subnormal inputs) gives the value.
// The -0 addend keeps the sign of a zero.
template <uint32_t kSelector>
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t w) {
  uint32_t half_bytes;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(half_bytes) : "r"(w), "n"(kSelector));
  const uint32_t bits = (half_bytes << 4) & 0x87f087f0u;
  uint32_t out;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;"
      : "=r"(out)
      : "r"(bits), "r"(0x7b807b80u), "r"(0x80008000u));  // 2^120 (bf16 0x7b80), -0
  return out;
}
// Bytes 0, 1 and bytes 2, 3 (prmt selectors: byte j, then byte j with sign replication).
__device__ __forceinline__ uint32_t decode_lo(uint32_t w) {
  return e4m3x2_to_bf16x2<0x9180u>(w);
}
__device__ __forceinline__ uint32_t decode_hi(uint32_t w) {
  return e4m3x2_to_bf16x2<0xb3a2u>(w);
}

// acc += A · B for one m16n8k16 bf16 MMA with f32 accumulation.
__device__ __forceinline__ void mma_16816(float (&acc)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                          uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// silu(gate) * up of two bf16 pairs, rounded to a bf16 pair: launch_swiglu's arithmetic.
__device__ __forceinline__ uint32_t silu_mul_bf16x2(uint32_t gate, uint32_t up) {
  const float2 g = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&gate));
  const float2 u = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&up));
  const __nv_bfloat162 out =
      __floats2bfloat162_rn(detail::silu_mul(g.x, u.x), detail::silu_mul(g.y, u.y));
  return *reinterpret_cast<const uint32_t*>(&out);
}

// x'[i, first_col + c] for i in [0, m), c in [0, cols), into stage[i * kStageStride + c];
// zero past column k. Every thread of the block calls it.
__device__ __forceinline__ void stage_swiglu(const __nv_bfloat16* x, int m, int k, int first_col,
                                             int cols, __nv_bfloat16* stage) {
  for (int i = 0; i < m; ++i) {
    const __nv_bfloat16* gate = x + int64_t{i} * 2 * k + first_col;
    uint32_t* out = reinterpret_cast<uint32_t*>(stage + i * kStageStride);
    for (int c = 2 * static_cast<int>(threadIdx.x); c < cols; c += 2 * blockDim.x) {
      uint32_t pair = 0;
      if (first_col + c < k) {
        pair = silu_mul_bf16x2(*reinterpret_cast<const uint32_t*>(gate + c),
                               *reinterpret_cast<const uint32_t*>(gate + k + c));
      }
      out[c / 2] = pair;
    }
  }
}

template <GemvInput kInput, int kWarps, typename TOut, int kLaneBytes>
__global__ void __launch_bounds__(kWarps * 32, 32 / kWarps) gemv_fp8_kernel(GemvFp8Params<TOut> p) {
  constexpr bool kSwiglu = kInput == GemvInput::kSwiGLU;
  static_assert(kLaneBytes == 16 || kLaneBytes == 32, "a lane reads 16 or 32 bytes a row a step");
  constexpr int kSub = kLaneBytes / 16;           // 16-byte loads of a row per lane and step
  constexpr int kStepCols = 4 * kLaneBytes;       // columns of k per warp step
  constexpr int kUnroll = kIterCols / kStepCols;  // steps in flight per iteration
  constexpr int kStageBytes = kSwiglu ? kGemvMaxRows * kStageStride * 2 : 0;
  constexpr int kPartialBytes = kWarps * 32 * 16;
  // The staged x' during the k loop, then the warps' partial sums.
  __shared__ alignas(
      16) unsigned char smem[kStageBytes > kPartialBytes ? kStageBytes : kPartialBytes];
  auto* stage = reinterpret_cast<__nv_bfloat16*>(smem);
  auto* partials = reinterpret_cast<float4*>(smem);

  const int warp = static_cast<int>(threadIdx.x >> 5);
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int g = lane >> 2;
  const int q = lane & 3;
  const int split_k = p.split_k;
  const int kw = warp & (split_k - 1);
  const int64_t tile = int64_t{blockIdx.x} * (kWarps / split_k) + warp / split_k;
  const int k = p.k;

  // A tile past n (the grid's last block) computes on row n - 1 and writes nothing.
  const int64_t row_lo = tile * kTileRows + g;
  const int64_t row_hi = row_lo + 8;
  const uint8_t* w_lo = p.w + min(row_lo, p.n - 1) * k + kLaneBytes * q;
  const int hi_offset = static_cast<int>(min(row_hi, p.n - 1) - min(row_lo, p.n - 1)) * k;
  const bool has_x_row = g < p.m;
  const __nv_bfloat16* x_row = p.x + (has_x_row ? g * k : 0) + kLaneBytes * q;  // kPlain
  const int stage_col = kw * kStepCols + kLaneBytes * q;  // kSwiGLU, + u * split_k * kStepCols

  // Iteration `it` covers the block's steps [it * per_iter, (it + 1) * per_iter); this warp
  // takes it * per_iter + u * split_k + kw for u in [0, kUnroll). A lane's 16 columns that lie
  // past k (only in the last iteration) load column 0 of its rows and are zeroed.
  const int per_iter = split_k * kUnroll;
  const int iterations = (k + per_iter * kStepCols - 1) / (per_iter * kStepCols);
  uint4 a_lo[kUnroll][kSub], a_hi[kUnroll][kSub];
  const auto load_step = [&](int it, int u) {
    const int col = (it * per_iter + u * split_k + kw) * kStepCols;
#pragma unroll
    for (int t = 0; t < kSub; ++t) {
      const bool in_k = col + kLaneBytes * q + 16 * t < k;
      const int off = in_k ? col + 16 * t : -kLaneBytes * q;
      a_lo[u][t] = load_weights(w_lo + off);
      a_hi[u][t] = load_weights(w_lo + hi_offset + off);
      if (!in_k) a_lo[u][t] = a_hi[u][t] = make_uint4(0, 0, 0, 0);
    }
  };

  // Weights only: in flight while the previous kernel finishes.
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) load_step(0, u);
  detail::wait_for_prior_grids();
  if constexpr (kSwiglu) {
    stage_swiglu(p.x, p.m, k, 0, per_iter * kStepCols, stage);
    __syncthreads();
  }
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int it = 0; it < iterations; ++it) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int col = (it * per_iter + u * split_k + kw) * kStepCols;
#pragma unroll
      for (int t = 0; t < kSub; ++t) {
        uint4 b0 = make_uint4(0, 0, 0, 0), b1 = make_uint4(0, 0, 0, 0);
        if (has_x_row && col + kLaneBytes * q + 16 * t < k) {
          const uint4* src;
          if constexpr (kSwiglu) {
            src = reinterpret_cast<const uint4*>(stage + g * kStageStride + stage_col +
                                                 u * split_k * kStepCols + 16 * t);
            b0 = src[0];
            b1 = src[1];
          } else {
            src = reinterpret_cast<const uint4*>(x_row + col + 16 * t);
            b0 = __ldg(src);
            b1 = __ldg(src + 1);
          }
        }
        // Columns +0..3, +4..7 (x pairs in b0), +8..11, +12..15 (in b1).
        const uint4& lo = a_lo[u][t];
        const uint4& hi = a_hi[u][t];
        mma_16816(acc, decode_lo(lo.x), decode_lo(hi.x), decode_hi(lo.x), decode_hi(hi.x), b0.x,
                  b0.y);
        mma_16816(acc, decode_lo(lo.y), decode_lo(hi.y), decode_hi(lo.y), decode_hi(hi.y), b0.z,
                  b0.w);
        mma_16816(acc, decode_lo(lo.z), decode_lo(hi.z), decode_hi(lo.z), decode_hi(hi.z), b1.x,
                  b1.y);
        mma_16816(acc, decode_lo(lo.w), decode_lo(hi.w), decode_hi(lo.w), decode_hi(hi.w), b1.z,
                  b1.w);
      }
      // Step u of the next iteration goes in flight as soon as its registers are free, so
      // the warp keeps kUnroll steps of loads in flight while it decodes and multiplies
      // (and before the staging work and its barriers).
      if (it + 1 < iterations) load_step(it + 1, u);
    }
    if (it + 1 < iterations) {
      if constexpr (kSwiglu) {
        __syncthreads();  // every warp has read this iteration's x'
        stage_swiglu(p.x, p.m, k, (it + 1) * per_iter * kStepCols, per_iter * kStepCols, stage);
        __syncthreads();
      }
    }
  }

  detail::allow_dependent_grids();
  if (split_k > 1) {  // uniform over the block
    __syncthreads();  // kSwiGLU: the staged x' is no longer read; partials reuse it
    partials[warp * 32 + lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    __syncthreads();
    if (kw != 0) return;
    acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
    for (int j = 0; j < split_k; ++j) {
      const float4 part = partials[(warp + j) * 32 + lane];
      acc[0] += part.x;
      acc[1] += part.y;
      acc[2] += part.z;
      acc[3] += part.w;
    }
  }

  const auto store = [&](int i, int64_t row, float sum) {
    if (i >= p.m || row >= p.n) return;
    const float b = p.bias != nullptr ? detail::to_float(p.bias[row]) : 0.0f;
    p.y[i * p.n + row] = detail::from_float<TOut>(__fmaf_rn(sum, p.scale[row], b));
  };
  store(2 * q, row_lo, acc[0]);
  store(2 * q + 1, row_lo, acc[1]);
  store(2 * q, row_hi, acc[2]);
  store(2 * q + 1, row_hi, acc[3]);
}

// Warps per tile: doubled from 1 until the grid has kPlainWarps warps per SM, while an
// iteration still fits in k.
int split_k_for(int64_t n, int64_t k, int sms) {
  const int64_t tiles = (n + kTileRows - 1) / kTileRows;
  const int64_t blocks_of_64 = (k + 63) / 64;
  int split_k = 1;
  while (split_k < kMaxSplitK && tiles * split_k < int64_t{sms} * kPlainWarps &&
         int64_t{split_k} * 2 * (kIterCols / 64) <= blocks_of_64) {
    split_k *= 2;
  }
  return split_k;
}

template <GemvInput kInput, int kWarps, typename TOut>
cudaError_t launch(const GemvFp8Params<TOut>& p, cudaStream_t stream) {
  const int64_t tiles = (p.n + kTileRows - 1) / kTileRows;
  const int64_t tiles_per_block = kWarps / p.split_k;
  const int64_t blocks = (tiles + tiles_per_block - 1) / tiles_per_block;
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(blocks));
  if (p.m == 1) {
    return detail::launch_kernel(gemv_fp8_kernel<kInput, kWarps, TOut, 32>, grid, dim3(kWarps * 32),
                                 0, stream, p);
  }
  return detail::launch_kernel(gemv_fp8_kernel<kInput, kWarps, TOut, 16>, grid, dim3(kWarps * 32),
                               0, stream, p);
}

// out[4 t + 0..3] = the decode of codes[4 t + 0..3], with the kernel's functions.
__global__ void decode_e4m3_kernel(const uint32_t* codes, int64_t words, uint2* out) {
  detail::wait_for_prior_grids();
  for (int64_t t = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; t < words;
       t += int64_t{gridDim.x} * blockDim.x) {
    out[t] = make_uint2(decode_lo(codes[t]), decode_hi(codes[t]));
  }
  detail::allow_dependent_grids();
}

}  // namespace

template <typename TOut>
cudaError_t launch_gemv_fp8(const __nv_bfloat16* x, int64_t m, int64_t k, GemvInput input,
                            const uint8_t* w8, const float* scale, int64_t n,
                            const __nv_bfloat16* bias, TOut* y, cudaStream_t stream) {
  if (!gemv_fp8_supports(m, k, x, w8) || n <= 0 || x == nullptr || w8 == nullptr ||
      scale == nullptr || y == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (input != GemvInput::kPlain && input != GemvInput::kSwiGLU) return cudaErrorInvalidValue;
  int sms = 0;
  if (const cudaError_t e = detail::sm_count(&sms); e != cudaSuccess) return e;
  const GemvFp8Params<TOut> p{
      x, w8, scale, bias, y, static_cast<int>(m), static_cast<int>(k), n, split_k_for(n, k, sms)};
  if (input == GemvInput::kSwiGLU) return launch<GemvInput::kSwiGLU, kSwigluWarps>(p, stream);
  return launch<GemvInput::kPlain, kPlainWarps>(p, stream);
}

template cudaError_t launch_gemv_fp8<__nv_bfloat16>(const __nv_bfloat16*, int64_t, int64_t,
                                                    GemvInput, const uint8_t*, const float*,
                                                    int64_t, const __nv_bfloat16*, __nv_bfloat16*,
                                                    cudaStream_t);
template cudaError_t launch_gemv_fp8<float>(const __nv_bfloat16*, int64_t, int64_t, GemvInput,
                                            const uint8_t*, const float*, int64_t,
                                            const __nv_bfloat16*, float*, cudaStream_t);

cudaError_t launch_decode_e4m3(const uint8_t* codes, int64_t count, __nv_bfloat16* out,
                               cudaStream_t stream) {
  if (codes == nullptr || out == nullptr || count <= 0 || count % 4 != 0 ||
      !detail::aligned_to(codes, 4) || !detail::aligned_to(out, 8)) {
    return cudaErrorInvalidValue;
  }
  const int64_t words = count / 4;
  constexpr int kThreads = 256;
  return detail::launch_kernel(decode_e4m3_kernel, dim3(detail::blocks_for(words, kThreads)),
                               dim3(kThreads), 0, stream, reinterpret_cast<const uint32_t*>(codes),
                               words, reinterpret_cast<uint2*>(out));
}

}  // namespace cellm::cuda
