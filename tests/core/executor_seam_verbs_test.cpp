// The prefix-cache and reservation verbs of the executor seam (attach_prefix,
// release_cells, reserve, kv_budget) over the real CellPool and SessionTable,
// through HistoryExecutor, whose predictions are exact: a session attached to
// cached cells predicts exactly what the oracle does for its whole history.
// Also the verbs' defaults, which leave test doubles and the cache off as they were.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "cellm/executor.h"
#include "support/fake_executor.h"
#include "support/history_executor.h"

namespace cellm::testing {
namespace {

HistoryExecutorOptions options(bool prefix_cache) {
  HistoryExecutorOptions o;
  o.max_sessions = 4;
  o.max_session_tokens = 64;
  o.vocab_size = 64;
  o.step_width = 8;
  o.prefix_cache = prefix_cache;
  return o;
}

// Runs tokens[from, end) of `sid` with an output; the status of the batch.
Status run(Executor& e, SessionId sid, const std::vector<Token>& tokens, size_t from, size_t end,
           Token* next = nullptr) {
  Input in;
  in.sid = sid;
  in.tokens = std::make_shared<const std::vector<Token>>(tokens);
  in.offset = from;
  in.size = end - from;
  in.position = 0;
  in.produce_output = true;
  BatchInput b;
  b.inputs.push_back(in);
  BatchOutput o;
  Status s = e.execute(b, o);
  if (s.ok() && next != nullptr) *next = o.outputs.at(0)->tokens.at(0);
  return s;
}

std::vector<Token> range(Token from, Token to) {
  std::vector<Token> t;
  for (Token k = from; k < to; ++k) t.push_back(k);
  return t;
}

TEST(ExecutorSeamVerbsTest, DefaultsPromiseNothingAndPreemptNothing) {
  FakeExecutor e;
  const SessionId sid = *e.open_session();
  const KvBudget b = e.kv_budget();
  EXPECT_EQ(b.capacity, 0) << "unknown: policies stay off";
  EXPECT_EQ(e.attach_prefix(sid, range(1, 5)), 0);
  EXPECT_FALSE(e.release_cells(sid));
  EXPECT_TRUE(e.reserve(sid, 10));
}

TEST(ExecutorSeamVerbsTest, AnAttachedPartialPrefixPredictsExactlyAndSharesCells) {
  HistoryExecutor e(options(true));
  const std::vector<Token> a_tokens = range(1, 11);  // 10 tokens
  const SessionId a = *e.open_session();
  e.set_sampling(a, SamplingParams{}, 0);
  ASSERT_TRUE(run(e, a, a_tokens, 0, a_tokens.size()).ok());
  e.close_session(a);
  EXPECT_EQ(e.kv_metrics().cells_cached, 10);
  EXPECT_EQ(e.kv_metrics().cells_in_use, 0);

  std::vector<Token> key = range(1, 7);  // leaves A's run after 6 tokens
  key.push_back(99);
  key.push_back(100);
  const SessionId b = *e.open_session();
  e.set_sampling(b, SamplingParams{}, 0);
  ASSERT_EQ(e.attach_prefix(b, key), 6);
  KvMetrics kv = e.kv_metrics();
  EXPECT_EQ(kv.cells_in_use, 6);
  EXPECT_EQ(kv.cells_cached, 4);
  EXPECT_EQ(kv.prefix_lookups, 1);
  EXPECT_EQ(kv.prefix_hits, 1);
  EXPECT_EQ(kv.prefix_hit_tokens, 6);
  EXPECT_EQ(e.history(b), range(1, 7)) << "the attached cells hold A's tokens";
  Token next = -1;
  ASSERT_TRUE(run(e, b, key, 6, key.size(), &next).ok());
  EXPECT_EQ(next, e.greedy_continuation(key, 1).at(0));

  // Released: the cells are cached, the policy stays; attached back, the last
  // token gives the same prediction.
  ASSERT_TRUE(e.release_cells(b));
  EXPECT_EQ(e.kv_metrics().cells_in_use, 0);
  EXPECT_EQ(e.kv_metrics().cells_cached, 12);
  ASSERT_EQ(e.attach_prefix(b, std::vector<Token>(key.begin(), key.end() - 1)),
            static_cast<Position>(key.size() - 1));
  Token again = -1;
  ASSERT_TRUE(run(e, b, key, key.size() - 1, key.size(), &again).ok());
  EXPECT_EQ(again, next);
  e.close_session(b);
  const KvBudget budget = e.kv_budget();
  EXPECT_EQ(budget.free + budget.cached, budget.capacity);
  EXPECT_EQ(budget.max_context, 64);
}

TEST(ExecutorSeamVerbsTest, ReservationsAreRefusedPastThePoolAndShowInTheBudget) {
  HistoryExecutor e(options(true));
  const SessionId a = *e.open_session();
  const KvBudget before = e.kv_budget();
  EXPECT_FALSE(e.reserve(a, before.capacity + 1));
  EXPECT_TRUE(e.reserve(a, 20));
  EXPECT_EQ(e.kv_budget().reserved, 20);
  EXPECT_EQ(e.kv_metrics().cells_reserved, 20);
  EXPECT_TRUE(e.reserve(a, 0));
  EXPECT_EQ(e.kv_budget().reserved, 0);
  EXPECT_FALSE(e.reserve(a + 100, 1)) << "unknown session";
}

TEST(ExecutorSeamVerbsTest, AFailedBatchCachesNothingOfItsSessions) {
  HistoryExecutor e(options(true));
  const SessionId a = *e.open_session();  // no sampling policy: the output fails the batch
  EXPECT_FALSE(run(e, a, range(1, 9), 0, 8).ok());
  e.close_session(a);
  EXPECT_EQ(e.kv_metrics().cells_cached, 0);
}

TEST(ExecutorSeamVerbsTest, WithTheCacheOffNothingIsCachedOrAttached) {
  HistoryExecutor e(options(false));
  const SessionId a = *e.open_session();
  e.set_sampling(a, SamplingParams{}, 0);
  ASSERT_TRUE(run(e, a, range(1, 11), 0, 10).ok());
  e.close_session(a);
  const SessionId b = *e.open_session();
  EXPECT_EQ(e.attach_prefix(b, range(1, 11)), 0);
  const KvMetrics kv = e.kv_metrics();
  EXPECT_EQ(kv.cells_in_use, 0);
  EXPECT_EQ(kv.cells_cached, 0);
  EXPECT_EQ(kv.prefix_lookups, 0);
}

}  // namespace
}  // namespace cellm::testing
