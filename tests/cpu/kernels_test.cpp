// Tests of the small CPU kernels: conversions, RMSNorm, SiLU·up, embedding
// gather and selected-row logits, each against its reference twin.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "cpu/kernels/activation.h"
#include "cpu/kernels/convert.h"
#include "cpu/kernels/embedding.h"
#include "cpu/kernels/reference.h"
#include "cpu/kernels/rmsnorm.h"
#include "cpu/kernels/simd.h"
#include "kernel_test_util.h"

namespace cellm::cpu {
namespace {

using testing::all_close;
using testing::kAllDTypes;
using testing::random_floats;
using testing::random_typed;
using testing::TypedBuffer;

TEST(ConvertTest, Bf16RoundTripIsExactAndRoundsToNearestEven) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
      continue;
    }
    ASSERT_EQ(f32_to_bf16(f), h);
  }
  // 1 + 2^-8 lies halfway between bf16 1 and 1 + 2^-7: ties to even (1).
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f), f32_to_bf16(1.0f));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 0x1.8p-8f)), 1.0f + 0x1p-7f);
}

TEST(ConvertTest, F16DecodesEveryBitPatternLikeTheHardware) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    float want = 0.0f;
    const uint16_t bits = static_cast<uint16_t>(h);
    simd::widen<DType::kF16>(&bits, 1, &want);  // F16C where compiled in
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(f)) << h;
    } else {
      ASSERT_EQ(std::bit_cast<uint32_t>(f), std::bit_cast<uint32_t>(want)) << h;
      ASSERT_EQ(f32_to_f16(f), h) << h;
    }
  }
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // rounds up to inf
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);  // tie to even: 0
  EXPECT_EQ(f32_to_f16(0x1.8p-25f), 0x0001);
}

TEST(ConvertTest, WideningMatchesTheScalarConversionOnOddLengths) {
  std::mt19937 rng(1);
  for (DType t : kAllDTypes) {
    for (int64_t n : {1, 7, 16, 33}) {
      const TypedBuffer b = random_typed(rng, t, n, -1000.0f, 1000.0f);
      std::vector<float> got(static_cast<size_t>(n) + 1, -7.0f);
      simd::widen(b.ptr().data, t, n, got.data());
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(got[static_cast<size_t>(i)], b.at(i));
      EXPECT_EQ(got.back(), -7.0f);  // nothing written past n
    }
  }
}

TEST(RmsNormTest, MatchesTheReferenceForEveryWeightDTypeAndOddWidths) {
  std::mt19937 rng(2);
  ThreadPool pool(3);
  for (DType t : kAllDTypes) {
    for (int64_t m : {1, 3, 50}) {
      for (int64_t d : {1, 7, 64, 769, 2048}) {
        const std::vector<float> x = random_floats(rng, m * d, -3.0f, 3.0f);
        const TypedBuffer w = random_typed(rng, t, d, 0.5f, 1.5f);
        std::vector<float> got(x.size(), NAN), want(x.size());
        rmsnorm(pool, x.data(), m, d, w.ptr(), 1e-6f, got.data());
        reference::rmsnorm(x.data(), m, d, w.ptr(), 1e-6f, want.data());
        // f32 sum of squares and rsqrt versus f64: 2e-6 relative.
        EXPECT_TRUE(all_close(got, want, 2e-6, 1e-7)) << to_string(t) << " m " << m << " d " << d;
      }
    }
  }
}

TEST(RmsNormTest, WorksInPlaceAndEpsilonDominatesATinyRow) {
  ThreadPool pool(1);
  std::vector<float> x = {1e-4f, -1e-4f, 1e-4f};
  const std::vector<float> w = {1.0f, 2.0f, 3.0f};
  std::vector<float> want(3);
  reference::rmsnorm(x.data(), 1, 3, TypedPtr{w.data()}, 1e-5f, want.data());
  rmsnorm(pool, x.data(), 1, 3, TypedPtr{w.data()}, 1e-5f, x.data());
  EXPECT_TRUE(all_close(x, want, 2e-6, 0.0));
  EXPECT_LT(std::fabs(x[0]), 0.1f);  // 1e-4 / sqrt(1e-8 + 1e-5), not 1
}

TEST(AddRmsNormTest, AddsTheResidualThenNormalisesTheSum) {
  std::mt19937 rng(3);
  ThreadPool pool(2);
  for (DType t : kAllDTypes) {
    for (int64_t m : {1, 5, 40}) {
      const int64_t d = 768 + 3;
      std::vector<float> h = random_floats(rng, m * d, -2.0f, 2.0f);
      const std::vector<float> x = random_floats(rng, m * d, -2.0f, 2.0f);
      const TypedBuffer w = random_typed(rng, t, d);
      std::vector<float> want_h(h.size()), want(h.size()), got(h.size(), NAN);
      for (size_t i = 0; i < h.size(); ++i) want_h[i] = h[i] + x[i];
      reference::rmsnorm(want_h.data(), m, d, w.ptr(), 1e-5f, want.data());
      add_rmsnorm(pool, h.data(), x.data(), m, d, w.ptr(), 1e-5f, got.data());
      EXPECT_EQ(h, want_h);
      EXPECT_TRUE(all_close(got, want, 2e-6, 1e-7)) << to_string(t) << " m " << m;
      // Output written over x.
      std::vector<float> h2 = h, x2 = x, want2(h.size());
      for (size_t i = 0; i < h2.size(); ++i) want_h[i] = h2[i] + x2[i];
      reference::rmsnorm(want_h.data(), m, d, w.ptr(), 1e-5f, want2.data());
      add_rmsnorm(pool, h2.data(), x2.data(), m, d, w.ptr(), 1e-5f, x2.data());
      EXPECT_TRUE(all_close(x2, want2, 2e-6, 1e-7));
    }
  }
}

TEST(SiluMulTest, MatchesTheReferenceOnLongAndOddLengths) {
  std::mt19937 rng(4);
  ThreadPool pool(3);
  for (int64_t n : {1, 15, 17, 2048 * 3 + 5, 100003}) {
    const std::vector<float> gate = random_floats(rng, n, -20.0f, 20.0f);
    const std::vector<float> up = random_floats(rng, n, -2.0f, 2.0f);
    std::vector<float> got(static_cast<size_t>(n), NAN), want(static_cast<size_t>(n));
    silu_mul(pool, gate.data(), up.data(), n, got.data());
    for (int64_t i = 0; i < n; ++i) want[i] = reference::silu_mul(gate[i], up[i]);
    // A few f32 roundings plus a 2-ulp exp: 1e-6 relative.
    EXPECT_TRUE(all_close(got, want, 1e-6, 1e-30)) << "n " << n;
  }
}

TEST(SiluMulTest, ExtremeGatesSaturateWithoutNaN) {
  ThreadPool pool(1);
  const std::vector<float> gate = {
      -1000.0f, -100.0f, -88.0f,  0.0f,
      88.0f,    100.0f,  1000.0f, std::numeric_limits<float>::infinity(),
      -0.0f,    1e-30f,  -30.0f,  30.0f,
      5.0f,     -5.0f,   0.5f,    -0.5f,
      2.0f};
  const std::vector<float> up(gate.size(), 2.0f);
  std::vector<float> got(gate.size()), want(gate.size());
  silu_mul(pool, gate.data(), up.data(), static_cast<int64_t>(gate.size()), got.data());
  for (size_t i = 0; i < gate.size(); ++i) want[i] = reference::silu_mul(gate[i], up[i]);
  EXPECT_TRUE(all_close(got, want, 1e-6, 1e-30));
  for (float g : got) EXPECT_FALSE(std::isnan(g));
}

TEST(FastExpTest, IsWithinTwoUlpOfStdExpAcrossTheNormalRange) {
  for (float x = -87.0f; x < 88.5f; x += 0.0137f) {
    const float want = std::exp(x);
    const float got = fast_exp(x);
    const float ulp = std::nextafter(want, INFINITY) - want;
    ASSERT_LE(std::fabs(got - want), 2.0f * ulp) << "x " << x;
  }
  EXPECT_EQ(fast_exp(0.0f), 1.0f);
  EXPECT_EQ(fast_exp(200.0f), INFINITY);
  EXPECT_EQ(fast_exp(-200.0f), 0.0f);
}

TEST(FastExpTest, ExpArrayMatchesFastExpForEveryElementAndTail) {
  for (int64_t n : {0, 1, 15, 16, 17, 32, 45}) {
    std::vector<float> x(static_cast<size_t>(n)), got(x.size());
    for (int64_t i = 0; i < n; ++i)
      x[static_cast<size_t>(i)] = -90.0f + 3.7f * static_cast<float>(i);
    exp_array(x.data(), n, got.data());
    for (int64_t i = 0; i < n; ++i) {
      const auto u = static_cast<size_t>(i);
      ASSERT_EQ(got[u], fast_exp(x[u])) << "n " << n << " i " << i;
    }
    exp_array(x.data(), n, x.data());  // in place
    EXPECT_EQ(x, got) << "n " << n;
  }
}

TEST(EmbeddingTest, GatherWidensTheSelectedRowsOfEveryDType) {
  std::mt19937 rng(5);
  for (DType t : kAllDTypes) {
    const int64_t vocab = 37, d = 19;
    const TypedBuffer table = random_typed(rng, t, vocab * d);
    const std::vector<int32_t> tokens = {36, 0, 5, 5, 17};
    std::vector<float> got(tokens.size() * d, NAN);
    embedding_gather(table.ptr(), vocab, d, tokens, got.data());
    for (size_t i = 0; i < tokens.size(); ++i) {
      for (int64_t c = 0; c < d; ++c) {
        EXPECT_EQ(got[i * d + c], table.at(tokens[i] * d + c)) << to_string(t);
      }
    }
  }
}

TEST(LogitsTest, SelectedRowsTimesTheLmHeadMatchTheReference) {
  std::mt19937 rng(6);
  ThreadPool pool(2);
  for (DType t : kAllDTypes) {
    const int64_t m = 9, d = 67, vocab = 1003;
    const std::vector<float> hidden = random_floats(rng, m * d);
    const TypedBuffer head = random_typed(rng, t, vocab * d);
    const std::vector<int32_t> rows = {8, 2, 3};
    std::vector<float> got(rows.size() * vocab, NAN), want(rows.size() * vocab);
    logits(pool, hidden.data(), m, d, rows, head.ptr(), vocab, got.data());
    for (size_t s = 0; s < rows.size(); ++s) {
      reference::matmul(hidden.data() + rows[s] * d, 1, d, head.ptr(), vocab, TypedPtr{},
                        want.data() + s * vocab);
    }
    // Sums of 67 products of magnitude <= 1: 1e-5 relative plus 1e-6 absolute.
    EXPECT_TRUE(all_close(got, want, 1e-5, 1e-6)) << to_string(t);
  }
}

}  // namespace
}  // namespace cellm::cpu
