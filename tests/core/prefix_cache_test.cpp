// PrefixCache on the Runner over the HistoryExecutor (prefix_cache_env.h): lookups,
// LRU and eviction, refusals and ownership of snapshots.
#include "cellm/prefix_cache.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <vector>

#include "cellm/runner.h"
#include "prefix_cache_env.h"
#include "support/history_executor.h"
#include "support/runner_harness.h"

namespace cellm::testing {
namespace {

TEST(PrefixCacheTest, EqualShorterAndExtendedPromptsReplayTheFinalToken) {
  Env env;
  PrefixCache cache(4);
  const std::vector<Token> prompt = tokens(6, 10);
  remember(env, cache, prompt);
  ASSERT_EQ(cache.size(), 1u);

  const std::vector<Token> equal = prompt;
  const std::vector<Token> shorter = head(prompt, 4);
  const std::vector<Token> extended = concat(prompt, {40, 41});
  const std::vector<std::pair<std::vector<Token>, size_t>> cases = {
      {equal, 5}, {shorter, 3}, {extended, 6}};
  size_t total = 0;
  for (const auto& [request, matched] : cases) {
    std::optional<PrefixMatch> hit = cache.lookup(request);
    ASSERT_TRUE(hit.has_value());
    EXPECT_EQ(hit->matched_tokens, matched);
    expect_warm_equals_cold(env, *hit, request);
    total += matched;
  }
  EXPECT_EQ(cache.lookups(), 3);
  EXPECT_EQ(cache.hits(), 3);
  EXPECT_EQ(cache.matched_tokens_total(), static_cast<int64_t>(total));
  EXPECT_FALSE(cache.lookup(std::vector<Token>{10}).has_value()) << "one token never matches";
  EXPECT_EQ(cache.lookups(), 4);
  cache.check_invariants();
}

TEST(PrefixCacheTest, BranchesSurviveSourceClosureAndSnapshotEviction) {
  Env env;
  PrefixCache cache(1);
  const std::vector<Token> prompt = tokens(6, 10);
  const SessionId snapshot = remember(env, cache, prompt);  // its source is closed
  const std::vector<Token> request = concat(prompt, {7});
  std::optional<PrefixMatch> branch = cache.lookup(request);
  ASSERT_TRUE(branch.has_value());

  remember(env, cache, tokens(5, 30));  // evicts the first snapshot
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_TRUE(env.executor.wait_closed(snapshot));
  EXPECT_FALSE(cache.lookup(request).has_value());

  EXPECT_EQ(env.executor.history(branch->session.id()), prompt);
  expect_warm_equals_cold(env, *branch, request);
}

TEST(PrefixCacheTest, LongestPrefixWinsOverMoreRecentShorterMatch) {
  Env env;
  PrefixCache cache(4);
  const SessionId longer = remember(env, cache, tokens(8, 10));
  const SessionId shorter = remember(env, cache, {10, 11, 12, 99, 98});
  const std::vector<Token> request = tokens(10, 10);
  std::optional<PrefixMatch> hit = cache.lookup(request);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->matched_tokens, 8u);
  EXPECT_EQ(last_clone_source(env), longer);
  EXPECT_NE(last_clone_source(env), shorter);
  expect_warm_equals_cold(env, *hit, request);
}

TEST(PrefixCacheTest, EqualLengthMatchesPreferTheMostRecentlyUsedSnapshot) {
  Env env;
  PrefixCache cache(4);
  const std::vector<Token> x = {10, 11, 12, 13, 50};
  const std::vector<Token> y = {10, 11, 12, 13, 60};
  const SessionId snap_x = remember(env, cache, x);
  const SessionId snap_y = remember(env, cache, y);
  const std::vector<Token> request = {10, 11, 12, 13, 70, 71};

  std::optional<PrefixMatch> first = cache.lookup(request);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->matched_tokens, 4u);
  EXPECT_EQ(last_clone_source(env), snap_y) << "the most recently inserted wins a tie";
  expect_warm_equals_cold(env, *first, request);

  std::optional<PrefixMatch> use_x = cache.lookup(concat(x, {1}));
  ASSERT_TRUE(use_x.has_value());
  EXPECT_EQ(last_clone_source(env), snap_x);

  std::optional<PrefixMatch> second = cache.lookup(request);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(last_clone_source(env), snap_x) << "a hit makes x the most recently used";
  expect_warm_equals_cold(env, *second, request);
}

TEST(PrefixCacheTest, DuplicateInsertRefreshesLruAndReleasesTheNewSnapshot) {
  Env env;
  PrefixCache cache(2);
  const std::vector<Token> a = tokens(5, 10);
  const std::vector<Token> b = tokens(5, 30);
  const SessionId snap_a = remember(env, cache, a);
  const SessionId snap_b = remember(env, cache, b);

  Session source = open_session(env.runner);
  run(source, a, 2);
  std::optional<Session> duplicate = clone_now(source, static_cast<Position>(a.size()));
  ASSERT_TRUE(duplicate.has_value());
  const SessionId dup_id = duplicate->id();
  EXPECT_TRUE(cache.insert(a, std::move(*duplicate)));
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_TRUE(env.executor.wait_closed(dup_id)) << "the new snapshot is released";
  cache.check_invariants();

  remember(env, cache, tokens(5, 50));  // evicts the least recently used: b
  EXPECT_TRUE(env.executor.wait_closed(snap_b));
  EXPECT_TRUE(env.executor.is_open(snap_a));
  cache.check_invariants();
  EXPECT_FALSE(cache.lookup(concat(b, {1})).has_value());
  std::optional<PrefixMatch> hit = cache.lookup(concat(a, {1}));
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(last_clone_source(env), snap_a);
  expect_warm_equals_cold(env, *hit, concat(a, {1}));
}

TEST(PrefixCacheTest, SuccessfulLookupRefreshesLruBeforeEviction) {
  Env env;
  PrefixCache cache(2);
  const std::vector<Token> a = tokens(5, 10);
  const std::vector<Token> b = tokens(5, 30);
  const SessionId snap_a = remember(env, cache, a);
  const SessionId snap_b = remember(env, cache, b);
  std::optional<PrefixMatch> hit = cache.lookup(concat(a, {1}));
  ASSERT_TRUE(hit.has_value());

  remember(env, cache, tokens(5, 50));
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_TRUE(env.executor.wait_closed(snap_b));
  EXPECT_TRUE(env.executor.is_open(snap_a));
  cache.check_invariants();
  EXPECT_FALSE(cache.lookup(concat(b, {1})).has_value());
  std::optional<PrefixMatch> again = cache.lookup(concat(a, {2}));
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(last_clone_source(env), snap_a);
  expect_warm_equals_cold(env, *again, concat(a, {2}));
}

TEST(PrefixCacheTest, TokenKeysPreserveAllThirtyTwoBits) {
  Env env;
  PrefixCache cache(4);
  const std::vector<Token> key = {std::numeric_limits<Token>::min(), -1,
                                  std::numeric_limits<Token>::max(), 0x12345678, -77777777};
  remember(env, cache, key);

  // A token that differs from the key's only in bit 31, 30 or 16 ends the match.
  for (const uint32_t bit : {31u, 30u, 16u}) {
    for (size_t i = 0; i < key.size(); ++i) {
      std::vector<Token> request = concat(key, {5});
      request[i] = static_cast<Token>(static_cast<uint32_t>(request[i]) ^ (1u << bit));
      std::optional<PrefixMatch> hit = cache.lookup(request);
      if (i == 0) {
        EXPECT_FALSE(hit.has_value()) << "bit " << bit;
        continue;
      }
      ASSERT_TRUE(hit.has_value()) << "bit " << bit << " at " << i;
      EXPECT_EQ(hit->matched_tokens, i) << "bit " << bit;
    }
  }
  const std::vector<Token> request = concat(key, {5});
  std::optional<PrefixMatch> full = cache.lookup(request);
  ASSERT_TRUE(full.has_value());
  EXPECT_EQ(full->matched_tokens, key.size());
  expect_warm_equals_cold(env, *full, request);
}

TEST(PrefixCacheTest, DisabledCacheReleasesInsertedSnapshotWithoutCloning) {
  Env env;
  PrefixCache cache(0);
  EXPECT_FALSE(cache.enabled());
  const std::vector<Token> prompt = tokens(5, 10);
  Session source = open_session(env.runner);
  PromptCapture capture = cache.capture_prompt(source, prompt);
  EXPECT_FALSE(capture.active());
  EXPECT_EQ(run_captured(source, prompt, 2, capture), env.executor.greedy_continuation(prompt, 2));
  EXPECT_FALSE(capture.collect());
  EXPECT_TRUE(env.executor.clones().empty()) << "a disabled capture clones nothing";

  std::optional<Session> snapshot = clone_now(source, static_cast<Position>(prompt.size()));
  ASSERT_TRUE(snapshot.has_value());
  const SessionId snap = snapshot->id();
  EXPECT_FALSE(cache.insert(prompt, std::move(*snapshot)));
  EXPECT_TRUE(env.executor.wait_closed(snap));
  EXPECT_EQ(cache.size(), 0u);

  const size_t clones_before = env.executor.clones().size();
  EXPECT_FALSE(cache.lookup(concat(prompt, {1})).has_value());
  EXPECT_EQ(env.executor.clones().size(), clones_before);
  EXPECT_EQ(cache.lookups(), 1);
  EXPECT_EQ(cache.hits(), 0);
}

TEST(PrefixCacheTest, InvalidInsertReleasesOwnershipAndPreservesExistingEntry) {
  Env env;
  PrefixCache cache(4);
  const std::vector<Token> a = tokens(6, 10);
  const SessionId snap_a = remember(env, cache, a);

  Session source = open_session(env.runner);
  run(source, a, 2);
  std::optional<Session> wrong = clone_now(source, 3);  // not at a.size()
  ASSERT_TRUE(wrong.has_value());
  const SessionId wrong_id = wrong->id();
  EXPECT_FALSE(cache.insert(a, std::move(*wrong)));
  EXPECT_TRUE(env.executor.wait_closed(wrong_id));

  EXPECT_FALSE(cache.insert(a, Session{}));
  std::optional<Session> empty = clone_now(source, 0);
  ASSERT_TRUE(empty.has_value());
  const SessionId empty_id = empty->id();
  EXPECT_FALSE(cache.insert({}, std::move(*empty))) << "an empty key is refused";
  EXPECT_TRUE(env.executor.wait_closed(empty_id));

  EXPECT_EQ(cache.size(), 1u);
  std::optional<PrefixMatch> hit = cache.lookup(concat(a, {1}));
  cache.check_invariants();
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(last_clone_source(env), snap_a);
  EXPECT_EQ(hit->matched_tokens, a.size());
  expect_warm_equals_cold(env, *hit, concat(a, {1}));
}

TEST(PrefixCacheTest, RetentionRefusalPreservesSnapshotAndAllowsLaterHit) {
  Env env;
  PrefixCache cache(4);
  const std::vector<Token> a = tokens(6, 10);
  const SessionId snap_a = remember(env, cache, a);
  // The executor now keeps only each session's tip: a shorter boundary of the
  // snapshot is refused.
  env.executor.set_retention_window(0);
  const size_t clones_before = env.executor.clones().size();
  EXPECT_FALSE(cache.lookup(concat(head(a, 4), {99, 98})).has_value());
  const std::vector<HistoryClone> clones = env.executor.clones();
  ASSERT_EQ(clones.size(), clones_before + 1);
  EXPECT_EQ(clones.back().source, snap_a);
  EXPECT_EQ(clones.back().upto, 4);
  EXPECT_FALSE(clones.back().child.has_value());
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_TRUE(env.executor.is_open(snap_a));

  const std::vector<Token> request = concat(a, {7});
  std::optional<PrefixMatch> hit = cache.lookup(request);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->matched_tokens, a.size());
  expect_warm_equals_cold(env, *hit, request);
  EXPECT_EQ(cache.hits(), 1);
}

TEST(PrefixCacheTest, OlderSnapshotCanSatisfyARefusedNewerMatch) {
  Env env;
  PrefixCache cache(4);
  const SessionId older = remember(env, cache, tokens(6, 10));
  const SessionId newer = remember(env, cache, tokens(8, 10));
  env.executor.refuse_clones_of(newer, true);
  const size_t clones_before = env.executor.clones().size();
  const std::vector<Token> request = tokens(9, 10);
  std::optional<PrefixMatch> hit = cache.lookup(request);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->matched_tokens, 6u);

  // Each candidate once at its longest boundary: no retry of the newer one.
  const std::vector<HistoryClone> clones = env.executor.clones();
  ASSERT_EQ(clones.size(), clones_before + 2);
  EXPECT_EQ(clones[clones_before].source, newer);
  EXPECT_EQ(clones[clones_before].upto, 8);
  EXPECT_FALSE(clones[clones_before].child.has_value());
  EXPECT_EQ(clones[clones_before + 1].source, older);
  EXPECT_EQ(clones[clones_before + 1].upto, 6);
  EXPECT_EQ(cache.size(), 2u);
  expect_warm_equals_cold(env, *hit, request);
  cache.check_invariants();
}

TEST(PrefixCacheTest, CapacityRefusalDoesNotLeakOrEvictTheSnapshot) {
  Env env(options(4));
  PrefixCache cache(4);
  const std::vector<Token> a = tokens(6, 10);
  const SessionId snap_a = remember(env, cache, a);
  ASSERT_TRUE(env.executor.wait_open_count(1));
  std::vector<Session> fillers;
  for (int i = 0; i < 3; ++i) fillers.push_back(open_session(env.runner));
  ASSERT_EQ(env.executor.open_count(), 4);
  const int32_t cells = env.executor.cells_in_use();

  const std::vector<Token> request = concat(a, {7});
  EXPECT_FALSE(cache.lookup(request).has_value());
  EXPECT_FALSE(env.executor.clones().back().child.has_value());
  EXPECT_EQ(env.executor.open_count(), 4);
  EXPECT_EQ(env.executor.cells_in_use(), cells);
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_TRUE(env.executor.is_open(snap_a));

  fillers.pop_back();
  cache.check_invariants();
  ASSERT_TRUE(env.executor.wait_open_count(3));
  std::optional<PrefixMatch> hit = cache.lookup(request);
  ASSERT_TRUE(hit.has_value());
  expect_warm_equals_cold(env, *hit, request);
}

TEST(PrefixCacheTest, CloneAllocationFailureIsAMissAndTheEngineRemainsUsable) {
  Env env;
  PrefixCache cache(4);
  const std::vector<Token> a = tokens(6, 10);
  remember(env, cache, a);
  ASSERT_TRUE(env.executor.wait_open_count(1));
  env.executor.fail_next_clone_allocations(1);
  const std::vector<Token> request = concat(a, {7});
  EXPECT_FALSE(cache.lookup(request).has_value());
  EXPECT_EQ(env.executor.open_count(), 1);
  EXPECT_EQ(cache.size(), 1u);

  Session fresh = open_session(env.runner);
  const std::vector<Token> other = tokens(4, 40);
  EXPECT_EQ(run(fresh, other, 4), env.executor.greedy_continuation(other, 4));
  std::optional<PrefixMatch> hit = cache.lookup(request);
  ASSERT_TRUE(hit.has_value());
  expect_warm_equals_cold(env, *hit, request);
}

TEST(PrefixCacheTest, ClearAndDestructionReleaseOnlyOwnedSnapshots) {
  Env env;
  const std::vector<Token> a = tokens(6, 10);
  const std::vector<Token> c = tokens(6, 50);
  std::optional<PrefixMatch> branch;
  std::optional<PrefixMatch> late_branch;
  {
    PrefixCache cache(4);
    const SessionId snap_a = remember(env, cache, a);
    const SessionId snap_b = remember(env, cache, tokens(6, 30));
    branch = cache.lookup(concat(a, {1}));
    ASSERT_TRUE(branch.has_value());
    ASSERT_TRUE(env.executor.wait_open_count(3));

    cache.clear();
    cache.check_invariants();
    EXPECT_EQ(cache.size(), 0u);
    EXPECT_TRUE(env.executor.wait_closed(snap_a));
    EXPECT_TRUE(env.executor.wait_closed(snap_b));
    EXPECT_TRUE(env.executor.wait_open_count(1));
    EXPECT_TRUE(env.executor.is_open(branch->session.id()));
    EXPECT_FALSE(cache.lookup(concat(a, {1})).has_value());

    const SessionId snap_c = remember(env, cache, c);
    late_branch = cache.lookup(concat(c, {1}));
    ASSERT_TRUE(late_branch.has_value());
    ASSERT_TRUE(env.executor.wait_open_count(3));
    EXPECT_TRUE(env.executor.is_open(snap_c));
  }
  EXPECT_TRUE(env.executor.wait_open_count(2)) << "destruction released the owned snapshot";
  expect_warm_equals_cold(env, *branch, concat(a, {1}));
  expect_warm_equals_cold(env, *late_branch, concat(c, {1}));
}

TEST(PrefixCacheTest, ManagerAndReturnedSessionsMayOutliveRunner) {
  HistoryExecutor executor(options());
  PrefixCache cache(4);
  std::optional<PrefixMatch> hit;
  const std::vector<Token> a = tokens(6, 10);
  const std::vector<Token> request = concat(a, {1});
  {
    Runner runner(executor, make_scheduler(4, 4));
    Session source = open_session(runner);
    PromptCapture capture = cache.capture_prompt(source, a);
    EXPECT_EQ(run_captured(source, a, 2, capture), executor.greedy_continuation(a, 2));
    ASSERT_TRUE(capture.collect());
    hit = cache.lookup(request);
    ASSERT_TRUE(hit.has_value());
    // Before the runner goes, the branch continues exactly.
    const std::vector<Token> suffix(request.begin() + 6, request.end());
    EXPECT_EQ(run(hit->session, suffix, 3), executor.greedy_continuation(request, 3));
  }
  EXPECT_EQ(executor.open_count(), 0) << "shutdown closed every session";
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_FALSE(cache.lookup(request).has_value());
  auto updates = std::make_shared<Updates>();
  GenerationHandle late = generate(hit->session, {3}, config(2), updates);
  EXPECT_TRUE(late.done());
  EXPECT_EQ(late.finish_reason(), FinishReason::kCancelled);
  cache.clear();
  hit.reset();
  EXPECT_EQ(executor.open_count(), 0);
}

}  // namespace
}  // namespace cellm::testing
