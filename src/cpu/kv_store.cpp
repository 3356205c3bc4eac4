#include "cpu/kv_store.h"

#include <algorithm>

#include "cellm/status.h"

namespace cellm::cpu {

KvStore::KvStore(int64_t num_layers, int64_t row_floats, int64_t max_cells, int64_t initial_rows)
    : num_layers_(num_layers), row_floats_(row_floats), max_cells_(max_cells) {
  CELLM_CHECK(num_layers > 0 && row_floats > 0);
  CELLM_CHECK(initial_rows > 0 && initial_rows <= max_cells);
  k_.resize(static_cast<size_t>(num_layers));
  v_.resize(static_cast<size_t>(num_layers));
  resize(initial_rows);
  growth_count_ = 0;
}

void KvStore::ensure_rows(int64_t needed) {
  CELLM_CHECK_MSG(needed <= max_cells_, "KV rows past max_cells");
  if (needed <= rows_) return;
  resize(std::min(max_cells_, std::max(2 * rows_, needed)));
  ++growth_count_;
}

void KvStore::resize(int64_t rows) {
  // std::vector::resize keeps the existing rows (the live cells) in place.
  for (int64_t l = 0; l < num_layers_; ++l) {
    k_[static_cast<size_t>(l)].resize(static_cast<size_t>(rows * row_floats_));
    v_[static_cast<size_t>(l)].resize(static_cast<size_t>(rows * row_floats_));
  }
  rows_ = rows;
}

}  // namespace cellm::cpu
