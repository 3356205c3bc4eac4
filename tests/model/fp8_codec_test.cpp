// The float8_e4m3fn codec (model/fp8.h) against torch's float8_e4m3fn: every code's
// value, the code torch's cast gives for every midpoint between neighbouring codes
// and the floats next to it (rounding, ties to even) and for random values, the
// round trip of every code, saturation, and the per-row quantizer.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "fp8_torch_table.h"
#include "model/fp8.h"

namespace cellm {
namespace {

TEST(Fp8Codec, EveryCodeDecodesAsTorch) {
  int nans = 0;
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    const float want = std::bit_cast<float>(fp8_torch::kCodeValueBits[c]);
    const float got = e4m3_to_f32(code);
    if (std::isnan(want)) {
      ++nans;
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
      EXPECT_TRUE(e4m3_is_nan(code));
      continue;
    }
    EXPECT_FALSE(e4m3_is_nan(code));
    EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want)) << "code " << c;
    EXPECT_EQ(e4m3_table()[static_cast<size_t>(c)], want);
    // bf16 holds every value exactly: the f32's low half is zero.
    EXPECT_EQ(std::bit_cast<uint32_t>(want) & 0xFFFFu, 0u) << "code " << c;
    EXPECT_EQ(e4m3_to_bf16(code), std::bit_cast<uint32_t>(want) >> 16) << "code " << c;
  }
  EXPECT_EQ(nans, 2);
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), 0x1p-9f);
  EXPECT_EQ(e4m3_to_f32(0x08), 0x1p-6f);
}

TEST(Fp8Codec, EncodeRoundsAsTorch) {
  constexpr size_t n = sizeof(fp8_torch::kInputCodes);
  static_assert(sizeof(fp8_torch::kInputBits) / sizeof(uint32_t) == n);
  ASSERT_GT(n, 500u);
  for (size_t i = 0; i < n; ++i) {
    const float x = std::bit_cast<float>(fp8_torch::kInputBits[i]);
    EXPECT_EQ(f32_to_e4m3(x), fp8_torch::kInputCodes[i]) << "x = " << x;
  }
}

TEST(Fp8Codec, EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    if (e4m3_is_nan(code)) continue;
    EXPECT_EQ(f32_to_e4m3(e4m3_to_f32(code)), code) << "code " << c;
  }
}

TEST(Fp8Codec, SaturatesAndKeepsNan) {
  EXPECT_EQ(f32_to_e4m3(448.0f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(1e6f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(-1e6f), 0xFE);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(f32_to_e4m3(-std::numeric_limits<float>::infinity()), 0xFE);
  EXPECT_TRUE(e4m3_is_nan(f32_to_e4m3(std::numeric_limits<float>::quiet_NaN())));
  // Below half the smallest subnormal: zero, keeping the sign.
  EXPECT_EQ(f32_to_e4m3(0x1p-11f), 0x00);
  EXPECT_EQ(f32_to_e4m3(-0x1p-11f), 0x80);
  // Half the smallest subnormal ties to even (0); a bit more rounds up.
  EXPECT_EQ(f32_to_e4m3(0x1p-10f), 0x00);
  EXPECT_EQ(f32_to_e4m3(0x1.01p-10f), 0x01);
}

TEST(Fp8Codec, RowQuantizerMapsTheLargestMagnitudeTo448) {
  const std::vector<float> row = {0.5f, -2.0f, 0.001f, 1.25f, 0.0f};
  std::vector<uint8_t> codes(row.size());
  const float scale = quantize_row_e4m3(row.data(), static_cast<int64_t>(row.size()), codes.data());
  EXPECT_FLOAT_EQ(scale, 2.0f / 448.0f);
  EXPECT_EQ(codes[1], 0xFE);
  for (size_t i = 0; i < row.size(); ++i) {
    const float back = e4m3_to_f32(codes[i]) * scale;
    EXPECT_LE(std::fabs(back - row[i]), std::fabs(row[i]) / 16 + scale * 0x1p-10f) << i;
  }
  const std::vector<float> zeros(4, 0.0f);
  EXPECT_EQ(quantize_row_e4m3(zeros.data(), 4, codes.data()), 0.0f);
  EXPECT_EQ(codes[0], 0);
}

}  // namespace
}  // namespace cellm
