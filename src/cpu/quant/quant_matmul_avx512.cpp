// The quantized matmul's kernels for AVX-512 VNNI (vpdpbusd, vpdpwssd on 512-bit vectors, 16
// weight rows a vector). The body is quant_matmul_simd.inc; the dispatcher calls in only where
// cpu_features() says the CPU has these instructions.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cpu/quant/isa_target.h"
#include "cpu/quant/quant_kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include "cpu/kernels/x86_intrinsics.h"

namespace cellm::cpu::quant {
namespace {

CELLM_TARGET_BEGIN(CELLM_ISA_AVX512)

#define CELLM_QUANT_VNNI 1
#include "cpu/quant/quant_matmul_simd.inc"
#undef CELLM_QUANT_VNNI

// quantize_activations' arithmetic, 16 values per step: the same max |x|, the same
// f32 products x * (127 / max) rounded to nearest even (vcvtps2dq in the default
// rounding mode is nearbyint), so every byte equals the scalar twin's.

// The 32 values at x into q; returns the block's scale d.
inline float quantize32(const float* x, int8_t* q) {
  const __m512 a = _mm512_loadu_ps(x);
  const __m512 b = _mm512_loadu_ps(x + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
  const float d = amax / 127.0f;
  const __m512 id = _mm512_set1_ps(d == 0.0f ? 0.0f : 127.0f / amax);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q),
                   _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(a, id))));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16),
                   _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(b, id))));
  return d;
}

void quantize_blocks32_sums(const float* x, int64_t k, uint8_t* out) {
  for (int64_t b = 0; b < k / kBlock32; ++b) {
    ActBlock32Sums blk;
    blk.d = quantize32(x + b * kBlock32, blk.qs);
    const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.qs))),
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.qs + 16)))));
    blk.sum = sum;
    blk.dsum = blk.d * static_cast<float>(sum);
    std::memcpy(out + b * static_cast<int64_t>(sizeof(blk)), &blk, sizeof(blk));
  }
}

void quantize_blocks32(const float* x, int64_t k, uint8_t* out) {
  for (int64_t b = 0; b < k / kBlock32; ++b) {
    ActBlock32 blk;
    blk.d = quantize32(x + b * kBlock32, blk.qs);
    std::memcpy(out + b * static_cast<int64_t>(sizeof(blk)), &blk, sizeof(blk));
  }
}

void quantize_blocks_k(const float* x, int64_t k, uint8_t* out) {
  for (int64_t b = 0; b < k / kBlockK; ++b) {
    const float* xb = x + b * kBlockK;
    __m512 m = _mm512_setzero_ps();
    for (int l = 0; l < kBlockK; l += 16)
      m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(xb + l)));
    const float amax = _mm512_reduce_max_ps(m);
    BlockQ8_K blk;
    blk.d = amax / 127.0f;
    const __m512 id = _mm512_set1_ps(blk.d == 0.0f ? 0.0f : 127.0f / amax);
    for (int g = 0; g < 16; ++g) {
      const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + 16 * g), id));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(blk.qs + 16 * g), _mm512_cvtsepi32_epi8(q));
      blk.bsums[g] = static_cast<int16_t>(_mm512_reduce_add_epi32(q));
    }
    std::memcpy(out + b * static_cast<int64_t>(sizeof(blk)), &blk, sizeof(blk));
  }
}

CELLM_TARGET_END

}  // namespace

QuantKernel avx512_vnni_kernel(QuantType t) {
  return kernel_for(t);
}

void quantize_activations_avx512(const float* x, int64_t k, ActFormat format, void* out) {
  auto* bytes = static_cast<uint8_t*>(out);
  switch (format) {
    case ActFormat::kBlock32Sums:
      quantize_blocks32_sums(x, k, bytes);
      return;
    case ActFormat::kBlock32:
      quantize_blocks32(x, k, bytes);
      return;
    case ActFormat::kBlockK:
      quantize_blocks_k(x, k, bytes);
      return;
  }
}

}  // namespace cellm::cpu::quant

#else

namespace cellm::cpu::quant {
QuantKernel avx512_vnni_kernel(QuantType) {
  return nullptr;
}
void quantize_activations_avx512(const float* x, int64_t k, ActFormat format, void* out) {
  quantize_activations(x, k, format, out);
}
}  // namespace cellm::cpu::quant

#endif
