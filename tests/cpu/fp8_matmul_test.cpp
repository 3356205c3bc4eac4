// fp8_matmul (e4m3 weights with per-row scales) against its scalar twin, every
// element: the fused decode path (m = 1) and the blocked path (m >= 2: 64-row by
// 512-column tiles decoded once, 4 x 4 register tiles), with and without bias, k with
// and without a 16-lane tail, every code (subnormals and ±448 included), with x exact
// and with x rounded to bf16 (bf16_dot, blocks of 256 W rows).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "cpu/kernels/thread_pool.h"
#include "cpu/quant/bf16_dot_matmul.h"
#include "cpu/quant/fp8_matmul.h"
#include "model/fp8.h"

namespace cellm::cpu::quant {
namespace {

struct Case {
  int64_t m, n, k;
  bool bias;
};

void check(const Case& c, bool bf16_dot, ThreadPool& pool) {
  std::mt19937 rng(static_cast<uint32_t>(c.m * 1000 + c.n * 10 + c.k));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> code(0, 255);
  std::vector<float> x(static_cast<size_t>(c.m * c.k));
  for (float& v : x) v = u(rng);
  std::vector<uint8_t> w(static_cast<size_t>(c.n * c.k));
  for (uint8_t& b : w) {
    do {
      b = static_cast<uint8_t>(code(rng));
    } while (e4m3_is_nan(b));
  }
  std::vector<float> scales(static_cast<size_t>(c.n));
  for (float& s : scales) s = std::fabs(u(rng)) * 0.01f + 1e-4f;
  std::vector<uint16_t> bias(static_cast<size_t>(c.n));
  for (uint16_t& b : bias) b = f32_to_bf16(u(rng));
  const TypedPtr bias_ptr = c.bias ? TypedPtr{bias.data(), DType::kBF16} : TypedPtr{};
  const Fp8Weights fw{w.data(), scales.data(), c.n, c.k};

  // The twin sees x as the kernel's path does: rounded to bf16 on the bf16_dot path.
  const bool rounds = bf16_dot && c.m > 1 && bf16_dot_supported();
  std::vector<float> xr = x;
  if (rounds) {
    for (float& v : xr) v = bf16_to_f32(f32_to_bf16(v));
  }
  std::vector<float> want(static_cast<size_t>(c.m * c.n)), got(want.size(), -1.0f);
  fp8_matmul_scalar(xr.data(), c.m, fw, bias_ptr, want.data());
  fp8_matmul(pool, x.data(), c.m, fw, bias_ptr, got.data(), bf16_dot);

  // The sums differ only in order: bound by k ulps of the sum of |products|.
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double magnitude = 0.0;
      for (int64_t t = 0; t < c.k; ++t) {
        magnitude += std::fabs(xr[static_cast<size_t>(i * c.k + t)] *
                               e4m3_to_f32(w[static_cast<size_t>(j * c.k + t)]));
      }
      const double tol = magnitude * scales[static_cast<size_t>(j)] * 1e-6 * 4 + 1e-6;
      const size_t at = static_cast<size_t>(i * c.n + j);
      ASSERT_NEAR(got[at], want[at], tol)
          << "m=" << c.m << " n=" << c.n << " k=" << c.k << " bias=" << c.bias
          << " bf16_dot=" << bf16_dot << " at [" << i << ", " << j << "]";
    }
  }
}

TEST(Fp8Matmul, MatchesTheScalarTwinOnEveryElement) {
  ThreadPool pool(2);
  const std::vector<Case> cases = {
      {1, 7, 16, false},
      {1, 33, 64, true},
      {2, 5, 17, true},
      {3, 64, 100, false},
      {4, 19, 256, true},
      {5, 8, 16, false},
      {6, 31, 33, true},
      {8, 64, 128, true},
      {17, 40, 96, false},
      {64, 24, 512, true},
      {1, 1, 1, false},
      {9, 3, 5, true},
      // Several cache tiles each way (rows past 64 and 256, columns past 512 and
      // 1,024 with a partial block), at the decode and prefill row counts.
      {1, 300, 1100, true},
      {2, 300, 1100, false},
      {4, 130, 600, true},
      {16, 70, 1030, false},
      {128, 260, 700, true},
  };
  for (const Case& c : cases) {
    check(c, /*bf16_dot=*/false, pool);
    check(c, /*bf16_dot=*/true, pool);
  }
}

TEST(Fp8Matmul, DecodesEveryCodeExactly) {
  // W = identity-like: row j holds code j at column j, so y[0, j] = x[j] * value(j).
  ThreadPool pool(2);
  const int64_t n = 256, k = 256;
  std::vector<uint8_t> w(static_cast<size_t>(n * k), 0);
  for (int64_t j = 0; j < n; ++j) {
    w[static_cast<size_t>(j * k + j)] =
        e4m3_is_nan(static_cast<uint8_t>(j)) ? 0 : static_cast<uint8_t>(j);
  }
  std::vector<float> scales(static_cast<size_t>(n), 1.0f);
  for (int64_t m : {1, 5}) {
    std::vector<float> x(static_cast<size_t>(m * k), 1.0f);
    std::vector<float> y(static_cast<size_t>(m * n));
    fp8_matmul(pool, x.data(), m, {w.data(), scales.data(), n, k}, TypedPtr{}, y.data());
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        const auto c = static_cast<uint8_t>(j);
        const float want = e4m3_is_nan(c) ? 0.0f : e4m3_to_f32(c);
        ASSERT_EQ(y[static_cast<size_t>(i * n + j)], want) << "code " << j << " m " << m;
      }
    }
  }
}

}  // namespace
}  // namespace cellm::cpu::quant
