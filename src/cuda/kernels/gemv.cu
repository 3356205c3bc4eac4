#include "cuda/kernels/gemv.h"

#include <algorithm>
#include <climits>

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/launch.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "gemv.cu needs sm_80 or newer (bf16 mma.sync)"
#endif

namespace cellm::cuda {
namespace {

// The work of one warp is a tile of 16 weight rows times all m (<= 8) rows of x: one
// tensor-core mma.m16n8k16 (A = the 16 weight rows, B = the 8 x rows, D in f32) per 16
// columns of k. The MMA keeps the arithmetic off the issue slots (a CUDA-core dot product
// at m = 8 needs ~10 instructions per weight element, most of what an SM can issue while
// it streams its share of the bandwidth); the weights go from their 16-byte global loads
// straight into the MMA's registers, never through shared memory.
//
// Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type").
// Lane = 4 g + q. A warp step covers 32 consecutive columns [c0, c0 + 32) of k: lane (g, q)
// loads the 8 columns [c0 + 8q, c0 + 8q + 8) of weight rows g and g + 8 (uint4 lo, hi) and
// of x row g (uint4 x), and feeds them to two MMAs. The MMA's k index j reaches a lane
// only through q (the lanes holding j in the A fragment hold it in the B fragment too),
// so any bijection between j and the lane's columns is a valid order of the dot product;
// this one makes each 32-bit register of the loads a register of the fragments, with no
// shuffle:
//   MMA 1: A = {lo.x, hi.x, lo.y, hi.y} (columns +0..3 of rows g, g + 8), B = {x.x, x.y}
//   MMA 2: A = {lo.z, hi.z, lo.w, hi.w} (columns +4..7),                   B = {x.z, x.w}
// The accumulators hold D[g][2q], D[g][2q+1], D[g+8][2q], D[g+8][2q+1], D[r][i] = y[i,
// tile row r]. x rows >= m are zero and their D columns are dropped.
//
// Split k. split_k warps (a power of two, <= 16) share a tile: warp kw of the tile takes
// the steps s with s % split_k == kw, kUnroll of them per iteration, whose 2 * kUnroll
// weight loads (128 bytes per lane) are issued together, one iteration ahead of their
// MMAs; the partial sums meet in shared memory and are added in warp order. A block of
// kWarps warps holds kWarps / split_k tiles. split_k follows (n, k) only, so a row of y
// has one summation order for every m and both inputs.
//
// kSwiGLU. The block stages x' for the columns of one iteration (split_k * kUnroll * 32 <=
// 2048) in shared memory, computed with launch_swiglu's arithmetic, and reads its B
// fragments there. The next iteration's weight loads are issued before the staging and
// its barriers, so the silu work overlaps the weight traffic. The x' work is repeated
// by every block, so these blocks are 32 warps (one per SM) rather than 16.
constexpr int kTileRows = 16;  // weight rows per tile: the MMA's M
constexpr int kStepCols = 32;  // columns of k per warp step: 4 lanes x 8 bf16
constexpr int kUnroll = 4;     // warp steps (2 weight loads each) in flight per iteration
constexpr int kMaxSplitK = 16;
constexpr int kPlainWarps = 16;   // kPlain block: 512 threads, 2 blocks per SM
constexpr int kSwigluWarps = 32;  // kSwiGLU block: 1024 threads, 1 block per SM
// x' staging: kGemvMaxRows rows of one iteration's columns, each row padded by 64 bytes
// so the 16-byte reads of rows g and g + 1 (one quarter-warp) fall in different banks.
constexpr int kStageCols = kMaxSplitK * kUnroll * kStepCols;  // 2048
constexpr int kStageStride = kStageCols + 32;                 // elements per staged row

template <typename TOut>
struct GemvParams {
  const __nv_bfloat16* x;     // [m, k] (kPlain) or [m, 2k] gate | up (kSwiGLU)
  const __nv_bfloat16* w;     // [n, k]
  const __nv_bfloat16* bias;  // [n] or null
  TOut* y;                    // [m, n]
  int m;                      // rows of x and y, in [1, kGemvMaxRows]
  int k;                      // columns of x' and w, a multiple of 8, < 2^24 (so 8 k fits an int)
  int64_t n;                  // rows of w, columns of y
  int split_k;                // warps per tile (kTensorCores) or per row group (kRows)
};

// 8 bf16 of weights, streamed: each is read once, so it skips L1 (which keeps x, read by
// every warp). A weak (not .nc) volatile load: ptxas sinks .nc loads below a following
// __syncthreads, which would drain the loads in flight at every kSwiGLU staging.
__device__ __forceinline__ uint4 load_weights(const __nv_bfloat16* p) {
  uint4 v;
  asm volatile("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// acc += A · B for one m16n8k16 bf16 MMA with f32 accumulation (fragments as above).
__device__ __forceinline__ void mma_16816(float (&acc)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                          uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// silu(gate) * up of two bf16 pairs, rounded to a bf16 pair: launch_swiglu's arithmetic
// (bf16 -> f32 is exact; cvt.rn.bf16x2 rounds each half as __float2bfloat16_rn does).
__device__ __forceinline__ uint32_t silu_mul_bf16x2(uint32_t gate, uint32_t up) {
  const float2 g = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&gate));
  const float2 u = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&up));
  const __nv_bfloat162 out =
      __floats2bfloat162_rn(detail::silu_mul(g.x, u.x), detail::silu_mul(g.y, u.y));
  return *reinterpret_cast<const uint32_t*>(&out);
}

// x'[i, first_col + c] for i in [0, m), c in [0, cols), into stage[i * kStageStride + c];
// zero past column k. Every thread of the block calls it. A thread computes one pair of
// columns at a time: the weights in flight hold half the registers, and the silu of more
// columns at once would spill.
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

template <GemvInput kInput, int kWarps, typename TOut>
__global__ void __launch_bounds__(kWarps * 32, 32 / kWarps) gemv_kernel(GemvParams<TOut> p) {
  constexpr bool kSwiglu = kInput == GemvInput::kSwiGLU;
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
  const __nv_bfloat16* w_lo = p.w + min(row_lo, p.n - 1) * k + 8 * q;
  // Row g + 8 as an offset from row g (one register, not a second pointer's two).
  const int hi_offset = static_cast<int>(min(row_hi, p.n - 1) - min(row_lo, p.n - 1)) * k;
  const bool has_x_row = g < p.m;
  const __nv_bfloat16* x_row = p.x + (has_x_row ? g * k : 0) + 8 * q;  // kPlain
  const int stage_col = kw * kStepCols + 8 * q;  // kSwiGLU, + u * split_k * kStepCols

  // Iteration `it` covers the block's steps [it * per_iter, (it + 1) * per_iter); this
  // warp takes it * per_iter + u * split_k + kw for u in [0, kUnroll). A lane whose 8
  // columns lie past k (only in the last iteration) loads column 0 and zeroes it.
  const int per_iter = split_k * kUnroll;
  const int iterations = (k + per_iter * kStepCols - 1) / (per_iter * kStepCols);
  uint4 a_lo[kUnroll], a_hi[kUnroll];
  const auto load_iteration = [&](int it) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int col = (it * per_iter + u * split_k + kw) * kStepCols;
      const bool in_k = col + 8 * q < k;
      a_lo[u] = load_weights(w_lo + (in_k ? col : -8 * q));
      a_hi[u] = load_weights(w_lo + hi_offset + (in_k ? col : -8 * q));
      if (!in_k) a_lo[u] = a_hi[u] = make_uint4(0, 0, 0, 0);
    }
  };

  load_iteration(0);  // weights only: in flight while the previous kernel finishes
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
      uint4 b = make_uint4(0, 0, 0, 0);
      if (has_x_row && col + 8 * q < k) {
        if constexpr (kSwiglu) {
          b = *reinterpret_cast<const uint4*>(stage + g * kStageStride + stage_col +
                                              u * split_k * kStepCols);
        } else {
          b = __ldg(reinterpret_cast<const uint4*>(x_row + col));
        }
      }
      mma_16816(acc, a_lo[u].x, a_hi[u].x, a_lo[u].y, a_hi[u].y, b.x, b.y);
      mma_16816(acc, a_lo[u].z, a_hi[u].z, a_lo[u].w, a_hi[u].w, b.z, b.w);
    }
    if (it + 1 < iterations) {
      // The next weights go in flight before the staging work and its barriers.
      load_iteration(it + 1);
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

  const auto store = [&](int i, int64_t row, float v) {
    if (i >= p.m || row >= p.n) return;
    if (p.bias != nullptr) v += detail::to_float(p.bias[row]);
    p.y[i * p.n + row] = detail::from_float<TOut>(v);
  };
  store(2 * q, row_lo, acc[0]);
  store(2 * q + 1, row_lo, acc[1]);
  store(2 * q, row_hi, acc[2]);
  store(2 * q + 1, row_hi, acc[3]);
}

// Warps per tile: doubled from 1 until the grid has kPlainWarps warps per SM (a kPlain
// block per SM, 64 KB of loads in flight: about twice what covers HBM's latency at full
// bandwidth), while an iteration still fits in k.
int split_k_for(int64_t n, int64_t k, int sms) {
  const int64_t tiles = (n + kTileRows - 1) / kTileRows;
  const int64_t steps = (k + kStepCols - 1) / kStepCols;
  int split_k = 1;
  while (split_k < kMaxSplitK && tiles * split_k < int64_t{sms} * kPlainWarps &&
         int64_t{split_k} * 2 * kUnroll <= steps) {
    split_k *= 2;
  }
  return split_k;
}

template <GemvInput kInput, int kWarps, typename TOut>
cudaError_t launch(const GemvParams<TOut>& p, cudaStream_t stream) {
  const int64_t tiles = (p.n + kTileRows - 1) / kTileRows;
  const int64_t tiles_per_block = kWarps / p.split_k;
  const int64_t blocks = (tiles + tiles_per_block - 1) / tiles_per_block;
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  return detail::launch_kernel(gemv_kernel<kInput, kWarps, TOut>,
                               dim3(static_cast<unsigned>(blocks)), dim3(kWarps * 32), 0, stream,
                               p);
}

// The kRows kernel. Warp group g of the grid (S warps, rows_split_for) owns weight rows
// [kGemvRowsPerWarp g, +kGemvRowsPerWarp) whole: lane l of the group's warp `part` reads
// columns [256 c + 8 l, +8) of each of them for the chunks c of its runs (U consecutive
// chunks from U part, then every S U: one 512-byte contiguous load per row per chunk, a run
// in flight), multiplies them with the same columns of every x row in f32 FMAs, and sums
// its lanes at the end (xor-shuffle tree); the group's S sums are then added in order of
// part through shared memory. The order of the sum depends on (k, S) only (U only groups
// the loads); S is the caller's, or follows (n, k, the SM count). For kSwiGLU, x' is
// computed per element from gate and up as launch_swiglu does (rounded to bf16).
constexpr int kRowsWarps = 8;  // 256-thread blocks
static_assert(kGemvRowsMaxSplit <= kRowsWarps, "a split shares one block's warps");
constexpr int kChunkCols = 256;
// U, the chunks in flight: 2 measured faster than 4 on every 8B and 1B shape at m = 1 (4
// holds twice the registers, so fewer warps per SM).
constexpr int kRowsUnroll = 2;
// How many of a warp's first U x R weight loads (chunk-major: chunk 0's R rows, then
// chunk 1's) it issues before its wait for the previous kernel, the rest right after:
// the loads a launched grid queues at the memory ahead of the small kernel (a norm, the
// attention) it launched during, which is on the step's critical path. 4 loads (one chunk)
// beat 0, 2, 6 and 8 on the 8B and the 1B at one row; for the same reason the warps ask
// the L2 for no further chunks before the wait (an L2 prefetch there cost 1.5-5%).
constexpr int kRowsPrewaitLoads = 4;
static_assert(kRowsPrewaitLoads >= 0 && kRowsPrewaitLoads <= kRowsUnroll * kGemvRowsPerWarp);

__device__ __forceinline__ void bf16x8_to_floats(const uint4& v, float (&out)[8]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(words[i] << 16);
    out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

// M: the x rows the accumulators are sized for (>= p.m), so m = 1 keeps 4 of them.
// U: chunks of each row in flight.
template <GemvInput kInput, int M, int U, typename TOut>
__global__ void __launch_bounds__(kRowsWarps * 32) gemv_rows_kernel(GemvParams<TOut> p) {
  constexpr int R = kGemvRowsPerWarp;
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int warp = static_cast<int>(threadIdx.x >> 5);
  // S = p.split_k warps share a group's rows: warp `part` of the group takes the runs of U
  // chunks from U part, every S U, and the group's sums meet in shared memory.
  const int S = p.split_k;
  const int group = warp / S;
  const int part = warp % S;
  const int64_t row0 = (int64_t{blockIdx.x} * (kRowsWarps / S) + group) * R;
  // A warp past n leaves, but not under a split, whose block barrier it must reach: there
  // it computes on row n - 1 like the last warp's spare rows and stores nothing.
  if (S == 1 && row0 >= p.n) return;
  const int k = p.k;
  const int chunks = (k + kChunkCols - 1) / kChunkCols;
  const int stride = S * U;  // chunks from one of this warp's runs to its next
  // Rows past n (the last warp) read row n - 1 and are not stored.
  const __nv_bfloat16* w_row[R];
#pragma unroll
  for (int r = 0; r < R; ++r) w_row[r] = p.w + min(row0 + r, p.n - 1) * k + 8 * lane;

  uint4 wv[U][R];
  // Loads [begin, end) of the run from chunk c0 (load u R + r is chunk c0 + u's row r)
  // into wv.
  const auto load_run = [&](int c0, int begin, int end) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int col = (c0 + u) * kChunkCols;
      const bool in_k = col + 8 * lane < k;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (u * R + r < begin || u * R + r >= end) continue;
        wv[u][r] = in_k ? load_weights(w_row[r] + col) : make_uint4(0, 0, 0, 0);
      }
    }
  };
  const auto load_chunks = [&](int c0) { load_run(c0, 0, U * R); };
  // Weights only: in flight while the previous kernel finishes (the first
  // kRowsPrewaitLoads loads of the run; the rest right after the wait).
  load_run(part * U, 0, kRowsPrewaitLoads);
  detail::wait_for_prior_grids();
  if constexpr (kRowsPrewaitLoads < U * R) load_run(part * U, kRowsPrewaitLoads, U * R);

  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int i = 0; i < M; ++i) acc[r][i] = 0.0f;
  }
  for (int c0 = part * U; c0 < chunks; c0 += stride) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int col = (c0 + u) * kChunkCols + 8 * lane;
      if (col >= k) continue;
      float wf[R][8];
#pragma unroll
      for (int r = 0; r < R; ++r) bf16x8_to_floats(wv[u][r], wf[r]);
#pragma unroll
      for (int i = 0; i < M; ++i) {
        if (i >= p.m) break;
        uint4 xv;
        if constexpr (kInput == GemvInput::kSwiGLU) {
          const __nv_bfloat16* gate = p.x + int64_t{i} * 2 * k + col;
          const uint4 g = __ldg(reinterpret_cast<const uint4*>(gate));
          const uint4 up = __ldg(reinterpret_cast<const uint4*>(gate + k));
          xv = make_uint4(silu_mul_bf16x2(g.x, up.x), silu_mul_bf16x2(g.y, up.y),
                          silu_mul_bf16x2(g.z, up.z), silu_mul_bf16x2(g.w, up.w));
        } else {
          xv = __ldg(reinterpret_cast<const uint4*>(p.x + int64_t{i} * k + col));
        }
        float xf[8];
        bf16x8_to_floats(xv, xf);
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[r][i] = fmaf(wf[r][e], xf[e], acc[r][i]);
        }
      }
    }
    if (c0 + stride < chunks) load_chunks(c0 + stride);
  }
  detail::allow_dependent_grids();

  // Each weight row's sum: the warp's lanes (xor-shuffle tree), then, under a split, the
  // group's warps in order of part.
  float sums[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int i = 0; i < M; ++i) sums[r][i] = i < p.m ? detail::warp_sum(acc[r][i]) : 0.0f;
  }
  if (S > 1) {
    __shared__ float s_parts[kRowsWarps][R][M];
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int i = 0; i < M; ++i) s_parts[warp][r][i] = sums[r][i];
      }
    }
    __syncthreads();
    if (part != 0) return;
    for (int w = warp + 1; w < warp + S; ++w) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int i = 0; i < M; ++i) sums[r][i] += s_parts[w][r][i];
      }
    }
  }

#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int i = 0; i < M; ++i) {
      if (i >= p.m) break;
      const float sum = sums[r][i];
      const int64_t row = row0 + r;
      if (lane == (r * M + i) % 32 && row < p.n) {
        float v = sum;
        if (p.bias != nullptr) v += detail::to_float(p.bias[row]);
        p.y[i * p.n + row] = detail::from_float<TOut>(v);
      }
    }
  }
}

// Blocks of the kRows kernel an SM holds at m = 1 (62-76 registers a thread).
constexpr int kRowsBlocksPerSm = 3;

// S when the caller leaves it to launch_gemv, the warps that share a kRows group's rows:
// doubled from 1 while the grid still fits one wave (kRowsBlocksPerSm blocks per SM) and
// each warp keeps a run of U chunks. A grid of few groups (the 8B o and down projections:
// 1,024 groups of 4 rows, 128 blocks) then keeps 2-4 times the loads in flight. A function
// of (groups, k, sms) only. Gemm's tuner times every split instead (gemv.h).
int rows_split_for(int64_t groups, int64_t k, int sms) {
  const int64_t chunks = (k + kChunkCols - 1) / kChunkCols;
  int split = 1;
  while (split < kRowsWarps && chunks >= int64_t{2} * split * kRowsUnroll &&
         (groups * 2 * split + kRowsWarps - 1) / kRowsWarps <= int64_t{kRowsBlocksPerSm} * sms) {
    split *= 2;
  }
  return split;
}

// p.split_k: the caller's split, or kGemvRowsAutoSplit.
template <GemvInput kInput, int M, typename TOut>
cudaError_t launch_rows(GemvParams<TOut> p, cudaStream_t stream) {
  const int64_t groups = (p.n + kGemvRowsPerWarp - 1) / kGemvRowsPerWarp;
  if (p.split_k == kGemvRowsAutoSplit) {
    int sms = 0;
    if (const cudaError_t e = detail::sm_count(&sms); e != cudaSuccess) return e;
    p.split_k = rows_split_for(groups, p.k, sms);
  }
  const int64_t groups_per_block = kRowsWarps / p.split_k;
  const int64_t blocks = (groups + groups_per_block - 1) / groups_per_block;
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  return detail::launch_kernel(gemv_rows_kernel<kInput, M, kRowsUnroll, TOut>,
                               dim3(static_cast<unsigned>(blocks)), dim3(kRowsWarps * 32), 0,
                               stream, p);
}

template <GemvInput kInput, typename TOut>
cudaError_t launch_rows_for_m(const GemvParams<TOut>& p, cudaStream_t stream) {
  if (p.m <= 1) return launch_rows<kInput, 1>(p, stream);
  if (p.m <= 2) return launch_rows<kInput, 2>(p, stream);
  if (p.m <= 4) return launch_rows<kInput, 4>(p, stream);
  return launch_rows<kInput, kGemvMaxRows>(p, stream);
}

}  // namespace

template <typename TOut>
cudaError_t launch_gemv(const __nv_bfloat16* x, int64_t m, int64_t k, GemvInput input,
                        const __nv_bfloat16* w, int64_t n, const __nv_bfloat16* bias, TOut* y,
                        cudaStream_t stream, GemvKernel kernel, int rows_split) {
  if (!gemv_supports(m, k, x, w) || n <= 0 || x == nullptr || w == nullptr || y == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (input != GemvInput::kPlain && input != GemvInput::kSwiGLU) return cudaErrorInvalidValue;
  if (!gemv_rows_split_valid(rows_split) ||
      (kernel != GemvKernel::kRows && rows_split != kGemvRowsAutoSplit)) {
    return cudaErrorInvalidValue;
  }
  if (kernel == GemvKernel::kRows) {
    const int rows = static_cast<int>(m), cols = static_cast<int>(k);
    const GemvParams<TOut> p{x, w, bias, y, rows, cols, n, rows_split};
    if (input == GemvInput::kSwiGLU) return launch_rows_for_m<GemvInput::kSwiGLU>(p, stream);
    return launch_rows_for_m<GemvInput::kPlain>(p, stream);
  }
  if (kernel != GemvKernel::kTensorCores) return cudaErrorInvalidValue;
  int sms = 0;
  if (const cudaError_t e = detail::sm_count(&sms); e != cudaSuccess) return e;
  const GemvParams<TOut> p{
      x, w, bias, y, static_cast<int>(m), static_cast<int>(k), n, split_k_for(n, k, sms)};
  if (input == GemvInput::kSwiGLU) return launch<GemvInput::kSwiGLU, kSwigluWarps>(p, stream);
  return launch<GemvInput::kPlain, kPlainWarps>(p, stream);
}

template cudaError_t launch_gemv<__nv_bfloat16>(const __nv_bfloat16*, int64_t, int64_t, GemvInput,
                                                const __nv_bfloat16*, int64_t, const __nv_bfloat16*,
                                                __nv_bfloat16*, cudaStream_t, GemvKernel, int);
template cudaError_t launch_gemv<float>(const __nv_bfloat16*, int64_t, int64_t, GemvInput,
                                        const __nv_bfloat16*, int64_t, const __nv_bfloat16*, float*,
                                        cudaStream_t, GemvKernel, int);

}  // namespace cellm::cuda
