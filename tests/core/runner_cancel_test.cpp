// Runner: cancellation and shutdown.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <thread>

#include "cellm/runner.h"
#include "support/fake_executor.h"
#include "support/runner_harness.h"

namespace cellm::testing {
namespace {

// --- CancelTest -------------------------------------------------------------

TEST(CancelTest, ExplicitCancellationEndsTheGeneration) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  executor.hold();
  auto updates = std::make_shared<Updates>();
  GenerationHandle handle = generate(session, tokens(2), config(100000), updates);
  ASSERT_TRUE(executor.wait_in_execute());
  handle.cancel();
  executor.release();
  handle.wait();
  EXPECT_EQ(handle.finish_reason(), FinishReason::kCancelled);
  EXPECT_TRUE(handle.error_message().empty());
  EXPECT_TRUE(updates->tokens().empty()) << "the in-flight output is not delivered";
  EXPECT_EQ(updates->terminal_calls(), 1);
  EXPECT_EQ(session.position(), 2) << "the consumed prompt still counts";
  fixture.runner.shutdown();
  EXPECT_EQ(executor.executed().size(), 1u);
}

TEST(CancelTest, CompletionObservesAllConsumedChunksInBatch) {
  FakeExecutor executor;
  Fixture fixture(executor, 1, 2);  // budget 5: both 2-token chunks in one batch
  Session session = open_session(fixture.runner);
  executor.hold();
  std::atomic<Position> position_in_terminal{-1};
  GenerationHandle handle =
      session.generate_async(tokens(4), config(100000), [&](const GenerationUpdate& update) {
        if (update.finish_reason) position_in_terminal = session.position();
      });
  ASSERT_TRUE(executor.wait_in_execute());
  handle.cancel();
  executor.release();
  handle.wait();
  EXPECT_EQ(handle.finish_reason(), FinishReason::kCancelled);
  EXPECT_EQ(executor.batch_sizes(), (std::vector<int>{2}));
  EXPECT_EQ(position_in_terminal.load(), 4);
  EXPECT_EQ(session.position(), 4);
}

TEST(CancelTest, CallbackMayRetireItsOwnSession) {
  FakeExecutor executor;
  Fixture fixture(executor);
  std::optional<Session> session = open_session(fixture.runner);
  auto updates = std::make_shared<Updates>();
  bool dropped = false;
  GenerationHandle handle =
      session->generate_async(tokens(2), config(100000), [&](const GenerationUpdate& update) {
        (*updates)(update);
        if (!update.finish_reason && !dropped) {
          dropped = true;
          session.reset();
        }
      });
  handle.wait();
  EXPECT_TRUE(dropped);
  EXPECT_EQ(handle.finish_reason(), FinishReason::kCancelled);
  EXPECT_EQ(updates->terminal_calls(), 1);
  EXPECT_EQ(updates->tokens(), (std::vector<Token>{t(1, 2)}));
  ASSERT_TRUE(executor.wait_open_count(0));
  EXPECT_EQ(executor.closed(), (std::vector<SessionId>{1}));
}

TEST(CancelTest, PositionSurvivesACancelledGeneration) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  executor.hold();
  GenerationHandle handle;
  auto updates = std::make_shared<Updates>();
  handle = session.generate_async(tokens(4), config(100000), [&](const GenerationUpdate& update) {
    (*updates)(update);
    if (!update.finish_reason) handle.cancel();
  });
  executor.release();
  handle.wait();
  ASSERT_EQ(handle.finish_reason(), FinishReason::kCancelled);
  EXPECT_EQ(updates->tokens(), (std::vector<Token>{t(1, 4)}));
  EXPECT_EQ(session.position(), 4);

  auto resumed = std::make_shared<Updates>();
  generate(session, {300}, config(1), resumed);
  ASSERT_TRUE(resumed->wait());
  const ExecutedInput last = executor.executed().back();
  EXPECT_EQ(last.start(), 4) << "resumes past the consumed prompt";
  EXPECT_EQ(last.tokens, (std::vector<Token>{t(1, 4), 300})) << "the delivered token is carried";
}

TEST(CancelTest, DecodeCancelAdvancesOnlyForDeliveredTokens) {
  FakeExecutor executor;
  executor.set_tokens_per_output(3);
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  executor.hold();
  GenerationHandle handle;
  auto updates = std::make_shared<Updates>();
  int bursts = 0;
  handle = session.generate_async(tokens(4), config(100000), [&](const GenerationUpdate& update) {
    (*updates)(update);
    if (!update.finish_reason && ++bursts == 2) handle.cancel();
  });
  executor.release();
  handle.wait();
  ASSERT_EQ(handle.finish_reason(), FinishReason::kCancelled);
  // Prompt [0,4) answered t4 t5 t6; the decode of t6 answered t7 t8 t9.
  EXPECT_EQ(updates->tokens(),
            (std::vector<Token>{t(1, 4), t(1, 5), t(1, 6), t(1, 7), t(1, 8), t(1, 9)}));
  EXPECT_EQ(session.position(), 9) << "delta + delivered - the pending t9";
  EXPECT_EQ(executor.executed().size(), 2u) << "the queued continuation was dropped";

  executor.set_tokens_per_output(1);
  auto resumed = std::make_shared<Updates>();
  generate(session, {300}, config(1), resumed);
  ASSERT_TRUE(resumed->wait());
  const ExecutedInput last = executor.executed().back();
  EXPECT_EQ(last.start(), 9);
  EXPECT_EQ(last.tokens, (std::vector<Token>{t(1, 9), 300}));
}

// --- ShutdownTest -----------------------------------------------------------

TEST(ShutdownTest, EndsLiveAndRejectsNewWork) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  executor.hold();
  auto live = std::make_shared<Updates>();
  GenerationHandle live_handle = generate(session, tokens(2), config(100000), live);
  ASSERT_TRUE(executor.wait_in_execute());

  auto admitted = fixture.runner.open_session_async();  // queued behind the held step
  auto stopping = std::async(std::launch::async, [&] { fixture.runner.shutdown(); });
  ASSERT_TRUE(wait_until_stopping(fixture.runner));
  executor.release();
  ASSERT_EQ(stopping.wait_for(kTimeout), std::future_status::ready);

  EXPECT_FALSE(settle(admitted).has_value());
  EXPECT_TRUE(live_handle.done());
  EXPECT_EQ(live_handle.finish_reason(), FinishReason::kCancelled);
  EXPECT_TRUE(live->tokens().empty());
  EXPECT_EQ(executor.open_count(), 0);
  EXPECT_EQ(executor.closed(), executor.opened());

  auto rejected_open = fixture.runner.open_session_async();
  EXPECT_EQ(rejected_open.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  EXPECT_FALSE(rejected_open.get().has_value());
  auto rejected = std::make_shared<Updates>();
  GenerationHandle rejected_handle = generate(session, tokens(1), config(1), rejected);
  EXPECT_EQ(rejected->last_thread(), std::this_thread::get_id());
  EXPECT_TRUE(rejected_handle.done());
  EXPECT_EQ(rejected_handle.finish_reason(), FinishReason::kCancelled);
  EXPECT_EQ(rejected->terminal_calls(), 1);
  EXPECT_EQ(executor.executed().size(), 1u);
}

TEST(ShutdownTest, DiscardsInFlightOutputAndCancelsGeneration) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  executor.hold();
  auto updates = std::make_shared<Updates>();
  GenerationHandle handle = generate(session, tokens(2), config(1), updates);
  ASSERT_TRUE(executor.wait_in_execute());
  std::thread stopping([&] { fixture.runner.shutdown(); });
  ASSERT_TRUE(wait_until_stopping(fixture.runner));
  executor.release();
  stopping.join();
  EXPECT_TRUE(handle.done());
  EXPECT_TRUE(updates->tokens().empty());
  EXPECT_EQ(updates->finish(), FinishReason::kCancelled) << "not NewTokenLimit: output discarded";
  EXPECT_EQ(updates->terminal_calls(), 1);
  EXPECT_EQ(executor.executed().size(), 1u);
  EXPECT_EQ(executor.open_count(), 0);
  EXPECT_EQ(session.position(), 2);
}

TEST(ShutdownTest, ConcurrentCallersWaitForFullStop) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  executor.hold();
  auto updates = std::make_shared<Updates>();
  GenerationHandle handle = generate(session, tokens(2), config(2), updates);
  ASSERT_TRUE(executor.wait_in_execute());

  std::vector<std::future<void>> callers;
  for (int i = 0; i < 4; ++i) {
    callers.push_back(std::async(std::launch::async, [&] { fixture.runner.shutdown(); }));
  }
  ASSERT_TRUE(wait_until_stopping(fixture.runner));
  for (auto& caller : callers) {
    EXPECT_EQ(caller.wait_for(std::chrono::milliseconds(10)), std::future_status::timeout);
  }
  EXPECT_FALSE(handle.done());
  executor.release();
  for (auto& caller : callers) {
    ASSERT_EQ(caller.wait_for(kTimeout), std::future_status::ready);
  }
  // Every caller returned only after everything settled.
  EXPECT_TRUE(handle.done());
  EXPECT_EQ(handle.finish_reason(), FinishReason::kCancelled);
  EXPECT_EQ(executor.open_count(), 0);
  EXPECT_EQ(executor.closed(), executor.opened());
}

TEST(ShutdownTest, CallbackShutdownStopsLaterOutputsInTheSameBatch) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session barrier = open_session(fixture.runner);
  Session first = open_session(fixture.runner);
  Session second = open_session(fixture.runner);
  executor.hold();
  auto barrier_updates = std::make_shared<Updates>();
  generate(barrier, tokens(2), config(1), barrier_updates);
  ASSERT_TRUE(executor.wait_in_execute());
  auto first_updates = std::make_shared<Updates>();
  auto second_updates = std::make_shared<Updates>();
  GenerationHandle first_handle =
      first.generate_async(tokens(2), config(2), [&](const GenerationUpdate& update) {
        (*first_updates)(update);
        if (!update.finish_reason) fixture.runner.shutdown();
      });
  GenerationHandle second_handle = generate(second, tokens(2), config(2), second_updates);
  executor.release();
  first_handle.wait();
  second_handle.wait();
  fixture.runner.shutdown();

  EXPECT_EQ(barrier_updates->finish(), FinishReason::kNewTokenLimit);
  EXPECT_EQ(first_updates->tokens(), (std::vector<Token>{t(2, 2)}));
  EXPECT_EQ(first_handle.finish_reason(), FinishReason::kCancelled);
  EXPECT_TRUE(second_updates->tokens().empty());
  EXPECT_EQ(second_handle.finish_reason(), FinishReason::kCancelled);
  EXPECT_EQ(first_updates->terminal_calls(), 1);
  EXPECT_EQ(second_updates->terminal_calls(), 1);
  EXPECT_EQ(executor.batch_sizes(), (std::vector<int>{1, 2}));
  EXPECT_EQ(second.position(), 2) << "the discarded output's input still counts";
}

TEST(ShutdownTest, CallbackCanRequestShutdown) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  auto updates = std::make_shared<Updates>();
  GenerationHandle handle =
      session.generate_async(tokens(2), config(2), [&](const GenerationUpdate& update) {
        (*updates)(update);
        if (!update.finish_reason) fixture.runner.shutdown();  // returns at once
      });
  handle.wait();
  fixture.runner.shutdown();
  EXPECT_EQ(updates->tokens().size(), 1u);
  EXPECT_EQ(handle.finish_reason(), FinishReason::kCancelled);
  EXPECT_EQ(updates->terminal_calls(), 1);
  EXPECT_EQ(executor.executed().size(), 1u);
  EXPECT_EQ(executor.open_count(), 0);
}

TEST(ShutdownTest, ClosesRemainingSessionsExactlyOnce) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session first = open_session(fixture.runner);
  Session second = open_session(fixture.runner);
  Session third = open_session(fixture.runner);
  second = Session{};
  ASSERT_TRUE(executor.wait_open_count(2));
  fixture.runner.shutdown();
  fixture.runner.shutdown();  // idempotent
  first = Session{};
  third = Session{};
  EXPECT_EQ(executor.open_count(), 0);
  std::vector<SessionId> closed = executor.closed();
  EXPECT_EQ(closed.front(), 2);
  std::sort(closed.begin(), closed.end());
  EXPECT_EQ(closed, (std::vector<SessionId>{1, 2, 3}));
}

TEST(ShutdownTest, ConcurrentAdmissionDoesNotStrandCallers) {
  FakeExecutor executor;
  Fixture fixture(executor);
  std::vector<Session> sessions;
  for (int i = 0; i < 16; ++i) sessions.push_back(open_session(fixture.runner));
  std::atomic<bool> go{false};
  std::atomic<int> stranded{0};
  std::atomic<int> settled{0};
  std::vector<std::thread> callers;
  for (int thread = 0; thread < 4; ++thread) {
    callers.emplace_back([&, thread] {
      while (!go.load()) std::this_thread::yield();
      for (size_t i = static_cast<size_t>(thread); i < sessions.size(); i += 4) {
        auto updates = std::make_shared<Updates>();
        GenerationHandle handle = generate(sessions[i], tokens(2), config(2), updates);
        auto open = fixture.runner.open_session_async();
        if (!updates->wait() || open.wait_for(kTimeout) != std::future_status::ready) {
          stranded++;
          continue;
        }
        handle.wait();
        settled++;
      }
    });
  }
  go.store(true);
  fixture.runner.shutdown();
  for (std::thread& caller : callers) caller.join();
  EXPECT_EQ(stranded.load(), 0);
  EXPECT_EQ(settled.load(), 16);
  const EngineMetrics m = fixture.runner.metrics();
  EXPECT_EQ(m.generations_started, m.generations_completed);
}

}  // namespace
}  // namespace cellm::testing
