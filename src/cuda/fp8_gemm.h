// Fp8Gemm: the linear layers' product for many rows (prefill, batched decode) over
// float8_e4m3fn operands, through cuBLASLt's FP8 tensor-core kernels:
//
//   y[i, j] = TOut(x_scale[i] * w_scale[j] * sum_c decode(x8[i, c]) * decode(w8[j, c])
//                  (+ bias[j]))
//
// x8 [m, k] e4m3 activations with one f32 scale per row (launch_quantize_rows_e4m3,
// kernels/quantize_e4m3.h), w8 [n, k] e4m3 weights with one f32 scale per output channel
// (the layout of launch_gemv_fp8's weights, kernels/gemv_fp8.h), bias [n] bf16 or null,
// y [m, n] bf16 or f32; row-major, as PyTorch's Linear.
//
// Mapping (as gemm.h): cuBLASLt is column-major, so A = w8 viewed [k, n] (ld k, op T),
// B = x8 viewed [k, m] (ld k, op N), D = y viewed [n, m] (ld n): M = n, N = m, K = k. That
// is the "TN" layout FP8 kernels require. Every product of two e4m3 values is exact in
// f32 and the sums are f32 (CUBLAS_COMPUTE_32F). CUBLASLT_MATMUL_DESC_FAST_ACCUM stays
// off: with it the Hopper kernels keep partial sums in the tensor cores' narrower
// accumulator across the whole of k instead of promoting them to f32 periodically, which
// loses accuracy that grows with k (14336 for the 8B's down projection).
//
// Two ways of applying the scales (Fp8PlanKind):
//   kOuterVector   cuBLASLt scales in its epilogue: A_SCALE_MODE = B_SCALE_MODE =
//                  CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, the A scale vector is
//                  w_scale ([n], cuBLASLt's M) and the B one x_scale ([m], its N); the
//                  bias (bf16, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE) goes through
//                  CUBLASLT_EPILOGUE_BIAS. The order of the epilogue's f32 operations is
//                  cuBLASLt's; one rounding to TOut at the end.
//   kEpilogueKernel the fallback that works wherever FP8 cuBLASLt does: unit scales, the
//                  f32 sums written to a scratch [m, ld] f32 that the plan owns (ld = n
//                  rounded up to 4 elements, so its columns are 16-byte aligned whatever
//                  n is), then launch_scale_outer_e4m3: TOut(fmaf(acc, x_scale[i] *
//                  w_scale[j], bias[j])) — the scale product and the fma each rounded
//                  once in f32, then one rounding to TOut.
//   kSkinny        cellm's own kernel for 9-64 rows (launch_skinny_gemm_e4m3,
//                  kernels/skinny_gemm.h): the weights streamed by TMA into wgmma, the
//                  scales and bias in its epilogue with kEpilogueKernel's arithmetic.
// Under Fp8Scaling::kAuto a plan is kOuterVector when cuBLASLt's heuristic offers an
// algorithm for it (with the bias in its epilogue when there is one) and its first
// cublasLtMatmul accepts the call; otherwise kEpilogueKernel. Then, for a call the skinny
// kernel serves (skinny_gemm_e4m3_supports): while tuning is on (set_tuning, in an
// Fp8Gemm created with `tune`: the executor turns it on while a decode batch size warms)
// that plan, the skinny kernel with its shared ring and with its whole-SM ring are timed
// on the call's operands (GemmTimer, gemm_tuning.h; the call's y is written many times)
// and the fastest kept; the choice is remembered process-wide (remember_tuned_choice,
// under a GemmKey of e4m3 operands), and a key met later, tuning or not, by any Fp8Gemm
// of the process adopts it, so they run the same kernel and give the same bits. A key
// with no remembered choice met while tuning is off keeps its cuBLASLt plan.
// Fp8Scaling::kEpilogueKernel forces the fallback and Fp8Scaling::kSkinny the skinny
// kernel (shared ring) wherever it serves (tests of each path, benchmarks). A plan's scratch is m *
// ld * 4 bytes, allocated when the plan is built: callers serving many prefill lengths on the
// fallback path pay that memory per distinct m.
//
// Plans are keyed by (m, n, k, TOut, bias or not, each pointer's alignment up to 256
// bytes). The first call of a key builds the plan (descriptors, heuristic, scratch: host
// work and a cudaMalloc) and enqueues; later calls only set the scale and bias pointers
// on the descriptor and enqueue, so they are safe inside CUDA graph capture. Warm every
// shape before capturing: a first call of a key inside capture is refused (InvalidState)
// rather than allocating.
//
// Errors: a call outside REQUIRES is an InvalidArgument naming what is wrong, returned
// before anything is enqueued; no FP8 algorithm for the shape is an Internal Status
// naming it; a failed launch is an Internal Status.
//
// Owns the cuBLASLt handle and a device workspace (RAII; movable, not copyable).
// Thread-safety: none. Calls on different streams must not overlap in time (they share
// the workspace and a plan's scratch).
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <compare>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "cellm/status.h"
#include "cuda/device_memory.h"
#include "cuda/gemm_tuning.h"
#include "cuda/kernels/skinny_gemm.h"

namespace cellm::cuda {

enum class Fp8Scaling {
  kAuto,            // kOuterVector where cuBLASLt offers it, kEpilogueKernel otherwise
                    // (or kSkinny, when timed faster)
  kEpilogueKernel,  // kEpilogueKernel for every plan
  kSkinny,          // kSkinny (shared ring) where it serves, kAuto's plan otherwise
};

enum class Fp8PlanKind { kOuterVector, kEpilogueKernel, kSkinny };

// The REQUIRES of Fp8Gemm::run, checked without a GPU: Ok, or an InvalidArgument naming
// the first violation. m >= 0, n > 0, n % 8 == 0, 0 < k, k % 16 == 0, m, n, k < 2^31; when m > 0:
// x8, x_scale, w8, w_scale, y non-null; x8 and w8 16-byte aligned (FP8 kernels read
// 16-byte vectors), the scales 4-byte, bias 2-byte, y sizeof(TOut)-aligned; y overlapping
// none of x8, x_scale, w8, w_scale, bias.
Status check_fp8_gemm_call(const uint8_t* x8, const float* x_scale, int64_t m, int64_t k,
                           const uint8_t* w8, const float* w_scale, int64_t n,
                           const __nv_bfloat16* bias, const void* y, size_t out_bytes);

class Fp8Gemm {
 public:
  // A cuBLASLt handle and a workspace of `workspace_bytes`; `tune`: kAuto times the
  // skinny kernel against cuBLASLt (above).
  static Result<Fp8Gemm> create(size_t workspace_bytes = size_t{32} << 20,
                                Fp8Scaling scaling = Fp8Scaling::kAuto, bool tune = true);

  Fp8Gemm(Fp8Gemm&& other) noexcept;
  Fp8Gemm& operator=(Fp8Gemm&& other) noexcept;
  Fp8Gemm(const Fp8Gemm&) = delete;
  Fp8Gemm& operator=(const Fp8Gemm&) = delete;
  ~Fp8Gemm();

  // y = the product above, enqueued on `stream`. TOut is __nv_bfloat16 or float. m = 0
  // enqueues nothing. REQUIRES: check_fp8_gemm_call(...) is Ok; device pointers; w8 and
  // x8 free of NaN codes.
  template <typename TOut>
  Status run(const uint8_t* x8, const float* x_scale, int64_t m, int64_t k, const uint8_t* w8,
             const float* w_scale, int64_t n, const __nv_bfloat16* bias, TOut* y,
             cudaStream_t stream);

  struct Key {
    int64_t m = 0, n = 0, k = 0;
    bool f32_out = false;
    bool has_bias = false;
    uint32_t align_x = 0, align_w = 0, align_y = 0, align_bias = 0, align_x_scale = 0,
             align_w_scale = 0;
    auto operator<=>(const Key&) const = default;
  };
  struct PlanInfo {
    Key key;
    Fp8PlanKind kind = Fp8PlanKind::kOuterVector;
    bool bias_in_epilogue = false;                 // kOuterVector only
    SkinnyRing skinny_ring = SkinnyRing::kShared;  // kSkinny only
  };
  size_t cached_plans() const { return plans_.size(); }
  // Whether keys met from now on may be timed (above). Off at creation; turning it off
  // frees the timer and its flush buffer.
  void set_tuning(bool on);
  // Every plan built so far, ordered by key.
  std::vector<PlanInfo> describe_plans() const;

 private:
  struct Plan;
  Fp8Gemm(Fp8Scaling scaling, bool tune);
  // The outer-vector plan of `key`, or null when cuBLASLt has no algorithm for it.
  Result<std::unique_ptr<Plan>> outer_vector_plan(const Key& key, const void* x_scale,
                                                  const void* w_scale, const void* bias);
  // The fallback plan of `key` (an Internal Status when cuBLASLt has no FP8 algorithm).
  Result<std::unique_ptr<Plan>> epilogue_kernel_plan(const Key& key);
  // `plan`, or a kSkinny plan where the process-wide table or, when `may_time` (plan then
  // proven on this call), the timing says the skinny kernel is faster for the key.
  template <typename TOut>
  Result<std::unique_ptr<Plan>> tune(std::unique_ptr<Plan> plan, bool may_time, const uint8_t* x8,
                                     const float* x_scale, int64_t m, int64_t k, const uint8_t* w8,
                                     const float* w_scale, int64_t n, const __nv_bfloat16* bias,
                                     TOut* y, cudaStream_t stream);
  template <typename TOut>
  Status enqueue(Plan& plan, const uint8_t* x8, const float* x_scale, int64_t m, int64_t k,
                 const uint8_t* w8, const float* w_scale, int64_t n, const __nv_bfloat16* bias,
                 TOut* y, cudaStream_t stream);

  Fp8Scaling scaling_ = Fp8Scaling::kAuto;
  bool tune_ = true;
  bool tuning_ = false;
  cublasLtHandle_t handle_ = nullptr;
  std::unique_ptr<GemmTimer> timer_;  // made by the first tuning
  DeviceBuffer workspace_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace cellm::cuda
