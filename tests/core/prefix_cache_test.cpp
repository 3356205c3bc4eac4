// PrefixCache and PromptCapture on the Runner over the
// HistoryExecutor: its predictions hash the whole committed history read back
// from the cell pool, so a continuation from a restored prefix equals the
// oracle's (the continuation computed without any cache) only if the restore
// was exact.
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
#include "support/history_executor.h"
#include "support/runner_harness.h"

namespace cellm::testing {
namespace {

using Wrapper = std::function<GenerationCallback(GenerationCallback)>;

HistoryExecutorOptions options(int32_t max_sessions = 16) {
  HistoryExecutorOptions o;
  o.max_sessions = max_sessions;
  o.max_session_tokens = 128;
  o.vocab_size = 64;
  o.step_width = 8;
  return o;
}

// The executor outlives the runner (members are destroyed in reverse order).
struct Env {
  explicit Env(const HistoryExecutorOptions& o = options())
      : executor(o), runner(executor, make_scheduler(4, 4)) {}
  HistoryExecutor executor;
  Runner runner;
};

std::vector<Token> concat(std::vector<Token> a, const std::vector<Token>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<Token> head(const std::vector<Token>& v, size_t n) {
  return std::vector<Token>(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n));
}

// Generates up to `n` greedy tokens after `delta`, delivering to `callback`;
// fails the test unless the budget ended it.
void run_raw(Session& session, const std::vector<Token>& delta, int n,
             GenerationCallback callback) {
  GenerationHandle handle = session.generate_async(delta, config(n), std::move(callback));
  handle.wait();
  EXPECT_EQ(handle.finish_reason(), FinishReason::kNewTokenLimit) << handle.error_message();
}

// As run_raw through `wrap(recorder)`; returns the delivered tokens.
std::vector<Token> run_with(Session& session, const std::vector<Token>& delta, int n,
                            const Wrapper& wrap) {
  auto updates = std::make_shared<Updates>();
  run_raw(session, delta, n, wrap(into(updates)));
  return updates->tokens();
}

std::vector<Token> run(Session& session, const std::vector<Token>& delta, int n) {
  return run_with(session, delta, n, [](GenerationCallback cb) { return cb; });
}

std::vector<Token> run_captured(Session& session, const std::vector<Token>& delta, int n,
                                const PromptCapture& capture) {
  return run_with(session, delta, n, [&](GenerationCallback cb) { return capture.wrap(cb); });
}

// Runs `prompt` on a fresh session with a capture and collects it; returns the
// snapshot's id. The source session is closed on return.
SessionId remember(Env& env, PrefixCache& cache, const std::vector<Token>& prompt) {
  Session source = open_session(env.runner);
  PromptCapture capture = cache.capture_prompt(source, prompt);
  EXPECT_EQ(run_captured(source, prompt, 3, capture), env.executor.greedy_continuation(prompt, 3));
  EXPECT_TRUE(capture.collect());
  cache.check_invariants();
  const std::vector<HistoryClone> clones = env.executor.clones();
  if (clones.empty() || !clones.back().child) {
    ADD_FAILURE() << "no snapshot was cloned";
    return 0;
  }
  EXPECT_EQ(env.executor.history(*clones.back().child), prompt);
  return *clones.back().child;
}

// Continues a hit with the request's unmatched suffix and compares with the
// oracle; also checks that only the suffix went through the executor.
void expect_warm_equals_cold(Env& env, PrefixMatch& match, const std::vector<Token>& request,
                             int n = 5) {
  ASSERT_LT(match.matched_tokens, request.size());
  ASSERT_EQ(match.session.position(), static_cast<Position>(match.matched_tokens));
  const std::vector<Token> suffix(
      request.begin() + static_cast<std::ptrdiff_t>(match.matched_tokens), request.end());
  EXPECT_EQ(run(match.session, suffix, n), env.executor.greedy_continuation(request, n));
  const std::vector<HistoryInput> inputs = env.executor.inputs_of(match.session.id());
  ASSERT_FALSE(inputs.empty());
  EXPECT_EQ(inputs.front().start, static_cast<Position>(match.matched_tokens));
  EXPECT_EQ(inputs.front().tokens, head(suffix, inputs.front().tokens.size()));
}

SessionId last_clone_source(const Env& env) {
  const std::vector<HistoryClone> clones = env.executor.clones();
  return clones.empty() ? 0 : clones.back().source;
}

std::optional<Session> clone_now(const Session& session, Position upto) {
  auto future = session.clone_async(upto);
  return settle(future);
}

GenerationUpdate update_with(std::vector<Token> tokens) {
  GenerationUpdate u;
  u.tokens = std::move(tokens);
  return u;
}

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

// ---------------------------------------------------------------------------
// Prompt capture.

TEST(PromptCaptureTest, PromptCapturePrecedesDecodeRetentionLoss) {
  Env env;
  // Clones only at a session's tip: once decode moves on, the prompt boundary
  // is gone for good.
  env.executor.set_retention_window(0);
  PrefixCache cache(4);
  const std::vector<Token> prompt = tokens(9, 10);
  Session source = open_session(env.runner);
  PromptCapture capture = cache.capture_prompt(source, prompt);
  EXPECT_EQ(run_captured(source, prompt, 6, capture), env.executor.greedy_continuation(prompt, 6));
  ASSERT_EQ(source.position(), static_cast<Position>(prompt.size() + 5));
  EXPECT_FALSE(clone_now(source, static_cast<Position>(prompt.size())).has_value())
      << "a clone taken after the generation has lost the prompt boundary";
  ASSERT_TRUE(capture.collect());
  const std::vector<Token> request = concat(prompt, {3});
  std::optional<PrefixMatch> hit = cache.lookup(request);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->matched_tokens, prompt.size());
  expect_warm_equals_cold(env, *hit, request);
}

TEST(PromptCaptureTest, PromptCaptureCopiesFullHistoryAfterPrefixReuse) {
  Env env;
  PrefixCache cache(4);
  const std::vector<Token> a = tokens(6, 10);
  remember(env, cache, a);
  const std::vector<Token> request = concat(a, {20, 21, 22});
  std::optional<PrefixMatch> hit = cache.lookup(request);
  ASSERT_TRUE(hit.has_value());
  ASSERT_EQ(hit->matched_tokens, 6u);

  PromptCapture capture = cache.capture_prompt(hit->session, request);
  const std::vector<Token> suffix(request.begin() + 6, request.end());
  EXPECT_EQ(run_captured(hit->session, suffix, 4, capture),
            env.executor.greedy_continuation(request, 4));
  ASSERT_TRUE(capture.collect());
  EXPECT_EQ(cache.size(), 2u);
  const HistoryClone snapshot = env.executor.clones().back();
  EXPECT_EQ(snapshot.source, hit->session.id());
  ASSERT_TRUE(snapshot.child.has_value());
  EXPECT_EQ(env.executor.history(*snapshot.child), request) << "the reused prefix and the suffix";

  const std::vector<Token> longer = concat(request, {1});
  std::optional<PrefixMatch> next = cache.lookup(longer);
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->matched_tokens, request.size());
  EXPECT_EQ(last_clone_source(env), *snapshot.child);
  expect_warm_equals_cold(env, *next, longer);
}

TEST(PromptCaptureTest, PromptCaptureCapacityRefusalPreservesUserTokens) {
  Env env(options(2));
  PrefixCache cache(4);
  Session source = open_session(env.runner);
  Session filler = open_session(env.runner);
  const std::vector<Token> prompt = tokens(7, 10);
  PromptCapture capture = cache.capture_prompt(source, prompt);
  EXPECT_EQ(run_captured(source, prompt, 5, capture), env.executor.greedy_continuation(prompt, 5));
  ASSERT_EQ(env.executor.clones().size(), 1u);
  EXPECT_FALSE(env.executor.clones().back().child.has_value());
  EXPECT_FALSE(capture.collect());
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_EQ(env.executor.open_count(), 2);
}

TEST(PromptCaptureTest, PromptCaptureAllocationFailurePreservesUserTokens) {
  Env env;
  PrefixCache cache(4);
  Session source = open_session(env.runner);
  const std::vector<Token> prompt = tokens(7, 10);
  env.executor.fail_next_clone_allocations(1);
  PromptCapture capture = cache.capture_prompt(source, prompt);
  EXPECT_EQ(run_captured(source, prompt, 5, capture), env.executor.greedy_continuation(prompt, 5));
  ASSERT_EQ(env.executor.clones().size(), 1u);
  EXPECT_FALSE(capture.collect());
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_EQ(env.executor.open_count(), 1);
  // The session continues exactly after the failed clone.
  const std::vector<Token> history = concat(prompt, env.executor.greedy_continuation(prompt, 5));
  EXPECT_EQ(run(source, {9}, 2), env.executor.greedy_continuation(concat(history, {9}), 2));
}

TEST(PromptCaptureTest, PromptCaptureDoesNotSwallowUserCallbackException) {
  Env env;
  PrefixCache cache(4);
  Session source = open_session(env.runner);
  const std::vector<Token> prompt = tokens(6, 10);
  PromptCapture capture = cache.capture_prompt(source, prompt);
  auto calls = std::make_shared<int>(0);
  GenerationHandle handle =
      source.generate_async(prompt, config(5), capture.wrap([calls](const GenerationUpdate&) {
        ++*calls;
        throw std::runtime_error("user callback says no");
      }));
  handle.wait();
  EXPECT_EQ(handle.finish_reason(), FinishReason::kFailed);
  EXPECT_EQ(handle.error_message(), "user callback says no");
  EXPECT_EQ(*calls, 1);
  ASSERT_TRUE(capture.collect()) << "the clone was queued before the callback threw";
  ASSERT_TRUE(env.executor.clones().back().child.has_value());
  EXPECT_EQ(env.executor.history(*env.executor.clones().back().child), prompt);
}

TEST(PromptCaptureTest, RejectedGenerationDoesNotCaptureWithoutOutput) {
  Env env;
  PrefixCache cache(4);
  Session source = open_session(env.runner);
  const std::vector<Token> prompt = tokens(6, 10);
  PromptCapture capture = cache.capture_prompt(source, prompt);
  auto updates = std::make_shared<Updates>();
  GenerationHandle handle = source.generate_async(prompt, config(0), capture.wrap(into(updates)));
  handle.wait();
  EXPECT_EQ(handle.finish_reason(), FinishReason::kFailed);
  EXPECT_EQ(updates->calls(), 1);
  EXPECT_TRUE(updates->tokens().empty());
  EXPECT_TRUE(env.executor.clones().empty());
  EXPECT_FALSE(capture.collect());
  EXPECT_EQ(cache.size(), 0u);
}

TEST(PromptCaptureTest, EmptyUpdatesDoNotConsumeFirstTerminalTokenCapture) {
  Env env;
  PrefixCache cache(4);
  Session source = open_session(env.runner);
  const std::vector<Token> prompt = tokens(6, 10);
  PromptCapture capture = cache.capture_prompt(source, prompt);
  auto updates = std::make_shared<Updates>();
  GenerationCallback callback = capture.wrap(into(updates));
  callback(GenerationUpdate{});  // no tokens: forwarded, captures nothing
  EXPECT_EQ(updates->calls(), 1);
  EXPECT_TRUE(env.executor.clones().empty());

  // Budget 1: the only engine update is terminal and carries the first token.
  GenerationHandle handle = source.generate_async(prompt, config(1), callback);
  handle.wait();
  EXPECT_EQ(handle.finish_reason(), FinishReason::kNewTokenLimit);
  EXPECT_EQ(updates->tokens(), env.executor.greedy_continuation(prompt, 1));
  ASSERT_TRUE(capture.collect());
  const std::vector<Token> request = concat(prompt, {2});
  std::optional<PrefixMatch> hit = cache.lookup(request);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->matched_tokens, prompt.size());
  expect_warm_equals_cold(env, *hit, request);
}

TEST(PromptCaptureTest, PromptCaptureIsQueuedBeforeUserCallbackClosesSource) {
  Env env;
  PrefixCache cache(4);
  auto source = std::make_shared<std::optional<Session>>(open_session(env.runner));
  const SessionId source_id = (*source)->id();
  const std::vector<Token> prompt = tokens(6, 10);
  PromptCapture capture = cache.capture_prompt(**source, prompt);
  auto updates = std::make_shared<Updates>();
  GenerationCallback close_on_first = [source, updates](const GenerationUpdate& update) {
    (*updates)(update);
    if (!update.tokens.empty()) source->reset();  // closes the source from the callback
  };
  GenerationHandle handle =
      (*source)->generate_async(prompt, config(8), capture.wrap(close_on_first));
  handle.wait();
  EXPECT_EQ(handle.finish_reason(), FinishReason::kCancelled);
  EXPECT_TRUE(env.executor.wait_closed(source_id));
  ASSERT_TRUE(capture.collect()) << "the clone was ordered before the close";
  const std::vector<Token> request = concat(prompt, {4});
  std::optional<PrefixMatch> hit = cache.lookup(request);
  ASSERT_TRUE(hit.has_value());
  expect_warm_equals_cold(env, *hit, request);
}

TEST(PromptCaptureTest, MovedPromptCaptureAndCopiedCallbackCollectOnlyOnce) {
  Env env;
  PrefixCache cache(4);
  Session source = open_session(env.runner);
  const std::vector<Token> prompt = tokens(6, 10);
  PromptCapture original = cache.capture_prompt(source, prompt);
  auto updates = std::make_shared<Updates>();
  GenerationCallback callback = original.wrap(into(updates));
  GenerationCallback copy = callback;
  PromptCapture moved = std::move(original);

  run_raw(source, prompt, 3, callback);
  EXPECT_EQ(updates->tokens(), env.executor.greedy_continuation(prompt, 3));
  copy(update_with({1, 2}));  // another non-empty update: forwarded, no second clone
  EXPECT_EQ(updates->calls(), 4);
  EXPECT_EQ(env.executor.clones().size(), 1u);

  EXPECT_FALSE(original.collect());  // NOLINT(bugprone-use-after-move)
  EXPECT_TRUE(moved.collect());
  EXPECT_FALSE(moved.collect());
  PromptCapture reassigned;
  reassigned = std::move(moved);
  EXPECT_FALSE(reassigned.collect());
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(env.executor.clones().size(), 1u);
}

TEST(PromptCaptureTest, PromptCaptureSurvivesMovingAndFreeingSourceWrapper) {
  Env env;
  PrefixCache cache(4);
  auto wrapper = std::make_unique<Session>(open_session(env.runner));
  const std::vector<Token> prompt = tokens(6, 10);
  PromptCapture capture = cache.capture_prompt(*wrapper, prompt);
  Session moved = std::move(*wrapper);
  wrapper.reset();  // the wrapper the capture was made from is gone

  EXPECT_EQ(run_captured(moved, prompt, 3, capture), env.executor.greedy_continuation(prompt, 3));
  ASSERT_TRUE(capture.collect());
  const HistoryClone snapshot = env.executor.clones().back();
  EXPECT_EQ(snapshot.source, moved.id());
  ASSERT_TRUE(snapshot.child.has_value());
  EXPECT_EQ(env.executor.history(*snapshot.child), prompt);
}

TEST(PromptCaptureTest, PromptCaptureKeepsOriginalIdentityAfterSourceReassignment) {
  Env env;
  PrefixCache cache(4);
  Session slot = open_session(env.runner);
  Session other = open_session(env.runner);
  const std::vector<Token> other_prompt = tokens(9, 70);
  run(other, other_prompt, 2);  // long enough that a clone of it at 6 would succeed
  const std::vector<Token> prompt = tokens(6, 10);
  PromptCapture capture = cache.capture_prompt(slot, prompt);
  Session original = std::move(slot);
  slot = std::move(other);  // the wrapper the capture saw now holds another session

  EXPECT_EQ(run_captured(original, prompt, 3, capture),
            env.executor.greedy_continuation(prompt, 3));
  ASSERT_TRUE(capture.collect());
  const HistoryClone snapshot = env.executor.clones().back();
  EXPECT_EQ(snapshot.source, original.id());
  EXPECT_NE(snapshot.source, slot.id());
  ASSERT_TRUE(snapshot.child.has_value());
  EXPECT_EQ(env.executor.history(*snapshot.child), prompt);
}

TEST(PromptCaptureTest, ClosedSourceCaptureForwardsOutputWithoutRetainingSession) {
  Env env;
  PrefixCache cache(4);
  std::optional<Session> source = open_session(env.runner);
  const SessionId source_id = source->id();
  const std::vector<Token> prompt = tokens(6, 10);
  PromptCapture capture = cache.capture_prompt(*source, prompt);
  source.reset();
  EXPECT_TRUE(env.executor.wait_closed(source_id)) << "the capture does not keep it open";
  EXPECT_TRUE(env.executor.wait_open_count(0));

  Session runner_of_prompt = open_session(env.runner);
  EXPECT_EQ(run_captured(runner_of_prompt, prompt, 4, capture),
            env.executor.greedy_continuation(prompt, 4));
  EXPECT_TRUE(env.executor.clones().empty()) << "refused before reaching the executor";
  EXPECT_FALSE(capture.collect());
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_EQ(env.executor.open_count(), 1);
}

TEST(PromptCaptureTest, DiscardedPromptCaptureLeavesCallbackUsableAndReleasesClone) {
  Env env;
  PrefixCache cache(4);
  Session source = open_session(env.runner);
  const std::vector<Token> prompt = tokens(6, 10);

  // Discarded after its clone was taken: the clone is released.
  auto capture = std::make_unique<PromptCapture>(cache.capture_prompt(source, prompt));
  auto updates = std::make_shared<Updates>();
  GenerationCallback callback = capture->wrap(into(updates));
  run_raw(source, prompt, 3, callback);
  ASSERT_EQ(env.executor.clones().size(), 1u);
  ASSERT_TRUE(env.executor.clones().back().child.has_value());
  const SessionId clone_id = *env.executor.clones().back().child;
  capture.reset();
  EXPECT_TRUE(env.executor.wait_closed(clone_id));
  callback(update_with({5}));
  EXPECT_EQ(updates->tokens(), concat(env.executor.greedy_continuation(prompt, 3), {5}));

  // Discarded before any update: the callback forwards and clones nothing.
  Session second = open_session(env.runner);
  auto early = std::make_unique<PromptCapture>(cache.capture_prompt(second, prompt));
  auto early_updates = std::make_shared<Updates>();
  GenerationCallback early_callback = early->wrap(into(early_updates));
  early.reset();
  run_raw(second, prompt, 2, early_callback);
  EXPECT_EQ(early_updates->tokens(), env.executor.greedy_continuation(prompt, 2));
  EXPECT_EQ(env.executor.clones().size(), 1u);
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_TRUE(env.executor.wait_open_count(2));
}

TEST(PromptCaptureTest, InactivePromptCapturesForwardUpdatesAndAllowEmptyCallback) {
  Env env;
  PrefixCache cache(4);
  PrefixCache disabled(0);
  Session source = open_session(env.runner);
  const std::vector<Token> prompt = tokens(6, 10);

  std::vector<PromptCapture> inactive;
  inactive.emplace_back();
  inactive.push_back(cache.capture_prompt(Session{}, prompt));
  inactive.push_back(cache.capture_prompt(source, {}));
  inactive.push_back(disabled.capture_prompt(source, prompt));
  for (PromptCapture& capture : inactive) {
    EXPECT_FALSE(capture.active());
    auto updates = std::make_shared<Updates>();
    capture.wrap(into(updates))(update_with({1, 2}));
    EXPECT_EQ(updates->tokens(), (std::vector<Token>{1, 2}));
    EXPECT_NO_THROW(capture.wrap(GenerationCallback{})(update_with({3})));
    EXPECT_FALSE(capture.collect());
  }
  EXPECT_TRUE(env.executor.clones().empty());

  // Through the runner an inactive wrap is transparent.
  EXPECT_EQ(run_captured(source, prompt, 3, inactive.back()),
            env.executor.greedy_continuation(prompt, 3));
  EXPECT_TRUE(env.executor.clones().empty());

  // An active capture with an empty user callback still captures.
  Session second = open_session(env.runner);
  PromptCapture active = cache.capture_prompt(second, prompt);
  EXPECT_TRUE(active.active());
  GenerationHandle handle = second.generate_async(prompt, config(2), active.wrap({}));
  handle.wait();
  EXPECT_EQ(handle.finish_reason(), FinishReason::kNewTokenLimit);
  EXPECT_TRUE(active.collect());
  EXPECT_FALSE(active.active());
  EXPECT_EQ(cache.size(), 1u);
}

}  // namespace
}  // namespace cellm::testing
