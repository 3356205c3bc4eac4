// The e4m3 activation codes of the FP8 products, as device functions shared by the row
// quantization (quantize_e4m3.cu) and the norm that quantizes the row it writes
// (rmsnorm.cu: launch_add_rmsnorm_e4m3), so both give the same bits. The arithmetic is
// quantize_e4m3.h's.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "cuda/kernels/quantize_e4m3.h"

namespace cellm::cuda::detail {

// A row's scale from its absolute maximum: amax / 448 (one rounding), or 1 for a zero row.
__device__ __forceinline__ float e4m3_row_scale(float amax) {
  return amax == 0.0f ? 1.0f : __fdiv_rn(amax, kE4m3Max);
}

// The codes of v[0..4) / scale, byte i holding v[i]'s: each quotient rounded once to f32,
// then to the nearest e4m3 value, saturating to ±448.
__device__ __forceinline__ uint32_t e4m3x4(const float (&v)[4], float scale) {
  uint32_t word = 0;
#pragma unroll
  for (int e = 0; e < 4; e += 2) {
    const float2 pair = make_float2(__fdiv_rn(v[e], scale), __fdiv_rn(v[e + 1], scale));
    // The low byte holds pair.x.
    const __nv_fp8x2_storage_t codes = __nv_cvt_float2_to_fp8x2(pair, __NV_SATFINITE, __NV_E4M3);
    word |= static_cast<uint32_t>(codes) << (8 * e);
  }
  return word;
}

}  // namespace cellm::cuda::detail
