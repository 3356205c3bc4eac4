// Conversions between 16-bit floats (bfloat16, IEEE binary16) and float.
//
// 16-bit values travel as their raw bits in a uint16_t. Widening is exact.
// Narrowing rounds to nearest, ties to even; values too large for the target
// become infinity of the same sign; NaN stays NaN (made quiet, sign kept).
// f32_to_f16 produces binary16 subnormals and relies on the default floating
// point environment (round to nearest, no flush-to-zero).
// Header-only, no state: safe from any thread.
#pragma once

#include <bit>
#include <cstdint>

namespace cellm {

inline float bf16_to_f32(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep sign and top payload, set the quiet bit
    return static_cast<uint16_t>((x >> 16) | 0x0040u);
  }
  const uint32_t lsb = (x >> 16) & 1u;
  x += 0x7fffu + lsb;  // round to nearest even; a carry into the exponent is correct rounding
  return static_cast<uint16_t>(x >> 16);
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1fu) {  // infinity or NaN
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  }
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + (127 - 15)) << 23) | (mantissa << 13));
}

inline uint16_t f32_to_f16(float f) {
  constexpr uint32_t kF32Infinity = 255u << 23;
  constexpr uint32_t kF16Overflow = (127u + 16u) << 23;  // 2^16: at or above is inf/NaN
  constexpr uint32_t kF16MinNormal = 113u << 23;         // 2^-14
  constexpr uint32_t kDenormMagic = ((127u - 15u) + (23u - 10u) + 1u) << 23;  // 0.5f
  uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x & 0x80000000u) >> 16;
  x &= 0x7fffffffu;
  uint32_t out;
  if (x >= kF16Overflow) {
    out = x > kF32Infinity ? (0x7e00u | ((x >> 13) & 0x3ffu)) : 0x7c00u;
  } else if (x < kF16MinNormal) {
    // Adding 0.5 aligns the 10 subnormal mantissa bits at the bottom of the float;
    // the hardware addition rounds to nearest even.
    const float aligned = std::bit_cast<float>(x) + std::bit_cast<float>(kDenormMagic);
    out = std::bit_cast<uint32_t>(aligned) - kDenormMagic;
  } else {
    const uint32_t mantissa_odd = (x >> 13) & 1u;
    x += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + mantissa_odd;  // rebias, round
    out = x >> 13;  // a carry past the largest finite value gives infinity
  }
  return static_cast<uint16_t>(out | sign);
}

}  // namespace cellm
