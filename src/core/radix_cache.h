// RadixCache: core's automatic prefix cache over a CellPool. It maps runs of
// tokens to the cells that hold their K and V, so a new session whose tokens
// start with a cached run can share those cells instead of recomputing them.
//
// - A node holds a run of tokens and one cell per token; the run of a node at
//   depth d holds positions [d, d + len). Children are keyed by their first
//   token. Every cell in the tree carries the pool's hold, at most one node per
//   cell, and the pool places it at the position its node gives it.
// - match() may stop inside a node: cells are per token, so a partial prefix
//   needs no copy.
// - insert() holds only the cells of the tokens not yet cached; tokens already
//   cached keep their old cells (the caller's duplicates go back when its
//   sequence is removed).
// - evict() trims the tails of leaves, least recently used first, and only
//   cells whose hold is their last owner (never a cell a sequence shares).
//
// Thread-safety: none; owned by a SessionTable on the engine thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "cellm/types.h"
#include "core/cell_pool.h"

namespace cellm {

class RadixCache {
 public:
  explicit RadixCache(CellPool& pool);
  // Drops every hold (the pool must still exist).
  ~RadixCache();
  RadixCache(const RadixCache&) = delete;
  RadixCache& operator=(const RadixCache&) = delete;

  // The cells of the longest cached prefix of `key`, at most max_tokens long and
  // taking at most max_pin cached-only cells (it stops before the one that would
  // exceed). Marks the matched nodes as used. cells[i] holds key[i].
  std::vector<CellId> match(std::span<const Token> key, int64_t max_tokens, int64_t max_pin);

  // Caches key[i] -> cells[i] (cells[i] at pool position i), splitting nodes
  // where the key leaves a run. Holds the cells of the tokens not yet cached and
  // returns how many. It stops early at a cell it cannot hold or that the pool
  // places elsewhere. REQUIRES: cells.size() >= key.size().
  int64_t insert(std::span<const Token> key, std::span<const CellId> cells);

  // Frees up to `need` cells by trimming leaf tails, least recently used first;
  // returns how many it freed.
  int64_t evict(int64_t need);

  // Drops every hold and every node.
  void clear();

  // Cells in the tree (each carries a hold).
  int64_t cached_cells() const { return cached_cells_; }
  int64_t evicted_cells() const { return evicted_cells_; }

  // Aborts (CELLM_CHECK) unless every node but the root has a non-empty run
  // with one cell per token, children are keyed by their first token and point
  // back to their parent, every cell of the tree is held and sits at
  // position = depth + index in exactly one node, and the pool holds no other
  // cell.
  void check_invariants() const;

 private:
  struct Node {
    std::vector<Token> tokens;
    std::vector<CellId> cells;
    std::map<Token, std::unique_ptr<Node>> children;
    Node* parent = nullptr;
    int64_t depth = 0;  // position of tokens[0]
    uint64_t last_use = 0;
  };

  // Splits `node` after its first `at` tokens; returns the new upper node,
  // which takes node's place under its parent. REQUIRES: 0 < at < len.
  Node* split(Node* node, size_t at);
  void unhold_subtree(Node* node);

  CellPool& pool_;
  Node root_;
  uint64_t clock_ = 0;
  int64_t cached_cells_ = 0;
  int64_t evicted_cells_ = 0;
};

}  // namespace cellm
