#include "core/cell_pool.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <string>
#include <unordered_map>

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
  // Every shared cell already has src as an owner, so none is cached-only and
  // the cached-only count does not change.
  for (CellId cell : shared) ++refcount_[cell];
  seqs_[child].cells = std::move(shared);
  return child;
}

void CellPool::seq_rm(SeqId seq) {
  if (!seq_live(seq)) return;
  Sequence& s = seqs_[seq];
  outstanding_ -= outstanding_of(s);
  s.limit = 0;
  for (CellId cell : s.cells) release_cell(cell);
  std::vector<CellId>().swap(s.cells);
  s.live = false;
  --num_live_seqs_;
  heap_push(free_seq_ids_, seq);
}

bool CellPool::rewind(SeqId seq, Position p) {
  if (!seq_live(seq) || p < 0 || p > pos(seq)) return false;
  Sequence& s = seqs_[seq];
  outstanding_ -= outstanding_of(s);
  for (size_t i = static_cast<size_t>(p); i < s.cells.size(); ++i) release_cell(s.cells[i]);
  s.cells.resize(static_cast<size_t>(p));
  outstanding_ += outstanding_of(s);  // the rewound positions are reserved again
  clamp_outstanding(s);
  return true;
}

void CellPool::clamp_outstanding(Sequence& s) {
  const int64_t room = int64_t{free_cells()} + cached_only_;
  if (outstanding_ <= room) return;
  const int64_t excess = outstanding_ - room;
  // Before the rewind outstanding <= room held, so the excess is at most what
  // this sequence just gained and its limit stays >= its length.
  s.limit -= excess;
  outstanding_ -= excess;
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
  for (SeqId seq : seq_ids) {
    if (!seq_live(seq)) return std::nullopt;
  }
  const auto n = static_cast<int64_t>(seq_ids.size());
  // Tokens within their sequence's reservation are already counted in
  // outstanding_; the rest need unreserved room.
  int64_t reserved_use = 0;
  if (outstanding_ > 0) {
    std::unordered_map<SeqId, int64_t> taken;
    for (SeqId seq : seq_ids) {
      int64_t& t = taken[seq];
      if (t < outstanding_of(seqs_[seq])) {
        ++t;
        ++reserved_use;
      }
    }
  }
  if (n - reserved_use > unreserved_cells()) return std::nullopt;
  if (n > free_cells() && reclaimer_) reclaimer_(n - free_cells());
  if (n > free_cells()) return std::nullopt;
  outstanding_ -= reserved_use;
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

bool CellPool::hold(CellId cell) {
  CELLM_CHECK_MSG(cell >= 0 && cell < capacity_cells_, "cell " + std::to_string(cell));
  if (refcount_[cell] == 0 || held_[cell]) return false;
  // The cell has another owner, so it does not become cached-only.
  held_[cell] = 1;
  ++refcount_[cell];
  ++held_count_;
  return true;
}

bool CellPool::unhold(CellId cell) {
  CELLM_CHECK_MSG(cell >= 0 && cell < capacity_cells_, "cell " + std::to_string(cell));
  if (!held_[cell]) return false;
  held_[cell] = 0;
  --held_count_;
  if (refcount_[cell] == 1) --cached_only_;
  if (--refcount_[cell] == 0) free_cell(cell);
  return true;
}

bool CellPool::held(CellId cell) const {
  CELLM_CHECK_MSG(cell >= 0 && cell < capacity_cells_, "cell " + std::to_string(cell));
  return held_[cell] != 0;
}

bool CellPool::seq_attach(SeqId seq, std::span<const CellId> cells) {
  if (!seq_live(seq) || !seqs_[seq].cells.empty()) return false;
  int64_t pinned = 0;
  for (size_t i = 0; i < cells.size(); ++i) {
    const CellId cell = cells[i];
    if (cell < 0 || cell >= capacity_cells_ || refcount_[cell] == 0 ||
        position_[cell] != static_cast<Position>(i)) {
      return false;
    }
    if (held_[cell] && refcount_[cell] == 1) ++pinned;
  }
  Sequence& s = seqs_[seq];
  const int64_t before = outstanding_of(s);
  const int64_t after = std::max<int64_t>(0, s.limit - static_cast<int64_t>(cells.size()));
  if (outstanding_ - before + after > int64_t{free_cells()} + cached_only_ - pinned) return false;
  for (CellId cell : cells) {
    if (held_[cell] && refcount_[cell] == 1) --cached_only_;
    ++refcount_[cell];
  }
  s.cells.assign(cells.begin(), cells.end());
  outstanding_ += after - before;
  return true;
}

bool CellPool::set_reservation(SeqId seq, int64_t n) {
  if (!seq_live(seq) || n < 0) return false;
  Sequence& s = seqs_[seq];
  const int64_t current = outstanding_of(s);
  if (n > unreserved_cells() + current) return false;
  s.limit = static_cast<int64_t>(s.cells.size()) + n;
  outstanding_ += n - current;
  return true;
}

int64_t CellPool::reservation(SeqId seq) const {
  return seq_live(seq) ? outstanding_of(seqs_[seq]) : 0;
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
  held_count_ = 0;
  cached_only_ = 0;
  outstanding_ = 0;
  refcount_.assign(capacity_cells_, 0);
  held_.assign(capacity_cells_, 0);
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
  if (--refcount_[cell] > 0) {
    if (refcount_[cell] == 1 && held_[cell]) ++cached_only_;
    return;
  }
  free_cell(cell);
}

void CellPool::free_cell(CellId cell) {
  heap_push(free_cells_, cell);
  --used_cells_;
  // Each step down passes a cell that an earlier take stepped over: amortized O(1).
  while (used_end_ > 0 && refcount_[used_end_ - 1] == 0) --used_end_;
}

void CellPool::check_invariants() const {
  const auto cap = static_cast<size_t>(capacity_cells_);
  CELLM_CHECK(refcount_.size() == cap);
  CELLM_CHECK(position_.size() == cap);
  CELLM_CHECK(held_.size() == cap);

  // Refcounts are the number of list entries naming each cell; positions match.
  std::vector<int32_t> owners(cap, 0);
  int32_t live = 0;
  int64_t outstanding = 0;
  for (size_t s = 0; s < seqs_.size(); ++s) {
    const Sequence& seq = seqs_[s];
    if (!seq.live) {
      CELLM_CHECK_MSG(seq.cells.empty(), "dead sequence " + std::to_string(s) + " holds cells");
      CELLM_CHECK_MSG(seq.limit == 0, "dead sequence " + std::to_string(s) + " has a reservation");
      continue;
    }
    ++live;
    outstanding += outstanding_of(seq);
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
  int32_t held = 0;
  int32_t cached_only = 0;
  for (size_t c = 0; c < cap; ++c) {
    CELLM_CHECK(held_[c] == 0 || held_[c] == 1);
    owners[c] += held_[c];
    CELLM_CHECK_MSG(refcount_[c] == owners[c], "cell " + std::to_string(c) + " has refcount " +
                                                   std::to_string(refcount_[c]) + " but " +
                                                   std::to_string(owners[c]) + " owners");
    if (owners[c] > 0) {
      ++used;
      end = static_cast<int32_t>(c) + 1;
    }
    held += held_[c];
    if (held_[c] && refcount_[c] == 1) ++cached_only;
  }
  CELLM_CHECK(used == used_cells_);
  CELLM_CHECK(end == used_end_);
  CELLM_CHECK_MSG(held == held_count_, "held count " + std::to_string(held_count_) + " but " +
                                           std::to_string(held) + " held cells");
  CELLM_CHECK_MSG(cached_only == cached_only_, "cached-only count " + std::to_string(cached_only_) +
                                                   " but " + std::to_string(cached_only) +
                                                   " such cells");
  CELLM_CHECK_MSG(outstanding == outstanding_, "outstanding " + std::to_string(outstanding_) +
                                                   " but the reservations sum to " +
                                                   std::to_string(outstanding));
  CELLM_CHECK_MSG(outstanding_ <= int64_t{free_cells()} + cached_only_,
                  "outstanding " + std::to_string(outstanding_) + " exceeds free " +
                      std::to_string(free_cells()) + " + cached-only " +
                      std::to_string(cached_only_));

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
