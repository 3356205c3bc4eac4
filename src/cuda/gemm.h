// Gemm: the linear layers' matrix product y = x · wᵀ (+ bias): through cuBLASLt, with one
// cached plan (descriptors, layouts, preference, heuristic algorithm) per call shape, or,
// for the decode shapes (bf16, at most kGemvMaxRows rows), through the GEMV kernel of
// kernels/gemv.h, which reads the weights once in one launch where cuBLASLt's split-K
// algorithms add a reduction kernel.
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
// The GEMV serves a bf16 call (either TOut) when gemv_supports(m, k, x, w) (1 <= m <=
// kGemvMaxRows, k % 8 == 0, x and w 16-byte aligned; kernels/gemv.h). It adds the bias in
// f32 before its single rounding, needs no plan and no workspace, and gives a row of y
// the same bits for every m it serves. GemmPath::kCublasLtOnly turns it off (benchmarks,
// and tests of the cuBLASLt path).
//
// Plans (cuBLASLt calls only) are keyed by (T, TOut, m, n, k, bias or not, the alignment
// of each pointer up to 256 bytes): the first call of a key builds its plan and runs
// cuBLASLt's heuristic (host work only); later calls only set the bias pointer and enqueue
// the product, so they are safe inside CUDA graph capture. Warm every shape before
// capturing (GEMV calls need no warming).
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

// Which kernels serve Gemm::run.
enum class GemmPath {
  kAuto,          // the GEMV for the shapes it serves (see above), cuBLASLt otherwise
  kCublasLtOnly,  // cuBLASLt for every call
};

class Gemm {
 public:
  // A cuBLASLt handle and a workspace of `workspace_bytes` (cuBLASLt advises 32 MiB on
  // Hopper).
  static Result<Gemm> create(size_t workspace_bytes = size_t{32} << 20,
                             GemmPath path = GemmPath::kAuto);

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

  // The MLP's activation and down projection:
  //   y[m, n] = swiglu(gate_up)[m, ff] · w_down[n, ff]ᵀ,  swiglu as launch_swiglu computes it.
  // gate_up: [m, 2 ff] (gate | up per row, the gate_up projection's output); w_down:
  // [n, ff]; act: [m, ff] scratch; y: [m, n]. T is __nv_bfloat16 or float.
  // Under kAuto, a bf16 call with gemv_supports(m, ff, gate_up, w_down) is one fused GEMV
  // launch that computes the activation as it stages its input; act is neither read nor
  // written, and y equals launch_swiglu followed by launch_gemv (kPlain) bit for bit.
  // Every other call (more rows, f32, odd alignment, kCublasLtOnly) is launch_swiglu into
  // act followed by run<T, T>(act, ...). So a forward calls this in place of the two for
  // every batch size and gives it the activation buffer it already has.
  // m = 0 enqueues nothing. REQUIRES: m >= 0, ff > 0, n > 0; device pointers; act and y
  // overlap neither each other nor the inputs. Errors as run's.
  template <typename T>
  Status run_swiglu_down(const T* gate_up, int64_t m, int64_t ff, const T* w_down, int64_t n,
                         T* act, T* y, cudaStream_t stream);

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

  explicit Gemm(GemmPath path);
  // The cached plan of `key`, built on first use (bias: the call's bias pointer, which the
  // heuristic reads for its alignment).
  Result<Plan*> plan_for(const PlanKey& key, const void* bias);

  GemmPath path_ = GemmPath::kAuto;
  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer workspace_;
  std::map<PlanKey, std::unique_ptr<Plan>> plans_;
};

}  // namespace cellm::cuda
