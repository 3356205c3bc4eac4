// PromptCapture on the Runner over the HistoryExecutor (prefix_cache_env.h): a
// generation's prompt captured into the prefix cache through its callback.
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
