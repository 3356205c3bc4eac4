// RMSNorm as Hugging Face's LlamaRMSNorm / Qwen3RMSNorm compute it, in f32:
//   out = (x * rsqrt(mean(x²) + eps)) * weight
// (normalise first, then multiply by the weight). Rows are independent, so
// Qwen3's per-head q/k norm is the same call with m = tokens * heads, d = head_dim.
//
// Shapes: x, h, out [m, d] f32 (row-major, contiguous); weight [d] in any DType.
// Thread-safety: reentrant; runs on `pool`.
#pragma once

#include <cstdint>

#include "cpu/kernels/convert.h"
#include "cpu/kernels/thread_pool.h"

namespace cellm::cpu {

// out[i, :] = rmsnorm(x[i, :]) for i in [0, m). out may equal x (in place).
// REQUIRES: m >= 0, d > 0, eps >= 0.
void rmsnorm(ThreadPool& pool, const float* x, int64_t m, int64_t d, TypedPtr weight, float eps,
             float* out);

// The residual step fused with the next norm: for each row,
//   h[i, :] += x[i, :];  out[i, :] = rmsnorm(h[i, :]).
// out may equal x (each row of x is read before its row of out is written);
// out must not overlap h. REQUIRES: m >= 0, d > 0, eps >= 0.
void add_rmsnorm(ThreadPool& pool, float* h, const float* x, int64_t m, int64_t d, TypedPtr weight,
                 float eps, float* out);

}  // namespace cellm::cpu
