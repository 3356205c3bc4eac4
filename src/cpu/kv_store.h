// KvStore: the CPU executor's off-graph K/V storage in the cell layout. Per
// layer, K and V are [rows, n_kv_heads, head_dim] f32, where row c is cell c of
// the CellPool. Storage starts at `initial_rows` and grows geometrically (to
// max(2 x rows, needed), capped at max_cells), carrying the live rows.
//
// Thread-safety: none; owned by the executor (engine thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace cellm::cpu {

class KvStore {
 public:
  // REQUIRES: num_layers > 0, row_floats > 0, 0 < initial_rows <= max_cells.
  KvStore(int64_t num_layers, int64_t row_floats, int64_t max_cells, int64_t initial_rows);

  // Makes rows [0, needed) addressable. REQUIRES: needed <= max_cells().
  void ensure_rows(int64_t needed);

  float* k(int64_t layer) { return k_[static_cast<size_t>(layer)].data(); }  // [rows, row_floats]
  float* v(int64_t layer) { return v_[static_cast<size_t>(layer)].data(); }  // [rows, row_floats]

  int64_t rows() const { return rows_; }
  int64_t max_cells() const { return max_cells_; }
  int64_t row_floats() const { return row_floats_; }  // n_kv_heads * head_dim
  int64_t growth_count() const { return growth_count_; }
  // One cell's K and V over every layer.
  int64_t bytes_per_cell() const { return cell_bytes(num_layers_, row_floats_); }
  // The same for a store of these dimensions, before one exists (sizing by memory).
  static int64_t cell_bytes(int64_t num_layers, int64_t row_floats) {
    return 2 * num_layers * row_floats * static_cast<int64_t>(sizeof(float));
  }
  int64_t allocated_bytes() const { return rows_ * bytes_per_cell(); }

 private:
  void resize(int64_t rows);

  int64_t num_layers_;
  int64_t row_floats_;
  int64_t max_cells_;
  int64_t rows_ = 0;
  int64_t growth_count_ = 0;
  std::vector<std::vector<float>> k_;  // [num_layers][rows * row_floats]
  std::vector<std::vector<float>> v_;  // [num_layers][rows * row_floats]
};

}  // namespace cellm::cpu
