// Runner: executor failures, malformed outputs and scheduler rejections.
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
