// Plain, obviously-correct twins of the CPU kernels, for tests: one loop nest
// per formula, accumulation in f64, no SIMD, no threads, no blocking. Each
// mirrors the contract of the kernel of the same name (see its header).
// Thread-safety: pure functions.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "cpu/kernels/convert.h"

namespace cellm::cpu::reference {

// y[i, j] = sum_k x[i, k] * w[j, k] + bias[j]   (x [m, k], w [n, k], y [m, n]).
inline void matmul(const float* x, int64_t m, int64_t k, TypedPtr w, int64_t n, TypedPtr bias,
                   float* y) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = bias.data ? load_as_f32(bias.data, bias.dtype, j) : 0.0;
      for (int64_t c = 0; c < k; ++c) {
        sum += double{x[i * k + c]} * load_as_f32(w.data, w.dtype, j * k + c);
      }
      y[i * n + j] = static_cast<float>(sum);
    }
  }
}

// out[i, :] = x[i, :] / sqrt(mean(x[i, :]²) + eps) * weight.
inline void rmsnorm(const float* x, int64_t m, int64_t d, TypedPtr weight, float eps, float* out) {
  for (int64_t i = 0; i < m; ++i) {
    double ss = 0.0;
    for (int64_t c = 0; c < d; ++c) ss += double{x[i * d + c]} * x[i * d + c];
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(d) + eps);
    for (int64_t c = 0; c < d; ++c) {
      out[i * d + c] =
          static_cast<float>(x[i * d + c] * r * load_as_f32(weight.data, weight.dtype, c));
    }
  }
}

// Rotates v [heads, head_dim] of one row at `pos` (rotate_half layout).
inline void rope_row(float* v, int64_t heads, int64_t head_dim, int32_t pos,
                     std::span<const float> inv_freq) {
  const auto half = static_cast<int64_t>(inv_freq.size());
  for (int64_t h = 0; h < heads; ++h) {
    float* x = v + h * head_dim;
    for (int64_t i = 0; i < half; ++i) {
      const double angle = double{static_cast<float>(pos) * inv_freq[static_cast<size_t>(i)]};
      const double c = std::cos(angle), s = std::sin(angle);
      const double a = x[i], b = x[i + half];
      x[i] = static_cast<float>(a * c - b * s);
      x[i + half] = static_cast<float>(b * c + a * s);
    }
  }
}

inline float silu_mul(float gate, float up) {
  return static_cast<float>(double{gate} / (1.0 + std::exp(-double{gate})) * up);
}

// One (row, head) of attention: softmax over the sequence's positions [lo, pos]
// computed in two passes (scores, then max-subtracted exp and weighted sum).
inline void attention_one(const float* q, int64_t head_dim, const float* k_cells,
                          const float* v_cells, int64_t kv_stride, int64_t kv_head, int32_t pos,
                          std::span<const int32_t> cells, int32_t window, float* out) {
  const int64_t lo = window > 0 ? std::max<int64_t>(0, int64_t{pos} - window + 1) : 0;
  std::vector<double> scores;
  for (int64_t p = lo; p <= pos; ++p) {
    const float* k = k_cells + cells[static_cast<size_t>(p)] * kv_stride + kv_head * head_dim;
    double dot = 0.0;
    for (int64_t i = 0; i < head_dim; ++i) dot += double{q[i]} * k[i];
    scores.push_back(dot / std::sqrt(static_cast<double>(head_dim)));
  }
  const double mx = *std::max_element(scores.begin(), scores.end());
  double denom = 0.0;
  for (double& s : scores) denom += (s = std::exp(s - mx));
  for (int64_t i = 0; i < head_dim; ++i) {
    double acc = 0.0;
    for (int64_t p = lo; p <= pos; ++p) {
      const float* v = v_cells + cells[static_cast<size_t>(p)] * kv_stride + kv_head * head_dim;
      acc += scores[static_cast<size_t>(p - lo)] * v[i];
    }
    out[i] = static_cast<float>(acc / denom);
  }
}

}  // namespace cellm::cpu::reference
