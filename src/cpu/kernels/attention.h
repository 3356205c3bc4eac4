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
// already be written (write_kv) before attention runs.
// Thread-safety: reentrant; `attention` runs on `pool`, its threads claiming
// (row, head) tasks a few at a time, the last rows (the longest in a prompt) first.
#pragma once

#include <cstdint>
#include <span>

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

}  // namespace cellm::cpu
