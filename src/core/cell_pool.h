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
//
// Because placement always takes the lowest free cell, when at most N cells are
// ever in use at once every occupied cell lies below N. Executors rely on this:
// a pool of capacity max_cells - 1 leaves cell max_cells - 1 free as a scratch
// row for padded slots.
//
// Thread-safety: none; owned and called by one thread (the engine thread).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
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
  // nullopt, and nothing changes, if any id is not live or there are fewer free
  // cells than tokens.
  std::optional<StepPlacement> declare_step(std::span<const SeqId> seq_ids);

  // Owners of `cell` (0 = free). REQUIRES: 0 <= cell < capacity().
  int32_t refcount(CellId cell) const;
  // Position held by `cell`, nullopt when free. REQUIRES: 0 <= cell < capacity().
  std::optional<Position> cell_position(CellId cell) const;

  // Removes every sequence and frees every cell.
  void clear();

  // Aborts (CELLM_CHECK) if the bookkeeping is inconsistent: refcounts equal the
  // number of list entries naming each cell, positions match list indices,
  // used counts agree, the free set is exactly the unowned cells.
  void check_invariants() const;

 private:
  struct Sequence {
    bool live = false;
    std::vector<CellId> cells;  // position i -> cell
  };

  // REQUIRES: free_cells() > 0.
  CellId take_lowest_free_cell();
  // Drops one owner of `cell`; frees it when that was the last.
  void release_cell(CellId cell);

  int32_t capacity_cells_ = 0;
  int32_t used_cells_ = 0;
  int32_t used_end_ = 0;  // one past the highest occupied cell; 0 when empty
  int32_t num_live_seqs_ = 0;
  std::vector<int32_t> refcount_;    // [capacity]
  std::vector<Position> position_;   // [capacity]; meaningful when refcount > 0
  std::vector<Sequence> seqs_;       // indexed by SeqId
  std::vector<SeqId> free_seq_ids_;  // min-heap of released ids below seqs_.size()
  std::vector<CellId> free_cells_;   // min-heap of free cells
};

}  // namespace cellm
