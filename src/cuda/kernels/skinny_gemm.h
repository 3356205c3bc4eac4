// The product of a decode batch's rows, y = x · wᵀ (+ bias), for 9-128 rows: still bound
// by reading the weights, where cuBLASLt's tiles leave SMs idle on the narrow projections
// (8B at 64 rows: o 4096 x 4096 ran at 62% of the copy bandwidth, qkv at 70%).
//
// Each block streams 64 (or 128) weight rows through a ring of shared-memory stages filled by the
// Hopper tensor memory accelerator: one warp issues TMA copies of the block's weight boxes
// (its rows x 2 x 64 columns) and of the x boxes (every x row, the same columns) per stage,
// completing on the stage's mbarrier; the first stages' weights go in flight before the
// programmatic wait, since weights are never written by a step. Four (or eight) warps multiply on
// tensor cores, in f32: built for sm_90a, each warpgroup of four multiplies its 64 weight
// rows by every x row with wgmma straight from the stage (kernels/wgmma.cuh); otherwise warp
// w owns weight rows [16 w, 16 w + 16) of the block (the M of bf16 mma.m16n8k16) and every
// x row (its N, 8 at a time), reading the stages with ldmatrix (the boxes are 128-byte
// swizzled). Either way warp w ends with the same sums. A warp that is done with a stage arrives on
// its `empty` barrier, on which the copying warp waits before it refills the slot. When n
// alone gives too few blocks to fill the GPU, k is cut into `splits` ranges of whole
// stages (skinny_gemm_splits) and a row tile's splits run as one thread block cluster:
// each block leaves its f32 sums in its shared memory, and block j of the cluster adds
// up the j-th share of the tile's outputs from all of them (distributed shared memory) in
// order of split, adds the bias and writes y. No workspace, no second pass. The order of
// every sum depends on (m, n, k, splits) only: every launch of a shape gives the same bits.
//
// Needs sm_90 (TMA, mbarrier transaction counts) and cuTensorMapEncodeTiled from the
// driver (found through the runtime; launches return cudaErrorNotSupported without it).
//
// Shapes (row-major, as PyTorch's Linear and launch_gemv): x [m, k] bf16, w [n, k] bf16,
// bias [n] bf16 or null, y [m, n] of TOut (bf16 or f32, rounded once from f32).
//
// launch_skinny_gemm_e4m3 is the same kernel over float8_e4m3fn operands, Fp8Gemm's
// product (fp8_gemm.h) for 9-64 rows: x8 [m, k] e4m3 with a scale per row, w8 [n, k]
// e4m3 with a scale per output channel. A box row is 128 e4m3 columns (128 bytes, as 64
// bf16 columns), the tensor cores take 32 columns a step (wgmma k32, or mma.m16n8k32),
// and each box's 128-column sum starts from zero and is then added to the f32 sums
// (the FP8 tensor cores keep partial sums with about 14 significant bits, so this bounds
// their error by that of 128 terms whatever k is). Arithmetic: y[i, j] = TOut(fmaf(s,
// x_scale[i] * w_scale[j], bias[j] or 0)), s the f32 sum of the products of the decoded
// values; the scale product and the fma each rounded once, as launch_scale_outer_e4m3.
//
// The launcher enqueues one kernel on `stream` with programmatic dependent launch
// (kernels/launch.cuh); it never allocates or synchronises, may be captured in a CUDA
// graph, and returns cudaErrorInvalidValue (launching nothing) outside the REQUIRES.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>

namespace cellm::cuda {

inline constexpr int64_t kSkinnyMinRows = 9;       // fewer rows: the GEMVs (gemv.h)
inline constexpr int64_t kSkinnyMaxRows = 128;     // x rows one launch serves
inline constexpr int64_t kSkinnyKStep = 128;       // columns of a stage; k is a multiple of it
inline constexpr int64_t kSkinnyE4m3MaxRows = 64;  // e4m3: x rows one launch serves
inline constexpr int64_t kSkinnyE4m3KStep = 256;   // e4m3: columns of a stage
inline constexpr int32_t kSkinnyMaxSplits = 8;     // blocks of a cluster (the portable most)

// True when launch_skinny_gemm serves the shape: kSkinnyMinRows <= m <= kSkinnyMaxRows,
// n >= 1, k a positive multiple of kSkinnyKStep below 2^24, x and w 16-byte aligned.
bool skinny_gemm_supports(int64_t m, int64_t n, int64_t k, const void* x, const void* w);

// The ring of shared-memory stages each block streams its weights through: kShared, about
// 96 KB (two blocks share an SM), or kWholeSm, about 200 KB (one block an SM: more bytes in
// flight an SM, half the blocks). Neither is faster for every shape; the GEMM tuner times
// both. The ring changes the split count, so the bits.
enum class SkinnyRing { kShared, kWholeSm };

// y = TOut(x · wᵀ (+ bias)). REQUIRES: skinny_gemm_supports(m, n, k, x, w); device
// pointers; y overlapping no input.
template <typename TOut>
cudaError_t launch_skinny_gemm(const __nv_bfloat16* x, int64_t m, int64_t k, const __nv_bfloat16* w,
                               int64_t n, const __nv_bfloat16* bias, TOut* y, SkinnyRing ring,
                               cudaStream_t stream);

// True when launch_skinny_gemm_e4m3 serves the shape: kSkinnyMinRows <= m <=
// kSkinnyE4m3MaxRows, n >= 1, k a positive multiple of kSkinnyE4m3KStep below 2^24, x8
// and w8 16-byte aligned.
bool skinny_gemm_e4m3_supports(int64_t m, int64_t n, int64_t k, const void* x8, const void* w8);

// y = TOut(fmaf(x8 · w8ᵀ, x_scale ⊗ w_scale, bias)) as above. REQUIRES:
// skinny_gemm_e4m3_supports(m, n, k, x8, w8); x_scale [m] and w_scale [n] f32, non-null;
// device pointers; y overlapping no input; x8 and w8 free of NaN codes.
template <typename TOut>
cudaError_t launch_skinny_gemm_e4m3(const uint8_t* x8, const float* x_scale, int64_t m, int64_t k,
                                    const uint8_t* w8, const float* w_scale, int64_t n,
                                    const __nv_bfloat16* bias, TOut* y, SkinnyRing ring,
                                    cudaStream_t stream);

// Weight rows a block of launch_skinny_gemm (or _e4m3) covers for m x rows (64, or 128 for more
// than 32 rows).
int64_t skinny_gemm_block_rows(int64_t m);

// clusters[s - 1]: how many clusters of s blocks of the kernel a device runs at once
// (cudaOccupancyMaxActiveClusters; for s = 1, blocks).
using SkinnyClusters = std::array<int, kSkinnyMaxSplits>;

// The splits launch_skinny_gemm takes for a shape on a device that holds `clusters` (for
// tests and benchmarks): the most, each over at least 4 stages of k, whose row tiles'
// clusters all run at once. `stage_cols` is kSkinnyKStep, or kSkinnyE4m3KStep for
// launch_skinny_gemm_e4m3.
int32_t skinny_gemm_splits(int64_t m, int64_t n, int64_t k, const SkinnyClusters& clusters,
                           int64_t stage_cols = kSkinnyKStep);

}  // namespace cellm::cuda
