#include "core/radix_cache.h"

#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "core/cell_pool.h"

namespace cellm {
namespace {

using Cells = std::vector<CellId>;
using Tokens = std::vector<Token>;

class RadixCacheTest : public ::testing::Test {
 protected:
  // A new sequence that takes `n` fresh cells, positions [0, n).
  SeqId Fill(int n) {
    const SeqId seq = pool.seq_new();
    Grow(seq, n);
    return seq;
  }
  Cells Grow(SeqId seq, int n) {
    std::vector<SeqId> ids(static_cast<size_t>(n), seq);
    std::optional<StepPlacement> placement = pool.declare_step(ids);
    EXPECT_TRUE(placement.has_value());
    return placement ? placement->cells : Cells{};
  }
  Cells CellsOf(SeqId seq) const {
    std::span<const CellId> cells = pool.cells_of(seq);
    return Cells(cells.begin(), cells.end());
  }
  void Check() const {
    pool.check_invariants();
    cache.check_invariants();
  }

  CellPool pool{32};
  RadixCache cache{pool};
};

TEST_F(RadixCacheTest, MatchStopsInsideANodeAndInsertSplitsIt) {
  const SeqId a = Fill(6);
  const Cells a_cells = CellsOf(a);
  EXPECT_EQ(cache.insert(Tokens{1, 2, 3, 4, 5, 6}, a_cells), 6);
  pool.seq_rm(a);
  Check();
  EXPECT_EQ(pool.cached_only_cells(), 6);

  const Cells partial = cache.match(Tokens{1, 2, 3, 9}, 100, 100);
  EXPECT_EQ(partial, Cells(a_cells.begin(), a_cells.begin() + 3));
  EXPECT_TRUE(cache.match(Tokens{2, 3}, 100, 100).empty());

  // A session that shares the first three tokens, then leaves the run.
  const SeqId b = pool.seq_new();
  ASSERT_TRUE(pool.seq_attach(b, partial));
  const Cells b_own = Grow(b, 2);
  Check();
  EXPECT_EQ(cache.insert(Tokens{1, 2, 3, 9, 9}, CellsOf(b)), 2);
  Check();
  EXPECT_EQ(cache.cached_cells(), 8);
  EXPECT_EQ(cache.match(Tokens{1, 2, 3, 4, 5, 6, 7}, 100, 100), a_cells);
  Cells b_path = partial;
  b_path.insert(b_path.end(), b_own.begin(), b_own.end());
  EXPECT_EQ(cache.match(Tokens{1, 2, 3, 9, 9}, 100, 100), b_path);
  // A key ending inside a run adds nothing.
  EXPECT_EQ(cache.insert(Tokens{1, 2}, a_cells), 0);
  pool.seq_rm(b);
  Check();
  EXPECT_EQ(pool.used_cells(), 8);
}

TEST_F(RadixCacheTest, DuplicateInsertKeepsTheOldCells) {
  const SeqId a = Fill(4);
  const SeqId b = Fill(4);
  const Cells a_cells = CellsOf(a);
  EXPECT_EQ(cache.insert(Tokens{7, 7, 7, 7}, a_cells), 4);
  EXPECT_EQ(cache.insert(Tokens{7, 7, 7, 7}, CellsOf(b)), 0);
  Check();
  pool.seq_rm(a);
  pool.seq_rm(b);
  Check();
  EXPECT_EQ(pool.used_cells(), 4);  // b's duplicates went back to the pool
  EXPECT_EQ(cache.match(Tokens{7, 7, 7, 7}, 100, 100), a_cells);
}

TEST_F(RadixCacheTest, MatchHonoursMaxTokensAndMaxPin) {
  const SeqId a = Fill(6);
  const Cells a_cells = CellsOf(a);
  cache.insert(Tokens{1, 2, 3, 4, 5, 6}, a_cells);
  EXPECT_EQ(cache.match(Tokens{1, 2, 3, 4, 5, 6}, 4, 100).size(), 4u);
  EXPECT_EQ(cache.match(Tokens{1, 2, 3, 4, 5, 6}, 0, 100).size(), 0u);
  // While a still owns its cells, matching them pins nothing.
  EXPECT_EQ(cache.match(Tokens{1, 2, 3, 4, 5, 6}, 100, 0).size(), 6u);
  ASSERT_TRUE(pool.rewind(a, 2));  // cells 2..5 become cached-only
  EXPECT_EQ(cache.match(Tokens{1, 2, 3, 4, 5, 6}, 100, 0).size(), 2u);
  EXPECT_EQ(cache.match(Tokens{1, 2, 3, 4, 5, 6}, 100, 3).size(), 5u);
  Check();
}

TEST_F(RadixCacheTest, EvictTrimsExactlyNeedFromTheLeastRecentlyUsedTail) {
  const SeqId a = Fill(6);
  const Cells a_cells = CellsOf(a);
  cache.insert(Tokens{1, 2, 3, 4, 5, 6}, a_cells);
  pool.seq_rm(a);
  const SeqId b = Fill(3);
  const Cells b_cells = CellsOf(b);
  cache.insert(Tokens{8, 8, 8}, b_cells);
  pool.seq_rm(b);
  cache.match(Tokens{8}, 100, 100);  // the 8-run is now the more recent

  EXPECT_EQ(cache.evict(2), 2);
  Check();
  EXPECT_EQ(cache.cached_cells(), 7);
  EXPECT_EQ(cache.match(Tokens{1, 2, 3, 4, 5, 6}, 100, 100),
            Cells(a_cells.begin(), a_cells.begin() + 4));
  EXPECT_EQ(cache.match(Tokens{8, 8, 8}, 100, 100), b_cells);
  EXPECT_EQ(pool.free_cells(), 32 - 7);

  // Evicting a whole leaf moves on to the next one and drops emptied nodes.
  EXPECT_EQ(cache.evict(6), 6);
  Check();
  EXPECT_EQ(cache.cached_cells(), 1);
  EXPECT_EQ(cache.evicted_cells(), 8);
  EXPECT_EQ(cache.evict(5), 1);
  EXPECT_EQ(cache.cached_cells(), 0);
  EXPECT_EQ(pool.used_cells(), 0);
  Check();
}

TEST_F(RadixCacheTest, EvictsOnlyWhenAStepIsShortAndNeverSharedCells) {
  CellPool small(10);
  RadixCache c(small);
  small.set_reclaimer([&](int64_t need) { return c.evict(need); });
  const SeqId a = small.seq_new();
  ASSERT_TRUE(small.declare_step(std::vector<SeqId>(6, a)).has_value());
  const std::span<const CellId> a_span = small.cells_of(a);
  const Cells a_cells(a_span.begin(), a_span.end());
  c.insert(Tokens{1, 2, 3, 4, 5, 6}, a_cells);
  small.seq_rm(a);
  // A session sharing the first two cached cells.
  const SeqId s = small.seq_new();
  ASSERT_TRUE(small.seq_attach(s, c.match(Tokens{1, 2}, 100, 100)));

  // 4 free cells: a step of 4 evicts nothing.
  const SeqId b = small.seq_new();
  ASSERT_TRUE(small.declare_step(std::vector<SeqId>(4, b)).has_value());
  EXPECT_EQ(c.cached_cells(), 6);
  EXPECT_EQ(c.evicted_cells(), 0);
  // One more token: exactly one cell is evicted, from the tail.
  ASSERT_TRUE(small.declare_step(std::vector<SeqId>(1, b)).has_value());
  EXPECT_EQ(c.evicted_cells(), 1);
  EXPECT_EQ(c.match(Tokens{1, 2, 3, 4, 5, 6}, 100, 100).size(), 5u);
  // Three more: the cached-only tail goes, the shared cells stay, and the step
  // that would need them is refused.
  ASSERT_TRUE(small.declare_step(std::vector<SeqId>(3, b)).has_value());
  EXPECT_FALSE(small.declare_step(std::vector<SeqId>(1, b)).has_value());
  small.check_invariants();
  c.check_invariants();
  EXPECT_EQ(c.cached_cells(), 2);
  EXPECT_EQ(small.refcount(a_cells[0]), 2);
  EXPECT_EQ(small.refcount(a_cells[1]), 2);
  small.set_reclaimer({});
}

TEST_F(RadixCacheTest, InsertStopsAtACellThePoolPlacesElsewhere) {
  const SeqId a = Fill(3);
  Cells cells = CellsOf(a);
  std::swap(cells[1], cells[2]);
  EXPECT_EQ(cache.insert(Tokens{1, 2, 3}, cells), 1);
  Check();
}

TEST_F(RadixCacheTest, ClearDropsEveryHold) {
  const SeqId a = Fill(5);
  cache.insert(Tokens{1, 2, 3, 4, 5}, CellsOf(a));
  pool.seq_rm(a);
  cache.clear();
  Check();
  EXPECT_EQ(pool.used_cells(), 0);
}

}  // namespace
}  // namespace cellm
