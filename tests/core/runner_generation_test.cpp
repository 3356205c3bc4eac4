// Runner: generations (callbacks, seeds, budgets, stop tokens) and logprobs.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <stdexcept>

#include "cellm/runner.h"
#include "support/fake_executor.h"
#include "support/runner_harness.h"

namespace cellm::testing {
namespace {

// --- GenerationTest ---------------------------------------------------------

TEST(GenerationTest, SeedIsSetBeforeTasksExecute) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  GenConfig cfg = config(1);
  cfg.seed = 1234;
  auto updates = std::make_shared<Updates>();
  generate(session, tokens(2), cfg, updates);
  ASSERT_TRUE(updates->wait());

  ASSERT_TRUE(executor.sampling(1).has_value());
  EXPECT_EQ(executor.sampling(1)->seed, 1234u);
  EXPECT_FALSE(executor.executed_without_sampling());
  EXPECT_EQ(executor.calls(), (std::vector<std::string>{"initialize", "open 1", "set_sampling 1",
                                                        "execute [1@0+2!]"}));
}

TEST(GenerationTest, SamplingPolicyIsInstalledOnTheSession) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  GenConfig cfg = config(1);
  cfg.sampling.temperature = 0.7f;
  cfg.sampling.top_p = 0.8f;
  cfg.sampling.top_k = 9;
  cfg.sampling.min_p = 0.05f;
  auto updates = std::make_shared<Updates>();
  generate(session, tokens(2), cfg, updates);
  ASSERT_TRUE(updates->wait());

  const std::optional<SamplingInstall> installed = executor.sampling(1);
  ASSERT_TRUE(installed.has_value());
  EXPECT_FLOAT_EQ(installed->params.temperature, 0.7f);
  EXPECT_FLOAT_EQ(installed->params.top_p, 0.8f);
  EXPECT_EQ(installed->params.top_k, 9);
  EXPECT_FLOAT_EQ(installed->params.min_p, 0.05f);
}

TEST(GenerationTest, WaitBlocksUntilTerminalCallbackReturns) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false;
  bool released = false;
  GenerationHandle handle =
      session.generate_async(tokens(2), config(1), [&](const GenerationUpdate& update) {
        if (!update.finish_reason) return;
        std::unique_lock<std::mutex> lock(mu);
        entered = true;
        cv.notify_all();
        cv.wait(lock, [&] { return released; });
      });
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, kTimeout, [&] { return entered; }));
  }
  // The terminal callback is running: nothing is published yet.
  EXPECT_FALSE(handle.done());
  EXPECT_FALSE(handle.finish_reason().has_value());
  EXPECT_EQ(handle.metrics().t_end_us, 0);
  auto waiter = std::async(std::launch::async, [&] { handle.wait(); });
  EXPECT_EQ(waiter.wait_for(std::chrono::milliseconds(20)), std::future_status::timeout);
  {
    std::lock_guard<std::mutex> lock(mu);
    released = true;
  }
  cv.notify_all();
  ASSERT_EQ(waiter.wait_for(kTimeout), std::future_status::ready);
  EXPECT_TRUE(handle.done());
  EXPECT_EQ(handle.finish_reason(), FinishReason::kNewTokenLimit);
  EXPECT_GT(handle.metrics().t_end_us, 0);
}

TEST(GenerationTest, NonterminalCallbackExceptionFailsOnlyItsGeneration) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  Session other = open_session(fixture.runner);
  std::atomic<int> calls{0};
  auto other_updates = std::make_shared<Updates>();
  generate(other, tokens(2), config(3), other_updates);
  GenerationHandle failed =
      session.generate_async(tokens(2), config(3), [&](const GenerationUpdate&) {
        calls++;
        throw std::runtime_error("callback failed");
      });
  failed.wait();
  EXPECT_EQ(failed.finish_reason(), FinishReason::kFailed);
  EXPECT_EQ(failed.error_message(), "callback failed");
  EXPECT_EQ(calls.load(), 1) << "a callback that throws is never called again";

  ASSERT_TRUE(other_updates->wait());
  EXPECT_EQ(other_updates->finish(), FinishReason::kNewTokenLimit);
  EXPECT_EQ(other_updates->tokens().size(), 3u);

  // The session itself is fine: the delivered token is carried into the next turn.
  EXPECT_EQ(session.position(), 2);
  auto next = std::make_shared<Updates>();
  GenerationHandle next_handle = generate(session, {500}, config(1), next);
  ASSERT_TRUE(next->wait());
  next_handle.wait();
  EXPECT_EQ(next_handle.finish_reason(), FinishReason::kNewTokenLimit);
  EXPECT_TRUE(next_handle.error_message().empty());
  EXPECT_EQ(executor.executed().back().tokens, (std::vector<Token>{t(1, 2), 500}));
}

TEST(GenerationTest, CallbackExceptionWinsWhenCallbackRequestsShutdown) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  std::atomic<int> calls{0};
  GenerationHandle failed =
      session.generate_async(tokens(2), config(2), [&](const GenerationUpdate& update) {
        calls++;
        if (!update.finish_reason) {
          fixture.runner.shutdown();
          throw std::runtime_error("callback failed during shutdown");
        }
      });
  failed.wait();
  EXPECT_EQ(failed.finish_reason(), FinishReason::kFailed);
  EXPECT_EQ(failed.error_message(), "callback failed during shutdown");
  EXPECT_EQ(calls.load(), 1);
  fixture.runner.shutdown();
  EXPECT_EQ(fixture.runner.metrics().finished_failed, 1);
}

TEST(GenerationTest, CallbackExceptionWinsOverExternalShutdown) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false;
  bool released = false;
  GenerationHandle failed =
      session.generate_async(tokens(2), config(2), [&](const GenerationUpdate& update) {
        if (update.finish_reason) return;
        std::unique_lock<std::mutex> lock(mu);
        entered = true;
        cv.notify_all();
        cv.wait(lock, [&] { return released; });
        throw std::runtime_error("callback failed during external shutdown");
      });
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, kTimeout, [&] { return entered; }));
  }
  auto stopping = std::async(std::launch::async, [&] { fixture.runner.shutdown(); });
  ASSERT_TRUE(wait_until_stopping(fixture.runner));
  {
    std::lock_guard<std::mutex> lock(mu);
    released = true;
  }
  cv.notify_all();
  ASSERT_EQ(stopping.wait_for(kTimeout), std::future_status::ready);
  EXPECT_TRUE(failed.done());
  EXPECT_EQ(failed.finish_reason(), FinishReason::kFailed);
  EXPECT_EQ(failed.error_message(), "callback failed during external shutdown");
}

TEST(GenerationTest, TerminalCallbackExceptionFailsOnlyItsGeneration) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  std::atomic<int> terminal_calls{0};
  GenerationHandle failed =
      session.generate_async(tokens(2), config(1), [&](const GenerationUpdate& update) {
        if (update.finish_reason) {
          terminal_calls++;
          throw std::runtime_error("callback failed");
        }
      });
  failed.wait();
  EXPECT_EQ(terminal_calls.load(), 1);
  EXPECT_EQ(failed.finish_reason(), FinishReason::kFailed);
  EXPECT_EQ(failed.error_message(), "callback failed");
  EXPECT_EQ(failed.metrics().n_generated_tokens, 1);

  auto next = std::make_shared<Updates>();
  GenerationHandle next_handle = generate(session, tokens(1), config(1), next);
  ASSERT_TRUE(next->wait());
  next_handle.wait();
  EXPECT_EQ(next->finish(), FinishReason::kNewTokenLimit);
}

TEST(GenerationTest, NullSeedInitializesNondeterministicSamplingState) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  auto updates = std::make_shared<Updates>();
  generate(session, tokens(2), config(1), updates);
  ASSERT_TRUE(updates->wait());
  ASSERT_TRUE(executor.sampling(1).has_value());
  EXPECT_FALSE(executor.sampling(1)->seed.has_value());
  EXPECT_FALSE(executor.executed_without_sampling());
}

TEST(GenerationTest, RejectsNonPositiveTokenBudgetWithMessage) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  for (int32_t budget : {0, -3}) {
    auto updates = std::make_shared<Updates>();
    GenerationHandle handle = generate(session, tokens(1), config(budget), updates);
    ASSERT_TRUE(updates->wait());
    handle.wait();
    EXPECT_EQ(handle.finish_reason(), FinishReason::kFailed);
    EXPECT_EQ(handle.error_message(), "max_new_tokens must be greater than zero");
    EXPECT_EQ(updates->error_message(), handle.error_message());
    EXPECT_EQ(updates->terminal_calls(), 1);
  }
  EXPECT_TRUE(executor.executed().empty());
}

TEST(GenerationTest, RejectsEmptyDeltaWithMessage) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  auto updates = std::make_shared<Updates>();
  GenerationHandle handle = generate(session, {}, config(1), updates);
  ASSERT_TRUE(updates->wait());
  handle.wait();
  EXPECT_EQ(handle.finish_reason(), FinishReason::kFailed);
  EXPECT_EQ(handle.error_message(), "generation delta must not be empty");
  EXPECT_EQ(updates->error_message(), handle.error_message());
}

TEST(GenerationTest, RejectsInvalidSamplingBeforeInstallingIt) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  auto updates = std::make_shared<Updates>();
  GenConfig bad = config(1);
  bad.sampling.top_p = 1.5f;
  GenerationHandle handle = generate(session, tokens(2), bad, updates);
  ASSERT_TRUE(updates->wait());
  handle.wait();
  EXPECT_EQ(handle.finish_reason(), FinishReason::kFailed);
  EXPECT_EQ(handle.error_message(), "invalid sampling: top_p must be in (0, 1], got 1.5");
  // The session is not poisoned: a valid generation runs next.
  auto next = std::make_shared<Updates>();
  GenerationHandle ok = generate(session, tokens(2), config(1), next);
  ok.wait();
  EXPECT_EQ(ok.finish_reason(), FinishReason::kNewTokenLimit);
}

TEST(GenerationTest, ActiveGenerationRejectsDuplicateWithoutReseeding) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  executor.hold();
  GenConfig active_cfg = config(2);
  active_cfg.seed = 12;
  auto active = std::make_shared<Updates>();
  generate(session, tokens(2), active_cfg, active);
  ASSERT_TRUE(executor.wait_in_execute());

  GenConfig duplicate_cfg = config(1);
  duplicate_cfg.seed = 37;
  auto duplicate = std::make_shared<Updates>();
  GenerationHandle duplicate_handle = generate(session, tokens(1), duplicate_cfg, duplicate);
  executor.release();

  ASSERT_TRUE(duplicate->wait());
  duplicate_handle.wait();
  ASSERT_TRUE(active->wait());
  duplicate_handle.wait();
  EXPECT_EQ(duplicate_handle.finish_reason(), FinishReason::kFailed);
  EXPECT_EQ(duplicate_handle.error_message(), "session already has an active generation");
  EXPECT_EQ(active->finish(), FinishReason::kNewTokenLimit);
  EXPECT_EQ(active->tokens(), (std::vector<Token>{t(1, 2), t(1, 3)}));
  EXPECT_EQ(executor.sampling(1)->seed, 12u);
  EXPECT_EQ(count_calls(executor, "set_sampling"), 1u);
}

TEST(GenerationTest, ANewGenerationReseedsTheExistingSession) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  GenConfig first_cfg = config(1);
  first_cfg.seed = 11;
  auto first = std::make_shared<Updates>();
  generate(session, tokens(2), first_cfg, first);
  ASSERT_TRUE(first->wait());
  EXPECT_EQ(executor.sampling(1)->seed, 11u);

  GenConfig second_cfg = config(1);
  second_cfg.seed = 22;
  second_cfg.sampling.temperature = 1.0f;
  auto second = std::make_shared<Updates>();
  generate(session, tokens(1), second_cfg, second);
  ASSERT_TRUE(second->wait());
  EXPECT_EQ(executor.sampling(1)->seed, 22u);
  EXPECT_FLOAT_EQ(executor.sampling(1)->params.temperature, 1.0f);
  EXPECT_EQ(count_calls(executor, "set_sampling"), 2u);
}

TEST(GenerationTest, StopTokenIsIncludedInUpdates) {
  FakeExecutor executor;
  executor.script_tokens(1, {7, 8, 999, 5});
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  GenConfig cfg = config(50);
  cfg.stop_tokens = {999};
  auto updates = std::make_shared<Updates>();
  generate(session, tokens(2), cfg, updates);
  ASSERT_TRUE(updates->wait());
  EXPECT_EQ(updates->finish(), FinishReason::kStopToken);
  EXPECT_EQ(updates->tokens(), (std::vector<Token>{7, 8, 999}));
  EXPECT_EQ(updates->bursts().back(), (std::vector<Token>{999}));
}

TEST(GenerationTest, ImmediateStopTokenIsDeliveredAndWinsOverBudget) {
  FakeExecutor executor;
  executor.script_tokens(1, {999});
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  GenConfig cfg = config(1);
  cfg.stop_tokens = {3, 999};
  auto updates = std::make_shared<Updates>();
  generate(session, tokens(2), cfg, updates);
  ASSERT_TRUE(updates->wait());
  EXPECT_EQ(updates->tokens(), (std::vector<Token>{999}));
  EXPECT_EQ(updates->finish(), FinishReason::kStopToken);
  EXPECT_EQ(updates->terminal_calls(), 1);
  EXPECT_EQ(executor.executed().size(), 1u);
}

// --- LogprobsTest -----------------------------------------------------------

GenConfig with_logprobs(int32_t max_new_tokens, int32_t num_logprobs = 3) {
  GenConfig c = config(max_new_tokens);
  c.sampling.num_logprobs = num_logprobs;
  return c;
}

std::vector<TokenLogprobs> logprobs_of(const std::vector<Token>& tokens) {
  std::vector<TokenLogprobs> out;
  for (Token token : tokens) out.push_back(FakeExecutor::logprobs_for(token));
  return out;
}

void expect_logprobs(const std::vector<TokenLogprobs>& got, const std::vector<Token>& tokens) {
  const std::vector<TokenLogprobs> want = logprobs_of(tokens);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].logprob, want[i].logprob) << "token " << i;
    EXPECT_EQ(got[i].top, want[i].top) << "token " << i;
  }
}

TEST(LogprobsTest, UpdatesCarryLogprobsParallelToTheirTokens) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  auto updates = std::make_shared<Updates>();
  generate(session, tokens(3), with_logprobs(5), updates);
  ASSERT_TRUE(updates->wait());
  EXPECT_EQ(updates->finish(), FinishReason::kNewTokenLimit);
  ASSERT_EQ(updates->tokens().size(), 5u);
  EXPECT_TRUE(updates->logprobs_parallel());
  expect_logprobs(updates->logprobs(), updates->tokens());
  ASSERT_TRUE(executor.sampling(1).has_value());
  EXPECT_EQ(executor.sampling(1)->params.num_logprobs, 3);
}

TEST(LogprobsTest, AGenerationThatAsksForNoneGetsNone) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  auto updates = std::make_shared<Updates>();
  generate(session, tokens(3), config(4), updates);
  ASSERT_TRUE(updates->wait());
  EXPECT_EQ(updates->tokens().size(), 4u);
  EXPECT_TRUE(updates->logprobs().empty());
}

TEST(LogprobsTest, AStopTokenCutsTheLogprobsWithTheTokens) {
  FakeExecutor executor;
  executor.set_tokens_per_output(4);
  executor.script_tokens(1, {5, 999, 6, 7});
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  GenConfig cfg = with_logprobs(50);
  cfg.stop_tokens = {999};
  auto updates = std::make_shared<Updates>();
  generate(session, tokens(2), cfg, updates);
  ASSERT_TRUE(updates->wait());
  ASSERT_EQ(updates->finish(), FinishReason::kStopToken);
  EXPECT_EQ(updates->tokens(), (std::vector<Token>{5, 999}));
  EXPECT_TRUE(updates->logprobs_parallel());
  expect_logprobs(updates->logprobs(), {5, 999});
}

TEST(LogprobsTest, TheBudgetCutsTheLogprobsWithTheTokens) {
  FakeExecutor executor;
  executor.set_tokens_per_output(3);
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  auto updates = std::make_shared<Updates>();
  generate(session, tokens(2), with_logprobs(4), updates);
  ASSERT_TRUE(updates->wait());
  ASSERT_EQ(updates->finish(), FinishReason::kNewTokenLimit);
  // Prompt answers t2 t3 t4 (all delivered); the decode answers t5 t6 t7, cut to t5.
  EXPECT_EQ(updates->bursts().back(), (std::vector<Token>{t(1, 5)}));
  EXPECT_TRUE(updates->logprobs_parallel());
  expect_logprobs(updates->logprobs(), {t(1, 2), t(1, 3), t(1, 4), t(1, 5)});
}

TEST(LogprobsTest, LogprobsThatAreNotParallelToTheTokensAreAnInvalidOutput) {
  struct Case {
    Malformation malformation;
    int32_t num_logprobs;
  };
  // An extra entry, asked for or not; none where they were asked for.
  for (const Case& c :
       {Case{Malformation::kExtraLogprobs, 2}, Case{Malformation::kExtraLogprobs, 0},
        Case{Malformation::kMissingLogprobs, 2}}) {
    FakeExecutor executor;
    executor.set_malformation(c.malformation);
    Fixture fixture(executor);
    Session session = open_session(fixture.runner);
    auto updates = std::make_shared<Updates>();
    GenerationHandle handle =
        generate(session, tokens(2), with_logprobs(3, c.num_logprobs), updates);
    ASSERT_TRUE(updates->wait());
    handle.wait();
    EXPECT_EQ(handle.finish_reason(), FinishReason::kFailed);
    EXPECT_EQ(handle.error_message(), "executor returned an invalid output")
        << "num_logprobs " << c.num_logprobs;
    EXPECT_TRUE(updates->tokens().empty());
  }
  // Without logprobs asked for, an output without them is well formed.
  FakeExecutor executor;
  executor.set_malformation(Malformation::kMissingLogprobs);
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  auto updates = std::make_shared<Updates>();
  GenerationHandle handle = generate(session, tokens(2), config(3), updates);
  handle.wait();
  EXPECT_EQ(handle.finish_reason(), FinishReason::kNewTokenLimit);
}

TEST(LogprobsTest, RejectsMoreThanTwentyLogprobs) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  auto updates = std::make_shared<Updates>();
  GenerationHandle handle = generate(session, tokens(2), with_logprobs(1, 21), updates);
  handle.wait();
  EXPECT_EQ(handle.finish_reason(), FinishReason::kFailed);
  EXPECT_EQ(handle.error_message(), "invalid sampling: num_logprobs must be in [0, 20], got 21");
}

}  // namespace
}  // namespace cellm::testing
