// SessionTable with the prefix cache on: history, close/release into the
// cache, attach_prefix, and a randomized run checking every refcount.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "core/session_table.h"

namespace cellm {
namespace {

using Tokens = std::vector<Token>;

Input Slice(SessionId sid, Tokens tokens, Position start, bool produce_output = false) {
  Input in;
  in.sid = sid;
  in.produce_output = produce_output;
  in.offset = 0;
  in.size = tokens.size();
  in.tokens = std::make_shared<const std::vector<Token>>(std::move(tokens));
  in.position = start;
  return in;
}

BatchInput Batch(std::vector<Input> inputs) {
  BatchInput batch;
  batch.inputs = std::move(inputs);
  return batch;
}

Tokens AsVector(std::span<const Token> tokens) {
  return Tokens(tokens.begin(), tokens.end());
}

class SessionTablePrefixTest : public ::testing::Test {
 protected:
  static constexpr int32_t kCells = 64;
  static constexpr int32_t kSessions = 8;
  static constexpr int32_t kSessionTokens = 24;
  static constexpr int32_t kVocab = 8;

  // Packs and declares, as an executor does for one forward.
  bool Commit(const BatchInput& batch) {
    Result<PackedStep> step = table.pack(batch);
    EXPECT_TRUE(step.ok()) << step.status().to_string();
    if (!step.ok()) return false;
    const bool placed = pool.declare_step(step->seq_ids).has_value();
    Check();
    return placed;
  }
  void Check() const {
    pool.check_invariants();
    table.prefix_cache()->check_invariants();
  }
  Position PosOf(SessionId sid) const { return pool.pos(*table.seq_of(sid)); }
  std::vector<CellId> CellsOf(SessionId sid) const {
    std::span<const CellId> cells = pool.cells_of(*table.seq_of(sid));
    return std::vector<CellId>(cells.begin(), cells.end());
  }

  CellPool pool{kCells};
  SessionTable table{pool, kSessions, kSessionTokens, kVocab, /*prefix_cache=*/true};
};

TEST(SessionTableNoCacheTest, OffByDefault) {
  CellPool pool(16);
  SessionTable table(pool, 2, 8, 4);
  EXPECT_EQ(table.prefix_cache(), nullptr);
  const SessionId a = *table.open();
  ASSERT_TRUE(table.pack(Batch({Slice(a, {1, 2, 3}, 0)})).ok());
  EXPECT_TRUE(table.history(a).empty());
  EXPECT_EQ(table.attach_prefix(a, Tokens{1, 2}, 100), 0);
  table.close(a);
  EXPECT_EQ(pool.used_cells(), 0);
}

TEST_F(SessionTablePrefixTest, HistoryFollowsRewinds) {
  const SessionId a = *table.open();
  ASSERT_TRUE(Commit(Batch({Slice(a, {1, 2, 3, 4}, 0)})));
  EXPECT_EQ(AsVector(table.history(a)), (Tokens{1, 2, 3, 4}));
  ASSERT_TRUE(Commit(Batch({Slice(a, {5, 6}, 2)})));  // rewinds to 2
  EXPECT_EQ(AsVector(table.history(a)), (Tokens{1, 2, 5, 6}));
  table.note_committed(a, 4, 7);  // a step run ahead, outside pack
  EXPECT_EQ(AsVector(table.history(a)), (Tokens{1, 2, 5, 6, 7}));
  table.note_committed(a, 9, 1);  // a hole: nothing of a can be trusted
  EXPECT_TRUE(table.history(a).empty());
  const size_t cached = static_cast<size_t>(table.prefix_cache()->cached_cells());
  table.close(a);
  EXPECT_EQ(static_cast<size_t>(table.prefix_cache()->cached_cells()), cached);
  Check();
}

TEST_F(SessionTablePrefixTest, CloseCachesOnlyTheCommittedTokens) {
  const SessionId a = *table.open();
  ASSERT_TRUE(Commit(Batch({Slice(a, {1, 2, 3, 4}, 0)})));
  // Packed but never declared: the history runs past the cells.
  ASSERT_TRUE(table.pack(Batch({Slice(a, {5, 6}, 4)})).ok());
  table.close(a);
  Check();
  EXPECT_EQ(table.prefix_cache()->cached_cells(), 4);
  EXPECT_EQ(pool.cached_only_cells(), 4);
}

TEST_F(SessionTablePrefixTest, TaintedSessionsCacheNothing) {
  const SessionId a = *table.open();
  ASSERT_TRUE(Commit(Batch({Slice(a, {1, 2, 3}, 0)})));
  table.taint(a);
  table.close(a);
  Check();
  EXPECT_EQ(pool.used_cells(), 0);
}

TEST_F(SessionTablePrefixTest, AttachOfAPartialPrefixSharesCells) {
  const SessionId a = *table.open();
  ASSERT_TRUE(Commit(Batch({Slice(a, {1, 2, 3, 4, 5, 6}, 0)})));
  const std::vector<CellId> a_cells = CellsOf(a);
  table.close(a);
  EXPECT_EQ(pool.cached_only_cells(), 6);

  const SessionId b = *table.open();
  EXPECT_EQ(table.attach_prefix(b, Tokens{1, 2, 3, 4, 0, 0}, 100), 4);
  Check();
  EXPECT_EQ(PosOf(b), 4);
  EXPECT_EQ(AsVector(table.history(b)), (Tokens{1, 2, 3, 4}));
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(pool.refcount(a_cells[static_cast<size_t>(i)]), i < 4 ? 2 : 1);
  EXPECT_EQ(table.attach_prefix(b, Tokens{1, 2}, 100), 0);  // not empty

  // A second session on the same prefix, and a clone of b.
  const SessionId c = *table.open();
  EXPECT_EQ(table.attach_prefix(c, Tokens{1, 2, 9}, 100), 2);
  const SessionId d = *table.clone(b, 3);
  EXPECT_EQ(AsVector(table.history(d)), (Tokens{1, 2, 3}));
  EXPECT_EQ(pool.refcount(a_cells[0]), 4);
  EXPECT_EQ(pool.refcount(a_cells[2]), 3);
  EXPECT_EQ(pool.refcount(a_cells[3]), 2);
  Check();

  // b continues past the shared cells; closing caches only its new suffix.
  ASSERT_TRUE(Commit(Batch({Slice(b, {7, 7}, 4)})));
  table.close(b);
  table.close(c);
  table.close(d);
  Check();
  EXPECT_EQ(table.prefix_cache()->cached_cells(), 8);
  EXPECT_EQ(pool.cached_only_cells(), 8);
  EXPECT_EQ(pool.used_cells(), 8);
}

TEST_F(SessionTablePrefixTest, AttachPinsNoMoreThanAsked) {
  const SessionId a = *table.open();
  ASSERT_TRUE(Commit(Batch({Slice(a, {1, 2, 3, 4}, 0)})));
  table.close(a);
  const SessionId b = *table.open();
  EXPECT_EQ(table.attach_prefix(b, Tokens{1, 2, 3, 4}, 3), 3);
  Check();
}

TEST_F(SessionTablePrefixTest, ReleaseKeepsTheIdAndThePolicy) {
  const SessionId a = *table.open();
  SamplingParams params;
  params.temperature = 0.7f;
  table.set_sampling(a, params, std::nullopt);  // a random seed is drawn here
  const uint64_t seed = table.policy_of(a)->seed;
  ASSERT_TRUE(Commit(Batch({Slice(a, {3, 1, 4, 1, 5}, 0)})));
  ASSERT_TRUE(table.release_cells(a));
  Check();
  EXPECT_EQ(PosOf(a), 0);
  EXPECT_TRUE(table.history(a).empty());
  ASSERT_NE(table.policy_of(a), nullptr);
  EXPECT_EQ(table.policy_of(a)->seed, seed);
  EXPECT_EQ(table.policy_of(a)->params.temperature, 0.7f);
  EXPECT_EQ(pool.cached_only_cells(), 5);
  EXPECT_FALSE(table.release_cells(a + 100));

  // The session resumes from its cached cells.
  EXPECT_EQ(table.attach_prefix(a, Tokens{3, 1, 4, 1, 5}, 100), 5);
  EXPECT_EQ(pool.cached_only_cells(), 0);
  Check();
}

TEST_F(SessionTablePrefixTest, TheReclaimerEvictsFromTheCache) {
  const SessionId a = *table.open();
  ASSERT_TRUE(Commit(Batch({Slice(a, Tokens(20, 1), 0)})));
  table.close(a);
  // Three sessions of 20 tokens need 60 cells; 44 are free, 20 cached.
  for (Token t = 2; t < 5; ++t) {
    const SessionId s = *table.open();
    ASSERT_TRUE(Commit(Batch({Slice(s, Tokens(20, t), 0)})));
  }
  EXPECT_EQ(table.prefix_cache()->evicted_cells(), 16);
  EXPECT_EQ(table.prefix_cache()->cached_cells(), 4);
  Check();
}

// Random sessions over a tiny vocabulary so prefixes repeat: commits with
// rewinds, clones, attaches, releases and closes, with the pool's and the
// cache's invariants checked after each. At the end everything is cached-only.
TEST_F(SessionTablePrefixTest, RandomSessionsKeepEveryRefcount) {
  int64_t attached = 0;
  int64_t released = 0;
  int64_t evicted_under_pressure = 0;
  int64_t evicted_before = 0;
  for (uint32_t seed = 1; seed <= 10; ++seed) {
    std::mt19937 rng(seed);
    auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint32_t>(n)); };
    auto tokens = [&](int n) {
      Tokens t(static_cast<size_t>(n));
      for (Token& x : t) x = static_cast<Token>(pick(2));
      return t;
    };
    std::vector<SessionId> open;
    for (int op = 0; op < 400; ++op) {
      const SessionId sid =
          open.empty() ? 0 : open[static_cast<size_t>(pick(static_cast<int>(open.size())))];
      switch (pick(7)) {
        case 0:
          if (auto s = table.open()) {
            open.push_back(*s);
            attached += table.attach_prefix(*s, tokens(12), pick(8));
          }
          break;
        case 1:
        case 2:
          if (sid != 0) {
            const Position pos = PosOf(sid);
            const Position start = pos > 0 ? pos - pick(std::min(pos, 3)) : 0;
            const int n = 1 + pick(5);
            if (start + n <= kSessionTokens && (start > 0 || pos == 0)) {
              Commit(Batch({Slice(sid, tokens(n), start)}));
            }
          }
          break;
        case 3:
          if (sid != 0) {
            if (auto s = table.clone(sid, pick(PosOf(sid) + 1))) open.push_back(*s);
          }
          break;
        case 4:
          if (sid != 0) {
            released += PosOf(sid);
            table.release_cells(sid);
          }
          break;
        case 5:
          if (sid != 0) {
            table.close(sid);
            open.erase(std::find(open.begin(), open.end(), sid));
          }
          break;
        case 6:
          if (sid != 0 && pick(4) == 0) table.taint(sid);
          break;
      }
      Check();
      // An untainted history covers at least the committed cells.
      for (SessionId s : open) {
        const std::span<const Token> h = table.history(s);
        if (!h.empty()) {
          EXPECT_GE(h.size(), static_cast<size_t>(PosOf(s)));
        }
      }
    }
    for (SessionId s : open) table.close(s);
    Check();
    EXPECT_EQ(pool.cached_only_cells(), pool.used_cells());
    evicted_under_pressure += table.prefix_cache()->evicted_cells() - evicted_before;
    table.prefix_cache()->evict(kCells);
    evicted_before = table.prefix_cache()->evicted_cells();
    EXPECT_EQ(pool.used_cells(), 0);
  }
  // The run exercised hits, releases and evictions under pressure.
  EXPECT_GT(attached, 0);
  EXPECT_GT(released, 0);
  EXPECT_GT(evicted_under_pressure, 0);
}

}  // namespace
}  // namespace cellm
