// matmul: y = x · Wᵀ (+ bias), the CPU executor's linear layer.
//
// Shapes (row-major): x [m, k] f32, w [n, k] in f32/f16/bf16 (PyTorch Linear's
// [out_features, in_features]), bias [n] in any DType or absent, y [m, n] f32.
// Weights stay 16-bit in memory and are widened to f32 in registers (bf16: shift
// left 16; f16: F16C); activations are never rounded, and every product is
// accumulated in f32 (so results match an f32 reference to ~1e-6 relative).
//
// Work is split over n, so W is streamed from memory once per call, and every row
// of x is computed against a W tile while it is in cache: up to 16 rows of x each
// thread owns a contiguous band of W's rows; above that (compute-bound) the
// threads claim 32 W rows at a time, so a thread that loses its core for a while
// leaves its share to the others.
//   m <= 4 (decode): W widened in registers as it streams from memory, rows two
//     tiles ahead prefetched into L2 (memory-bound: ~90% of DRAM read bandwidth);
//   m >= 5: each W tile [64 rows, 512 columns] is widened once into a per-thread
//     f32 buffer (the next one prefetched) and shared by all rows of x in 4x4
//     register tiles (compute-bound: on par with OpenBLAS sgemm on pre-widened
//     weights, so no BLAS is used).
// Thread-safety: reentrant; runs on `pool` and returns when y is complete.
#pragma once

#include <cstdint>

#include "cpu/kernels/convert.h"
#include "cpu/kernels/thread_pool.h"

namespace cellm::cpu {

// y[i, j] = sum_k x[i, k] * w[j, k] + (bias.data ? bias[j] : 0).
// REQUIRES: m >= 0, n >= 0, k >= 0; y does not overlap x, w or bias.
void matmul(ThreadPool& pool, const float* x, int64_t m, int64_t k, TypedPtr w, int64_t n,
            TypedPtr bias, float* y);

}  // namespace cellm::cpu
