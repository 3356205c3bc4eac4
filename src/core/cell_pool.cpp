#include "core/cell_pool.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <string>

#include "cellm/status.h"

namespace cellm {
namespace {

// Min-heaps over std::vector: the smallest element sits at front().
template <typename T>
void heap_push(std::vector<T>& heap, T value) {
  heap.push_back(value);
  std::push_heap(heap.begin(), heap.end(), std::greater<T>());
}

template <typename T>
T heap_pop(std::vector<T>& heap) {
  std::pop_heap(heap.begin(), heap.end(), std::greater<T>());
  T value = heap.back();
  heap.pop_back();
  return value;
}

}  // namespace

CellPool::CellPool(int32_t capacity_cells) : capacity_cells_(capacity_cells) {
  CELLM_CHECK_MSG(capacity_cells > 0, "capacity_cells = " + std::to_string(capacity_cells));
  clear();
}

SeqId CellPool::seq_new() {
  SeqId seq;
  if (!free_seq_ids_.empty()) {
    seq = heap_pop(free_seq_ids_);
  } else {
    seq = static_cast<SeqId>(seqs_.size());
    seqs_.emplace_back();
  }
  seqs_[seq].live = true;
  ++num_live_seqs_;
  return seq;
}

bool CellPool::seq_live(SeqId seq) const {
  return seq >= 0 && static_cast<size_t>(seq) < seqs_.size() && seqs_[seq].live;
}

std::optional<SeqId> CellPool::seq_clone(SeqId src, Position upto) {
  if (!seq_live(src) || upto < 0 || upto > pos(src)) return std::nullopt;
  const SeqId child = seq_new();  // may reallocate seqs_: index it afresh below
  const std::vector<CellId>& src_cells = seqs_[src].cells;
  std::vector<CellId> shared(src_cells.begin(), src_cells.begin() + upto);
  for (CellId cell : shared) ++refcount_[cell];
  seqs_[child].cells = std::move(shared);
  return child;
}

void CellPool::seq_rm(SeqId seq) {
  if (!seq_live(seq)) return;
  Sequence& s = seqs_[seq];
  for (CellId cell : s.cells) release_cell(cell);
  std::vector<CellId>().swap(s.cells);
  s.live = false;
  --num_live_seqs_;
  heap_push(free_seq_ids_, seq);
}

bool CellPool::rewind(SeqId seq, Position p) {
  if (!seq_live(seq) || p < 0 || p > pos(seq)) return false;
  std::vector<CellId>& cells = seqs_[seq].cells;
  for (size_t i = static_cast<size_t>(p); i < cells.size(); ++i) release_cell(cells[i]);
  cells.resize(static_cast<size_t>(p));
  return true;
}

Position CellPool::pos(SeqId seq) const {
  CELLM_CHECK_MSG(seq_live(seq), "sequence " + std::to_string(seq) + " is not live");
  return static_cast<Position>(seqs_[seq].cells.size());
}

std::span<const CellId> CellPool::cells_of(SeqId seq) const {
  CELLM_CHECK_MSG(seq_live(seq), "sequence " + std::to_string(seq) + " is not live");
  return seqs_[seq].cells;
}

std::optional<StepPlacement> CellPool::declare_step(std::span<const SeqId> seq_ids) {
  if (seq_ids.size() > static_cast<size_t>(free_cells())) return std::nullopt;
  for (SeqId seq : seq_ids) {
    if (!seq_live(seq)) return std::nullopt;
  }
  StepPlacement placement;
  placement.cells.reserve(seq_ids.size());
  placement.positions.reserve(seq_ids.size());
  for (SeqId seq : seq_ids) {
    std::vector<CellId>& cells = seqs_[seq].cells;
    const CellId cell = take_lowest_free_cell();
    const auto position = static_cast<Position>(cells.size());
    position_[cell] = position;
    cells.push_back(cell);
    placement.cells.push_back(cell);
    placement.positions.push_back(position);
  }
  return placement;
}

int32_t CellPool::refcount(CellId cell) const {
  CELLM_CHECK_MSG(cell >= 0 && cell < capacity_cells_, "cell " + std::to_string(cell));
  return refcount_[cell];
}

std::optional<Position> CellPool::cell_position(CellId cell) const {
  CELLM_CHECK_MSG(cell >= 0 && cell < capacity_cells_, "cell " + std::to_string(cell));
  if (refcount_[cell] == 0) return std::nullopt;
  return position_[cell];
}

void CellPool::clear() {
  used_cells_ = 0;
  used_end_ = 0;
  num_live_seqs_ = 0;
  refcount_.assign(capacity_cells_, 0);
  position_.assign(capacity_cells_, 0);
  seqs_.clear();
  free_seq_ids_.clear();
  // An ascending array is already a valid min-heap.
  free_cells_.resize(capacity_cells_);
  std::iota(free_cells_.begin(), free_cells_.end(), CellId{0});
}

CellId CellPool::take_lowest_free_cell() {
  CELLM_CHECK(!free_cells_.empty());
  const CellId cell = heap_pop(free_cells_);
  refcount_[cell] = 1;
  ++used_cells_;
  used_end_ = std::max(used_end_, cell + 1);
  return cell;
}

void CellPool::release_cell(CellId cell) {
  CELLM_CHECK(refcount_[cell] > 0);
  if (--refcount_[cell] > 0) return;
  heap_push(free_cells_, cell);
  --used_cells_;
  // Each step down passes a cell that an earlier take stepped over: amortized O(1).
  while (used_end_ > 0 && refcount_[used_end_ - 1] == 0) --used_end_;
}

void CellPool::check_invariants() const {
  const auto cap = static_cast<size_t>(capacity_cells_);
  CELLM_CHECK(refcount_.size() == cap);
  CELLM_CHECK(position_.size() == cap);

  // Refcounts are the number of list entries naming each cell; positions match.
  std::vector<int32_t> owners(cap, 0);
  int32_t live = 0;
  for (size_t s = 0; s < seqs_.size(); ++s) {
    const Sequence& seq = seqs_[s];
    if (!seq.live) {
      CELLM_CHECK_MSG(seq.cells.empty(), "dead sequence " + std::to_string(s) + " holds cells");
      continue;
    }
    ++live;
    for (size_t i = 0; i < seq.cells.size(); ++i) {
      const CellId cell = seq.cells[i];
      CELLM_CHECK_MSG(cell >= 0 && cell < capacity_cells_,
                      "sequence " + std::to_string(s) + " names cell " + std::to_string(cell));
      ++owners[cell];
      CELLM_CHECK_MSG(position_[cell] == static_cast<Position>(i),
                      "cell " + std::to_string(cell) + " holds position " +
                          std::to_string(position_[cell]) + " but sits at index " +
                          std::to_string(i) + " of sequence " + std::to_string(s));
    }
  }
  CELLM_CHECK(live == num_live_seqs_);

  int32_t used = 0;
  int32_t end = 0;
  for (size_t c = 0; c < cap; ++c) {
    CELLM_CHECK_MSG(refcount_[c] == owners[c], "cell " + std::to_string(c) + " has refcount " +
                                                   std::to_string(refcount_[c]) + " but " +
                                                   std::to_string(owners[c]) + " owners");
    if (owners[c] > 0) {
      ++used;
      end = static_cast<int32_t>(c) + 1;
    }
  }
  CELLM_CHECK(used == used_cells_);
  CELLM_CHECK(end == used_end_);

  // The free set is exactly the unowned cells, once each.
  CELLM_CHECK(std::is_heap(free_cells_.begin(), free_cells_.end(), std::greater<CellId>()));
  CELLM_CHECK(free_cells_.size() == cap - static_cast<size_t>(used));
  std::vector<bool> seen(cap, false);
  for (CellId cell : free_cells_) {
    CELLM_CHECK(cell >= 0 && cell < capacity_cells_);
    CELLM_CHECK_MSG(!seen[cell], "cell " + std::to_string(cell) + " is free twice");
    CELLM_CHECK_MSG(owners[cell] == 0, "owned cell " + std::to_string(cell) + " is free");
    seen[cell] = true;
  }

  // The free ids are exactly the dead sequences, once each.
  CELLM_CHECK(std::is_heap(free_seq_ids_.begin(), free_seq_ids_.end(), std::greater<SeqId>()));
  CELLM_CHECK(free_seq_ids_.size() == seqs_.size() - static_cast<size_t>(live));
  std::vector<bool> id_seen(seqs_.size(), false);
  for (SeqId seq : free_seq_ids_) {
    CELLM_CHECK(seq >= 0 && static_cast<size_t>(seq) < seqs_.size());
    CELLM_CHECK_MSG(!seqs_[seq].live, "live sequence " + std::to_string(seq) + " is free");
    CELLM_CHECK_MSG(!id_seen[seq], "sequence id " + std::to_string(seq) + " is free twice");
    id_seen[seq] = true;
  }
}

}  // namespace cellm
