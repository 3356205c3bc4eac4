// bf16_dot_matmul (cpu/quant/bf16_dot_matmul.h): the AVX-512 BF16 path against
// its scalar twin on awkward shapes (k around the 32-wide step, n around the
// 4-row tile, 1..65 rows), the twin against an f64 dot of the same bf16 operands,
// and both within x's bf16 rounding of the exact f32 product.
#include "cpu/quant/bf16_dot_matmul.h"

#include <gtest/gtest.h>

#include <bit>

#include <cmath>
#include <random>
#include <vector>

#include "kernel_test_util.h"
#include "model/half.h"

namespace cellm::cpu::quant {
namespace {

using cpu::testing::all_close;

struct Problem {
  int64_t m, k, n;
  std::vector<float> x;
  std::vector<uint16_t> w;
  std::vector<float> want_rounded;  // f64 sums of bf16(x) * w
  std::vector<float> want_exact;    // f64 sums of x * w
  std::vector<double> scale;        // sums of |x * w|
};

Problem make(std::mt19937& rng, int64_t m, int64_t k, int64_t n) {
  Problem p{m, k, n, cpu::testing::random_floats(rng, m * k, -2.0f, 2.0f), {}, {}, {}, {}};
  const std::vector<float> wf = cpu::testing::random_floats(rng, n * k);
  for (const float v : wf) p.w.push_back(f32_to_bf16(v));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double r = 0.0, e = 0.0, s = 0.0;
      for (int64_t c = 0; c < k; ++c) {
        const double w = bf16_to_f32(p.w[static_cast<size_t>(j * k + c)]);
        const float x = p.x[static_cast<size_t>(i * k + c)];
        r += double{bf16_to_f32(f32_to_bf16(x))} * w;
        e += double{x} * w;
        s += std::fabs(double{x} * w);
      }
      p.want_rounded.push_back(static_cast<float>(r));
      p.want_exact.push_back(static_cast<float>(e));
      p.scale.push_back(s);
    }
  return p;
}

std::vector<float> run(ThreadPool& pool, const Problem& p, bool simd) {
  std::vector<float> y(static_cast<size_t>(p.m * p.n), NAN);
  bf16_dot_matmul(pool, p.x.data(), p.m, p.k, p.w.data(), p.n, y.data(), simd);
  return y;
}

constexpr int64_t kRows[] = {1, 3, 4, 5, 17, 65};
constexpr int64_t kCols[] = {1, 31, 32, 33, 576, 1000};
constexpr int64_t kOuts[] = {1, 5, 64, 67, 203};

TEST(Bf16DotMatmulTest, TheAvx512Bf16PathMatchesItsScalarTwin) {
  if (!bf16_dot_supported()) GTEST_SKIP() << "no AVX-512 BF16 on this CPU";
  ThreadPool pool(2);
  std::mt19937 rng(21);
  for (const int64_t m : kRows)
    for (const int64_t k : kCols)
      for (const int64_t n : kOuts) {
        const Problem p = make(rng, m, k, n);
        EXPECT_TRUE(all_close(run(pool, p, true), run(pool, p, false), 1e-5, 1e-30, p.scale))
            << "m " << m << " k " << k << " n " << n;
      }
}

// A row's result does not depend on the rows computed with it (DESIGN.md: a seeded
// generation gives the same tokens whatever else shares its batches): every row of a
// product of 2..300 rows, decode-sized or prefill-sized, has the bits of that row
// computed alone. A kernel whose summation order changes with the number of rows
// (a different tile for prefill than for decode) breaks this.
TEST(Bf16DotMatmulTest, ARowsResultHasTheSameBitsInAnyBatch) {
  if (!bf16_dot_supported()) GTEST_SKIP() << "no AVX-512 BF16 on this CPU";
  ThreadPool pool(2);
  std::mt19937 rng(25);
  for (const int64_t m : {2, 7, 16, 17, 40, 300}) {
    const Problem p = make(rng, m, 576, 203);
    const std::vector<float> batch = run(pool, p, true);
    for (const int64_t i : {int64_t{0}, m / 2, m - 1}) {
      std::vector<float> alone(static_cast<size_t>(p.n));
      bf16_dot_matmul(pool, p.x.data() + i * p.k, 1, p.k, p.w.data(), p.n, alone.data());
      for (int64_t j = 0; j < p.n; ++j) {
        ASSERT_EQ(std::bit_cast<uint32_t>(alone[static_cast<size_t>(j)]),
                  std::bit_cast<uint32_t>(batch[static_cast<size_t>(i * p.n + j)]))
            << "row " << i << " of " << m << ", column " << j;
      }
    }
  }
}

// Products of one x in one pass (a layer's q, k and v): each y has the bits of its
// product alone, on both paths, at decode and prefill row counts and with tiles that do
// not fill (n not a multiple of 4), so no tile may straddle two products.
TEST(Bf16DotMatmulTest, SharedProductsHaveTheBitsOfEachProductAlone) {
  std::mt19937 rng(26);
  ThreadPool pool(2);
  for (const bool simd : {false, true}) {
    if (simd && !bf16_dot_supported()) continue;
    for (const int64_t m : {1, 3, 16, 17, 40}) {
      const int64_t k = 96;
      const int64_t ns[] = {67, 5, 203};
      std::vector<Problem> ps;
      for (const int64_t n : ns) ps.push_back(make(rng, 0, k, n));
      const std::vector<float> x = cpu::testing::random_floats(rng, m * k, -2.0f, 2.0f);
      std::vector<std::vector<float>> shared(3);
      std::vector<Bf16Product> products;
      for (size_t i = 0; i < 3; ++i) {
        shared[i].assign(static_cast<size_t>(m * ns[i]), NAN);
        products.push_back(Bf16Product{ps[i].w.data(), ns[i], shared[i].data()});
      }
      bf16_dot_matmul_shared(pool, x.data(), m, k, products, simd);
      for (size_t i = 0; i < 3; ++i) {
        std::vector<float> alone(static_cast<size_t>(m * ns[i]), NAN);
        bf16_dot_matmul(pool, x.data(), m, k, ps[i].w.data(), ns[i], alone.data(), simd);
        for (size_t e = 0; e < alone.size(); ++e) {
          ASSERT_EQ(std::bit_cast<uint32_t>(alone[e]), std::bit_cast<uint32_t>(shared[i][e]))
              << "simd " << simd << " m " << m << " product " << i << " element " << e;
        }
      }
    }
  }
}

TEST(Bf16DotMatmulTest, TheScalarTwinSumsTheBf16RoundedProducts) {
  ThreadPool pool(1);
  std::mt19937 rng(22);
  for (const int64_t m : {1, 5})
    for (const int64_t k : kCols)
      for (const int64_t n : {1, 67}) {
        const Problem p = make(rng, m, k, n);
        const std::vector<float> got = run(pool, p, false);
        EXPECT_TRUE(all_close(got, p.want_rounded, 1e-5, 1e-30, p.scale))
            << "m " << m << " k " << k << " n " << n;
        // Rounding x to bf16 (8 significant bits) moves each product by at most 2^-8.
        EXPECT_TRUE(all_close(got, p.want_exact, 1.0 / 256 + 1e-5, 1e-30, p.scale));
      }
}

}  // namespace
}  // namespace cellm::cpu::quant
