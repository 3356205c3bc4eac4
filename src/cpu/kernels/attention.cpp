#include "cpu/kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "cellm/status.h"
#include "cpu/kernels/simd.h"

namespace cellm::cpu {
namespace {

constexpr int64_t kScoreBlock = 32;  // scores computed per online-softmax step

void attend_one(const AttentionArgs& a, int64_t r, int64_t h, float scale) {
  const int64_t group = a.n_heads / a.n_kv_heads;
  const int64_t kvh = h / group;
  const int64_t hd = a.head_dim;
  const int64_t kv_stride = a.n_kv_heads * hd;
  const float* q = a.q + (r * a.n_heads + h) * hd;
  float* out = a.out + (r * a.n_heads + h) * hd;
  const int32_t pos = a.q_pos[static_cast<size_t>(r)];
  const std::span<const int32_t> cells = a.cells_of_row[static_cast<size_t>(r)];
  // REQUIRES: the row's own cell exists (its K/V was written before attention).
  CELLM_CHECK_MSG(pos >= 0 && static_cast<int64_t>(cells.size()) > pos,
                  "attention: query position beyond its sequence's cell list");
  const int64_t lo = a.window > 0 ? std::max<int64_t>(0, int64_t{pos} - a.window + 1) : 0;

  float acc[kMaxAttentionHeadDim];
  std::fill(acc, acc + hd, 0.0f);
  float running_max = -std::numeric_limits<float>::infinity();
  float denom = 0.0f;
  float scores[kScoreBlock];
  for (int64_t b = lo; b <= pos; b += kScoreBlock) {
    const int64_t nb = std::min<int64_t>(kScoreBlock, int64_t{pos} + 1 - b);
    float block_max = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < nb; ++j) {
      const int32_t cell = cells[static_cast<size_t>(b + j)];
      CELLM_CHECK_MSG(cell >= 0 && cell < a.max_cells, "attention: cell out of range");
      scores[j] = simd::dot(q, a.k_cells + cell * kv_stride + kvh * hd, hd) * scale;
      block_max = std::max(block_max, scores[j]);
    }
    const float new_max = std::max(running_max, block_max);
    const float correction = std::exp(running_max - new_max);  // 0 on the first block
    denom *= correction;
    bool rescale = correction != 1.0f;
    for (int64_t j = 0; j < nb; ++j) {
      const float e = std::exp(scores[j] - new_max);
      denom += e;
      const float* v = a.v_cells + cells[static_cast<size_t>(b + j)] * kv_stride + kvh * hd;
      simd::scale_axpy(acc, rescale ? correction : 1.0f, e, v, hd);
      rescale = false;
    }
    running_max = new_max;
  }
  const float inv = 1.0f / denom;
  for (int64_t i = 0; i < hd; ++i) out[i] = acc[i] * inv;
}

}  // namespace

void attention(ThreadPool& pool, const AttentionArgs& a) {
  // REQUIRES: consistent shapes, one position and one cell list per row.
  CELLM_CHECK(a.n_rows >= 0 && a.n_heads > 0 && a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0);
  CELLM_CHECK(a.head_dim > 0 && a.head_dim <= kMaxAttentionHeadDim && a.window >= 0);
  CELLM_CHECK(static_cast<int64_t>(a.q_pos.size()) == a.n_rows &&
              static_cast<int64_t>(a.cells_of_row.size()) == a.n_rows);
  if (a.n_rows == 0) return;
  CELLM_CHECK(a.q && a.k_cells && a.v_cells && a.out && a.max_cells > 0);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(a.head_dim)));
  pool.parallel_for(a.n_rows * a.n_heads, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) attend_one(a, t / a.n_heads, t % a.n_heads, scale);
  });
}

void write_kv(const float* k, const float* v, int64_t n_rows, int64_t row_elems,
              std::span<const int32_t> cell_of_row, float* k_cells, float* v_cells,
              int64_t max_cells) {
  // REQUIRES: one cell per row, each within the pool.
  CELLM_CHECK(n_rows >= 0 && row_elems > 0 && static_cast<int64_t>(cell_of_row.size()) == n_rows);
  const size_t row_bytes = static_cast<size_t>(row_elems) * sizeof(float);
  for (int64_t r = 0; r < n_rows; ++r) {
    const int32_t cell = cell_of_row[static_cast<size_t>(r)];
    CELLM_CHECK_MSG(cell >= 0 && cell < max_cells, "write_kv: cell out of range");
    std::memcpy(k_cells + cell * row_elems, k + r * row_elems, row_bytes);
    std::memcpy(v_cells + cell * row_elems, v + r * row_elems, row_bytes);
  }
}

}  // namespace cellm::cpu
