// Attention over KV cells, and the write of a step's K/V rows into their cells.
//
// KV storage of one layer: k_cells and v_cells are
// [max_cells, n_kv_heads, head_dim] f32; cell c holds the K (V) of one token.
// A sequence is an ordered cell list: cells[i] holds the token at position i.
//
// Query row r sits at position q_pos[r] of the sequence whose cell list is
// cells_of_row[r], and attends that sequence's positions [lo, q_pos[r]], where
// lo = max(0, q_pos[r] - window + 1) for window > 0 and 0 for window 0 (full
// history). Head h reads kv head h / (n_heads / n_kv_heads) (grouped-query).
//   out[r, h] = softmax_j(q[r, h] · k[j] / sqrt(head_dim)) · v[j]
// computed with an online (running max) softmax in f32. The row's own K/V must
// already be written (write_kv, write_kv_e4m3) before attention runs.
//
// K/V may instead be stored as e4m3 codes with one f32 scale per (cell, kv head)
// (AttentionArgs::k_codes set; cpu::KvStorage::kFp8): the value read is
// e4m3(code) * scale, exactly; the same softmax runs over those values.
// Thread-safety: reentrant; `attention` runs on `pool`, its threads claiming
// (row, head) tasks a few at a time, the last rows (the longest in a prompt) first.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>

#include "model/fp8.h"

#include "cpu/kernels/thread_pool.h"

namespace cellm::cpu {

struct AttentionArgs {
  const float* q = nullptr;  // [n_rows, n_heads, head_dim]
  int64_t n_rows = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;          // divides n_heads
  int64_t head_dim = 0;            // <= kMaxAttentionHeadDim
  const float* k_cells = nullptr;  // [max_cells, n_kv_heads, head_dim]
  const float* v_cells = nullptr;  // [max_cells, n_kv_heads, head_dim]
  int64_t max_cells = 0;
  std::span<const int32_t> q_pos;  // [n_rows] absolute position of each query row
  // [n_rows] the cell list of each row's sequence; needs size() > q_pos[r].
  std::span<const std::span<const int32_t>> cells_of_row;
  int32_t window = 0;    // sliding window in tokens; 0 = full history
  float* out = nullptr;  // [n_rows, n_heads, head_dim]; must not overlap the inputs
  // e4m3 K/V: when k_codes is set, k_cells and v_cells are not read; K of cell c, kv
  // head g, element i is e4m3_to_f32(k_codes[(c * n_kv_heads + g) * head_dim + i]) *
  // k_scales[c * n_kv_heads + g], V alike.
  const uint8_t* k_codes = nullptr;  // [max_cells, n_kv_heads, head_dim]
  const uint8_t* v_codes = nullptr;  // [max_cells, n_kv_heads, head_dim]
  const float* k_scales = nullptr;   // [max_cells, n_kv_heads]
  const float* v_scales = nullptr;   // [max_cells, n_kv_heads]
};

inline constexpr int64_t kMaxAttentionHeadDim = 512;

// REQUIRES: the shapes above; every cell read is in [0, max_cells).
void attention(ThreadPool& pool, const AttentionArgs& args);

// k_cells[cell_of_row[r]] = k[r] and v_cells[cell_of_row[r]] = v[r] for r in
// [0, n_rows), whole rows of row_elems = n_kv_heads * head_dim floats.
// k, v: [n_rows, row_elems]; k_cells, v_cells: [max_cells, row_elems].
// REQUIRES: cell_of_row.size() == n_rows, every cell in [0, max_cells).
void write_kv(const float* k, const float* v, int64_t n_rows, int64_t row_elems,
              std::span<const int32_t> cell_of_row, float* k_cells, float* v_cells,
              int64_t max_cells);

// The scale of a K or V head row whose largest magnitude is amax: the smallest power of
// two >= amax / 448, or 1 when amax is 0. A power of two makes x / scale and code x
// scale exact, and on SmolLM2-135M it gave a lower perplexity than amax / 448 itself
// (docs/PERFORMANCE.md); the row's largest value lands in (224, 448].
inline float kv_scale_e4m3(float amax) {
  const float ratio = amax / kE4M3Max;
  if (!(ratio > 0.0f) || !std::isfinite(ratio)) return amax > 0.0f ? ratio : 1.0f;
  int e = 0;
  const float m = std::frexp(ratio, &e);  // ratio = m * 2^e, m in [0.5, 1)
  return std::ldexp(1.0f, m == 0.5f ? e - 1 : e);
}

// Quantizes one K or V head row of n floats to e4m3 for the cache: scale =
// kv_scale_e4m3(the row's largest magnitude), dst[i] = f32_to_e4m3(src[i] / scale).
// Returns the scale. The scalar definition the e4m3 K/V writes (write_kv_e4m3, and a
// device kernel's twin) follow element for element.
inline float quantize_kv_head_e4m3(const float* src, int64_t n, uint8_t* dst) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(src[i]));
  const float scale = kv_scale_e4m3(amax);
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_e4m3(src[i] / scale);
  return scale;
}

// write_kv for e4m3 storage: each row's n_kv_heads head rows of head_dim floats are
// quantized by quantize_kv_head_e4m3 into the codes and the scale of cell_of_row[r].
// k, v: [n_rows, n_kv_heads * head_dim]; codes [max_cells, n_kv_heads * head_dim];
// scales [max_cells, n_kv_heads].
// REQUIRES: cell_of_row.size() == n_rows, every cell in [0, max_cells).
void write_kv_e4m3(const float* k, const float* v, int64_t n_rows, int64_t n_kv_heads,
                   int64_t head_dim, std::span<const int32_t> cell_of_row, uint8_t* k_codes,
                   float* k_scales, uint8_t* v_codes, float* v_scales, int64_t max_cells);

}  // namespace cellm::cpu
