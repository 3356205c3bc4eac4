#include "cuda/kernels/skinny_gemm.h"

#include <cooperative_groups.h>
#include <cuda.h>  // CUtensorMap and its enums (types only: no driver library is linked)
#include <cudaTypedefs.h>

#include <algorithm>
#include <climits>
#include <map>
#include <mutex>

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/mbarrier.cuh"
#include "cuda/kernels/mma.cuh"
#include "cuda/kernels/wgmma.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "skinny_gemm.cu needs sm_90 (TMA tensor copies, mbarrier transaction counts)"
#endif

// The consumers multiply with wgmma when compiled for sm_90a (__CUDA_ARCH_FEAT_SM90_ALL, as
// CMake's default architecture "90a" is): warpgroups read both operands from the stage. A
// plain sm_90 build has no wgmma and multiplies with ldmatrix + mma.sync, per warp.

namespace cellm::cuda {
namespace {

using bf16 = __nv_bfloat16;
using detail::barrier_arrive;
using detail::barrier_arrive_expect;
using detail::barrier_init;
using detail::barrier_wait;
using detail::fence_barrier_init;
using detail::ldmatrix_x4;
using detail::mma_16816;
using detail::smem_addr;

// A block: kConsumers warps that multiply, each owning 16 of the block's kBlockRows weight
// rows (the M of mma.m16n8k16) and every x row (its N, 8 at a time), and one producer warp
// whose first lane issues the TMA copies. A stage is the block's weight rows and all x
// rows over kStageCols columns: kBoxes weight boxes and kBoxes x boxes, each of 128-byte
// rows (kBoxCols columns) stored with the 128-byte swizzle (16-byte chunk c of row r at
// chunk c ^ (r % 8)), so the 8 rows an ldmatrix phase reads fall in distinct banks
// without padding. Two boxes side by side give each weight row 256 contiguous bytes a
// stage (measured against one box: 7-16% faster at 32 rows, -1 to +4% at 16; four boxes
// leave too few stages in the ring).
// Each stage has a `full` barrier (the producer arms it with the stage's byte count; the
// copies complete it) and an `empty` one (each consumer warp arrives when it has read the
// stage; the producer waits on it before it refills the slot).
//
// kConsumers (kBlockRows = 16 kConsumers) is 4 up to 32 x rows and 8 for 33-128: every
// block reads all of x each stage, so at 64 x rows 64-row blocks would read as many bytes
// of x from L2 as of weights; 128-row blocks read half as many (measured 4-25% faster at
// 64 rows). At 128 x rows a stage is 64 KB (one block an SM, either ring); 256-row blocks
// there, reading x once for twice the weights, measured slower.
constexpr int consumers_for(int mt) {
  return mt == 8 || mt == 16 ? 8 : 4;
}
// A box row is 128 bytes, the 128-byte swizzle's width: 64 bf16 or 128 e4m3 columns. A
// stage is two boxes side by side, so the stage's bytes do not depend on the operand type.
constexpr int kRowBytes = 128;
constexpr int kBoxes = 2;
template <bool kE4m3>
constexpr int box_cols() {
  return kE4m3 ? kRowBytes : kRowBytes / 2;
}
template <bool kE4m3>
constexpr int stage_cols() {
  return kBoxes * box_cols<kE4m3>();
}
static_assert(stage_cols<false>() == kSkinnyKStep && stage_cols<true>() == kSkinnyE4m3KStep);
constexpr int kSwizzleAlign = 1024;  // the 128-byte swizzle's period

// MT: x tiles of 8 rows (m <= 8 MT). An x box is 8 MT rows (rows past m are zero-filled
// by the copy), so a box pair is 2 W KB of weights and MT KB of x; a stage is kBoxes pairs.
template <int MT>
constexpr int weight_box_bytes() {
  return 16 * consumers_for(MT) * kRowBytes;
}
template <int MT>
constexpr int x_box_bytes() {
  return 8 * MT * kRowBytes;
}
template <int MT>
constexpr int weight_bytes() {
  return kBoxes * weight_box_bytes<MT>();
}
template <int MT>
constexpr int stage_bytes() {
  return weight_bytes<MT>() + kBoxes * x_box_bytes<MT>();
}
// The ring's stages (SkinnyRing, skinny_gemm.h): about 96 KB of them (two blocks share an
// SM) or about 200 KB (one block an SM), at least two. A block's bytes in flight are its
// ring: at 16 rows a block of the shared ring streams ~15 GB/s whatever the shape, as if
// each ring's worth took ~5 us to land; the whole-SM ring holds more bytes in flight an SM
// with half the blocks (faster for o, down and 128 x rows; slower for gate_up at 16-32).
// The ring is a template argument of the kernel: with the stage count read at run time the
// whole-SM ring ran up to 19% slower.
constexpr int ring_bytes(SkinnyRing ring) {
  return (ring == SkinnyRing::kWholeSm ? 200 : 96) * 1024;
}
template <int MT>
constexpr int stages(SkinnyRing ring) {
  return std::max(ring_bytes(ring) / stage_bytes<MT>(), 2);
}
template <int MT>
constexpr size_t smem_bytes(SkinnyRing ring) {
  return static_cast<size_t>(stage_bytes<MT>()) * stages<MT>(ring) + kSwizzleAlign;  // + alignment
}

template <typename TOut>
struct SkinnyParams {
  CUtensorMap w_map;     // w [n, k]: boxes of 16 W rows x 128 bytes
  CUtensorMap x_map;     // x [m, k]: boxes of 8 MT rows x 128 bytes
  const float* x_scale;  // e4m3: [m]
  const float* w_scale;  // e4m3: [n]
  const bf16* bias;      // [n] or null
  TOut* y;               // [m, n]
  int m;
  int64_t n;
  int splits;        // blocks along k per row tile (gridDim.y, one cluster)
  int split_stages;  // stages of k a split covers (the last split may cover fewer)
  int k_stages;      // k / the stage's columns
};

// --- TMA (PTX ISA: "cp.async.bulk.tensor"; the barriers in mbarrier.cuh) ---

// The box of `map` at (column col, row row) into shared `dst`, completing on `bar`.
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, int col, int row,
                                         uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(smem_addr(bar))
      : "memory");
}

// The byte offset of 16-byte chunk `chunk` of row `row` in a 128-byte-swizzled box.
[[maybe_unused]] __device__ __forceinline__ int swizzled(int row, int chunk) {
  return row * kRowBytes + ((chunk ^ (row & 7)) << 4);
}

template <int MT>
__device__ __forceinline__ void zero(float (&d)[MT][4]) {
#pragma unroll
  for (int t = 0; t < MT; ++t) {
#pragma unroll
    for (int c = 0; c < 4; ++c) d[t][c] = 0.f;
  }
}
template <int MT>
__device__ __forceinline__ void add(float (&acc)[MT][4], const float (&part)[MT][4]) {
#pragma unroll
  for (int t = 0; t < MT; ++t) {
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[t][c] += part[t][c];
  }
}

// Output (x row i, weight row `row`) before its rounding to TOut, from its sum v: bf16
// operands add the bias; e4m3 ones scale as launch_scale_outer_e4m3 does, fmaf(v,
// x_scale[i] * w_scale[row], bias or 0).
template <bool kE4m3, typename TOut>
__device__ __forceinline__ float finish(const SkinnyParams<TOut>& p, int i, int64_t row, float v) {
  const float bias = p.bias != nullptr ? detail::to_float(p.bias[row]) : 0.f;
  if constexpr (kE4m3) {
    return __fmaf_rn(v, __fmul_rn(p.x_scale[i], p.w_scale[row]), bias);
  } else {
    return p.bias != nullptr ? v + bias : v;
  }
}

// Fragments as in attention_mma.cu (PTX ISA, "Matrix Fragments for mma.m16n8k16"):
// lane = 4 g + q.
//   A = 16 weight rows x 16 columns: ldmatrix.x4 of blocks (rows 0-7, columns +0), (rows
//     8-15, +0), (rows 0-7, +8), (rows 8-15, +8) gives a0..a3.
//   B[c][t] = x[t][c] for 8 x rows t: ldmatrix.x4 (no transpose) of blocks (rows 0-7,
//     columns +0), (rows 0-7, +8), (rows 8-15, +0), (rows 8-15, +8) gives b0, b1 of x tile
//     2 t2, then of tile 2 t2 + 1.
//   C[r][t] = acc[tile][c]: c0, c1 = (row g, x rows 2q, 2q + 1), c2, c3 = row g + 8.
// For e4m3 operands (mma.m16n8k32) the same ldmatrix addresses give the fragments: a
// b16 pair of ldmatrix is 4 e4m3 bytes, which the k32 fragments hold where the k16 ones
// hold 2 bf16 (32 bytes of a row per 16 or 32 columns alike).
//
// e4m3 sums. Hopper's FP8 tensor cores keep a running sum with about 14 significant bits
// (fp8_gemm.h), so each box's 128 columns are summed into fresh registers (`part`) and
// then added to the f32 accumulators with CUDA-core adds: the error stays that of 128
// terms, whatever k is.
template <int MT, SkinnyRing kRing, bool kE4m3, typename TOut>
__global__ void __launch_bounds__((consumers_for(MT) + 1) * 32)
    skinny_gemm_kernel(const __grid_constant__ SkinnyParams<TOut> p) {
  static_assert(MT % 2 == 0, "x tiles go to ldmatrix in pairs");
  static_assert(!kE4m3 || MT <= 8, "e4m3: acc and part of 16 x tiles would not fit");
  constexpr int kBoxCols = box_cols<kE4m3>();
  constexpr int kStageCols = stage_cols<kE4m3>();
  constexpr int kConsumers = consumers_for(MT);
  constexpr int kBlockRows = 16 * kConsumers;
  constexpr int kWeightBytes = weight_bytes<MT>();
  constexpr int kStageBytes = stage_bytes<MT>();
  constexpr int S = stages<MT>(kRing);
  extern __shared__ unsigned char smem_raw[];
  __shared__ alignas(8) uint64_t full[S];
  __shared__ alignas(8) uint64_t empty[S];
  // The swizzle repeats every 1024 bytes from the box's start: align the ring to it.
  unsigned char* ring =
      smem_raw + ((kSwizzleAlign - smem_addr(smem_raw) % kSwizzleAlign) % kSwizzleAlign);

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int64_t tile = blockIdx.x;
  const int split = static_cast<int>(blockIdx.y);
  const int64_t row0 = tile * kBlockRows;
  const int first = split * p.split_stages;  // first stage of k of this split
  const int n_stages = min(p.split_stages, p.k_stages - first);

  if (warp == kConsumers && lane == 0) {  // the producer's descriptors, while barriers start
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&p.w_map)) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&p.x_map)) : "memory");
  }
  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      barrier_init(&full[s], 1);
      barrier_init(&empty[s], kConsumers);
    }
    fence_barrier_init();
  }
  __syncthreads();

  if (warp == kConsumers) {
    // The producer. The weights of the first stages go in flight before the programmatic
    // wait (no step writes them); x comes from the kernel before this one.
    if (lane == 0) {
      const int prologue = min(S, n_stages);
      // Box b of stage s: columns (first + s) kStageCols + b kBoxCols.
      const auto load_weights = [&](unsigned char* stage, int s, uint64_t* bar) {
        for (int b = 0; b < kBoxes; ++b) {
          tma_load(stage + b * weight_box_bytes<MT>(), &p.w_map,
                   (first + s) * kStageCols + b * kBoxCols, static_cast<int>(row0), bar);
        }
      };
      const auto load_x = [&](unsigned char* stage, int s, uint64_t* bar) {
        for (int b = 0; b < kBoxes; ++b) {
          tma_load(stage + kWeightBytes + b * x_box_bytes<MT>(), &p.x_map,
                   (first + s) * kStageCols + b * kBoxCols, 0, bar);
        }
      };
      for (int s = 0; s < prologue; ++s) {
        barrier_arrive_expect(&full[s], kStageBytes);
        load_weights(ring + s * kStageBytes, s, &full[s]);
      }
      detail::wait_for_prior_grids();
      for (int s = 0; s < prologue; ++s) load_x(ring + s * kStageBytes, s, &full[s]);
      for (int s = S; s < n_stages; ++s) {
        const int slot = s % S;
        barrier_wait(&empty[slot], static_cast<uint32_t>((s / S - 1) & 1));
        unsigned char* stage = ring + slot * kStageBytes;
        barrier_arrive_expect(&full[slot], kStageBytes);
        load_weights(stage, s, &full[slot]);
        load_x(stage, s, &full[slot]);
      }
    }
    // The producer writes nothing; with splits it still takes part in the cluster's
    // barriers and in writing y, after the programmatic wait as every writer.
    if (p.splits == 1) return;
    detail::wait_for_prior_grids();
  }

  // A consumer: weight rows [16 warp, 16 warp + 16) of the tile, every x row.
  const bool consumer = warp < kConsumers;
  float acc[MT][4];
  zero(acc);
  if (consumer) {
    detail::wait_for_prior_grids();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    // Warpgroup warp / 4 multiplies its 64 weight rows of each box by the box's 8 MT x
    // rows (wgmma.cuh): the same rows a warp and the same registers as mma.sync's below.
    const int group_rows = (warp / 4) * 64;
    for (int s = 0; s < n_stages; ++s) {
      const int slot = s % S;
      barrier_wait(&full[slot], static_cast<uint32_t>((s / S) & 1));
      __syncwarp();  // wgmma is .sync.aligned: the warp converged after its lanes' waits
      if constexpr (!kE4m3) detail::wgmma_fence();
#pragma unroll
      for (int box = 0; box < kBoxes; ++box) {
        const unsigned char* ws =
            ring + slot * kStageBytes + box * weight_box_bytes<MT>() + group_rows * kRowBytes;
        const unsigned char* xs =
            ring + slot * kStageBytes + kWeightBytes + box * x_box_bytes<MT>();
        if constexpr (kE4m3) {
          // 32 bytes a row per k32 step, as per k16 step for bf16.
          // The box's first step overwrites part (scale-d 0), the others add to it.
          float part[MT][4];
          detail::wgmma_fence();
          detail::wgmma_m64k32_e4m3<MT, false>(part, detail::wgmma_descriptor_sw128(ws),
                                               detail::wgmma_descriptor_sw128(xs));
#pragma unroll
          for (int kk = 1; kk < kRowBytes / 32; ++kk) {
            detail::wgmma_m64k32_e4m3<MT, true>(part, detail::wgmma_descriptor_sw128(ws + 32 * kk),
                                                detail::wgmma_descriptor_sw128(xs + 32 * kk));
          }
          detail::wgmma_commit();
          detail::wgmma_wait<0>();
          detail::wgmma_fence_operands(part);
          add(acc, part);
        } else {
#pragma unroll
          for (int kk = 0; kk < kRowBytes / 32; ++kk) {
            detail::wgmma_m64k16<MT>(acc, detail::wgmma_descriptor_sw128(ws + 32 * kk),
                                     detail::wgmma_descriptor_sw128(xs + 32 * kk));
          }
        }
      }
      if constexpr (!kE4m3) {
        detail::wgmma_commit();
        detail::wgmma_wait<0>();
        detail::wgmma_fence_operands(acc);
      }
#else
    // Every row an ldmatrix lane addresses is 8-aligned plus lane % 8: its swizzle is lane % 8.
    const int a_row = warp * 16 + lane % 8 + ((lane / 8) % 2) * 8;
    const int a_chunk = lane / 16;
    const int b_row = (lane / 16) * 8 + lane % 8;
    const int b_chunk = (lane / 8) % 2;
    for (int s = 0; s < n_stages; ++s) {
      const int slot = s % S;
      barrier_wait(&full[slot], static_cast<uint32_t>((s / S) & 1));
#pragma unroll
      for (int box = 0; box < kBoxes; ++box) {
        const unsigned char* ws = ring + slot * kStageBytes + box * weight_box_bytes<MT>();
        const unsigned char* xs =
            ring + slot * kStageBytes + kWeightBytes + box * x_box_bytes<MT>();
        const auto multiply_box = [&](float(&sums)[MT][4]) {
#pragma unroll
          for (int kk = 0; kk < kRowBytes / 32; ++kk) {
            uint32_t a[4];
            ldmatrix_x4(a, ws + swizzled(a_row, 2 * kk + a_chunk));
#pragma unroll
            for (int t2 = 0; t2 < MT / 2; ++t2) {
              uint32_t b[4];
              ldmatrix_x4(b, xs + swizzled(16 * t2 + b_row, 2 * kk + b_chunk));
              if constexpr (kE4m3) {
                detail::mma_16832_e4m3(sums[2 * t2], a, b[0], b[1]);
                detail::mma_16832_e4m3(sums[2 * t2 + 1], a, b[2], b[3]);
              } else {
                mma_16816(sums[2 * t2], a, b[0], b[1]);
                mma_16816(sums[2 * t2 + 1], a, b[2], b[3]);
              }
            }
          }
        };
        if constexpr (kE4m3) {
          float part[MT][4];
          zero(part);
          multiply_box(part);
          add(acc, part);
        } else {
          multiply_box(acc);
        }
      }
#endif
      __syncwarp();
      if (lane == 0) barrier_arrive(&empty[slot]);  // this warp is done with the slot
    }
    detail::allow_dependent_grids();
  }

  // f(i, row, value) for each of this thread's sums inside y: element c of tile t is
  // weight row row0 + 16 warp + g + 8 (c / 2), x row 8 t + 2q + c % 2.
  const int g = lane / 4;
  const int q = lane % 4;
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
  // Without splits each consumer writes its sums from its registers (staging them through
  // shared memory for whole-sector stores measured slower at 16 x rows).
  if (p.splits == 1) {
    for_each_sum([&](int i, int64_t row, float v) {
      p.y[int64_t{i} * p.n + row] = detail::from_float<TOut>(finish<kE4m3>(p, i, row, v));
    });
    return;
  }

  // Splits: the tile's blocks form one cluster. Each puts its sums in its own shared
  // memory (the ring, once every consumer warp is past its last stage: the copies into it
  // have all completed), and after the cluster's barrier block j adds up its share of
  // the tile's outputs from every block's shared memory in order of split (distributed
  // shared memory), adds the bias and writes y four adjacent outputs a store (a warp's
  // stores then cover whole 32-byte sectors: scalar stores filled a quarter of each). The
  // second barrier keeps each block's shared memory alive until the others have read it.
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  // sums[i][r]: x row i, weight row row0 + r; rows padded by 4 floats, so the lanes of a
  // store (8 weight rows, 4 x rows 2 apart) hit 32 distinct banks.
  constexpr int kSumsPitch = kBlockRows + 4;
  static_assert(8 * MT * kSumsPitch * sizeof(float) <= 2 * kStageBytes, "the sums fit the ring");
  float* sums = reinterpret_cast<float*>(ring);
  if (consumer) {
    constexpr int kConsumerThreads = kConsumers * 32;
    asm volatile("bar.sync 1, %0;" ::"n"(kConsumerThreads) : "memory");
    for_each_sum([&](int i, int64_t row, float v) { sums[i * kSumsPitch + (row - row0)] = v; });
  }
  cluster.sync();
  // Four adjacent outputs a thread at a time, kSumUnroll such quads a round: one 16-byte
  // load from each block of the cluster for each quad, every load of the round issued
  // before the first add (the loads cross the cluster: ~200 cycles each), then added in
  // split order.
  constexpr int kThreads = (kConsumers + 1) * 32;
  constexpr int kQuads = kBlockRows / 4;  // of a sums row
  constexpr int kSumUnroll = 2;           // 1 measured the same; 2 keeps more loads in flight
  static_assert(kSumsPitch % 4 == 0, "sums rows stay 16-byte aligned");
  const bool whole_stores =
      p.n % 4 == 0 && reinterpret_cast<uintptr_t>(p.y) % (4 * sizeof(TOut)) == 0;
  const int rows = static_cast<int>(min(int64_t{kBlockRows}, p.n - row0));
  const int quads = p.m * kQuads;
  const int share = (quads + p.splits - 1) / p.splits;
  const int begin = static_cast<int>(cluster.block_rank()) * share;
  const int end = min(quads, begin + share);
  for (int first = begin + tid; first < end; first += kSumUnroll * kThreads) {
    float4 part[kSumUnroll][kSkinnyMaxSplits];
#pragma unroll
    for (int u = 0; u < kSumUnroll; ++u) {
      const int o = first + u * kThreads;
      if (o >= end) break;
      const int at = (o / kQuads) * kSumsPitch + (o % kQuads) * 4;  // inside sums: any r
#pragma unroll
      for (int s = 0; s < kSkinnyMaxSplits; ++s) {
        if (s < p.splits) {
          part[u][s] = *reinterpret_cast<const float4*>(cluster.map_shared_rank(sums, s) + at);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kSumUnroll; ++u) {
      const int o = first + u * kThreads;
      if (o >= end) break;
      const int i = o / kQuads;
      const int r = (o % kQuads) * 4;
      if (r >= rows) continue;
      float v[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int s = 0; s < kSkinnyMaxSplits; ++s) {
        if (s < p.splits) {
          v[0] += part[u][s].x;
          v[1] += part[u][s].y;
          v[2] += part[u][s].z;
          v[3] += part[u][s].w;
        }
      }
      const int64_t row = row0 + r;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (r + j < rows) v[j] = finish<kE4m3>(p, i, row + j, v[j]);
      }
      TOut* out = p.y + int64_t{i} * p.n + row;
      if (whole_stores && r + 4 <= rows) {
        detail::store_floats(out, v);
      } else {
        for (int j = 0; j < 4 && r + j < rows; ++j) out[j] = detail::from_float<TOut>(v[j]);
      }
    }
  }
  cluster.sync();
}

// cuTensorMapEncodeTiled, from the driver the runtime already loaded (no link to libcuda).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) == cudaSuccess &&
        found == cudaDriverEntryPointSuccess) {
      encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
    }
  });
  return encode;
}

// A row-major matrix [rows, cols] of bf16 or e4m3 elements as boxes of box_rows x 128
// bytes, 128-byte swizzled; rows past the matrix read as zeros.
template <bool kE4m3>
cudaError_t encode_map(CUtensorMap* map, const void* base, int64_t rows, int64_t cols, int box_rows,
                       CUtensorMapL2promotion promotion) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  constexpr int kElementBytes = kRowBytes / box_cols<kE4m3>();
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * kElementBytes};  // row pitch
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols<kE4m3>()),
                             static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode(
      map, kE4m3 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2,
      const_cast<void*>(base), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// How L2 fetches the weight rows (128 bytes a box row): no promotion measured 2-5% faster
// than 256-byte promotion at every 16-row shape.
constexpr CUtensorMapL2promotion kWeightPromotion = CU_TENSOR_MAP_L2_PROMOTION_NONE;

template <int MT, SkinnyRing kRing, bool kE4m3, typename TOut>
cudaError_t launch_tiles(SkinnyParams<TOut> p, const void* x, const void* w, int64_t k,
                         cudaStream_t stream) {
  constexpr size_t bytes = smem_bytes<MT>(kRing);
  constexpr int kBlockRows = 16 * consumers_for(MT);
  constexpr int kThreads = (consumers_for(MT) + 1) * 32;
  auto* kernel = skinny_gemm_kernel<MT, kRing, kE4m3, TOut>;
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  // Once per kernel and device (not stream operations: capture-safe): its shared memory,
  // and how many clusters of each split count the device holds at once (clusters
  // stay inside a GPC, so this is less than the SMs' blocks over the cluster size).
  struct Setup {
    cudaError_t error = cudaSuccess;
    SkinnyClusters clusters{};
  };
  static std::mutex mutex;
  static std::map<int, Setup> setups;
  Setup setup;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    auto it = setups.find(device);
    if (it == setups.end()) {
      Setup s;
      s.error = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(bytes));
      for (int32_t splits = 1; splits <= kSkinnyMaxSplits && s.error == cudaSuccess; ++splits) {
        cudaLaunchConfig_t config{};
        config.gridDim = dim3(1, static_cast<unsigned>(splits));
        config.blockDim = dim3(kThreads);
        config.dynamicSmemBytes = bytes;
        cudaLaunchAttribute cluster{};
        cluster.id = cudaLaunchAttributeClusterDimension;
        cluster.val.clusterDim.x = 1;
        cluster.val.clusterDim.y = static_cast<unsigned>(splits);
        cluster.val.clusterDim.z = 1;
        config.attrs = &cluster;
        config.numAttrs = 1;
        s.error = cudaOccupancyMaxActiveClusters(&s.clusters[splits - 1], kernel, &config);
      }
      it = setups.emplace(device, s).first;
    }
    setup = it->second;
  }
  if (setup.error != cudaSuccess) return setup.error;
  if (const cudaError_t e = encode_map<kE4m3>(&p.w_map, w, p.n, k, kBlockRows, kWeightPromotion);
      e != cudaSuccess) {
    return e;
  }
  if (const cudaError_t e =
          encode_map<kE4m3>(&p.x_map, x, p.m, k, 8 * MT, CU_TENSOR_MAP_L2_PROMOTION_NONE);
      e != cudaSuccess) {
    return e;
  }
  const int32_t splits = skinny_gemm_splits(p.m, p.n, k, setup.clusters, stage_cols<kE4m3>());
  const int64_t tiles = (p.n + kBlockRows - 1) / kBlockRows;
  if (tiles > INT_MAX) return cudaErrorInvalidValue;
  p.split_stages = (p.k_stages + splits - 1) / splits;
  p.splits = (p.k_stages + p.split_stages - 1) / p.split_stages;  // each with work
  const auto splits_now = static_cast<unsigned>(p.splits);
  return detail::launch_kernel_in_clusters(kernel, dim3(static_cast<unsigned>(tiles), splits_now),
                                           dim3(kThreads), bytes, stream, dim3(1, splits_now, 1),
                                           p);
}

template <int MT, bool kE4m3, typename TOut>
cudaError_t launch_rows(const SkinnyParams<TOut>& p, const void* x, const void* w, int64_t k,
                        SkinnyRing ring, cudaStream_t stream) {
  return ring == SkinnyRing::kWholeSm
             ? launch_tiles<MT, SkinnyRing::kWholeSm, kE4m3>(p, x, w, k, stream)
             : launch_tiles<MT, SkinnyRing::kShared, kE4m3>(p, x, w, k, stream);
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

bool skinny_gemm_supports(int64_t m, int64_t n, int64_t k, const void* x, const void* w) {
  return m >= kSkinnyMinRows && m <= kSkinnyMaxRows && n >= 1 && n < (int64_t{1} << 31) && k > 0 &&
         k % kSkinnyKStep == 0 && k < (int64_t{1} << 24) && aligned16(x) && aligned16(w);
}

bool skinny_gemm_e4m3_supports(int64_t m, int64_t n, int64_t k, const void* x8, const void* w8) {
  return m >= kSkinnyMinRows && m <= kSkinnyE4m3MaxRows && n >= 1 && n < (int64_t{1} << 31) &&
         k > 0 && k % kSkinnyE4m3KStep == 0 && k < (int64_t{1} << 24) && aligned16(x8) &&
         aligned16(w8);
}

int64_t skinny_gemm_block_rows(int64_t m) {
  return 16 * (m <= 16   ? consumers_for(2)
               : m <= 32 ? consumers_for(4)
               : m <= 64 ? consumers_for(8)
                         : consumers_for(16));
}

int32_t skinny_gemm_splits(int64_t m, int64_t n, int64_t k, const SkinnyClusters& clusters,
                           int64_t stage_cols) {
  // The most splits (up to kSkinnyMaxSplits, a cluster's portable size) whose clusters all
  // fit one wave, each split keeping at least kMinSplitStages stages. A block streams its
  // range of k through a ring deep enough to cover the memory latency, so a grid that
  // holds every SM in one wave streams at the rate of all of them; another wave would add
  // a ramp of latency, and more splits mean more, shorter blocks.
  constexpr int64_t kMinSplitStages = 4;  // 1 KB of each weight row
  const int64_t tiles = (n + skinny_gemm_block_rows(m) - 1) / skinny_gemm_block_rows(m);
  const int64_t k_stages = k / stage_cols;
  int32_t best = 1;
  for (int32_t s = 2; s <= kSkinnyMaxSplits; ++s) {
    if (k_stages < kMinSplitStages * s) break;
    if (tiles <= clusters[s - 1]) best = s;
  }
  return best;
}

template <typename TOut>
cudaError_t launch_skinny_gemm(const bf16* x, int64_t m, int64_t k, const bf16* w, int64_t n,
                               const bf16* bias, TOut* y, SkinnyRing ring, cudaStream_t stream) {
  if (!skinny_gemm_supports(m, n, k, x, w) || y == nullptr) return cudaErrorInvalidValue;
  SkinnyParams<TOut> p{};
  p.bias = bias;
  p.y = y;
  p.m = static_cast<int>(m);
  p.n = n;
  p.splits = 1;
  p.k_stages = static_cast<int>(k / kSkinnyKStep);
  if (m <= 16) return launch_rows<2, false>(p, x, w, k, ring, stream);
  if (m <= 32) return launch_rows<4, false>(p, x, w, k, ring, stream);
  if (m <= 64) return launch_rows<8, false>(p, x, w, k, ring, stream);
  return launch_rows<16, false>(p, x, w, k, ring, stream);
}

template <typename TOut>
cudaError_t launch_skinny_gemm_e4m3(const uint8_t* x8, const float* x_scale, int64_t m, int64_t k,
                                    const uint8_t* w8, const float* w_scale, int64_t n,
                                    const bf16* bias, TOut* y, SkinnyRing ring,
                                    cudaStream_t stream) {
  if (!skinny_gemm_e4m3_supports(m, n, k, x8, w8) || x_scale == nullptr || w_scale == nullptr ||
      y == nullptr) {
    return cudaErrorInvalidValue;
  }
  SkinnyParams<TOut> p{};
  p.x_scale = x_scale;
  p.w_scale = w_scale;
  p.bias = bias;
  p.y = y;
  p.m = static_cast<int>(m);
  p.n = n;
  p.splits = 1;
  p.k_stages = static_cast<int>(k / kSkinnyE4m3KStep);
  if (m <= 16) return launch_rows<2, true>(p, x8, w8, k, ring, stream);
  if (m <= 32) return launch_rows<4, true>(p, x8, w8, k, ring, stream);
  return launch_rows<8, true>(p, x8, w8, k, ring, stream);
}

template cudaError_t launch_skinny_gemm<__nv_bfloat16>(const bf16*, int64_t, int64_t, const bf16*,
                                                       int64_t, const bf16*, __nv_bfloat16*,
                                                       SkinnyRing, cudaStream_t);
template cudaError_t launch_skinny_gemm<float>(const bf16*, int64_t, int64_t, const bf16*, int64_t,
                                               const bf16*, float*, SkinnyRing, cudaStream_t);

template cudaError_t launch_skinny_gemm_e4m3<__nv_bfloat16>(const uint8_t*, const float*, int64_t,
                                                            int64_t, const uint8_t*, const float*,
                                                            int64_t, const bf16*, __nv_bfloat16*,
                                                            SkinnyRing, cudaStream_t);
template cudaError_t launch_skinny_gemm_e4m3<float>(const uint8_t*, const float*, int64_t, int64_t,
                                                    const uint8_t*, const float*, int64_t,
                                                    const bf16*, float*, SkinnyRing, cudaStream_t);

}  // namespace cellm::cuda
