#include "cpu/kernels/rope.h"

#include <cmath>

#include "cellm/status.h"

namespace cellm::cpu {

void rope(ThreadPool& pool, float* q, int64_t n_heads, float* k, int64_t n_kv_heads, int64_t m,
          int64_t head_dim, std::span<const int32_t> positions, std::span<const float> inv_freq) {
  // REQUIRES: one position per row and a rotary part that fits the head.
  CELLM_CHECK(m >= 0 && n_heads >= 0 && n_kv_heads >= 0 && head_dim > 0);
  CELLM_CHECK(static_cast<int64_t>(positions.size()) == m);
  CELLM_CHECK(2 * static_cast<int64_t>(inv_freq.size()) <= head_dim);
  CELLM_CHECK((q != nullptr || n_heads == 0) && (k != nullptr || n_kv_heads == 0));
  const int64_t half = static_cast<int64_t>(inv_freq.size());
  const auto rows = [&](int64_t begin, int64_t end) {
    std::vector<float> cos_sin(static_cast<size_t>(2 * half));
    float* cs = cos_sin.data();
    float* sn = cs + half;
    for (int64_t r = begin; r < end; ++r) {
      const float pos = static_cast<float>(positions[static_cast<size_t>(r)]);
      for (int64_t i = 0; i < half; ++i) {
        const float angle = pos * inv_freq[static_cast<size_t>(i)];
        cs[i] = std::cos(angle);
        sn[i] = std::sin(angle);
      }
      const auto rotate = [&](float* x, int64_t heads) {
        for (int64_t h = 0; h < heads; ++h) {
          float* v = x + (r * heads + h) * head_dim;
          for (int64_t i = 0; i < half; ++i) {
            const float a = v[i], b = v[i + half];
            // Two products rounded apart, then the sum, as torch's
            // q * cos + rotate_half(q) * sin.
            const float ac = a * cs[i], bs = b * sn[i], bc = b * cs[i], as = a * sn[i];
            v[i] = ac - bs;
            v[i + half] = bc + as;
          }
        }
      };
      if (n_heads > 0) rotate(q, n_heads);
      if (n_kv_heads > 0) rotate(k, n_kv_heads);
    }
  };
  if (m < 8) {
    rows(0, m);
  } else {
    pool.parallel_for(m, rows);
  }
}

}  // namespace cellm::cpu
