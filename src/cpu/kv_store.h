// KvStore: the CPU executor's off-graph K/V storage in the cell layout. Per
// layer, K and V hold [rows, n_kv_heads, head_dim] values, where row c is cell c
// of the CellPool, in one of two forms:
//   kF32: f32 values.
//   kFp8: e4m3 codes (model/fp8.h) [rows, n_kv_heads, head_dim] plus one f32 scale per
//         (cell, kv head) [rows, n_kv_heads]: value = e4m3(code) * scale, scale = the
//         smallest power of two >= the head row's largest magnitude / 448 (1 for an
//         all-zero row, whose codes are 0; cpu/kernels/attention.h, kv_scale_e4m3).
//         A cell is head_dim + 4 bytes per head and layer instead of 4 x head_dim.
// Storage starts at `initial_rows` and grows geometrically (to max(2 x rows, needed),
// capped at max_cells), carrying the live rows.
//
// Thread-safety: none; owned by the executor (engine thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace cellm::cpu {

enum class KvStorage {
  kF32,
  kFp8,  // e4m3 codes and one f32 scale per (cell, kv head)
};

class KvStore {
 public:
  // REQUIRES: num_layers > 0, row_floats > 0, 0 < initial_rows <= max_cells; for kFp8,
  // head_dim > 0 divides row_floats (row_floats = n_kv_heads * head_dim).
  KvStore(int64_t num_layers, int64_t row_floats, int64_t max_cells, int64_t initial_rows,
          KvStorage storage = KvStorage::kF32, int64_t head_dim = 0);

  // Makes rows [0, needed) addressable. REQUIRES: needed <= max_cells().
  void ensure_rows(int64_t needed);

  KvStorage storage() const { return storage_; }
  // kF32 only: [rows, row_floats].
  float* k(int64_t layer) { return k_[static_cast<size_t>(layer)].data(); }
  float* v(int64_t layer) { return v_[static_cast<size_t>(layer)].data(); }
  // kFp8 only: codes [rows, row_floats] and scales [rows, row_floats / head_dim].
  uint8_t* k_codes(int64_t layer) { return k8_[static_cast<size_t>(layer)].data(); }
  uint8_t* v_codes(int64_t layer) { return v8_[static_cast<size_t>(layer)].data(); }
  float* k_scales(int64_t layer) { return k_[static_cast<size_t>(layer)].data(); }
  float* v_scales(int64_t layer) { return v_[static_cast<size_t>(layer)].data(); }

  int64_t rows() const { return rows_; }
  int64_t max_cells() const { return max_cells_; }
  int64_t row_floats() const { return row_floats_; }  // n_kv_heads * head_dim
  int64_t growth_count() const { return growth_count_; }
  // One cell's K and V over every layer (codes and scales for kFp8).
  int64_t bytes_per_cell() const {
    return cell_bytes(num_layers_, row_floats_, storage_, head_dim_);
  }
  // The same for a store of these dimensions, before one exists (sizing by memory).
  static int64_t cell_bytes(int64_t num_layers, int64_t row_floats,
                            KvStorage storage = KvStorage::kF32, int64_t head_dim = 0) {
    if (storage == KvStorage::kFp8) {
      return 2 * num_layers * (row_floats + (row_floats / head_dim) * int64_t{sizeof(float)});
    }
    return 2 * num_layers * row_floats * static_cast<int64_t>(sizeof(float));
  }
  int64_t allocated_bytes() const { return rows_ * bytes_per_cell(); }

 private:
  void resize(int64_t rows);

  int64_t num_layers_;
  int64_t row_floats_;
  int64_t max_cells_;
  KvStorage storage_;
  int64_t head_dim_;  // kFp8: the values one scale covers; 0 for kF32
  int64_t rows_ = 0;
  int64_t growth_count_ = 0;
  // kF32: the values [num_layers][rows * row_floats]; kFp8: the scales
  // [num_layers][rows * row_floats / head_dim].
  std::vector<std::vector<float>> k_;
  std::vector<std::vector<float>> v_;
  std::vector<std::vector<uint8_t>> k8_;  // kFp8: [num_layers][rows * row_floats] codes
  std::vector<std::vector<uint8_t>> v8_;
};

}  // namespace cellm::cpu
