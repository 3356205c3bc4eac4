// CellPool holds, reservations, attach and the reclaimer.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <random>
#include <vector>

#include "core/cell_pool.h"

namespace cellm {
namespace {

using Cells = std::vector<CellId>;

Cells Grow(CellPool& pool, SeqId seq, int n) {
  std::vector<SeqId> ids(static_cast<size_t>(n), seq);
  std::optional<StepPlacement> placement = pool.declare_step(ids);
  EXPECT_TRUE(placement.has_value());
  pool.check_invariants();
  return placement ? placement->cells : Cells{};
}

// A reclaimer that unholds cached-only cells, lowest first, as a cache would.
int64_t UnholdCachedOnly(CellPool& pool, int64_t need) {
  int64_t freed = 0;
  for (CellId c = 0; c < pool.capacity() && freed < need; ++c) {
    if (pool.held(c) && pool.refcount(c) == 1) {
      EXPECT_TRUE(pool.unhold(c));
      ++freed;
    }
  }
  return freed;
}

TEST(CellPoolHoldTest, AHeldCellOutlivesItsSequenceAsCachedOnly) {
  CellPool pool(8);
  const SeqId a = pool.seq_new();
  const Cells cells = Grow(pool, a, 3);
  EXPECT_FALSE(pool.hold(5));  // free cells cannot be held
  EXPECT_TRUE(pool.hold(cells[0]));
  EXPECT_FALSE(pool.hold(cells[0]));  // one hold per cell
  EXPECT_TRUE(pool.hold(cells[1]));
  EXPECT_EQ(pool.refcount(cells[0]), 2);
  EXPECT_EQ(pool.held_cells(), 2);
  EXPECT_EQ(pool.cached_only_cells(), 0);
  pool.check_invariants();

  pool.seq_rm(a);
  pool.check_invariants();
  EXPECT_EQ(pool.used_cells(), 2);
  EXPECT_EQ(pool.cached_only_cells(), 2);
  EXPECT_EQ(pool.cell_position(cells[1]), Position{1});
  EXPECT_EQ(pool.unreserved_cells(), 8);

  EXPECT_TRUE(pool.unhold(cells[0]));
  EXPECT_FALSE(pool.unhold(cells[0]));
  EXPECT_EQ(pool.refcount(cells[0]), 0);
  EXPECT_EQ(pool.cached_only_cells(), 1);
  pool.check_invariants();
}

TEST(CellPoolHoldTest, UnholdingASharedCellKeepsIt) {
  CellPool pool(8);
  const SeqId a = pool.seq_new();
  const Cells cells = Grow(pool, a, 2);
  ASSERT_TRUE(pool.hold(cells[1]));
  ASSERT_TRUE(pool.unhold(cells[1]));
  EXPECT_EQ(pool.refcount(cells[1]), 1);
  EXPECT_EQ(pool.used_cells(), 2);
  pool.check_invariants();
}

TEST(CellPoolAttachTest, AttachSharesCachedCellsLikeAClone) {
  CellPool pool(8);
  const SeqId a = pool.seq_new();
  const Cells cells = Grow(pool, a, 4);
  for (CellId c : cells) ASSERT_TRUE(pool.hold(c));
  pool.seq_rm(a);
  EXPECT_EQ(pool.cached_only_cells(), 4);

  const SeqId b = pool.seq_new();
  const Cells prefix(cells.begin(), cells.begin() + 3);
  EXPECT_FALSE(pool.seq_attach(b, Cells{cells[1]}));  // holds position 1, not 0
  ASSERT_TRUE(pool.seq_attach(b, prefix));
  EXPECT_FALSE(pool.seq_attach(b, prefix));  // not empty any more
  pool.check_invariants();
  EXPECT_EQ(pool.pos(b), 3);
  EXPECT_EQ(pool.cached_only_cells(), 1);
  EXPECT_EQ(pool.refcount(cells[0]), 2);

  // The next token continues at position 3 in a new cell.
  const Cells next = Grow(pool, b, 1);
  EXPECT_NE(next[0], cells[3]);
  EXPECT_EQ(pool.cell_position(next[0]), Position{3});
  pool.seq_rm(b);
  pool.check_invariants();
  EXPECT_EQ(pool.cached_only_cells(), 4);
}

TEST(CellPoolAttachTest, AttachMayNotPinCellsReservationsCountOn) {
  CellPool pool(4);
  const SeqId a = pool.seq_new();
  const Cells cells = Grow(pool, a, 2);
  for (CellId c : cells) ASSERT_TRUE(pool.hold(c));
  pool.seq_rm(a);
  const SeqId r = pool.seq_new();
  ASSERT_TRUE(pool.set_reservation(r, 3));  // 2 free + 2 cached-only, 3 promised
  const SeqId b = pool.seq_new();
  EXPECT_FALSE(pool.seq_attach(b, cells));  // would leave 2 free + 0 cached-only
  ASSERT_TRUE(pool.seq_attach(b, Cells{cells[0]}));
  pool.check_invariants();
}

TEST(CellPoolReservationTest, ReservationsAreRefusedBeyondTheRoom) {
  CellPool pool(8);
  const SeqId a = pool.seq_new();
  const SeqId b = pool.seq_new();
  Grow(pool, a, 2);
  EXPECT_FALSE(pool.set_reservation(a, 7));
  EXPECT_EQ(pool.reserved_cells(), 0);
  ASSERT_TRUE(pool.set_reservation(a, 4));
  EXPECT_EQ(pool.reservation(a), 4);
  EXPECT_EQ(pool.unreserved_cells(), 2);
  EXPECT_FALSE(pool.set_reservation(b, 3));
  ASSERT_TRUE(pool.set_reservation(b, 2));
  EXPECT_FALSE(pool.set_reservation(-1, 0));
  EXPECT_FALSE(pool.set_reservation(a, -1));
  // Growing a reservation counts what the sequence already has.
  ASSERT_TRUE(pool.set_reservation(a, 4));
  pool.check_invariants();

  // Unreserved tokens find no room; reserved ones do.
  const SeqId c = pool.seq_new();
  const std::vector<SeqId> unreserved{c};
  EXPECT_FALSE(pool.declare_step(unreserved).has_value());
  Grow(pool, a, 3);
  EXPECT_EQ(pool.reservation(a), 1);
  // Beyond its reservation a sequence needs unreserved room too: a's last
  // reserved cell plus one more is refused.
  const std::vector<SeqId> two{a, a};
  EXPECT_FALSE(pool.declare_step(two).has_value());
  pool.check_invariants();

  ASSERT_TRUE(pool.set_reservation(a, 0));
  EXPECT_EQ(pool.reserved_cells(), 2);
  pool.seq_rm(b);
  EXPECT_EQ(pool.reserved_cells(), 0);
  pool.check_invariants();
}

TEST(CellPoolReservationTest, RewindGivesTheReservationBack) {
  CellPool pool(8);
  const SeqId a = pool.seq_new();
  ASSERT_TRUE(pool.set_reservation(a, 5));
  Grow(pool, a, 4);
  EXPECT_EQ(pool.reservation(a), 1);
  ASSERT_TRUE(pool.rewind(a, 1));
  EXPECT_EQ(pool.reservation(a), 4);
  pool.check_invariants();
}

TEST(CellPoolReservationTest, RewindOfSharedCellsShrinksTheReservation) {
  CellPool pool(6);
  const SeqId a = pool.seq_new();
  ASSERT_TRUE(pool.set_reservation(a, 6));
  Grow(pool, a, 4);
  const std::optional<SeqId> b = pool.seq_clone(a, 4);
  ASSERT_TRUE(b.has_value());
  // The clone keeps the 4 cells, so only 2 free cells back a's promise.
  ASSERT_TRUE(pool.rewind(a, 0));
  pool.check_invariants();
  EXPECT_EQ(pool.reservation(a), 2);
}

TEST(CellPoolReclaimerTest, CalledOnlyWhenAStepIsShort) {
  CellPool pool(6);
  std::vector<int64_t> calls;
  pool.set_reclaimer([&](int64_t need) {
    calls.push_back(need);
    return UnholdCachedOnly(pool, need);
  });
  const SeqId a = pool.seq_new();
  const Cells cells = Grow(pool, a, 4);
  for (CellId c : cells) ASSERT_TRUE(pool.hold(c));
  pool.seq_rm(a);
  const SeqId b = pool.seq_new();
  Grow(pool, b, 2);
  EXPECT_TRUE(calls.empty());
  Grow(pool, b, 3);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0], 3);
  EXPECT_EQ(pool.cached_only_cells(), 1);
  EXPECT_EQ(pool.free_cells(), 0);
  pool.check_invariants();

  // Nothing left to reclaim: the step is refused and the sequence unchanged.
  const std::vector<SeqId> two{b, b};
  EXPECT_FALSE(pool.declare_step(two).has_value());
  EXPECT_EQ(pool.pos(b), 5);
  pool.check_invariants();
}

// Random operations with the invariants checked after each; a sequence's
// declare within its reservation never fails.
TEST(CellPoolReservationTest, RandomOperationsKeepTheInvariants) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng(seed);
    auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint32_t>(n)); };
    CellPool pool(48);
    pool.set_reclaimer([&](int64_t need) { return UnholdCachedOnly(pool, need); });
    std::vector<SeqId> seqs;
    int reserved_steps = 0;
    for (int op = 0; op < 600; ++op) {
      const int kind = pick(9);
      const SeqId seq =
          seqs.empty() ? -1 : seqs[static_cast<size_t>(pick(static_cast<int>(seqs.size())))];
      switch (kind) {
        case 0:
          seqs.push_back(pool.seq_new());
          break;
        case 1:
          if (seq >= 0) {
            if (auto child = pool.seq_clone(seq, pick(pool.pos(seq) + 1))) seqs.push_back(*child);
          }
          break;
        case 2:
        case 3:
          if (seq >= 0) {
            const int n = 1 + pick(6);
            const int64_t reserved = pool.reservation(seq);
            std::vector<SeqId> ids(static_cast<size_t>(n), seq);
            const bool ok = pool.declare_step(ids).has_value();
            if (n <= reserved) {
              EXPECT_TRUE(ok) << "seed " << seed << " op " << op;
              ++reserved_steps;
            }
          }
          break;
        case 4:
          if (seq >= 0) pool.rewind(seq, pick(pool.pos(seq) + 1));
          break;
        case 5:
          if (seq >= 0) {
            pool.seq_rm(seq);
            seqs.erase(std::find(seqs.begin(), seqs.end(), seq));
          }
          break;
        case 6:
          if (seq >= 0 && pool.pos(seq) > 0) {
            pool.hold(pool.cells_of(seq)[static_cast<size_t>(pick(pool.pos(seq)))]);
          }
          break;
        case 7:
          pool.unhold(pick(pool.capacity()));
          break;
        case 8:
          if (seq >= 0) pool.set_reservation(seq, pick(12));
          break;
      }
      pool.check_invariants();
    }
    for (SeqId s : seqs) pool.seq_rm(s);
    UnholdCachedOnly(pool, pool.capacity());
    pool.check_invariants();
    EXPECT_EQ(pool.used_cells(), 0);
    EXPECT_GT(reserved_steps, 0);
  }
}

}  // namespace
}  // namespace cellm
