// The float8_e4m3fn codec (DType::kF8E4M3): 1 sign bit, 4 exponent bits with bias
// 7, 3 mantissa bits. No infinities; S.1111.111 is NaN; the largest finite
// magnitude is 448 (0.1111.110); exponent field 0 holds subnormals m * 2^-9.
//
// Decoding is exact: every e4m3 value is an f32 and a bf16 value (3 mantissa bits
// fit in bf16's 7, and 2^-9 .. 448 lies in bf16's exponent range).
// Encoding rounds to nearest, ties to even, and saturates: magnitudes past 448
// (infinities included) give ±448, where torch's plain cast gives NaN from 464 on;
// quantizers clamp to ±448 first, so for them the two agree. NaN gives NaN (0x7F
// with the sign bit).
// Thread-safety: pure functions.
#pragma once

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace cellm {

inline constexpr float kE4M3Max = 448.0f;

// Whether `code` is one of the two NaN codes.
constexpr bool e4m3_is_nan(uint8_t code) {
  return (code & 0x7F) == 0x7F;
}

// The value of `code` (exact; NaN for the NaN codes).
inline float e4m3_to_f32(uint8_t code) {
  const bool negative = (code & 0x80) != 0;
  const int exponent = (code >> 3) & 0xF;
  const int mantissa = code & 0x7;
  float magnitude;
  if (e4m3_is_nan(code)) {
    magnitude = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -9);
  } else {
    magnitude = std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
  }
  return negative ? -magnitude : magnitude;
}

// The bf16 bits of `code`'s value (exact: the f32's upper half, its lower half is 0).
inline uint16_t e4m3_to_bf16(uint8_t code) {
  return static_cast<uint16_t>(std::bit_cast<uint32_t>(e4m3_to_f32(code)) >> 16);
}

// The 256 values, indexed by code (NaN codes hold NaN).
inline const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[static_cast<size_t>(c)] = e4m3_to_f32(static_cast<uint8_t>(c));
    return t;
  }();
  return table;
}

// `value` rounded to the nearest e4m3 (ties to even), saturated to ±448.
inline uint8_t f32_to_e4m3(float value) {
  const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  if (std::isnan(value)) return static_cast<uint8_t>(sign | 0x7F);
  const float a = std::fabs(value);
  if (a >= kE4M3Max) return static_cast<uint8_t>(sign | 0x7E);
  if (a < 0x1p-6f) {
    // Subnormal range: steps of 2^-9; 8 steps is the smallest normal (code 0x08).
    // a * 2^9 is exact, and the default rounding mode rounds ties to even.
    const auto q = static_cast<uint8_t>(std::nearbyint(a * 0x1p9f));
    return static_cast<uint8_t>(sign | q);
  }
  int e2 = 0;
  const float fraction = std::frexp(a, &e2);  // a = fraction * 2^e2, fraction in [0.5, 1)
  int exponent = e2 - 1 + 7;                  // a = (1 + m / 8) * 2^(exponent - 7)
  // (2 fraction - 1) * 8 is exact; rounding it to an integer rounds the mantissa.
  auto mantissa = static_cast<int>(std::nearbyint((2.0f * fraction - 1.0f) * 8.0f));
  if (mantissa == 8) {
    mantissa = 0;
    ++exponent;
  }
  const int code = (exponent << 3) | mantissa;
  return static_cast<uint8_t>(sign | (code > 0x7E ? 0x7E : code));
}

// Quantizes one row of n floats to e4m3 with one scale: scale = amax / 448 (amax
// the row's largest magnitude), dst[i] = e4m3(src[i] / scale), so the row's largest
// value maps to ±448. Returns the scale (0 for an all-zero row, whose codes are 0).
// REQUIRES: src finite.
inline float quantize_row_e4m3(const float* src, int64_t n, uint8_t* dst) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(src[i]));
  const float scale = amax / kE4M3Max;
  for (int64_t i = 0; i < n; ++i) dst[i] = scale > 0.0f ? f32_to_e4m3(src[i] / scale) : 0;
  return scale;
}

}  // namespace cellm
