// CellPool: the neutral bookkeeping of the KV cache in the cell layout. It owns
// no storage: an executor keeps, per layer, K and V as [max_cells, n_kv_heads,
// head_dim] and uses the pool to decide which cell (row) each token uses.
//
// A cell is one token slot: cell c holds that token's K and V in every layer.
// Per cell the pool keeps a reference count and the token's position; per
// sequence, the ordered list of its cells (position i -> cell id).
//
// - New tokens take the lowest free cell; a step's placement is all or nothing.
// - Clone shares, it never copies: the child's list is the source's prefix
//   [0, upto) and each of those cells gains a reference. Later writes of either
//   go to new cells. A cell is freed when its last owner drops it.
// - rewind(seq, p) drops the sequence's cells at positions >= p.
// - No limit on the number of sequences other than memory.
// - A hold is one extra, non-sequence owner of a cell (the prefix cache's), at
//   most one per cell. A cell whose only owner is its hold is "cached-only": it
//   keeps its K and V but can be reclaimed at any time.
// - A reservation promises a sequence room to grow: set_reservation(seq, n)
//   makes sure the next n cells of `seq` can always be declared. The pool keeps
//   outstanding (the reserved cells not yet taken) <= free + cached-only, and
//   when a step finds too few free cells it asks the reclaimer to turn
//   cached-only cells into free ones. With no holds and no reservations the pool
//   behaves exactly as without these features.
//
// Because placement always takes the lowest free cell, when at most N cells are
// ever in use at once every occupied cell lies below N. Executors rely on this:
// a pool of capacity max_cells - 1 leaves cell max_cells - 1 free as a scratch
// row for padded slots.
//
// Thread-safety: none; owned and called by one thread (the engine thread).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "cellm/types.h"

namespace cellm {

using SeqId = int32_t;   // a pool sequence; ids of removed sequences are reused
using CellId = int32_t;  // a row of every layer's K and V storage

// Where a declared step's tokens went, one entry per declared token, in order.
struct StepPlacement {
  std::vector<CellId> cells;
  std::vector<Position> positions;  // each token continues its own sequence
};

class CellPool {
 public:
  // REQUIRES: capacity_cells > 0.
  explicit CellPool(int32_t capacity_cells);

  int32_t capacity() const { return capacity_cells_; }
  int32_t used_cells() const { return used_cells_; }
  int32_t free_cells() const { return capacity_cells_ - used_cells_; }
  // Every occupied cell lies below used_end(); 0 when the pool is empty.
  int32_t used_end() const { return used_end_; }
  int32_t num_seqs() const { return num_live_seqs_; }
  // Cells whose only owner is a hold (reclaimable).
  int32_t cached_only_cells() const { return cached_only_; }
  // Cells that carry a hold, whether or not sequences share them too.
  int32_t held_cells() const { return held_count_; }
  // Reserved cells not yet taken: the sum over sequences of max(0, limit - pos).
  int64_t reserved_cells() const { return outstanding_; }
  // What a new reservation or an unreserved step may still draw on:
  // free + cached-only - reserved (never negative).
  int64_t unreserved_cells() const { return int64_t{free_cells()} + cached_only_ - outstanding_; }

  // A new, empty sequence (the lowest free id).
  SeqId seq_new();
  bool seq_live(SeqId seq) const;
  // A new sequence sharing `src`'s cells at positions [0, upto); nullopt (nothing
  // changes) if `src` is not live or upto is outside [0, pos(src)].
  std::optional<SeqId> seq_clone(SeqId src, Position upto);
  // Drops every claim of `seq`, frees cells nobody else owns, releases the id.
  // Unknown ids are ignored.
  void seq_rm(SeqId seq);
  // Drops the claims at positions >= p. false (nothing changes) if `seq` is not
  // live or p is outside [0, pos(seq)].
  bool rewind(SeqId seq, Position p);
  // One past the newest position of `seq` (its length). REQUIRES: seq_live(seq).
  Position pos(SeqId seq) const;
  // The cells of `seq` in position order: cells_of(seq)[i] holds position i.
  // REQUIRES: seq_live(seq). Valid until the next mutating call.
  std::span<const CellId> cells_of(SeqId seq) const;

  // Declares the next forward: one entry per token, each token continuing its
  // own sequence (tokens of one sequence need not be adjacent; they take
  // consecutive positions in order). Each token takes the lowest free cell.
  // A reserved sequence's tokens draw on its reservation first; the others
  // (unreserved tokens) must fit in unreserved_cells(). When fewer cells are
  // free than tokens, the reclaimer (if set) is asked for the difference first.
  // nullopt, and nothing changes in the sequences, if any id is not live, the
  // unreserved tokens do not fit, or too few cells are free after reclaiming
  // (cells the reclaimer freed stay free).
  std::optional<StepPlacement> declare_step(std::span<const SeqId> seq_ids);

  // Adds a hold to an owned cell. false (nothing changes) if the cell is free
  // or already held. REQUIRES: 0 <= cell < capacity().
  bool hold(CellId cell);
  // Drops the hold of `cell`, freeing it when the hold was its last owner.
  // false (nothing changes) if the cell is not held.
  // REQUIRES: 0 <= cell < capacity().
  bool unhold(CellId cell);
  bool held(CellId cell) const;

  // Makes the empty sequence `seq` own `cells`, cells[i] at position i, like a
  // clone of the sequence that wrote them. Refused (false, nothing changes) if
  // `seq` is not live or not empty, a cell is free or holds another position,
  // or the cached-only cells it takes over exceed what the reservations leave
  // (reserved_cells() must stay <= free + cached-only).
  bool seq_attach(SeqId seq, std::span<const CellId> cells);

  // Reserves room for `seq` to grow by n more cells (limit = pos + n); n = 0
  // drops the reservation. Refused (false, nothing changes) if `seq` is not
  // live, n < 0, or unreserved_cells() plus the sequence's current reservation
  // is below n.
  bool set_reservation(SeqId seq, int64_t n);
  // The cells `seq` may still take from its reservation; 0 for unknown ids.
  int64_t reservation(SeqId seq) const;

  // Called by declare_step with the number of cells it is short; it should
  // unhold cached-only cells and return how many it freed. It must not touch
  // sequences or reservations. An empty function removes it.
  using Reclaimer = std::function<int64_t(int64_t need)>;
  void set_reclaimer(Reclaimer reclaimer) { reclaimer_ = std::move(reclaimer); }

  // Owners of `cell` (0 = free). REQUIRES: 0 <= cell < capacity().
  int32_t refcount(CellId cell) const;
  // Position held by `cell`, nullopt when free. REQUIRES: 0 <= cell < capacity().
  std::optional<Position> cell_position(CellId cell) const;

  // Removes every sequence, hold and reservation and frees every cell. The
  // reclaimer stays; a cache holding cells must be cleared first.
  void clear();

  // Aborts (CELLM_CHECK) if the bookkeeping is inconsistent: refcounts equal the
  // number of list entries naming each cell plus its hold, positions match list
  // indices, used, held and cached-only counts agree, the free set is exactly
  // the unowned cells, reserved_cells() is the sum of the sequences'
  // reservations and is at most free + cached-only.
  void check_invariants() const;

 private:
  struct Sequence {
    bool live = false;
    int64_t limit = 0;          // reserved length; no reservation while <= pos
    std::vector<CellId> cells;  // position i -> cell
  };
  static int64_t outstanding_of(const Sequence& s) {
    return std::max<int64_t>(0, s.limit - static_cast<int64_t>(s.cells.size()));
  }

  // REQUIRES: free_cells() > 0.
  CellId take_lowest_free_cell();
  // Drops one sequence's claim on `cell`; frees it when that was the last owner.
  void release_cell(CellId cell);
  // Returns an unowned cell to the free set.
  void free_cell(CellId cell);
  // After cells went back (rewind): lowers the reservation of `s` if its growth
  // would break outstanding <= free + cached-only (cells still shared elsewhere
  // do not come back as room).
  void clamp_outstanding(Sequence& s);

  int32_t capacity_cells_ = 0;
  int32_t used_cells_ = 0;
  int32_t used_end_ = 0;  // one past the highest occupied cell; 0 when empty
  int32_t num_live_seqs_ = 0;
  int32_t held_count_ = 0;
  int32_t cached_only_ = 0;  // held cells with refcount 1
  int64_t outstanding_ = 0;
  Reclaimer reclaimer_;
  std::vector<int32_t> refcount_;    // [capacity]
  std::vector<uint8_t> held_;        // [capacity]; 1 when the cell carries a hold
  std::vector<Position> position_;   // [capacity]; meaningful when refcount > 0
  std::vector<Sequence> seqs_;       // indexed by SeqId
  std::vector<SeqId> free_seq_ids_;  // min-heap of released ids below seqs_.size()
  std::vector<CellId> free_cells_;   // min-heap of free cells
};

}  // namespace cellm
