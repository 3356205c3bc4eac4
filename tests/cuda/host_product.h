// The double-precision reference of the matrix-product tests (Gemm, launch_gemv): each
// element of x · wᵀ, and the sum of its terms' magnitudes, which scales the error an f32
// accumulation of the same terms may make.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

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

}  // namespace cellm::cuda::testing
