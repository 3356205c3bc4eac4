// Runner: generations, deltas and positions, speculative outputs and executor
// failures.
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

// Refuses every submission.
class RejectingScheduler : public Scheduler {
 public:
  bool submit(std::vector<Task>) override { return false; }
  bool has_work() const override { return false; }
  std::vector<Task> get_work() override { return {}; }
  std::vector<Task> cancel(SessionId) override { return {}; }
  std::vector<Task> clear() override { return {}; }
  size_t num_queued() const override { return 0; }
  size_t max_prefill_chunk_size() const override { return 8; }
};

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

// --- DeltaTest --------------------------------------------------------------

TEST(DeltaTest, FreshSessionStartsAtZero) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  EXPECT_EQ(session.position(), 0);
  auto updates = std::make_shared<Updates>();
  generate(session, tokens(3), config(1), updates);
  ASSERT_TRUE(updates->wait());
  const std::vector<ExecutedInput> seen = executor.executed();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].position, 0);
  EXPECT_EQ(seen[0].offset, 0u);
  EXPECT_EQ(seen[0].tokens, tokens(3));
  EXPECT_TRUE(seen[0].produce_output);
  EXPECT_EQ(updates->tokens(), (std::vector<Token>{t(1, 3)}));
  EXPECT_EQ(session.position(), 3);
}

TEST(DeltaTest, ChunksUseDeltaBasePlusOffset) {
  FakeExecutor executor;
  Fixture fixture(executor, 2, 4);
  Session session = open_session(fixture.runner);
  auto updates = std::make_shared<Updates>();
  generate(session, tokens(10), config(1), updates);
  ASSERT_TRUE(updates->wait());
  const std::vector<ExecutedInput> seen = executor.executed();
  ASSERT_EQ(seen.size(), 3u);
  const size_t offsets[] = {0, 4, 8};
  const size_t sizes[] = {4, 4, 2};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(seen[i].position, 0) << i;
    EXPECT_EQ(seen[i].offset, offsets[i]) << i;
    EXPECT_EQ(seen[i].size, sizes[i]) << i;
    EXPECT_EQ(seen[i].start(), static_cast<Position>(offsets[i])) << i;
    EXPECT_EQ(seen[i].produce_output, i == 2) << i;
    EXPECT_EQ(seen[i].batch, 0) << "all three chunks fit one batch";
  }
  EXPECT_EQ(executor.history(1), tokens(10));
  EXPECT_EQ(updates->tokens(), (std::vector<Token>{t(1, 10)}));
}

TEST(DeltaTest, SecondTurnContinuesWhereTheFirstEnded) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  auto first = std::make_shared<Updates>();
  generate(session, tokens(3), config(2), first);
  ASSERT_TRUE(first->wait());
  EXPECT_EQ(first->tokens(), (std::vector<Token>{t(1, 3), t(1, 4)}));
  EXPECT_EQ(session.position(), 4) << "the last delivered token is pending, not committed";

  auto second = std::make_shared<Updates>();
  generate(session, {500}, config(1), second);
  ASSERT_TRUE(second->wait());
  const ExecutedInput last = executor.executed().back();
  EXPECT_EQ(last.start(), 4);
  EXPECT_EQ(last.tokens, (std::vector<Token>{t(1, 4), 500}));
  EXPECT_EQ(second->tokens(), (std::vector<Token>{t(1, 6)}));
  EXPECT_EQ(executor.history(1), (std::vector<Token>{100, 101, 102, t(1, 3), t(1, 4), 500}));
  EXPECT_EQ(second->finish(), FinishReason::kNewTokenLimit);
}

TEST(DeltaTest, PositionIsPerSession) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session first = open_session(fixture.runner);
  Session second = open_session(fixture.runner);
  auto a = std::make_shared<Updates>();
  generate(first, tokens(4), config(1), a);
  ASSERT_TRUE(a->wait());
  auto b = std::make_shared<Updates>();
  generate(second, tokens(2), config(1), b);
  ASSERT_TRUE(b->wait());
  const ExecutedInput last = executor.executed().back();
  EXPECT_EQ(last.sid, 2);
  EXPECT_EQ(last.start(), 0);
  EXPECT_EQ(first.position(), 4);
  EXPECT_EQ(second.position(), 2);
  EXPECT_EQ(b->tokens(), (std::vector<Token>{t(2, 2)}));
}

TEST(DeltaTest, GeneratedTokenFollowsTheDelta) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  auto updates = std::make_shared<Updates>();
  generate(session, tokens(2), config(2), updates);
  ASSERT_TRUE(updates->wait());
  const std::vector<ExecutedInput> seen = executor.executed();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].start(), 0);
  EXPECT_EQ(seen[1].start(), 2);
  EXPECT_EQ(seen[1].tokens, (std::vector<Token>{t(1, 2)}));
  EXPECT_TRUE(seen[1].produce_output);
  EXPECT_EQ(updates->tokens(), (std::vector<Token>{t(1, 2), t(1, 3)}));
}

TEST(DeltaTest, InvalidInitialRangesFailBeforeBeginning) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  auto empty_delta = std::make_shared<Updates>();
  generate(session, {}, config(1), empty_delta);
  auto bad_budget = std::make_shared<Updates>();
  generate(session, tokens(1), config(0), bad_budget);
  ASSERT_TRUE(empty_delta->wait());
  ASSERT_TRUE(bad_budget->wait());
  EXPECT_EQ(empty_delta->finish(), FinishReason::kFailed);
  EXPECT_EQ(bad_budget->finish(), FinishReason::kFailed);
  fixture.runner.shutdown();
  EXPECT_FALSE(executor.sampling(1).has_value());
  EXPECT_EQ(count_calls(executor, "set_sampling"), 0u);
  EXPECT_TRUE(executor.executed().empty());
  EXPECT_EQ(session.position(), 0);
}

TEST(DeltaTest, MalformedOutputFailsEvenWhenTheGenerationEnds) {
  FakeExecutor executor;
  executor.set_malformation(Malformation::kEmptyTokens);
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  auto updates = std::make_shared<Updates>();
  GenerationHandle handle = generate(session, tokens(2), config(1), updates);
  ASSERT_TRUE(updates->wait());
  handle.wait();
  EXPECT_EQ(updates->finish(), FinishReason::kFailed);
  EXPECT_EQ(handle.error_message(), "executor returned an invalid output");
  EXPECT_EQ(updates->terminal_calls(), 1);
  EXPECT_EQ(executor.executed().size(), 1u);
}

TEST(DeltaTest, UnexpectedOutputForLeadingChunkFailsAndPoisonsSession) {
  FakeExecutor executor;
  executor.set_malformation(Malformation::kUnexpectedOutput);
  Fixture fixture(executor, 2, 2);
  Session session = open_session(fixture.runner);
  auto first = std::make_shared<Updates>();
  GenerationHandle first_handle = generate(session, tokens(4), config(1), first);
  ASSERT_TRUE(first->wait());
  first_handle.wait();
  EXPECT_EQ(first_handle.error_message(), "executor returned an invalid output");
  EXPECT_TRUE(first->tokens().empty());
  EXPECT_EQ(first->terminal_calls(), 1);

  executor.set_malformation(Malformation::kNone);
  auto second = std::make_shared<Updates>();
  GenerationHandle second_handle = generate(session, tokens(1), config(1), second);
  ASSERT_TRUE(second->wait());
  second_handle.wait();
  EXPECT_EQ(second_handle.finish_reason(), FinishReason::kFailed);
  EXPECT_EQ(second_handle.error_message(), "session cannot continue after an executor failure");
  EXPECT_EQ(executor.executed().size(), 2u) << "the poisoned session runs nothing more";
}

TEST(DeltaTest, MalformedOutputFailsWithoutAnotherTask) {
  for (Malformation m :
       {Malformation::kEmptyTokens, Malformation::kWrongSid, Malformation::kMissingOutput}) {
    FakeExecutor executor;
    executor.set_malformation(m);
    Fixture fixture(executor);
    Session session = open_session(fixture.runner);
    auto updates = std::make_shared<Updates>();
    GenerationHandle handle = generate(session, tokens(2), config(5), updates);
    ASSERT_TRUE(updates->wait());
    handle.wait();
    EXPECT_EQ(updates->finish(), FinishReason::kFailed);
    EXPECT_EQ(handle.error_message(), "executor returned an invalid output");
    EXPECT_EQ(updates->terminal_calls(), 1);
    EXPECT_TRUE(updates->tokens().empty());
    EXPECT_EQ(executor.executed().size(), 1u);
    EXPECT_EQ(fixture.runner.queued_tasks(), 0u);
  }
}

TEST(DeltaTest, StopTokenSchedulesNothingFurther) {
  FakeExecutor executor;
  executor.script_tokens(1, {7, 999});
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  GenConfig cfg = config(50);
  cfg.stop_tokens = {999};
  auto updates = std::make_shared<Updates>();
  generate(session, tokens(2), cfg, updates);
  ASSERT_TRUE(updates->wait());
  EXPECT_EQ(updates->finish(), FinishReason::kStopToken);
  EXPECT_EQ(executor.executed().size(), 2u) << "the prompt and one decode";
  EXPECT_EQ(fixture.runner.queued_tasks(), 0u);
  fixture.runner.shutdown();
  EXPECT_EQ(executor.executed().size(), 2u);
}

// --- SpeculativeTest (three tokens per output) ------------------------------

TEST(SpeculativeTest, TerminalStepPositionCarriesToTheNextTurn) {
  FakeExecutor executor;
  executor.set_tokens_per_output(3);
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  auto first = std::make_shared<Updates>();
  generate(session, tokens(2), config(6), first);
  ASSERT_TRUE(first->wait());
  ASSERT_EQ(first->finish(), FinishReason::kNewTokenLimit);
  // Prompt [0,2) answers t2 t3 t4; the decode of t4 answers t5 t6 t7.
  EXPECT_EQ(first->tokens(),
            (std::vector<Token>{t(1, 2), t(1, 3), t(1, 4), t(1, 5), t(1, 6), t(1, 7)}));
  EXPECT_EQ(session.position(), 7) << "all delivered tokens but the last are committed";

  auto second = std::make_shared<Updates>();
  generate(session, tokens(1), config(1), second);
  ASSERT_TRUE(second->wait());
  const ExecutedInput last = executor.executed().back();
  EXPECT_EQ(last.start(), 7);
  EXPECT_EQ(last.tokens, (std::vector<Token>{t(1, 7), 100}));
}

TEST(SpeculativeTest, StopTokenInAcceptedRunDropsOnlyTheSuffix) {
  FakeExecutor executor;
  executor.set_tokens_per_output(4);
  executor.script_tokens(1, {5, 999, 6, 7});
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  GenConfig cfg = config(50);
  cfg.stop_tokens = {999};
  auto first = std::make_shared<Updates>();
  generate(session, tokens(2), cfg, first);
  ASSERT_TRUE(first->wait());
  ASSERT_EQ(first->finish(), FinishReason::kStopToken);
  EXPECT_EQ(first->tokens(), (std::vector<Token>{5, 999}));
  EXPECT_EQ(session.position(), 4) << "the speculative suffix after STOP is not kept";
  EXPECT_EQ(executor.history(1), (std::vector<Token>{100, 101, 5, 999, 6}));

  executor.set_tokens_per_output(1);
  auto second = std::make_shared<Updates>();
  generate(session, {300}, config(1), second);
  ASSERT_TRUE(second->wait());
  const ExecutedInput last = executor.executed().back();
  EXPECT_EQ(last.start(), 4);
  EXPECT_EQ(last.tokens, (std::vector<Token>{300})) << "a committed STOP needs no carry";
  EXPECT_EQ(executor.history(1), (std::vector<Token>{100, 101, 5, 999, 300}))
      << "the next input rewound the suffix";
}

TEST(SpeculativeTest, FinalStopTokenCarriesToTheNextTurn) {
  FakeExecutor executor;
  executor.set_tokens_per_output(3);
  executor.script_tokens(1, {5, 6, 999});
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  GenConfig cfg = config(50);
  cfg.stop_tokens = {999};
  auto first = std::make_shared<Updates>();
  generate(session, tokens(2), cfg, first);
  ASSERT_TRUE(first->wait());
  ASSERT_EQ(first->finish(), FinishReason::kStopToken);
  EXPECT_EQ(first->tokens(), (std::vector<Token>{5, 6, 999}));
  EXPECT_EQ(session.position(), 4);

  auto second = std::make_shared<Updates>();
  generate(session, {300}, config(1), second);
  ASSERT_TRUE(second->wait());
  const ExecutedInput last = executor.executed().back();
  EXPECT_EQ(last.start(), 4);
  EXPECT_EQ(last.tokens, (std::vector<Token>{999, 300}));
}

TEST(SpeculativeTest, AcceptedRunUsesExecutorPosition) {
  FakeExecutor executor;
  executor.set_tokens_per_output(3);
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  auto updates = std::make_shared<Updates>();
  generate(session, tokens(2), config(7), updates);
  ASSERT_TRUE(updates->wait());
  EXPECT_EQ(updates->finish(), FinishReason::kNewTokenLimit);
  EXPECT_EQ(updates->tokens().size(), 7u);
  const std::vector<ExecutedInput> seen = executor.executed();
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0].start(), 0);
  EXPECT_EQ(seen[1].start(), 4);
  EXPECT_EQ(seen[2].start(), 7);
  EXPECT_EQ(updates->bursts().back(), (std::vector<Token>{t(1, 8)}));
  EXPECT_EQ(session.position(), 9) << "t8 was delivered and committed; t9, t10 were not";
  EXPECT_TRUE(executor.violations().empty());
}

// --- FailureTest ------------------------------------------------------------

TEST(FailureTest, MalformedOutputRetiresTheSession) {
  FakeExecutor executor;
  executor.set_malformation(Malformation::kEmptyTokens);
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  auto first = std::make_shared<Updates>();
  GenerationHandle first_handle = generate(session, tokens(2), config(2), first);
  ASSERT_TRUE(first->wait());
  first_handle.wait();
  EXPECT_EQ(first_handle.error_message(), "executor returned an invalid output");

  executor.set_malformation(Malformation::kNone);
  auto second = std::make_shared<Updates>();
  GenerationHandle second_handle = generate(session, tokens(1), config(1), second);
  ASSERT_TRUE(second->wait());
  second_handle.wait();
  EXPECT_EQ(second_handle.error_message(), "session cannot continue after an executor failure");
  auto clone = session.clone_async(0);
  EXPECT_FALSE(settle(clone).has_value());
}

TEST(FailureTest, SchedulerRejectionEndsTheGeneration) {
  FakeExecutor executor;
  Runner runner(executor, std::make_unique<RejectingScheduler>());
  Session session = open_session(runner);
  auto updates = std::make_shared<Updates>();
  GenerationHandle handle = generate(session, tokens(2), config(2), updates);
  ASSERT_TRUE(updates->wait());
  handle.wait();
  EXPECT_EQ(handle.finish_reason(), FinishReason::kFailed);
  EXPECT_EQ(handle.error_message(), "scheduler rejected generation tasks");
  EXPECT_EQ(updates->error_message(), handle.error_message());
  EXPECT_EQ(updates->terminal_calls(), 1);
  EXPECT_TRUE(executor.executed().empty());
}

// The runner's message names the executor's cause.
const std::string kExecuteFailed =
    std::string("executor failed to execute the batch: ") + FakeExecutor::kFailedBatchMessage;

TEST(FailureTest, TheExecutorsMessageReachesTheGenerationsError) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  executor.fail_batches_from(0);
  auto updates = std::make_shared<Updates>();
  GenerationHandle handle = generate(session, tokens(3), config(2), updates);
  ASSERT_TRUE(updates->wait());
  handle.wait();
  EXPECT_EQ(handle.finish_reason(), FinishReason::kFailed);
  EXPECT_NE(handle.error_message().find(FakeExecutor::kFailedBatchMessage), std::string::npos)
      << handle.error_message();
  EXPECT_EQ(handle.error_message(), kExecuteFailed);
  EXPECT_EQ(updates->error_message(), handle.error_message());
}

TEST(FailureTest, FailureOnLeadingPrefillChunksEndsGeneration) {
  FakeExecutor executor;
  executor.fail_batches_from(0);
  Fixture fixture(executor, 1, 4);  // budget 9: chunks 4 + 4 fit, the last 2 waits
  Session session = open_session(fixture.runner);
  auto updates = std::make_shared<Updates>();
  GenerationHandle handle = generate(session, tokens(10), config(1), updates);
  ASSERT_TRUE(updates->wait());
  handle.wait();
  EXPECT_EQ(handle.error_message(), kExecuteFailed);
  EXPECT_EQ(updates->error_message(), handle.error_message());
  EXPECT_EQ(updates->terminal_calls(), 1);
  const std::vector<ExecutedInput> seen = executor.executed();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].size, 4u);
  EXPECT_EQ(seen[1].size, 4u);
  EXPECT_EQ(fixture.runner.queued_tasks(), 0u) << "the third chunk was unqueued";
  fixture.runner.shutdown();
  EXPECT_EQ(executor.executed().size(), 2u);
}

TEST(FailureTest, ExecutorFailurePoisonsTheSession) {
  FakeExecutor executor;
  executor.fail_batches_from(0);
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  auto first = std::make_shared<Updates>();
  GenerationHandle first_handle = generate(session, tokens(2), config(2), first);
  ASSERT_TRUE(first->wait());
  first_handle.wait();
  EXPECT_EQ(first_handle.finish_reason(), FinishReason::kFailed);
  EXPECT_EQ(first_handle.error_message(), kExecuteFailed);

  executor.fail_batches_from(-1);
  auto second = std::make_shared<Updates>();
  GenerationHandle second_handle = generate(session, tokens(1), config(1), second);
  ASSERT_TRUE(second->wait());
  second_handle.wait();
  EXPECT_EQ(second_handle.error_message(), "session cannot continue after an executor failure");
  EXPECT_EQ(second->error_message(), second_handle.error_message());

  // Another session is unaffected.
  Session fresh = open_session(fixture.runner);
  auto third = std::make_shared<Updates>();
  generate(fresh, tokens(1), config(1), third);
  ASSERT_TRUE(third->wait());
  EXPECT_EQ(third->finish(), FinishReason::kNewTokenLimit);
}

TEST(FailureTest, IncompleteBatchOutputFailsEverySessionInTheBatch) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session barrier = open_session(fixture.runner);
  Session a = open_session(fixture.runner);
  Session b = open_session(fixture.runner);
  executor.set_malformation(Malformation::kShortBatch, 1);
  executor.hold();
  auto barrier_updates = std::make_shared<Updates>();
  generate(barrier, tokens(1), config(1), barrier_updates);
  ASSERT_TRUE(executor.wait_in_execute());
  auto ua = std::make_shared<Updates>();
  auto ub = std::make_shared<Updates>();
  GenerationHandle ha = generate(a, tokens(2), config(3), ua);
  GenerationHandle hb = generate(b, tokens(2), config(3), ub);
  executor.release();
  ha.wait();
  hb.wait();
  ASSERT_TRUE(barrier_updates->wait());
  EXPECT_EQ(barrier_updates->finish(), FinishReason::kNewTokenLimit);
  EXPECT_EQ(executor.batch_sizes(), (std::vector<int>{1, 2}));
  EXPECT_EQ(ha.error_message(), "executor returned an incomplete batch output");
  EXPECT_EQ(hb.error_message(), "executor returned an incomplete batch output");
  EXPECT_TRUE(ua->tokens().empty());
  EXPECT_TRUE(ub->tokens().empty());
  fixture.runner.shutdown();
  EXPECT_EQ(fixture.runner.metrics().steps_failed, 1);
}

}  // namespace
}  // namespace cellm::testing
