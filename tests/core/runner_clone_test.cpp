// Runner: clone_async.
#include <gtest/gtest.h>

#include <future>
#include <stdexcept>

#include "cellm/runner.h"
#include "support/fake_executor.h"
#include "support/runner_harness.h"

namespace cellm::testing {
namespace {

std::optional<Session> clone(const Session& session, Position upto) {
  auto future = session.clone_async(upto);
  return settle(future);
}

// Runs a 3-token prompt with budget 2: position 4, token t(sid, 4) pending.
void run_turn(Session& session) {
  auto updates = std::make_shared<Updates>();
  GenerationHandle handle = generate(session, tokens(3), config(2), updates);
  handle.wait();
  ASSERT_EQ(handle.finish_reason(), FinishReason::kNewTokenLimit);
  ASSERT_EQ(session.position(), 4);
}

TEST(CloneTest, DefaultMovedFromAndClosedSessionsRefuseSynchronously) {
  FakeExecutor executor;
  Session detached;
  auto from_default = detached.clone_async(0);
  EXPECT_EQ(from_default.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  EXPECT_FALSE(from_default.get().has_value());

  Fixture fixture(executor);
  Session source = open_session(fixture.runner);
  Session owner = std::move(source);
  auto from_moved = source.clone_async(0);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(from_moved.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  EXPECT_FALSE(from_moved.get().has_value());

  fixture.runner.shutdown();
  auto from_closed = owner.clone_async(0);
  EXPECT_EQ(from_closed.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  EXPECT_FALSE(from_closed.get().has_value());
  EXPECT_EQ(count_calls(executor, "clone"), 0u);
}

TEST(CloneTest, DefaultExecutorRefusesWithoutPoisoningSource) {
  FakeExecutor executor;
  executor.set_clone_supported(false);
  Fixture fixture(executor);
  Session source = open_session(fixture.runner);
  run_turn(source);
  EXPECT_FALSE(clone(source, 2).has_value());
  EXPECT_EQ(executor.calls().back(), "clone 1@2 refused");

  auto updates = std::make_shared<Updates>();
  generate(source, {300}, config(1), updates);
  ASSERT_TRUE(updates->wait());
  EXPECT_EQ(updates->finish(), FinishReason::kNewTokenLimit);
  EXPECT_EQ(executor.executed().back().tokens, (std::vector<Token>{t(1, 4), 300}));
}

TEST(CloneTest, CopiesOnlyCommittedPrefixAndStartsIdleWithoutSampling) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session source = open_session(fixture.runner);
  run_turn(source);
  std::optional<Session> child = clone(source, 4);
  ASSERT_TRUE(child.has_value());
  EXPECT_EQ(child->id(), 2);
  EXPECT_EQ(child->position(), 4);
  EXPECT_EQ(executor.history(2), (std::vector<Token>{100, 101, 102, t(1, 3)}));
  EXPECT_FALSE(executor.sampling(2).has_value());

  // The child carries no pending token: its first input is just its delta.
  auto updates = std::make_shared<Updates>();
  generate(*child, {300}, config(1), updates);
  ASSERT_TRUE(updates->wait());
  const ExecutedInput last = executor.executed().back();
  EXPECT_EQ(last.sid, 2);
  EXPECT_EQ(last.start(), 4);
  EXPECT_EQ(last.tokens, (std::vector<Token>{300}));
  EXPECT_EQ(updates->tokens(), (std::vector<Token>{t(2, 5)}));
  EXPECT_EQ(source.position(), 4) << "the source is untouched";
}

TEST(CloneTest, EmptyBoundaryIsDelegatedAndCloneCanBeCloned) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session source = open_session(fixture.runner);
  run_turn(source);
  std::optional<Session> empty = clone(source, 0);
  ASSERT_TRUE(empty.has_value());
  EXPECT_EQ(empty->position(), 0);
  EXPECT_TRUE(executor.history(2).empty());

  std::optional<Session> prefix = clone(source, 3);
  ASSERT_TRUE(prefix.has_value());
  std::optional<Session> grandchild = clone(*prefix, 2);
  ASSERT_TRUE(grandchild.has_value());
  EXPECT_EQ(grandchild->position(), 2);
  EXPECT_EQ(executor.history(grandchild->id()), (std::vector<Token>{100, 101}));
  EXPECT_EQ(count_calls(executor, "clone 1@0 -> 2"), 1u);
}

TEST(CloneTest, RejectsNegativeFutureAndPendingTokenBoundaries) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session source = open_session(fixture.runner);
  run_turn(source);  // committed 4, t(1,4) pending at position 4
  EXPECT_FALSE(clone(source, -1).has_value());
  EXPECT_FALSE(clone(source, 5).has_value()) << "position 5 would include the pending token";
  EXPECT_FALSE(clone(source, 100).has_value());
  EXPECT_EQ(count_calls(executor, "clone"), 0u) << "refused before reaching the executor";
  EXPECT_TRUE(clone(source, 4).has_value());
}

TEST(CloneTest, FirstOutputCallbackClonesBeforeNextForward) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session source = open_session(fixture.runner);
  std::future<std::optional<Session>> snapshot;
  executor.hold();
  bool first = true;
  GenerationHandle handle =
      source.generate_async(tokens(3), config(3), [&](const GenerationUpdate& update) {
        if (first && !update.finish_reason) {
          first = false;
          snapshot = source.clone_async(source.position());
        }
      });
  executor.release();
  handle.wait();
  std::optional<Session> child = settle(snapshot);
  ASSERT_TRUE(child.has_value());
  EXPECT_EQ(child->position(), 3);
  EXPECT_EQ(executor.history(child->id()), tokens(3));
  const std::vector<std::string> calls = executor.calls();
  EXPECT_EQ(calls,
            (std::vector<std::string>{"initialize", "open 1", "set_sampling 1", "execute [1@0+3!]",
                                      "clone 1@3 -> 2", "execute [1@3+1!]", "execute [1@4+1!]"}));
}

TEST(CloneTest, TerminalCallbackCloneSurvivesImmediateSourceDestruction) {
  FakeExecutor executor;
  Fixture fixture(executor);
  std::optional<Session> source = open_session(fixture.runner);
  std::future<std::optional<Session>> snapshot;
  executor.hold();
  GenerationHandle handle =
      source->generate_async(tokens(3), config(1), [&](const GenerationUpdate& update) {
        if (update.finish_reason) {
          snapshot = source->clone_async(3);
          source.reset();
        }
      });
  executor.release();
  handle.wait();
  std::optional<Session> child = settle(snapshot);
  ASSERT_TRUE(child.has_value());
  EXPECT_EQ(child->position(), 3);
  ASSERT_TRUE(executor.wait_open_count(1));
  EXPECT_EQ(executor.closed(), (std::vector<SessionId>{1}));
  auto updates = std::make_shared<Updates>();
  generate(*child, {300}, config(1), updates);
  ASSERT_TRUE(updates->wait());
  EXPECT_EQ(updates->finish(), FinishReason::kNewTokenLimit);
}

TEST(CloneTest, SpeculativeStatePastAcceptedPositionCannotBeCloned) {
  FakeExecutor executor;
  executor.set_tokens_per_output(4);
  executor.script_tokens(1, {5, 999, 6, 7});
  Fixture fixture(executor);
  Session source = open_session(fixture.runner);
  GenConfig cfg = config(10);
  cfg.stop_tokens = {999};
  auto updates = std::make_shared<Updates>();
  generate(source, tokens(2), cfg, updates);
  ASSERT_TRUE(updates->wait());
  ASSERT_EQ(source.position(), 4);
  ASSERT_EQ(executor.history(1).size(), 5u) << "the executor still holds the suffix 6";
  EXPECT_FALSE(clone(source, 5).has_value());
  std::optional<Session> child = clone(source, 4);
  ASSERT_TRUE(child.has_value());
  EXPECT_EQ(executor.history(child->id()), (std::vector<Token>{100, 101, 5, 999}));
}

TEST(CloneTest, RefusalAndCapacityPressureLeaveSourceUsable) {
  FakeExecutor executor;
  executor.set_capacity(1);
  Fixture fixture(executor);
  Session source = open_session(fixture.runner);
  run_turn(source);
  EXPECT_FALSE(clone(source, 4).has_value());
  EXPECT_EQ(executor.calls().back(), "clone 1@4 refused");
  auto updates = std::make_shared<Updates>();
  generate(source, {300}, config(2), updates);
  ASSERT_TRUE(updates->wait());
  EXPECT_EQ(updates->finish(), FinishReason::kNewTokenLimit);
  EXPECT_EQ(source.position(), 7);
}

TEST(CloneTest, ExecutorExceptionSettlesFutureAndKeepsEngineRunning) {
  FakeExecutor executor;
  executor.set_clone_throws(true);
  Fixture fixture(executor);
  Session source = open_session(fixture.runner);
  run_turn(source);
  EXPECT_FALSE(clone(source, 2).has_value());
  EXPECT_EQ(executor.calls().back(), "clone 1@2 threw");
  executor.set_clone_throws(false);
  EXPECT_TRUE(clone(source, 2).has_value());
  auto updates = std::make_shared<Updates>();
  generate(source, {300}, config(1), updates);
  ASSERT_TRUE(updates->wait());
  EXPECT_EQ(updates->finish(), FinishReason::kNewTokenLimit);
}

TEST(CloneTest, FailedOrMalformedExecutorStateIsNotCloned) {
  for (bool malformed : {false, true}) {
    FakeExecutor executor;
    if (malformed) {
      executor.set_malformation(Malformation::kWrongSid);
    } else {
      executor.fail_batches_from(0);
    }
    Fixture fixture(executor);
    Session source = open_session(fixture.runner);
    auto updates = std::make_shared<Updates>();
    generate(source, tokens(3), config(2), updates);
    ASSERT_TRUE(updates->wait());
    ASSERT_EQ(updates->finish(), FinishReason::kFailed);
    EXPECT_FALSE(clone(source, 0).has_value()) << malformed;
    EXPECT_EQ(count_calls(executor, "clone"), 0u);
  }
}

TEST(CloneTest, CancelledPrefillExposesOnlyItsConsumedPrefix) {
  FakeExecutor executor;
  Fixture fixture(executor, 1, 2);  // budget 5: two 2-token chunks per batch
  Session source = open_session(fixture.runner);
  executor.hold();
  auto updates = std::make_shared<Updates>();
  GenerationHandle handle = generate(source, tokens(6), config(5), updates);
  ASSERT_TRUE(executor.wait_in_execute());
  handle.cancel();
  executor.release();
  handle.wait();
  ASSERT_EQ(handle.finish_reason(), FinishReason::kCancelled);
  EXPECT_EQ(source.position(), 4);
  EXPECT_FALSE(clone(source, 5).has_value());
  std::optional<Session> child = clone(source, 4);
  ASSERT_TRUE(child.has_value());
  EXPECT_EQ(executor.history(child->id()), tokens(4));
}

TEST(CloneTest, CallbackShutdownSettlesQueuedCloneWithoutCallingExecutor) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session source = open_session(fixture.runner);
  std::future<std::optional<Session>> snapshot;
  executor.hold();
  GenerationHandle handle =
      source.generate_async(tokens(3), config(5), [&](const GenerationUpdate& update) {
        if (!update.finish_reason) {
          snapshot = source.clone_async(3);
          fixture.runner.shutdown();
        }
      });
  executor.release();
  handle.wait();
  EXPECT_FALSE(settle(snapshot).has_value());
  fixture.runner.shutdown();
  EXPECT_EQ(count_calls(executor, "clone"), 0u);
  EXPECT_EQ(executor.open_count(), 0);
}

TEST(CloneTest, AbandonedFutureReleasesItsOwnedSession) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session source = open_session(fixture.runner);
  run_turn(source);
  (void)source.clone_async(2);  // dropped at once
  // Commands (the child's close included) all run before the next forward.
  auto updates = std::make_shared<Updates>();
  generate(source, {300}, config(1), updates);
  ASSERT_TRUE(updates->wait());
  EXPECT_EQ(executor.open_count(), 1);
  std::vector<SessionId> closed = executor.closed();
  ASSERT_EQ(closed.size(), 1u);
  EXPECT_EQ(closed[0], 2);
  EXPECT_EQ(count_calls(executor, "clone 1@2 -> 2"), 1u);
}

enum class SourceEnd { kCancel, kClose, kShutdown };

class CloneStopTest : public ::testing::TestWithParam<SourceEnd> {};

TEST_P(CloneStopTest, CloneCompletesIndependentlyUnlessRunnerStops) {
  FakeExecutor executor;
  Fixture fixture(executor);
  std::optional<Session> source = open_session(fixture.runner);
  run_turn(*source);
  executor.hold();
  auto updates = std::make_shared<Updates>();
  GenerationHandle handle = generate(*source, {300}, config(100), updates);
  ASSERT_TRUE(executor.wait_in_execute());
  auto snapshot = source->clone_async(4);  // queued behind the held step
  std::future<void> stopping;
  switch (GetParam()) {
    case SourceEnd::kCancel:
      handle.cancel();
      break;
    case SourceEnd::kClose:
      source.reset();
      break;
    case SourceEnd::kShutdown:
      stopping = std::async(std::launch::async, [&] { fixture.runner.shutdown(); });
      ASSERT_TRUE(wait_until_stopping(fixture.runner));
      break;
  }
  executor.release();
  handle.wait();
  EXPECT_EQ(handle.finish_reason(), FinishReason::kCancelled);
  std::optional<Session> child = settle(snapshot);
  if (GetParam() == SourceEnd::kShutdown) {
    stopping.wait();
    EXPECT_FALSE(child.has_value());
    EXPECT_EQ(count_calls(executor, "clone"), 0u);
    EXPECT_EQ(executor.open_count(), 0);
    return;
  }
  ASSERT_TRUE(child.has_value());
  EXPECT_EQ(child->position(), 4);
  EXPECT_EQ(executor.history(child->id()), (std::vector<Token>{100, 101, 102, t(1, 3)}));
  auto child_updates = std::make_shared<Updates>();
  generate(*child, {400}, config(1), child_updates);
  ASSERT_TRUE(child_updates->wait());
  EXPECT_EQ(child_updates->finish(), FinishReason::kNewTokenLimit);
}

INSTANTIATE_TEST_SUITE_P(SourceEnds, CloneStopTest,
                         ::testing::Values(SourceEnd::kCancel, SourceEnd::kClose,
                                           SourceEnd::kShutdown),
                         [](const ::testing::TestParamInfo<SourceEnd>& info) {
                           switch (info.param) {
                             case SourceEnd::kCancel:
                               return "Cancel";
                             case SourceEnd::kClose:
                               return "Close";
                             case SourceEnd::kShutdown:
                               return "Shutdown";
                           }
                           return "Unknown";
                         });

}  // namespace
}  // namespace cellm::testing
