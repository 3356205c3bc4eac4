// Helpers for the CPU kernel tests: seeded random data in any DType, and an
// element-by-element comparison that names the first mismatch.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cpu/kernels/convert.h"

namespace cellm::cpu::testing {

// A buffer of n elements of one DType; ptr() is its TypedPtr.
struct TypedBuffer {
  DType dtype = DType::kF32;
  std::vector<float> f32;
  std::vector<uint16_t> h16;

  TypedPtr ptr() const {
    return {dtype == DType::kF32 ? static_cast<const void*>(f32.data())
                                 : static_cast<const void*>(h16.data()),
            dtype};
  }
  float at(int64_t i) const { return load_as_f32(ptr().data, dtype, i); }
};

inline std::vector<float> random_floats(std::mt19937& rng, int64_t n, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// n random values in [lo, hi), stored as dtype (rounded to nearest even).
inline TypedBuffer random_typed(std::mt19937& rng, DType dtype, int64_t n, float lo = -1.0f,
                                float hi = 1.0f) {
  TypedBuffer b;
  b.dtype = dtype;
  const std::vector<float> v = random_floats(rng, n, lo, hi);
  if (dtype == DType::kF32) {
    b.f32 = v;
  } else {
    b.h16.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      b.h16[i] = dtype == DType::kBF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
    }
  }
  return b;
}

// Every element: |got - want| <= abs_tol + rel_tol * scale[i] (scale[i] = |want[i]|
// when scale is empty). Reports the first few mismatches with their index.
inline ::testing::AssertionResult all_close(const std::vector<float>& got,
                                            const std::vector<float>& want, double rel_tol,
                                            double abs_tol, const std::vector<double>& scale = {}) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "sizes differ: " << got.size() << " vs " << want.size();
  }
  int bad = 0;
  std::string report;
  for (size_t i = 0; i < got.size(); ++i) {
    const double s = scale.empty() ? std::fabs(double{want[i]}) : scale[i];
    const double err = std::fabs(double{got[i]} - double{want[i]});
    if (got[i] != want[i] && !(err <= abs_tol + rel_tol * s)) {  // equal infinities pass
      if (++bad <= 5) {
        report += "\n  [" + std::to_string(i) + "] got " + std::to_string(got[i]) + " want " +
                  std::to_string(want[i]) + " (err " + std::to_string(err) + ")";
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.size() << " differ:" << report;
}

inline constexpr DType kAllDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

}  // namespace cellm::cpu::testing
