// Runner: deltas and positions, and speculative (multi-token) outputs.
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

}  // namespace
}  // namespace cellm::testing
