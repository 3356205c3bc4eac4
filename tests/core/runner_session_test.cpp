// Runner: handles, sessions, lifetime and executor initialization.
#include <gtest/gtest.h>

#include <future>
#include <stdexcept>
#include <thread>
#include <type_traits>

#include "cellm/runner.h"
#include "support/fake_executor.h"
#include "support/runner_harness.h"

namespace cellm::testing {
namespace {

static_assert(std::is_move_constructible_v<Session> && std::is_move_assignable_v<Session>);
static_assert(!std::is_copy_constructible_v<Session> && !std::is_copy_assignable_v<Session>);
static_assert(std::is_copy_constructible_v<GenerationHandle>);

TEST(FinishReasonTest, NamesAreStable) {
  EXPECT_STREQ(to_string(FinishReason::kStopToken), "stop_token");
  EXPECT_STREQ(to_string(FinishReason::kNewTokenLimit), "token_limit");
  EXPECT_STREQ(to_string(FinishReason::kCancelled), "cancelled");
  EXPECT_STREQ(to_string(FinishReason::kFailed), "failed");
}

TEST(GenerationHandleTest, DefaultHandleIsInvalid) {
  GenerationHandle handle;
  EXPECT_FALSE(handle.valid());
  EXPECT_FALSE(handle.done());
  EXPECT_FALSE(handle.finish_reason().has_value());
  EXPECT_TRUE(handle.error_message().empty());
  EXPECT_EQ(handle.metrics().sid, 0);
  handle.cancel();  // no-ops
  handle.wait();
}

TEST(GenerationHandleTest, MoveTransfersValidity) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  auto updates = std::make_shared<Updates>();
  GenerationHandle original = generate(session, tokens(1), config(1), updates);

  GenerationHandle moved = std::move(original);
  GenerationHandle copy = moved;

  EXPECT_FALSE(original.valid());  // NOLINT(bugprone-use-after-move)
  EXPECT_FALSE(original.done());
  EXPECT_TRUE(moved.valid());
  moved.wait();
  EXPECT_TRUE(moved.done());
  EXPECT_TRUE(copy.done());
  EXPECT_EQ(copy.finish_reason(), FinishReason::kNewTokenLimit);
  EXPECT_EQ(updates->tokens(), (std::vector<Token>{FakeExecutor::token_at(session.id(), 1)}));
}

TEST(SessionTest, DefaultSessionRejectsGenerationSynchronously) {
  Session session;
  EXPECT_FALSE(session.valid());
  EXPECT_EQ(session.id(), 0);
  EXPECT_EQ(session.position(), 0);
  auto updates = std::make_shared<Updates>();

  GenerationHandle handle = generate(session, tokens(1), config(1), updates);

  EXPECT_EQ(updates->last_thread(), std::this_thread::get_id());
  EXPECT_TRUE(handle.valid());
  EXPECT_TRUE(handle.done());
  EXPECT_EQ(handle.finish_reason(), FinishReason::kFailed);
  EXPECT_EQ(handle.error_message(), "session is not initialized");
  EXPECT_EQ(updates->error_message(), "session is not initialized");
  EXPECT_TRUE(updates->tokens().empty());
  EXPECT_EQ(updates->terminal_calls(), 1);
  EXPECT_EQ(updates->calls(), 1);
}

TEST(SessionTest, SynchronousCallbackExceptionIsContained) {
  Session session;
  bool called = false;
  GenerationHandle handle;
  EXPECT_NO_THROW(handle =
                      session.generate_async(tokens(1), config(1), [&](const GenerationUpdate&) {
                        called = true;
                        throw std::runtime_error("callback failed");
                      }));
  EXPECT_TRUE(called);
  EXPECT_TRUE(handle.done());
  EXPECT_EQ(handle.finish_reason(), FinishReason::kFailed);
  EXPECT_EQ(handle.error_message(), "callback failed");
}

TEST(SessionTest, NonStandardCallbackExceptionUsesFallbackMessage) {
  Session session;
  GenerationHandle handle;
  EXPECT_NO_THROW(handle = session.generate_async(tokens(1), config(1),
                                                  [](const GenerationUpdate&) { throw 7; }));
  EXPECT_TRUE(handle.done());
  EXPECT_EQ(handle.finish_reason(), FinishReason::kFailed);
  EXPECT_EQ(handle.error_message(), "generation callback threw a non-standard exception");
}

TEST(SessionTest, DestructionClosesThroughTheEngineThread) {
  FakeExecutor executor;
  Fixture fixture(executor);
  SessionId id = 0;
  {
    Session session = open_session(fixture.runner);
    id = session.id();
    EXPECT_EQ(executor.open_count(), 1);
  }
  ASSERT_TRUE(executor.wait_open_count(0));
  EXPECT_EQ(executor.closed(), (std::vector<SessionId>{id}));
  const std::set<std::thread::id> threads = executor.call_threads();
  ASSERT_EQ(threads.size(), 1u);
  EXPECT_NE(*threads.begin(), std::this_thread::get_id());
}

TEST(SessionTest, MoveTransfersOwnershipAndRejectsTheSource) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session original = open_session(fixture.runner);
  const SessionId id = original.id();
  Session owner = std::move(original);
  EXPECT_FALSE(original.valid());  // NOLINT(bugprone-use-after-move)
  EXPECT_TRUE(owner.valid());
  EXPECT_EQ(owner.id(), id);

  auto rejected = std::make_shared<Updates>();
  GenerationHandle rejected_handle = generate(original, tokens(1), config(1), rejected);
  EXPECT_TRUE(rejected_handle.done());
  EXPECT_EQ(rejected_handle.error_message(), "session is not initialized");
  EXPECT_TRUE(executor.executed().empty());

  auto accepted = std::make_shared<Updates>();
  generate(owner, tokens(1), config(1), accepted);
  ASSERT_TRUE(accepted->wait());
  EXPECT_EQ(accepted->finish(), FinishReason::kNewTokenLimit);

  // Move-assigning over an owner closes what it owned.
  owner = Session{};
  ASSERT_TRUE(executor.wait_open_count(0));
  EXPECT_EQ(executor.closed(), (std::vector<SessionId>{id}));
}

TEST(SessionTest, CapacityRefusalIsReported) {
  FakeExecutor executor;
  executor.set_capacity(1);
  Fixture fixture(executor);
  Session first = open_session(fixture.runner);
  auto refused = fixture.runner.open_session_async();
  EXPECT_FALSE(settle(refused).has_value());
  fixture.runner.shutdown();
  EXPECT_EQ(fixture.runner.metrics().sessions_refused, 1);
}

TEST(SessionTest, DestructionCancelsActiveGenerationWithoutWaiting) {
  FakeExecutor executor;
  executor.hold();
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  const SessionId id = session.id();
  auto updates = std::make_shared<Updates>();
  GenerationHandle handle = generate(session, tokens(2), config(1), updates);
  ASSERT_TRUE(executor.wait_in_execute());

  auto destroyed =
      std::async(std::launch::async, [s = std::move(session)]() mutable { s = Session{}; });
  ASSERT_EQ(destroyed.wait_for(kTimeout), std::future_status::ready);
  EXPECT_FALSE(handle.done());
  executor.release();

  ASSERT_TRUE(updates->wait());
  EXPECT_EQ(updates->finish(), FinishReason::kCancelled);
  EXPECT_TRUE(updates->tokens().empty());
  EXPECT_EQ(updates->terminal_calls(), 1);
  ASSERT_TRUE(executor.wait_open_count(0));
  EXPECT_EQ(executor.closed(), (std::vector<SessionId>{id}));
}

TEST(SessionTest, DestroyingASessionEndsItsGeneration) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  auto updates = std::make_shared<Updates>();
  GenerationHandle handle = generate(session, tokens(2), config(100000), updates);
  session = Session{};
  ASSERT_TRUE(updates->wait());
  handle.wait();
  EXPECT_EQ(handle.finish_reason(), FinishReason::kCancelled);
  EXPECT_TRUE(handle.error_message().empty());
  EXPECT_EQ(updates->terminal_calls(), 1);
  ASSERT_TRUE(executor.wait_open_count(0));
}

TEST(LifetimeTest, SessionOutlivingTheRunnerStillClosesCleanly) {
  FakeExecutor executor;
  Session session;
  {
    Fixture fixture(executor);
    session = open_session(fixture.runner);
  }
  // The stop closed it exactly once; the handle still answers.
  EXPECT_EQ(executor.closed().size(), 1u);
  EXPECT_TRUE(session.valid());
  auto updates = std::make_shared<Updates>();
  GenerationHandle handle = generate(session, tokens(1), config(1), updates);
  EXPECT_TRUE(handle.done());
  EXPECT_EQ(handle.finish_reason(), FinishReason::kCancelled);
  auto clone = session.clone_async(0);
  EXPECT_FALSE(settle(clone).has_value());
  session = Session{};
  EXPECT_EQ(executor.closed().size(), 1u);
}

TEST(InitializeTest, RunsOnceBeforeAnythingElseIsAskedOfTheExecutor) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  auto updates = std::make_shared<Updates>();
  generate(session, tokens(2), config(2), updates);
  ASSERT_TRUE(updates->wait());
  session = Session{};
  fixture.runner.shutdown();

  EXPECT_EQ(executor.initialize_calls(), 1);
  EXPECT_FALSE(executor.called_before_initialize());
  const std::vector<std::string> calls = executor.calls();
  ASSERT_FALSE(calls.empty());
  EXPECT_EQ(calls.front(), "initialize");
  EXPECT_EQ(calls[1], "open 1");
  EXPECT_EQ(calls.back(), "close 1");
}

TEST(InitializeTest, FailureStopsTheRunnerAndRefusesSessions) {
  FakeExecutor executor;
  executor.set_initialize_result(Internal("FakeExecutor: no device"));
  Fixture fixture(executor);
  auto refused = fixture.runner.open_session_async();
  EXPECT_FALSE(settle(refused).has_value());
  fixture.runner.shutdown();
  EXPECT_EQ(executor.initialize_calls(), 1);
  EXPECT_EQ(executor.calls(), (std::vector<std::string>{"initialize"}));
  EXPECT_EQ(fixture.runner.metrics().sessions_refused, 0);
}

TEST(InitializeTest, AFailuresTextReachesWhoeverIsRefused) {
  FakeExecutor executor;
  executor.set_initialize_result(InvalidState("FakeExecutor: no device"));
  Fixture fixture(executor);
  auto refused = fixture.runner.open_session_async();
  EXPECT_FALSE(settle(refused).has_value());
  const Status init = fixture.runner.initialize_status();
  EXPECT_EQ(init.code(), StatusCode::kInvalidState);
  EXPECT_EQ(init.message(), "FakeExecutor: no device");
}

TEST(InitializeTest, ASuccessReadsOk) {
  FakeExecutor executor;
  Fixture fixture(executor);
  auto opened = fixture.runner.open_session_async();
  ASSERT_TRUE(settle(opened).has_value());
  EXPECT_TRUE(fixture.runner.initialize_status().ok());
}

TEST(InitializeTest, FailureDoesNotStrandAQueuedOpen) {
  FakeExecutor executor;
  executor.set_initialize_result(Internal("FakeExecutor: no device"));
  executor.hold_initialize();  // the opens queue behind initialize()
  Fixture fixture(executor);
  std::vector<std::future<std::optional<Session>>> opens;
  for (int i = 0; i < 4; ++i) opens.push_back(fixture.runner.open_session_async());
  for (auto& open : opens) {
    EXPECT_EQ(open.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  }
  executor.release();
  for (auto& open : opens) EXPECT_FALSE(settle(open).has_value());
  EXPECT_TRUE(executor.opened().empty());
}

}  // namespace
}  // namespace cellm::testing
