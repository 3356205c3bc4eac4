// The double-precision reference of the matrix-product tests (Gemm, launch_gemv): each
// element of x · wᵀ, and the sum of its terms' magnitudes, which scales the error an f32
// accumulation of the same terms may make.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "device_test_util.h"

namespace cellm::cuda::testing {

// sum_c x[i, c] * w[j, c] in f64, and sum_c |x[i, c] * w[j, c]| (the error scale).
struct HostProduct {
  std::vector<double> value;  // [m, n]
  std::vector<double> scale;  // [m, n]
};

// x: [m, k], w: [n, k], row-major.
inline HostProduct host_product(const std::vector<float>& x, const std::vector<float>& w, int64_t m,
                                int64_t k, int64_t n) {
  HostProduct p{std::vector<double>(static_cast<size_t>(m * n)),
                std::vector<double>(static_cast<size_t>(m * n))};
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0, abs_sum = 0.0;
      for (int64_t c = 0; c < k; ++c) {
        const double term = double{x[i * k + c]} * double{w[j * k + c]};
        sum += term;
        abs_sum += std::fabs(term);
      }
      p.value[i * n + j] = sum;
      p.scale[i * n + j] = abs_sum;
    }
  }
  return p;
}

// The raw download of a [m, n] output of TOut followed by guard elements: every element
// against want (+ bias[j] when bias is not empty) within rel |want| + 1e-6 * scale (the
// error an f32 sum of the terms may make is ~2^-24 of their magnitudes), the first 5
// misses reported; and every guard byte still 0xFF (nothing written past y).
template <typename TOut>
void expect_product_output(const std::vector<TOut>& raw, const HostProduct& want,
                           const std::vector<float>& bias, int64_t m, int64_t n, double rel,
                           const std::string& what) {
  const std::vector<float> got = to_floats(raw);
  size_t bad = 0;
  for (int64_t e = 0; e < m * n; ++e) {
    const auto i = static_cast<size_t>(e);
    const double b = bias.empty() ? 0.0 : double{bias[static_cast<size_t>(e % n)]};
    const double expected = want.value[i] + b;
    const double tol = rel * std::fabs(expected) + 1e-6 * want.scale[i];
    if (!(std::fabs(double{got[i]} - expected) <= tol) && ++bad <= 5) {
      ADD_FAILURE() << what << " [" << e / n << ", " << e % n << "]: got " << got[i] << " want "
                    << expected << " (tol " << tol << ")";
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << m * n << " elements off";
  const auto* guard = reinterpret_cast<const unsigned char*>(raw.data() + m * n);
  const size_t guard_bytes = (raw.size() - static_cast<size_t>(m * n)) * sizeof(TOut);
  for (size_t byte = 0; byte < guard_bytes; ++byte) {
    ASSERT_EQ(guard[byte], 0xFF) << what << ": byte " << byte << " past y was written";
  }
}

}  // namespace cellm::cuda::testing
