// RMSNorm as Hugging Face's LlamaRMSNorm / Qwen3RMSNorm compute it, in f32 throughout:
//   out = (x / sqrt(mean(x²) + eps)) * weight      (normalise first, then the weight)
// Two forms: the residual step fused with the next norm (the f32 residual stream), and
// Qwen3's per-head q/k norm applied in place inside the fused qkv rows.
// CPU twins: cpu::add_rmsnorm / cpu::rmsnorm (src/cpu/kernels/rmsnorm.h).
//
// T is the activation type (float or __nv_bfloat16). Launchers enqueue on `stream`,
// never allocate or synchronise (safe inside CUDA graph capture), and return the launch
// error (cudaErrorInvalidValue for bad arguments). m = 0 launches nothing. The kernels
// are launched with programmatic dependent launch (kernels/launch.cuh) and read `weight`
// before waiting for the previous kernel: no kernel of the stream may write it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace cellm::cuda {

// Which kernel of the stream last wrote launch_add_rmsnorm's residual. kEarlierKernel
// promises that a matrix product (a cellm GEMV or GEMM, or cuBLASLt's) runs between that
// writer and the norm. A product lets the next kernel launch only after its own wait
// (cuBLASLt's kernels wait for everything), so the writer has completed when the norm
// starts, and the norm reads the residual before its programmatic wait, with its weights:
// a decode step's residual rows have left the L2 by then, and read after the wait they
// would queue behind the weights of the product the norm lets launch. kPreviousKernel
// (the embedding's or a gather's output) reads it after the wait.
enum class ResidualWriter { kPreviousKernel, kEarlierKernel };

// For each row i in [0, m): if delta != nullptr, residual[i, :] += float(delta[i, :]);
// then out[i, :] = T(residual[i, :] / sqrt(mean(residual[i, :]²) + eps) * float(weight)).
// residual: [m, d] f32 (updated in place when delta is given); delta: [m, d] T or null;
// weight: [d] T; out: [m, d] T. All rows contiguous (row stride d).
// out may equal delta (a row of delta is read before its row of out is written); out must
// not overlap residual. REQUIRES: m >= 0, d > 0, eps >= 0.
template <typename T>
cudaError_t launch_add_rmsnorm(float* residual, const T* delta, const T* weight, int64_t m,
                               int64_t d, float eps, T* out, cudaStream_t stream,
                               ResidualWriter writer = ResidualWriter::kPreviousKernel);

// True when launch_add_rmsnorm_e4m3 serves the call: d > 0, d % 16 == 0, the pointers
// non-null (delta may be null) and aligned as the packed norm reads them (residual 16
// bytes, delta, weight and out 8 bytes), x8 16 bytes and x8_scale 4 bytes.
bool add_rmsnorm_e4m3_supports(int64_t d, const float* residual, const __nv_bfloat16* delta,
                               const __nv_bfloat16* weight, const __nv_bfloat16* out,
                               const uint8_t* x8, const float* x8_scale);

// launch_add_rmsnorm<__nv_bfloat16>, and the row it writes quantized for an FP8 product in
// the same pass: x8 [m, d] and x8_scale [m] get exactly what launch_quantize_rows_e4m3
// (quantize_e4m3.h, kPlain) gives for out, which saves that kernel's launch and its read
// of out. REQUIRES: add_rmsnorm_e4m3_supports(...), m >= 0, eps >= 0; x8 and x8_scale
// overlap no other argument.
cudaError_t launch_add_rmsnorm_e4m3(float* residual, const __nv_bfloat16* delta,
                                    const __nv_bfloat16* weight, int64_t m, int64_t d, float eps,
                                    __nv_bfloat16* out, uint8_t* x8, float* x8_scale,
                                    cudaStream_t stream,
                                    ResidualWriter writer = ResidualWriter::kPreviousKernel);

// Qwen3's q/k norm, in place: for each row i in [0, m) and head h in [0, n_heads), the
// head_dim elements at x[i * row_stride + offset + h * head_dim] are RMS-normalised and
// multiplied by weight[0, head_dim).
// x: rows of row_stride elements of T (e.g. the fused [m, (n_q + 2 n_kv) * head_dim] qkv);
// weight: [head_dim] T.
// REQUIRES: m >= 0, n_heads >= 0, head_dim > 0, offset >= 0,
//           offset + n_heads * head_dim <= row_stride, eps >= 0.
template <typename T>
cudaError_t launch_head_rmsnorm(T* x, int64_t m, int64_t row_stride, int64_t offset,
                                int64_t n_heads, int64_t head_dim, const T* weight, float eps,
                                cudaStream_t stream);

}  // namespace cellm::cuda
