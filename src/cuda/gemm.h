// Gemm: the linear layers' matrix product y = x · wᵀ (+ bias) through cuBLASLt, with one
// cached plan (descriptors, layouts, preference, heuristic algorithm) per call shape.
//
// Shapes (row-major, as PyTorch's Linear): x [m, k], w [n, k] ([out_features,
// in_features]), bias [n] or null, y [m, n]. Every product is accumulated in f32
// (CUBLAS_COMPUTE_32F, f32 alpha/beta). Type combinations (T, TOut):
//   (__nv_bfloat16, __nv_bfloat16), (__nv_bfloat16, float)   production (bf16 A/B)
//   (float, float)   the exact-parity mode: true f32 products, never TF32
//
// Row-major -> column-major mapping. cuBLASLt is column-major, and a row-major [r, c]
// matrix (leading dimension c) is, byte for byte, the column-major [c, r] matrix: its
// transpose. So, with the suffix c for the column-major view of the same memory,
//   x [m, k] = xc [k, m], ld k        w [n, k] = wc [k, n], ld k        y [m, n] = yc [n, m], ld n
// and y = x · wᵀ  <=>  yᵀ = w · xᵀ  <=>  yc = wcᵀ · xc. cuBLASLt computes D = op(A) · op(B)
// with A = wc (op T), B = xc (op N), C = D = yc (beta = 0): M = n, N = m, K = k. The bias
// [n] is then a per-row vector of D ([n, m]) broadcast over its m columns — exactly what
// CUBLASLT_EPILOGUE_BIAS adds.
//
// The bias goes through that epilogue when its type equals TOut (bf16 -> bf16, f32 -> f32);
// otherwise (bf16 -> f32), or when cuBLASLt offers no epilogue algorithm for the shape,
// a separate kernel adds it after the product (launch_add_bias, kernels/bias.h).
//
// Plans are keyed by (T, TOut, m, n, k, bias or not, the alignment of each pointer up to
// 256 bytes): the first call of a key builds its plan and runs cuBLASLt's heuristic (host
// work only); later calls only set the bias pointer and enqueue the product, so they are
// safe inside CUDA graph capture. Warm every shape before capturing.
//
// Owns the cuBLASLt handle and a device workspace (RAII; movable, not copyable).
// Thread-safety: none. Calls on different streams must not overlap in time (they share
// the workspace).
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <compare>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>

#include "cellm/status.h"
#include "cuda/device_memory.h"

namespace cellm::cuda {

class Gemm {
 public:
  // A cuBLASLt handle and a workspace of `workspace_bytes` (cuBLASLt advises 32 MiB on
  // Hopper).
  static Result<Gemm> create(size_t workspace_bytes = size_t{32} << 20);

  Gemm(Gemm&& other) noexcept;
  Gemm& operator=(Gemm&& other) noexcept;
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;
  ~Gemm();

  // y[m, n] = x[m, k] · w[n, k]ᵀ (+ bias[n] when bias != nullptr), enqueued on `stream`.
  // m = 0 enqueues nothing. REQUIRES: m >= 0, n > 0, k > 0; device pointers; y does not
  // overlap x, w or bias. Errors (a shape cuBLASLt cannot serve, a launch failure) come
  // back as an Internal Status naming the shape.
  template <typename T, typename TOut>
  Status run(const T* x, int64_t m, int64_t k, const T* w, int64_t n, const T* bias, TOut* y,
             cudaStream_t stream);

  // Plans built so far (one per distinct key; see above).
  size_t cached_plans() const { return plans_.size(); }

 private:
  struct PlanKey {
    int a_type = 0;    // cudaDataType_t of x and w
    int out_type = 0;  // cudaDataType_t of y
    int64_t m = 0, n = 0, k = 0;
    bool has_bias = false;
    // Largest power of two (capped at 256) dividing each pointer; 0 for a null bias.
    uint32_t align_x = 0, align_w = 0, align_y = 0, align_bias = 0;
    auto operator<=>(const PlanKey&) const = default;
  };
  struct Plan;

  Gemm() = default;
  // The cached plan of `key`, built on first use (bias: the call's bias pointer, which the
  // heuristic reads for its alignment).
  Result<Plan*> plan_for(const PlanKey& key, const void* bias);

  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer workspace_;
  std::map<PlanKey, std::unique_ptr<Plan>> plans_;
};

}  // namespace cellm::cuda
