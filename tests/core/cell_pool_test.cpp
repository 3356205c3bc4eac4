#include "core/cell_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace cellm {
namespace {

using Cells = std::vector<CellId>;

Cells CellsOf(const CellPool& pool, SeqId seq) {
  std::span<const CellId> cells = pool.cells_of(seq);
  return Cells(cells.begin(), cells.end());
}

// Appends `n` tokens to `seq` in one step and returns the cells they took.
Cells Grow(CellPool& pool, SeqId seq, int n) {
  std::vector<SeqId> ids(static_cast<size_t>(n), seq);
  std::optional<StepPlacement> placement = pool.declare_step(ids);
  EXPECT_TRUE(placement.has_value());
  pool.check_invariants();
  return placement ? placement->cells : Cells{};
}

// Everything observable about a pool, to show that a refused call changed nothing.
struct Snapshot {
  int32_t used_cells = 0;
  int32_t used_end = 0;
  int32_t num_seqs = 0;
  std::map<SeqId, Cells> seqs;
  std::vector<int32_t> refcounts;
  std::vector<std::optional<Position>> positions;

  static Snapshot Of(const CellPool& pool, SeqId max_seq_id) {
    Snapshot s;
    s.used_cells = pool.used_cells();
    s.used_end = pool.used_end();
    s.num_seqs = pool.num_seqs();
    for (SeqId seq = 0; seq < max_seq_id; ++seq) {
      if (pool.seq_live(seq)) s.seqs[seq] = CellsOf(pool, seq);
    }
    for (CellId c = 0; c < pool.capacity(); ++c) {
      s.refcounts.push_back(pool.refcount(c));
      s.positions.push_back(pool.cell_position(c));
    }
    return s;
  }
  bool operator==(const Snapshot&) const = default;
};

TEST(CellPoolPlacementTest, NewTokensTakeTheLowestFreeCell) {
  CellPool pool(8);
  EXPECT_EQ(pool.used_end(), 0);
  const SeqId a = pool.seq_new();
  std::optional<StepPlacement> p = pool.declare_step(std::vector<SeqId>{a, a, a});
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->cells, (Cells{0, 1, 2}));
  EXPECT_EQ(p->positions, (std::vector<Position>{0, 1, 2}));
  EXPECT_EQ(pool.pos(a), 3);
  EXPECT_EQ(pool.used_cells(), 3);
  EXPECT_EQ(pool.free_cells(), 5);
  EXPECT_EQ(pool.used_end(), 3);
  for (CellId c = 0; c < 3; ++c) {
    EXPECT_EQ(pool.refcount(c), 1);
    EXPECT_EQ(pool.cell_position(c), c);
  }
  EXPECT_EQ(pool.refcount(3), 0);
  EXPECT_EQ(pool.cell_position(3), std::nullopt);
  pool.check_invariants();
}

TEST(CellPoolPlacementTest, FreedHolesRefillBeforeThePoolGrows) {
  CellPool pool(16);
  const SeqId a = pool.seq_new();
  const SeqId b = pool.seq_new();
  const SeqId c = pool.seq_new();
  EXPECT_EQ(Grow(pool, a, 2), (Cells{0, 1}));
  EXPECT_EQ(Grow(pool, b, 2), (Cells{2, 3}));
  EXPECT_EQ(Grow(pool, c, 1), (Cells{4}));
  pool.seq_rm(b);
  pool.check_invariants();
  EXPECT_EQ(pool.used_end(), 5);  // cell 4 still holds c's token
  EXPECT_EQ(Grow(pool, c, 3), (Cells{2, 3, 5}));
  EXPECT_EQ(CellsOf(pool, c), (Cells{4, 2, 3, 5}));
  EXPECT_EQ(pool.cell_position(2), 1);
  EXPECT_EQ(pool.used_end(), 6);
  pool.seq_rm(c);
  pool.check_invariants();
  EXPECT_EQ(pool.used_end(), 2);  // the extent shrinks past the trailing free cells
  pool.seq_rm(a);
  EXPECT_EQ(pool.used_end(), 0);
  pool.check_invariants();
}

TEST(CellPoolPlacementTest, InterleavedSequencesInOneStepGetConsecutivePositionsPerSequence) {
  CellPool pool(16);
  const SeqId a = pool.seq_new();
  const SeqId b = pool.seq_new();
  Grow(pool, a, 1);
  std::optional<StepPlacement> p = pool.declare_step(std::vector<SeqId>{a, b, a, b, b});
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->cells, (Cells{1, 2, 3, 4, 5}));
  EXPECT_EQ(p->positions, (std::vector<Position>{1, 0, 2, 1, 2}));
  EXPECT_EQ(CellsOf(pool, a), (Cells{0, 1, 3}));
  EXPECT_EQ(CellsOf(pool, b), (Cells{2, 4, 5}));
  EXPECT_EQ(pool.pos(a), 3);
  EXPECT_EQ(pool.pos(b), 3);
  pool.check_invariants();
}

TEST(CellPoolPlacementTest, DeclareIsRefusedWhenTooFewCellsAreFree) {
  CellPool pool(4);
  const SeqId a = pool.seq_new();
  const SeqId b = pool.seq_new();
  Grow(pool, a, 2);
  Grow(pool, b, 1);
  const Snapshot before = Snapshot::Of(pool, 4);
  EXPECT_FALSE(pool.declare_step(std::vector<SeqId>{a, b}).has_value());
  EXPECT_EQ(Snapshot::Of(pool, 4), before);
  pool.check_invariants();
  // Exactly enough is fine.
  std::optional<StepPlacement> p = pool.declare_step(std::vector<SeqId>{b});
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->cells, (Cells{3}));
  EXPECT_EQ(pool.free_cells(), 0);
  EXPECT_FALSE(pool.declare_step(std::vector<SeqId>{a}).has_value());
  pool.check_invariants();
}

TEST(CellPoolPlacementTest, DeclareIsRefusedWhenAnySequenceIsNotLive) {
  CellPool pool(16);
  const SeqId a = pool.seq_new();
  const SeqId b = pool.seq_new();
  Grow(pool, a, 2);
  pool.seq_rm(b);
  const Snapshot before = Snapshot::Of(pool, 4);
  EXPECT_FALSE(pool.declare_step(std::vector<SeqId>{a, b}).has_value());
  EXPECT_FALSE(pool.declare_step(std::vector<SeqId>{a, 7}).has_value());
  EXPECT_FALSE(pool.declare_step(std::vector<SeqId>{-1, a}).has_value());
  EXPECT_EQ(Snapshot::Of(pool, 4), before);
  pool.check_invariants();
}

TEST(CellPoolPlacementTest, AnEmptyStepPlacesNothing) {
  CellPool pool(4);
  std::optional<StepPlacement> p = pool.declare_step({});
  ASSERT_TRUE(p.has_value());
  EXPECT_TRUE(p->cells.empty());
  EXPECT_EQ(pool.used_cells(), 0);
}

TEST(CellPoolCloneTest, CloneSharesCellsWithoutTakingNewOnes) {
  CellPool pool(16);
  const SeqId a = pool.seq_new();
  Grow(pool, a, 4);
  std::optional<SeqId> b = pool.seq_clone(a, 4);
  ASSERT_TRUE(b.has_value());
  EXPECT_NE(*b, a);
  EXPECT_EQ(CellsOf(pool, *b), CellsOf(pool, a));
  EXPECT_EQ(pool.pos(*b), 4);
  EXPECT_EQ(pool.used_cells(), 4);
  EXPECT_EQ(pool.num_seqs(), 2);
  for (CellId c = 0; c < 4; ++c) EXPECT_EQ(pool.refcount(c), 2);
  pool.check_invariants();
}

TEST(CellPoolCloneTest, WritesAfterCloneGoToNewCellsForBoth) {
  CellPool pool(16);
  const SeqId a = pool.seq_new();
  Grow(pool, a, 3);
  const SeqId b = *pool.seq_clone(a, 2);
  std::optional<StepPlacement> p = pool.declare_step(std::vector<SeqId>{a, b});
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->cells, (Cells{3, 4}));
  EXPECT_EQ(p->positions, (std::vector<Position>{3, 2}));
  EXPECT_EQ(CellsOf(pool, a), (Cells{0, 1, 2, 3}));
  EXPECT_EQ(CellsOf(pool, b), (Cells{0, 1, 4}));
  EXPECT_EQ(pool.refcount(0), 2);
  EXPECT_EQ(pool.refcount(1), 2);
  EXPECT_EQ(pool.refcount(2), 1);
  EXPECT_EQ(pool.refcount(3), 1);
  EXPECT_EQ(pool.refcount(4), 1);
  EXPECT_EQ(pool.cell_position(4), 2);
  pool.check_invariants();
}

TEST(CellPoolCloneTest, ClonedCellsFreeOnlyWhenTheLastOwnerLeaves) {
  CellPool pool(16);
  const SeqId a = pool.seq_new();
  Grow(pool, a, 3);
  const SeqId b = *pool.seq_clone(a, 3);
  pool.seq_rm(a);
  pool.check_invariants();
  EXPECT_FALSE(pool.seq_live(a));
  EXPECT_EQ(pool.used_cells(), 3);
  EXPECT_EQ(pool.used_end(), 3);
  for (CellId c = 0; c < 3; ++c) {
    EXPECT_EQ(pool.refcount(c), 1);
    EXPECT_EQ(pool.cell_position(c), c);
  }
  pool.seq_rm(b);
  pool.check_invariants();
  EXPECT_EQ(pool.used_cells(), 0);
  EXPECT_EQ(pool.used_end(), 0);
  EXPECT_EQ(pool.num_seqs(), 0);
}

TEST(CellPoolCloneTest, CloneAtZeroIsEmptyAndACloneOfACloneSharesTheSameCells) {
  CellPool pool(16);
  const SeqId a = pool.seq_new();
  Grow(pool, a, 3);
  const SeqId empty = *pool.seq_clone(a, 0);
  EXPECT_EQ(pool.pos(empty), 0);
  EXPECT_EQ(pool.used_cells(), 3);
  const SeqId b = *pool.seq_clone(a, 3);
  const SeqId c = *pool.seq_clone(b, 2);
  EXPECT_EQ(CellsOf(pool, c), (Cells{0, 1}));
  EXPECT_EQ(pool.refcount(0), 3);
  EXPECT_EQ(pool.refcount(1), 3);
  EXPECT_EQ(pool.refcount(2), 2);
  EXPECT_EQ(Grow(pool, empty, 1), (Cells{3}));
  EXPECT_EQ(pool.cell_position(3), 0);
  // A clone of an empty sequence is allowed too.
  const SeqId fresh = pool.seq_new();
  EXPECT_TRUE(pool.seq_clone(fresh, 0).has_value());
  pool.check_invariants();
}

TEST(CellPoolCloneTest, CloneIsRefusedBeyondThePositionOrFromADeadSequence) {
  CellPool pool(16);
  const SeqId a = pool.seq_new();
  const SeqId dead = pool.seq_new();
  Grow(pool, a, 3);
  pool.seq_rm(dead);
  const Snapshot before = Snapshot::Of(pool, 4);
  EXPECT_FALSE(pool.seq_clone(a, 4).has_value());
  EXPECT_FALSE(pool.seq_clone(a, -1).has_value());
  EXPECT_FALSE(pool.seq_clone(dead, 0).has_value());
  EXPECT_FALSE(pool.seq_clone(42, 0).has_value());
  EXPECT_EQ(Snapshot::Of(pool, 4), before);
  pool.check_invariants();
}

TEST(CellPoolRewindTest, RewindDropsAndFreesOnlyUnsharedCells) {
  CellPool pool(16);
  const SeqId a = pool.seq_new();
  Grow(pool, a, 4);
  const SeqId b = *pool.seq_clone(a, 2);
  EXPECT_TRUE(pool.rewind(a, 1));
  pool.check_invariants();
  EXPECT_EQ(CellsOf(pool, a), (Cells{0}));
  EXPECT_EQ(pool.pos(a), 1);
  EXPECT_EQ(pool.refcount(0), 2);
  EXPECT_EQ(pool.refcount(1), 1);  // still b's
  EXPECT_EQ(pool.refcount(2), 0);
  EXPECT_EQ(pool.refcount(3), 0);
  EXPECT_EQ(pool.used_cells(), 2);
  EXPECT_EQ(pool.used_end(), 2);
  // The sequence continues at the rewound position, in the lowest free cell.
  std::optional<StepPlacement> p = pool.declare_step(std::vector<SeqId>{a});
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->cells, (Cells{2}));
  EXPECT_EQ(p->positions, (std::vector<Position>{1}));
  EXPECT_EQ(CellsOf(pool, b), (Cells{0, 1}));
  pool.check_invariants();
}

TEST(CellPoolRewindTest, RewindIsRefusedOutOfRange) {
  CellPool pool(16);
  const SeqId a = pool.seq_new();
  Grow(pool, a, 4);
  const Snapshot before = Snapshot::Of(pool, 2);
  EXPECT_FALSE(pool.rewind(a, 5));
  EXPECT_FALSE(pool.rewind(a, -1));
  EXPECT_FALSE(pool.rewind(1, 0));
  EXPECT_TRUE(pool.rewind(a, 4));  // a no-op at the end
  EXPECT_EQ(Snapshot::Of(pool, 2), before);
  EXPECT_TRUE(pool.rewind(a, 0));
  EXPECT_EQ(pool.pos(a), 0);
  EXPECT_EQ(pool.used_cells(), 0);
  EXPECT_TRUE(pool.seq_live(a));
  pool.check_invariants();
}

TEST(CellPoolSequenceTest, SequenceIdsAreReusedLowestFirstAfterRemoval) {
  CellPool pool(8);
  EXPECT_EQ(pool.seq_new(), 0);
  EXPECT_EQ(pool.seq_new(), 1);
  EXPECT_EQ(pool.seq_new(), 2);
  pool.seq_rm(1);
  pool.seq_rm(1);  // unknown now: ignored
  pool.seq_rm(99);
  pool.seq_rm(-3);
  EXPECT_EQ(pool.num_seqs(), 2);
  EXPECT_EQ(pool.seq_new(), 1);
  pool.seq_rm(2);
  pool.seq_rm(0);
  pool.check_invariants();
  EXPECT_EQ(pool.seq_new(), 0);
  EXPECT_EQ(pool.seq_new(), 2);
  EXPECT_EQ(pool.seq_new(), 3);
  EXPECT_EQ(pool.pos(2), 0);  // a reused id starts empty
  pool.check_invariants();
}

TEST(CellPoolSequenceTest, ThereIsNoLimitOnTheNumberOfSequences) {
  constexpr int kSeqs = 5000;
  CellPool pool(131072);
  std::vector<SeqId> seqs;
  for (int i = 0; i < kSeqs; ++i) seqs.push_back(pool.seq_new());
  EXPECT_EQ(pool.num_seqs(), kSeqs);
  // Every sequence writes in one interleaved step, then every other leaves.
  std::vector<SeqId> step;
  for (int round = 0; round < 3; ++round) step.insert(step.end(), seqs.begin(), seqs.end());
  std::optional<StepPlacement> p = pool.declare_step(step);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(pool.used_cells(), 3 * kSeqs);
  EXPECT_EQ(pool.used_end(), 3 * kSeqs);
  EXPECT_EQ(CellsOf(pool, seqs[7]), (Cells{7, kSeqs + 7, 2 * kSeqs + 7}));
  for (int i = 0; i < kSeqs; i += 2) pool.seq_rm(seqs[static_cast<size_t>(i)]);
  EXPECT_EQ(pool.num_seqs(), kSeqs / 2);
  EXPECT_EQ(pool.used_cells(), 3 * kSeqs / 2);
  // Clones of every remaining sequence take no cells.
  for (int i = 1; i < kSeqs; i += 2) {
    ASSERT_TRUE(pool.seq_clone(seqs[static_cast<size_t>(i)], 2).has_value());
  }
  EXPECT_EQ(pool.num_seqs(), kSeqs);
  EXPECT_EQ(pool.used_cells(), 3 * kSeqs / 2);
  // The freed holes refill first.
  std::optional<StepPlacement> q = pool.declare_step(std::vector<SeqId>{seqs[1], seqs[1]});
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(q->cells, (Cells{0, 2}));
  pool.check_invariants();
}

TEST(CellPoolSequenceTest, ClearRemovesEverySequenceAndFreesEveryCell) {
  CellPool pool(8);
  const SeqId a = pool.seq_new();
  Grow(pool, a, 3);
  pool.seq_clone(a, 2);
  pool.clear();
  pool.check_invariants();
  EXPECT_EQ(pool.num_seqs(), 0);
  EXPECT_EQ(pool.used_cells(), 0);
  EXPECT_EQ(pool.free_cells(), 8);
  EXPECT_EQ(pool.used_end(), 0);
  EXPECT_FALSE(pool.seq_live(a));
  for (CellId c = 0; c < 8; ++c) EXPECT_EQ(pool.refcount(c), 0);
  EXPECT_EQ(pool.seq_new(), 0);
  EXPECT_EQ(Grow(pool, 0, 2), (Cells{0, 1}));
  pool.check_invariants();
}

TEST(CellPoolDeathTest, AskingForTheCellsOfADeadSequenceAborts) {
  CellPool pool(4);
  EXPECT_DEATH(pool.pos(0), "sequence 0 is not live");
  EXPECT_DEATH(pool.cells_of(3), "sequence 3 is not live");
  EXPECT_DEATH(pool.refcount(4), "cell 4");
}

// A plain reference model: per sequence, the list of its cells (index = position).
class ReferencePool {
 public:
  explicit ReferencePool(int32_t capacity) : capacity_(capacity) {}

  std::map<SeqId, Cells> seqs;

  std::vector<int32_t> Refcounts() const {
    std::vector<int32_t> counts(static_cast<size_t>(capacity_), 0);
    for (const auto& [seq, cells] : seqs) {
      for (CellId c : cells) ++counts[static_cast<size_t>(c)];
    }
    return counts;
  }
  // The free cells, ascending.
  Cells FreeCells() const {
    std::vector<int32_t> counts = Refcounts();
    Cells free;
    for (CellId c = 0; c < capacity_; ++c) {
      if (counts[static_cast<size_t>(c)] == 0) free.push_back(c);
    }
    return free;
  }
  SeqId LowestFreeId() const {
    SeqId id = 0;
    while (seqs.count(id) != 0) ++id;
    return id;
  }

 private:
  int32_t capacity_;
};

void ExpectMatches(const CellPool& pool, const ReferencePool& ref, SeqId max_seq_id) {
  pool.check_invariants();
  for (SeqId seq = 0; seq < max_seq_id; ++seq) {
    auto it = ref.seqs.find(seq);
    ASSERT_EQ(pool.seq_live(seq), it != ref.seqs.end()) << "sequence " << seq;
    if (it != ref.seqs.end()) {
      ASSERT_EQ(CellsOf(pool, seq), it->second) << "sequence " << seq;
    }
  }
  const std::vector<int32_t> counts = ref.Refcounts();
  std::set<CellId> distinct;
  int32_t end = 0;
  for (CellId c = 0; c < pool.capacity(); ++c) {
    ASSERT_EQ(pool.refcount(c), counts[static_cast<size_t>(c)]) << "cell " << c;
    if (counts[static_cast<size_t>(c)] > 0) {
      distinct.insert(c);
      end = c + 1;
    }
  }
  for (const auto& [seq, cells] : ref.seqs) {
    for (size_t i = 0; i < cells.size(); ++i) {
      ASSERT_EQ(pool.cell_position(cells[i]), static_cast<Position>(i));
    }
  }
  ASSERT_EQ(pool.used_cells(), static_cast<int32_t>(distinct.size()));
  ASSERT_EQ(pool.used_end(), end);
  ASSERT_EQ(pool.num_seqs(), static_cast<int32_t>(ref.seqs.size()));
}

TEST(CellPoolRandomizedTest, ThousandsOfOperationsKeepTheBookkeepingConsistent) {
  constexpr int32_t kCapacity = 96;
  constexpr int kOperations = 6000;
  constexpr SeqId kMaxSeqId = 64;  // the model never holds more than 40 sequences
  CellPool pool(kCapacity);
  ReferencePool ref(kCapacity);
  std::mt19937 rng(20240611);
  auto pick = [&rng](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };
  auto random_live = [&]() {
    auto it = ref.seqs.begin();
    std::advance(it, pick(static_cast<int>(ref.seqs.size())));
    return it->first;
  };
  auto random_dead = [&]() {
    SeqId id = ref.LowestFreeId();
    return pick(2) == 0 ? id : id + 100;
  };

  std::map<std::string, int> done;  // how often each path ran
  for (int op = 0; op < kOperations; ++op) {
    const int kind = pick(100);
    if (ref.seqs.empty() || kind < 12) {
      if (ref.seqs.size() >= 40) continue;
      const SeqId expected = ref.LowestFreeId();
      ASSERT_EQ(pool.seq_new(), expected);
      ref.seqs[expected] = {};
      ++done["new"];
    } else if (kind < 24) {
      const SeqId src = random_live();
      const Cells& cells = ref.seqs[src];
      const int upto = pick(static_cast<int>(cells.size()) + 2);
      std::optional<SeqId> child = pool.seq_clone(src, upto);
      if (upto > static_cast<int>(cells.size()) || ref.seqs.size() >= 40) {
        if (upto > static_cast<int>(cells.size())) {
          ASSERT_FALSE(child.has_value());
          ++done["clone refused"];
        } else {
          ASSERT_TRUE(child.has_value());
          pool.seq_rm(*child);  // keep the model's sequence count bounded
        }
      } else {
        ASSERT_TRUE(child.has_value());
        ASSERT_EQ(*child, ref.LowestFreeId());
        ref.seqs[*child] = Cells(cells.begin(), cells.begin() + upto);
        ++done["clone"];
      }
    } else if (kind < 36) {
      if (pick(8) == 0) {
        pool.seq_rm(random_dead());
        ++done["rm dead"];
      } else {
        const SeqId seq = random_live();
        pool.seq_rm(seq);
        ref.seqs.erase(seq);
        ++done["rm"];
      }
    } else if (kind < 50) {
      const bool dead = pick(10) == 0;
      const SeqId seq = dead ? random_dead() : random_live();
      const int length = dead ? 0 : static_cast<int>(ref.seqs[seq].size());
      const int p = pick(length + 2) - (pick(10) == 0 ? 1 : 0);
      const bool ok = pool.rewind(seq, p);
      if (dead || p < 0 || p > length) {
        ASSERT_FALSE(ok);
        ++done["rewind refused"];
      } else {
        ASSERT_TRUE(ok);
        ref.seqs[seq].resize(static_cast<size_t>(p));
        ++done["rewind"];
      }
    } else {
      const int n = pick(13);
      std::vector<SeqId> ids;
      for (int i = 0; i < n; ++i) ids.push_back(random_live());
      const bool with_dead = n > 0 && pick(12) == 0;
      if (with_dead) ids[static_cast<size_t>(pick(n))] = random_dead();
      const Cells free = ref.FreeCells();
      std::optional<StepPlacement> placement = pool.declare_step(ids);
      if (with_dead || ids.size() > free.size()) {
        ASSERT_FALSE(placement.has_value());
        ++done[with_dead ? "declare refused: dead" : "declare refused: full"];
      } else {
        ASSERT_TRUE(placement.has_value());
        // The lowest free cells, in token order; each token continues its sequence.
        ASSERT_EQ(placement->cells, Cells(free.begin(), free.begin() + n));
        for (int i = 0; i < n; ++i) {
          Cells& cells = ref.seqs[ids[static_cast<size_t>(i)]];
          ASSERT_EQ(placement->positions[static_cast<size_t>(i)],
                    static_cast<Position>(cells.size()));
          cells.push_back(free[static_cast<size_t>(i)]);
        }
        ++done["declare"];
      }
    }
    ExpectMatches(pool, ref, kMaxSeqId + 100);
    if (HasFatalFailure()) FAIL() << "after operation " << op;
  }
  for (const char* path :
       {"new", "clone", "clone refused", "rm", "rm dead", "rewind", "rewind refused", "declare",
        "declare refused: dead", "declare refused: full"}) {
    EXPECT_GE(done[path], 20) << path;
  }
}

}  // namespace
}  // namespace cellm
