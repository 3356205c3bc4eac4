// The e4m3 codes' vector decode, shared by the CPU kernels that read them (the FP8 weight
// products, cpu/quant/fp8_matmul.cpp, and the attention over an e4m3 KV cache,
// attention.cpp). The scalar definition is model/fp8.h's.
#pragma once

#include <cstdint>

#include "model/fp8.h"

#if defined(__x86_64__) && (defined(__AVX512F__) || (defined(__AVX2__) && defined(__F16C__)))
#include "cpu/kernels/x86_intrinsics.h"
#endif

namespace cellm::cpu {

#if defined(__x86_64__) && (defined(__AVX512F__) || (defined(__AVX2__) && defined(__F16C__)))
// 2^-8 times the values of codes held one per 16-bit lane: sign to bit 15, exponent
// and mantissa bits to f16's (an e4m3 exponent field e is the f16 field e, bias 15
// instead of 7: hence 2^-8; e4m3 subnormals land on f16 subnormals, which the f16 ->
// f32 conversion widens exactly). NaN codes become finite values.
inline __m256i e4m3_to_f16_bits_scaled(__m256i h) {
  const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x80)), 8);
  const __m256i mag = _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x7F)), 7);
  return _mm256_or_si256(sign, mag);
}
#endif

#if defined(__x86_64__) && defined(__AVX512F__)
// 2^-8 times the values of the 16 codes at p, as f32 (NaN codes: finite).
inline __m512 load_e4m3x16_scaled(const uint8_t* p) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm512_cvtph_ps(e4m3_to_f16_bits_scaled(_mm256_cvtepu8_epi16(b)));
}
#endif

// dst[i] = the value of codes[i] for i < n, exactly (NaN codes give NaN).
inline void decode_e4m3(const uint8_t* codes, int64_t n, float* dst) {
  int64_t i = 0;
#if defined(__x86_64__) && defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_mul_ps(load_e4m3x16_scaled(codes + i), _mm512_set1_ps(256.0f));
    // A NaN code (magnitude bits all ones) decodes to +-480 here, past e4m3's largest 448.
    const __mmask16 nan = _mm512_cmp_ps_mask(_mm512_abs_ps(v), _mm512_set1_ps(480.0f), _CMP_EQ_OQ);
    _mm512_storeu_ps(dst + i, _mm512_mask_mov_ps(v, nan, _mm512_set1_ps(__builtin_nanf(""))));
  }
#endif
  const float* table = e4m3_table().data();
  for (; i < n; ++i) dst[i] = table[codes[i]];
}

}  // namespace cellm::cpu
