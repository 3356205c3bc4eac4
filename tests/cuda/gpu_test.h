// Shared helpers of the GPU tests: skip cleanly without a GPU, and compare a
// device result with its CPU twin element by element.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cuda/cuda_check.h"

// Skips the current test (reported as skipped) when no CUDA device is usable.
#define CELLM_SKIP_WITHOUT_GPU()                                   \
  do {                                                             \
    if (!::cellm::cuda::gpu_available()) GTEST_SKIP() << "no GPU"; \
  } while (0)

#define CELLM_ASSERT_CUDA(expr)                                                            \
  do {                                                                                     \
    const cudaError_t cellm_err_ = (expr);                                                 \
    ASSERT_EQ(cellm_err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(cellm_err_); \
  } while (0)

namespace cellm::cuda::testing {

// Every element: |got - want| <= abs_tol + rel_tol * |want|; NaN never passes.
inline void expect_all_close(const std::vector<float>& got, const std::vector<float>& want,
                             float abs_tol, float rel_tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float tol = abs_tol + rel_tol * std::abs(want[i]);
    if (!(std::abs(got[i] - want[i]) <= tol)) {
      if (++bad <= 5) {
        ADD_FAILURE() << what << " [" << i << "]: got " << got[i] << " want " << want[i];
      }
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements off";
}

}  // namespace cellm::cuda::testing
