// Hopper warpgroup matrix multiply (wgmma, sm_90): the few pieces cellm's kernels use.
//
// A warpgroup (4 consecutive warps, the first a multiple of 4) multiplies a 64-row A by an
// N-row B, both read by the tensor cores straight from shared memory ("K-major": each row
// holds K contiguous bf16, or e4m3 bytes), accumulating D [64 x N] in f32 registers. A
// 128-byte row is 64 bf16 or 128 e4m3 columns: the k16 bf16 and the k32 e4m3 steps both
// take 32 bytes of each row. Both operands are
// named by a 64-bit shared-memory descriptor (PTX ISA, "Matrix Descriptor Format"):
//   bits 0-13   start address >> 4
//   bits 16-29  leading-dimension byte offset >> 4 (unused by swizzled K-major layouts: 1)
//   bits 32-45  stride-dimension byte offset >> 4: from one 8-row group to the next
//   bits 49-51  base offset (0: every 8-row group starts 1024-byte aligned)
//   bits 62-63  layout: 1 = the 128-byte swizzle, as a TMA box of 128-byte rows stores it
// For a box of 128-byte rows with the 128-byte swizzle (16-byte chunk c of row r at c ^
// (r % 8), from a 1024-byte aligned start) the stride is 1024 bytes, and the 16 columns
// kk of the row's 64 start 32 kk bytes on (the swizzle applies to the address the tensor
// cores form, so the start advances unswizzled).
//
// D's registers as mma.m16n8k16's C, one 16-row slice a warp: warp w of the group holds
// rows 16 w + g and 16 w + g + 8 (lane = 4 g + q) of columns 8 j + 2 q and 8 j + 2 q + 1 in
// d[j][0..1] and d[j][2..3].
//
// The sequence: wgmma_fence() (the accumulators were written by other instructions), the
// wgmma_m64n*k16 of a stage, wgmma_commit(), wgmma_wait<0>() (their shared-memory reads
// and register writes are then done), wgmma_fence_operands(d) (so the compiler does not
// move other uses of d across the wait).
#pragma once

#include <cstdint>

#include "cuda/kernels/mma.cuh"

namespace cellm::cuda::detail {

__device__ __forceinline__ uint64_t wgmma_descriptor_sw128(const void* p) {
  const uint64_t start = (smem_addr(p) & 0x3FFFF) >> 4;
  return start | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int Pending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(Pending) : "memory");
}
template <int MT>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[MT][4]) {
#pragma unroll
  for (int j = 0; j < MT; ++j) {
#pragma unroll
    for (int c = 0; c < 4; ++c) asm volatile("" : "+f"(d[j][c])::"memory");
  }
}

// D[64 x 16] += A[64 x 16] · B[16 x 16]ᵀ, both K-major in shared memory.
__device__ __forceinline__ void wgmma_m64n16k16(float (&d)[2][4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, "
      "%8, %9, 1, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3])
      : "l"(a), "l"(b));
}

// D[64 x 32] += A[64 x 16] · B[32 x 16]ᵀ, both K-major in shared memory.
__device__ __forceinline__ void wgmma_m64n32k16(float (&d)[4][4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, 1, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
      : "l"(a), "l"(b));
}

// D[64 x 64] += A[64 x 16] · B[64 x 16]ᵀ, both K-major in shared memory.
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[8][4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, 1, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3])
      : "l"(a), "l"(b));
}

// D[64 x 128] += A[64 x 16] · B[128 x 16]ᵀ, both K-major in shared memory.
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[16][4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, "
      "%40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, 1, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),
        "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]),
        "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
        "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]),
        "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]),
        "+f"(d[15][2]), "+f"(d[15][3])
      : "l"(a), "l"(b));
}

// wgmma_m64n{8 MT}k16 for MT x-tiles of 8 rows.
template <int MT>
__device__ __forceinline__ void wgmma_m64k16(float (&d)[MT][4], uint64_t a, uint64_t b) {
  if constexpr (MT == 2) {
    wgmma_m64n16k16(d, a, b);
  } else if constexpr (MT == 4) {
    wgmma_m64n32k16(d, a, b);
  } else if constexpr (MT == 8) {
    wgmma_m64n64k16(d, a, b);
  } else {
    static_assert(MT == 16, "wgmma_m64k16: 2, 4, 8 or 16 x tiles");
    wgmma_m64n128k16(d, a, b);
  }
}

// The e4m3 wgmma of N = 8 MT columns: D[64 x N] (+)= A[64 x 32] · B[N x 32]ᵀ, both K-major
// in shared memory. Its asm text, and its D operands with constraint C: "+f" to add to
// D, "=f" to overwrite it (scale-d 0: D is then not read).
#define CELLM_WGMMA_E4M3(N, REGS, A, B, SCALE_D)                                       \
  "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 {" REGS "}, %" #A ", %" #B \
  ", %" #SCALE_D ", 1, 1;"
#define CELLM_WGMMA_D2(C) \
  C(d[0][0]), C(d[0][1]), C(d[0][2]), C(d[0][3]), C(d[1][0]), C(d[1][1]), C(d[1][2]), C(d[1][3])
#define CELLM_WGMMA_D4(C)                                                                         \
  C(d[0][0]), C(d[0][1]), C(d[0][2]), C(d[0][3]), C(d[1][0]), C(d[1][1]), C(d[1][2]), C(d[1][3]), \
      C(d[2][0]), C(d[2][1]), C(d[2][2]), C(d[2][3]), C(d[3][0]), C(d[3][1]), C(d[3][2]),         \
      C(d[3][3])
#define CELLM_WGMMA_D8(C)                                                                         \
  C(d[0][0]), C(d[0][1]), C(d[0][2]), C(d[0][3]), C(d[1][0]), C(d[1][1]), C(d[1][2]), C(d[1][3]), \
      C(d[2][0]), C(d[2][1]), C(d[2][2]), C(d[2][3]), C(d[3][0]), C(d[3][1]), C(d[3][2]),         \
      C(d[3][3]), C(d[4][0]), C(d[4][1]), C(d[4][2]), C(d[4][3]), C(d[5][0]), C(d[5][1]),         \
      C(d[5][2]), C(d[5][3]), C(d[6][0]), C(d[6][1]), C(d[6][2]), C(d[6][3]), C(d[7][0]),         \
      C(d[7][1]), C(d[7][2]), C(d[7][3])

template <bool kAccumulate>
__device__ __forceinline__ void wgmma_m64n16k32_e4m3(float (&d)[2][4], uint64_t a, uint64_t b) {
  if constexpr (kAccumulate) {
    asm volatile(CELLM_WGMMA_E4M3(16, "%0, %1, %2, %3, %4, %5, %6, %7", 8, 9, 10)
                 : CELLM_WGMMA_D2("+f")
                 : "l"(a), "l"(b), "n"(1));
  } else {
    asm volatile(CELLM_WGMMA_E4M3(16, "%0, %1, %2, %3, %4, %5, %6, %7", 8, 9, 10)
                 : CELLM_WGMMA_D2("=f")
                 : "l"(a), "l"(b), "n"(0));
  }
}
template <bool kAccumulate>
__device__ __forceinline__ void wgmma_m64n32k32_e4m3(float (&d)[4][4], uint64_t a, uint64_t b) {
  if constexpr (kAccumulate) {
    asm volatile(
        CELLM_WGMMA_E4M3(32, "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15",
                         16, 17, 18)
        : CELLM_WGMMA_D4("+f")
        : "l"(a), "l"(b), "n"(1));
  } else {
    asm volatile(
        CELLM_WGMMA_E4M3(32, "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15",
                         16, 17, 18)
        : CELLM_WGMMA_D4("=f")
        : "l"(a), "l"(b), "n"(0));
  }
}
template <bool kAccumulate>
__device__ __forceinline__ void wgmma_m64n64k32_e4m3(float (&d)[8][4], uint64_t a, uint64_t b) {
  if constexpr (kAccumulate) {
    asm volatile(CELLM_WGMMA_E4M3(
                     64,
                     "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, "
                     "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31",
                     32, 33, 34)
                 : CELLM_WGMMA_D8("+f")
                 : "l"(a), "l"(b), "n"(1));
  } else {
    asm volatile(CELLM_WGMMA_E4M3(
                     64,
                     "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, "
                     "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31",
                     32, 33, 34)
                 : CELLM_WGMMA_D8("=f")
                 : "l"(a), "l"(b), "n"(0));
  }
}
#undef CELLM_WGMMA_D2
#undef CELLM_WGMMA_D4
#undef CELLM_WGMMA_D8
#undef CELLM_WGMMA_E4M3

// wgmma_m64n{8 MT}k32_e4m3 for MT x-tiles of 8 rows: D += A · Bᵀ, or D = A · Bᵀ when
// !kAccumulate (D's registers are then not read).
template <int MT, bool kAccumulate>
__device__ __forceinline__ void wgmma_m64k32_e4m3(float (&d)[MT][4], uint64_t a, uint64_t b) {
  if constexpr (MT == 2) {
    wgmma_m64n16k32_e4m3<kAccumulate>(d, a, b);
  } else if constexpr (MT == 4) {
    wgmma_m64n32k32_e4m3<kAccumulate>(d, a, b);
  } else {
    static_assert(MT == 8, "wgmma_m64k32_e4m3: 2, 4 or 8 x tiles");
    wgmma_m64n64k32_e4m3<kAccumulate>(d, a, b);
  }
}

}  // namespace cellm::cuda::detail
