// Runner: SessionRef, the non-owning clone path (runner.h) that a prompt
// capture uses from a generation callback.
#include <gtest/gtest.h>

#include <future>
#include <memory>
#include <optional>
#include <string>

#include "cellm/runner.h"
#include "support/fake_executor.h"
#include "support/runner_harness.h"

namespace cellm::testing {
namespace {

bool refused_at_once(std::future<std::optional<Session>> future) {
  return future.wait_for(std::chrono::seconds(0)) == std::future_status::ready &&
         !future.get().has_value();
}

// Runs a 3-token prompt with budget 2: position 4, one token pending.
void run_turn(Session& session) {
  auto updates = std::make_shared<Updates>();
  GenerationHandle handle = generate(session, tokens(3), config(2), updates);
  handle.wait();
  ASSERT_EQ(session.position(), 4);
}

TEST(SessionRefTest, ClonesThroughTheRunnerWithTheSessionsRules) {
  FakeExecutor executor;
  Fixture fixture(executor);
  EXPECT_EQ(SessionRef().id(), 0);
  EXPECT_TRUE(refused_at_once(SessionRef().clone_async(0)));
  EXPECT_EQ(Session().ref().id(), 0);

  Session source = open_session(fixture.runner);
  run_turn(source);
  const SessionRef ref = source.ref();
  EXPECT_EQ(ref.id(), source.id());
  auto past_pending = ref.clone_async(5);
  EXPECT_FALSE(settle(past_pending).has_value()) << "the pending token is not committed";
  auto future = ref.clone_async(3);
  std::optional<Session> child = settle(future);
  ASSERT_TRUE(child.has_value());
  EXPECT_EQ(child->position(), 3);
  EXPECT_EQ(executor.history(child->id()), tokens(3));
  EXPECT_EQ(count_calls(executor, "clone"), 1u);
}

TEST(SessionRefTest, FollowsTheSessionAcrossMovesAndIsRefusedOnceClosed) {
  FakeExecutor executor;
  Fixture fixture(executor);
  auto wrapper = std::make_unique<Session>(open_session(fixture.runner));
  const SessionRef ref = wrapper->ref();
  std::optional<Session> moved(std::move(*wrapper));
  *wrapper = open_session(fixture.runner);  // the old wrapper now holds another session
  run_turn(*moved);
  auto future = ref.clone_async(4);
  std::optional<Session> child = settle(future);
  ASSERT_TRUE(child.has_value());
  EXPECT_EQ(executor.calls().back(), "clone 1@4 -> 3");

  const SessionId sid = moved->id();
  moved.reset();  // requests the close
  EXPECT_TRUE(refused_at_once(ref.clone_async(0)));
  ASSERT_TRUE(executor.wait_open_count(2));
  EXPECT_EQ(executor.closed(), (std::vector<SessionId>{sid}));
  EXPECT_EQ(count_calls(executor, "clone"), 1u) << "refused before reaching the executor";
}

TEST(SessionRefTest, OutlivesItsSessionAndRunnerAndThenRefuses) {
  FakeExecutor executor;
  SessionRef ref;
  {
    Fixture fixture(executor);
    Session source = open_session(fixture.runner);
    ref = source.ref();
    fixture.runner.shutdown();
    EXPECT_TRUE(refused_at_once(ref.clone_async(0))) << "the runner is stopping";
  }
  EXPECT_EQ(executor.open_count(), 0);
  EXPECT_TRUE(refused_at_once(ref.clone_async(0))) << "the runner is gone";
  EXPECT_EQ(count_calls(executor, "clone"), 0u);
}

}  // namespace
}  // namespace cellm::testing
