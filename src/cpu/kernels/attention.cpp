#include "cpu/kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "cellm/status.h"
#include "cpu/kernels/activation.h"
#include "cpu/kernels/e4m3.h"
#include "cpu/kernels/simd.h"

namespace cellm::cpu {
namespace {

constexpr int64_t kScoreBlock = 32;    // scores computed per online-softmax step
constexpr int64_t kTasksPerClaim = 4;  // (row, head) tasks a thread claims at once

// Asks for the `bytes` at p in L1 (a K or V row of a cell the loop reaches next: a
// sequence's cells lie far apart in the pool, where the hardware prefetchers do not
// follow, so without this each row is a demand miss).
inline void prefetch_row(const void* p, int64_t bytes) {
  const auto* c = static_cast<const char*>(p);
  for (int64_t line = 0; line < bytes; line += 64) __builtin_prefetch(c + line, 0, 3);
}

// out[t] = q · k[t] over hd floats for the four keys k[0..4).
[[gnu::always_inline]] inline void dot4(const float* q, const float* const* k, int64_t hd,
                                        float* out) {
  using simd::kLanes;
  simd::Vf acc[4] = {simd::zero(), simd::zero(), simd::zero(), simd::zero()};
  int64_t i = 0;
  for (; i + kLanes <= hd; i += kLanes) {
    const simd::Vf qv = simd::load<DType::kF32>(q + i);
    for (int t = 0; t < 4; ++t) acc[t] = simd::fma(qv, simd::load<DType::kF32>(k[t] + i), acc[t]);
  }
  if (i < hd) {
    const int r = static_cast<int>(hd - i);
    const simd::Vf qv = simd::load_partial<DType::kF32>(q + i, r);
    for (int t = 0; t < 4; ++t) {
      acc[t] = simd::fma(qv, simd::load_partial<DType::kF32>(k[t] + i, r), acc[t]);
    }
  }
  float sums[4];
  simd::reduce4(acc[0], acc[1], acc[2], acc[3], sums);
  for (int t = 0; t < 4; ++t) out[t] = sums[t];
}

// e4m3 K/V (AttentionArgs::k_codes) are decoded exactly (decode_e4m3, e4m3.h); the row's
// scale is applied to the score (K) or to the softmax weight (V) instead.

// NV > 0: head_dim is NV vectors, and the output accumulates in registers; NV == 0:
// any head_dim, accumulated in memory. The same operations either way. kFp8: K/V are
// e4m3 codes with a scale per (cell, kv head), decoded to f32 one key at a time.
template <int NV, bool kFp8>
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

  float acc[NV > 0 ? 1 : kMaxAttentionHeadDim];
  simd::Vf vacc[NV > 0 ? NV : 1];
  if constexpr (NV > 0) {
    for (int i = 0; i < NV; ++i) vacc[i] = simd::zero();
  } else {
    std::fill(acc, acc + hd, 0.0f);
  }
  float running_max = -std::numeric_limits<float>::infinity();
  float denom = 0.0f;
  float scores[kScoreBlock];
  // kFp8: four decoded keys, then one decoded value row.
  alignas(64) float kbuf[kFp8 ? 4 : 1][kFp8 ? kMaxAttentionHeadDim : 1];
  alignas(64) float vbuf[kFp8 ? kMaxAttentionHeadDim : 1];
  const float* k_head = kFp8 ? nullptr : a.k_cells + kvh * hd;
  const float* v_head = kFp8 ? nullptr : a.v_cells + kvh * hd;
  const uint8_t* k8_head = kFp8 ? a.k_codes + kvh * hd : nullptr;
  const uint8_t* v8_head = kFp8 ? a.v_codes + kvh * hd : nullptr;
  // K rows of a block, V rows of the block and K rows of the next: asked for a block
  // ahead of their use.
  const int64_t row_bytes = kFp8 ? hd : hd * static_cast<int64_t>(sizeof(float));
  const auto prefetch_block = [&](int64_t b, bool keys, bool values) {
    const int64_t nb = std::min<int64_t>(kScoreBlock, int64_t{pos} + 1 - b);
    for (int64_t j = 0; j < nb; ++j) {
      const int64_t cell = cells[static_cast<size_t>(b + j)];
      if (cell < 0 || cell >= a.max_cells) continue;  // the block's check reports it
      if constexpr (kFp8) {
        if (keys) prefetch_row(k8_head + cell * kv_stride, row_bytes);
        if (values) prefetch_row(v8_head + cell * kv_stride, row_bytes);
      } else {
        if (keys) prefetch_row(k_head + cell * kv_stride, row_bytes);
        if (values) prefetch_row(v_head + cell * kv_stride, row_bytes);
      }
    }
  };
  prefetch_block(lo, true, false);
  for (int64_t b = lo; b <= pos; b += kScoreBlock) {
    const int64_t nb = std::min<int64_t>(kScoreBlock, int64_t{pos} + 1 - b);
    const int32_t* block_cells = cells.data() + b;
    for (int64_t j = 0; j < nb; ++j) {
      CELLM_CHECK_MSG(block_cells[j] >= 0 && block_cells[j] < a.max_cells,
                      "attention: cell out of range");
    }
    prefetch_block(b, false, true);
    if (b + kScoreBlock <= pos) prefetch_block(b + kScoreBlock, true, false);
    // Four keys at a time: q's vectors are loaded once for the four dot products.
    for (int64_t j = 0; j < nb; j += 4) {
      const float* kp[4];
      for (int t = 0; t < 4; ++t) {
        const int64_t cell = block_cells[std::min<int64_t>(j + t, nb - 1)];
        if constexpr (kFp8) {
          decode_e4m3(k8_head + cell * kv_stride, hd, kbuf[t]);
          kp[t] = kbuf[t];
        } else {
          kp[t] = k_head + cell * kv_stride;
        }
      }
      dot4(q, kp, hd, scores + j);
      if constexpr (kFp8) {
        for (int64_t t = j; t < std::min<int64_t>(j + 4, nb); ++t) {
          scores[t] *= a.k_scales[int64_t{block_cells[t]} * a.n_kv_heads + kvh];
        }
      }
    }
    float block_max = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < nb; ++j) {
      scores[j] *= scale;
      block_max = std::max(block_max, scores[j]);
    }
    const float new_max = std::max(running_max, block_max);
    const float correction = std::exp(running_max - new_max);  // 0 on the first block
    denom *= correction;
    for (int64_t j = 0; j < nb; ++j) scores[j] -= new_max;
    exp_array(scores, nb, scores);
    // Value row j and its softmax weight (the scale folded in for e4m3).
    auto value_row = [&](int64_t j, float& weight) -> const float* {
      if constexpr (kFp8) {
        const int64_t cell = block_cells[j];
        decode_e4m3(v8_head + cell * kv_stride, hd, vbuf);
        weight = scores[j] * a.v_scales[cell * a.n_kv_heads + kvh];
        return vbuf;
      } else {
        weight = scores[j];
        return v_head + block_cells[j] * kv_stride;
      }
    };
    if constexpr (NV > 0) {
      if (correction != 1.0f) {
        for (int i = 0; i < NV; ++i) vacc[i] = simd::mul(vacc[i], simd::set1(correction));
      }
      for (int64_t j = 0; j < nb; ++j) {
        denom += scores[j];
        float weight;
        const float* v = value_row(j, weight);
        const simd::Vf e = simd::set1(weight);
        for (int i = 0; i < NV; ++i) {
          vacc[i] = simd::fma(e, simd::load<DType::kF32>(v + i * simd::kLanes), vacc[i]);
        }
      }
    } else {
      bool rescale = correction != 1.0f;
      for (int64_t j = 0; j < nb; ++j) {
        denom += scores[j];
        float weight;
        const float* v = value_row(j, weight);
        simd::scale_axpy(acc, rescale ? correction : 1.0f, weight, v, hd);
        rescale = false;
      }
    }
    running_max = new_max;
  }
  const float inv = 1.0f / denom;
  if constexpr (NV > 0) {
    for (int i = 0; i < NV; ++i) {
      simd::store(out + i * simd::kLanes, simd::mul(vacc[i], simd::set1(inv)));
    }
  } else {
    for (int64_t i = 0; i < hd; ++i) out[i] = acc[i] * inv;
  }
}

using AttendFn = void (*)(const AttentionArgs&, int64_t, int64_t, float);

template <bool kFp8>
AttendFn pick_attend(int64_t head_dim) {
  if (head_dim % simd::kLanes != 0) return &attend_one<0, kFp8>;
  switch (head_dim / simd::kLanes) {
    case 2:
      return &attend_one<2, kFp8>;
    case 4:
      return &attend_one<4, kFp8>;
    case 8:
      return &attend_one<8, kFp8>;
    default:
      return &attend_one<0, kFp8>;
  }
}

}  // namespace

void attention(ThreadPool& pool, const AttentionArgs& a) {
  // REQUIRES: consistent shapes, one position and one cell list per row.
  CELLM_CHECK(a.n_rows >= 0 && a.n_heads > 0 && a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0);
  CELLM_CHECK(a.head_dim > 0 && a.head_dim <= kMaxAttentionHeadDim && a.window >= 0);
  CELLM_CHECK(static_cast<int64_t>(a.q_pos.size()) == a.n_rows &&
              static_cast<int64_t>(a.cells_of_row.size()) == a.n_rows);
  if (a.n_rows == 0) return;
  const bool fp8 = a.k_codes != nullptr;
  CELLM_CHECK(a.q && a.out && a.max_cells > 0);
  CELLM_CHECK(fp8 ? (a.v_codes && a.k_scales && a.v_scales) : (a.k_cells && a.v_cells));
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(a.head_dim)));
  // A row's cost grows with its position, so a static split of a prompt's rows
  // gives one thread the long ones. Threads claim a few tasks at a time instead,
  // the last rows (in a prompt, the longest) first.
  const int64_t tasks = a.n_rows * a.n_heads;
  const AttendFn attend = fp8 ? pick_attend<true>(a.head_dim) : pick_attend<false>(a.head_dim);
  pool.parallel_for_dynamic(tasks, kTasksPerClaim, [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) {
      const int64_t t = tasks - 1 - c;
      attend(a, t / a.n_heads, t % a.n_heads, scale);
    }
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

void write_kv_e4m3(const float* k, const float* v, int64_t n_rows, int64_t n_kv_heads,
                   int64_t head_dim, std::span<const int32_t> cell_of_row, uint8_t* k_codes,
                   float* k_scales, uint8_t* v_codes, float* v_scales, int64_t max_cells) {
  // REQUIRES: one cell per row, each within the pool.
  CELLM_CHECK(n_rows >= 0 && n_kv_heads > 0 && head_dim > 0 &&
              static_cast<int64_t>(cell_of_row.size()) == n_rows);
  const int64_t row_elems = n_kv_heads * head_dim;
  for (int64_t r = 0; r < n_rows; ++r) {
    const int64_t cell = cell_of_row[static_cast<size_t>(r)];
    CELLM_CHECK_MSG(cell >= 0 && cell < max_cells, "write_kv_e4m3: cell out of range");
    for (int64_t g = 0; g < n_kv_heads; ++g) {
      const int64_t src = r * row_elems + g * head_dim;
      const int64_t dst = cell * row_elems + g * head_dim;
      k_scales[cell * n_kv_heads + g] = quantize_kv_head_e4m3(k + src, head_dim, k_codes + dst);
      v_scales[cell * n_kv_heads + g] = quantize_kv_head_e4m3(v + src, head_dim, v_codes + dst);
    }
  }
}

}  // namespace cellm::cpu
