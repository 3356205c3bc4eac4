#include "cpu/kernels/matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cpu/kernels/reference.h"
#include "kernel_test_util.h"

namespace cellm::cpu {
namespace {

using testing::all_close;
using testing::random_floats;
using testing::random_typed;
using testing::TypedBuffer;

// Tolerance: f32 accumulation in a different order than the f64 reference, so
// each element may differ by 1e-5 of the sum of its terms' magnitudes
// (sum_k |x[i,k] * w[j,k]| + |bias[j]|) — ~1e-5 relative for sums without
// cancellation, and meaningful for those with it.
constexpr double kRelTol = 1e-5;

void expect_matches_reference(ThreadPool& pool, int64_t m, int64_t k, int64_t n, DType w_type,
                              bool with_bias, DType bias_type, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<float> x = random_floats(rng, m * k);
  const TypedBuffer w = random_typed(rng, w_type, n * k);
  const TypedBuffer bias = random_typed(rng, bias_type, with_bias ? n : 0);
  const TypedPtr bias_ptr = with_bias ? bias.ptr() : TypedPtr{};

  std::vector<float> got(static_cast<size_t>(m * n), NAN);
  matmul(pool, x.data(), m, k, w.ptr(), n, bias_ptr, got.data());
  std::vector<float> want(static_cast<size_t>(m * n));
  reference::matmul(x.data(), m, k, w.ptr(), n, bias_ptr, want.data());

  std::vector<double> scale(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = with_bias ? std::fabs(bias.at(j)) : 0.0;
      for (int64_t c = 0; c < k; ++c) s += std::fabs(double{x[i * k + c]} * w.at(j * k + c));
      scale[static_cast<size_t>(i * n + j)] = s;
    }
  }
  EXPECT_TRUE(all_close(got, want, kRelTol, 1e-30, scale))
      << "m " << m << " k " << k << " n " << n << " w " << to_string(w_type) << " bias "
      << (with_bias ? to_string(bias_type) : "none");
}

void sweep(DType w_type) {
  ThreadPool pool(3);
  uint32_t seed = 1;
  // Decode sizes (1..64 rows, in-register widening), the packing threshold
  // (4 / 5 rows), prefill sizes, k around the SIMD width and the 512-column
  // cache tile, n around the 4-row micro tile and the 64-row cache tile.
  for (int64_t m : {1, 2, 3, 4, 5, 7, 17, 64, 130}) {
    for (int64_t k : {1, 7, 16, 17, 100, 512, 513, 1100}) {
      for (int64_t n : {1, 3, 5, 64, 67, 131}) {
        expect_matches_reference(pool, m, k, n, w_type, (seed % 2) == 0, w_type, seed);
        ++seed;
      }
    }
  }
}

TEST(MatmulTest, F32WeightsMatchTheF64ReferenceOnAwkwardShapes) {
  sweep(DType::kF32);
}

TEST(MatmulTest, Bf16WeightsMatchTheF32ReferenceOnAwkwardShapes) {
  sweep(DType::kBF16);
}

TEST(MatmulTest, F16WeightsMatchTheF32ReferenceOnAwkwardShapes) {
  sweep(DType::kF16);
}

TEST(MatmulTest, BiasMayHaveADifferentDTypeThanTheWeights) {
  ThreadPool pool(2);
  expect_matches_reference(pool, 3, 33, 70, DType::kBF16, true, DType::kF32, 7);
  expect_matches_reference(pool, 9, 33, 70, DType::kF16, true, DType::kBF16, 8);
  expect_matches_reference(pool, 1, 768, 768, DType::kF32, true, DType::kF16, 9);
}

TEST(MatmulTest, ModelShapesMatchOnOneAndTwoThreads) {
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    expect_matches_reference(pool, 1, 768, 2048, DType::kBF16, false, DType::kBF16, 11);
    expect_matches_reference(pool, 6, 2048, 768, DType::kBF16, false, DType::kBF16, 12);
    expect_matches_reference(pool, 128, 768, 96, DType::kF16, true, DType::kF16, 13);
  }
}

TEST(MatmulTest, ActivationsAreNotRoundedToSixteenBits) {
  // x = 1 + 2^-20 (twice, among zeros) is not a bf16 or f16 value; with w = 1
  // the sum 2 + 2^-19 is exact in f32 in any order, and keeps the low bits only
  // if x is used unrounded. m covers the in-register, packed and sgemm paths.
  ThreadPool pool(1);
  for (DType t : {DType::kBF16, DType::kF16}) {
    for (int64_t m : {1, 3, 8, 20}) {
      std::vector<float> x(static_cast<size_t>(m * 32), 0.0f);
      for (int64_t i = 0; i < m; ++i) x[i * 32 + 5] = x[i * 32 + 20] = 1.0f + 0x1p-20f;
      const uint16_t one = t == DType::kBF16 ? f32_to_bf16(1.0f) : f32_to_f16(1.0f);
      const std::vector<uint16_t> w(32, one);
      std::vector<float> y(static_cast<size_t>(m), 0.0f);
      matmul(pool, x.data(), m, 32, TypedPtr{w.data(), t}, 1, TypedPtr{}, y.data());
      for (float v : y) EXPECT_EQ(v, 2.0f + 0x1p-19f) << to_string(t) << " m " << m;
    }
  }
}

TEST(MatmulTest, ZeroColumnsGiveTheBiasAndZeroRowsWriteNothing) {
  ThreadPool pool(2);
  const std::vector<float> bias = {1.5f, -2.0f, 3.25f};
  std::vector<float> y(6, NAN);
  matmul(pool, nullptr, 2, 0, TypedPtr{nullptr, DType::kBF16}, 3, TypedPtr{bias.data()}, y.data());
  EXPECT_EQ(y, (std::vector<float>{1.5f, -2.0f, 3.25f, 1.5f, -2.0f, 3.25f}));
  matmul(pool, nullptr, 0, 5, TypedPtr{nullptr, DType::kBF16}, 3, TypedPtr{}, nullptr);
}

}  // namespace
}  // namespace cellm::cpu
