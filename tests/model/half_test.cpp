#include "model/half.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace cellm {
namespace {

// Decodes a 16-bit float from its fields, independently of half.h:
// (-1)^s * 2^(e - bias) * (1 + m / 2^mantissa_bits), subnormals, inf and NaN.
double DecodeFields(uint16_t h, int exponent_bits, int mantissa_bits) {
  const int bias = (1 << (exponent_bits - 1)) - 1;
  const int sign = h >> 15;
  const int exponent = (h >> mantissa_bits) & ((1 << exponent_bits) - 1);
  const int mantissa = h & ((1 << mantissa_bits) - 1);
  double magnitude;
  if (exponent == (1 << exponent_bits) - 1) {
    magnitude = mantissa == 0 ? INFINITY : NAN;
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<double>(mantissa), 1 - bias - mantissa_bits);
  } else {
    magnitude = std::ldexp(1.0 + std::ldexp(static_cast<double>(mantissa), -mantissa_bits),
                           exponent - bias);
  }
  return sign ? -magnitude : magnitude;
}

TEST(HalfTest, EveryBf16WidensToTheValueItsFieldsEncode) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    const double expected = DecodeFields(h, 8, 7);
    const float got = bf16_to_f32(h);
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << bits;
      ASSERT_EQ(std::signbit(got), (bits & 0x8000) != 0) << std::hex << bits;
    } else {
      ASSERT_EQ(static_cast<double>(got), expected) << std::hex << bits;
      ASSERT_EQ(std::signbit(got), (bits & 0x8000) != 0) << std::hex << bits;
    }
  }
}

TEST(HalfTest, EveryF16WidensToTheValueItsFieldsEncode) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    const double expected = DecodeFields(h, 5, 10);
    const float got = f16_to_f32(h);
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << bits;
    } else {
      ASSERT_EQ(static_cast<double>(got), expected) << std::hex << bits;
      ASSERT_EQ(std::signbit(got), (bits & 0x8000) != 0) << std::hex << bits;
    }
  }
}

TEST(HalfTest, EveryNonNanBf16AndF16SurvivesARoundTripBitForBit) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    if (!std::isnan(bf16_to_f32(h))) {
      ASSERT_EQ(f32_to_bf16(bf16_to_f32(h)), h) << std::hex << bits;
    }
    if (!std::isnan(f16_to_f32(h))) {
      ASSERT_EQ(f32_to_f16(f16_to_f32(h)), h) << std::hex << bits;
    }
  }
}

TEST(HalfTest, NanStaysNanThroughNarrowingAndRoundTrips) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    if (std::isnan(bf16_to_f32(h))) {
      ASSERT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(bf16_to_f32(h)))));
    }
    if (std::isnan(f16_to_f32(h))) {
      ASSERT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f16_to_f32(h)))));
    }
  }
  // A float NaN whose payload lives only in the low bits must not become infinity.
  const float low_payload_nan = std::bit_cast<float>(0x7f800001u);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(low_payload_nan))));
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(low_payload_nan))));
}

// For every pair of adjacent finite positive 16-bit values a < b (and their
// negatives), the midpoint is exact in float: it must round to the one with an
// even mantissa, and one float ulp either side must round to the nearer one.
template <typename Widen, typename Narrow>
void ExpectRoundToNearestEven(Widen widen, Narrow narrow, uint16_t largest_finite) {
  for (uint32_t a = 0; a < largest_finite; ++a) {
    const uint16_t lo = static_cast<uint16_t>(a);
    const uint16_t hi = static_cast<uint16_t>(a + 1);
    const double exact_mid = (static_cast<double>(widen(lo)) + static_cast<double>(widen(hi))) / 2;
    const float mid = static_cast<float>(exact_mid);
    ASSERT_EQ(static_cast<double>(mid), exact_mid);
    const uint16_t even = (lo & 1) == 0 ? lo : hi;
    ASSERT_EQ(narrow(mid), even) << std::hex << a;
    ASSERT_EQ(narrow(-mid), static_cast<uint16_t>(even | 0x8000)) << std::hex << a;
    ASSERT_EQ(narrow(std::nextafter(mid, 0.0f)), lo) << std::hex << a;
    ASSERT_EQ(narrow(std::nextafter(mid, INFINITY)), hi) << std::hex << a;
  }
}

TEST(HalfTest, Bf16NarrowingRoundsToNearestEvenAtEveryMidpoint) {
  ExpectRoundToNearestEven(bf16_to_f32, f32_to_bf16, 0x7f7f);
}

TEST(HalfTest, F16NarrowingRoundsToNearestEvenAtEveryMidpointIncludingSubnormals) {
  ExpectRoundToNearestEven(f16_to_f32, f32_to_f16, 0x7bff);
}

TEST(HalfTest, ValuesBeyondTheLargestFiniteRoundToInfinity) {
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65519.99f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // the midpoint to 2^16 rounds to even: infinity
  EXPECT_EQ(f32_to_f16(1e9f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-1e9f), 0xfc00);
  EXPECT_EQ(f32_to_f16(INFINITY), 0x7c00);
  EXPECT_EQ(f32_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-INFINITY), 0xff80);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);  // half the smallest subnormal: ties to even (zero)
  EXPECT_EQ(f32_to_f16(0x1.000002p-25f), 0x0001);
  EXPECT_EQ(f32_to_f16(1e-10f), 0x0000);
}

TEST(HalfTest, SampledFloatsNarrowToTheNearestRepresentable) {
  // Every 65537th float bit pattern: the narrowed value is never farther than
  // either neighbour of the result.
  for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 65537) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(bits));
    if (!std::isfinite(f)) continue;
    const uint16_t b = f32_to_bf16(f);
    const double err_b = std::fabs(static_cast<double>(bf16_to_f32(b)) - f);
    if (std::isfinite(bf16_to_f32(b))) {
      for (int step : {-1, 1}) {
        const uint16_t n = static_cast<uint16_t>(b + step);
        const float nv = bf16_to_f32(n);
        if (std::isfinite(nv) && (n & 0x7fff) <= 0x7f7f && ((n ^ b) & 0x8000) == 0) {
          ASSERT_LE(err_b, std::fabs(static_cast<double>(nv) - f)) << std::hex << bits;
        }
      }
    }
    if (std::fabs(f) < 65504.0f) {
      const uint16_t h = f32_to_f16(f);
      const double err_h = std::fabs(static_cast<double>(f16_to_f32(h)) - f);
      for (int step : {-1, 1}) {
        const uint16_t n = static_cast<uint16_t>(h + step);
        if ((n & 0x7fff) <= 0x7bff && ((n ^ h) & 0x8000) == 0) {
          ASSERT_LE(err_h, std::fabs(static_cast<double>(f16_to_f32(n)) - f)) << std::hex << bits;
        }
      }
    }
  }
}

}  // namespace
}  // namespace cellm
