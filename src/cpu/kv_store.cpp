#include "cpu/kv_store.h"

#include <algorithm>

#include "cellm/status.h"

namespace cellm::cpu {

KvStore::KvStore(int64_t num_layers, int64_t row_floats, int64_t max_cells, int64_t initial_rows,
                 KvStorage storage, int64_t head_dim)
    : num_layers_(num_layers),
      row_floats_(row_floats),
      max_cells_(max_cells),
      storage_(storage),
      head_dim_(storage == KvStorage::kFp8 ? head_dim : 0) {
  CELLM_CHECK(num_layers > 0 && row_floats > 0);
  CELLM_CHECK(initial_rows > 0 && initial_rows <= max_cells);
  CELLM_CHECK(storage == KvStorage::kF32 || (head_dim > 0 && row_floats % head_dim == 0));
  k_.resize(static_cast<size_t>(num_layers));
  v_.resize(static_cast<size_t>(num_layers));
  if (storage_ == KvStorage::kFp8) {
    k8_.resize(static_cast<size_t>(num_layers));
    v8_.resize(static_cast<size_t>(num_layers));
  }
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
  const int64_t floats_per_row =
      storage_ == KvStorage::kFp8 ? row_floats_ / head_dim_ : row_floats_;
  for (size_t l = 0; l < static_cast<size_t>(num_layers_); ++l) {
    k_[l].resize(static_cast<size_t>(rows * floats_per_row));
    v_[l].resize(static_cast<size_t>(rows * floats_per_row));
    if (storage_ == KvStorage::kFp8) {
      k8_[l].resize(static_cast<size_t>(rows * row_floats_));
      v8_[l].resize(static_cast<size_t>(rows * row_floats_));
    }
  }
  rows_ = rows;
}

}  // namespace cellm::cpu
