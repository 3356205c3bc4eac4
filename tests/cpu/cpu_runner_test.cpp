// The CPU executor under the real Runner: see runner_parity.h; and a pool shared
// by need (capacity rule off) serving more sessions than fixed slots could.
#include <gtest/gtest.h>

#include "cellm/cpu_executor.h"
#include "kjv_prompts.h"
#include "runner_parity.h"

namespace cellm {
namespace {

Result<std::unique_ptr<Executor>> make_cpu(std::shared_ptr<const ModelWeights> weights,
                                           int32_t sessions, int32_t tokens, int32_t width) {
  ExecutorLimits limits;
  limits.max_sessions = sessions;
  limits.max_session_tokens = tokens;
  limits.step_width = width;
  CpuExecutorOptions options;
  options.initial_cells = 64;  // grows while the test runs
  options.num_threads = 2;
  CELLM_ASSIGN_OR_RETURN(std::unique_ptr<CpuExecutor> e,
                         CpuExecutor::create(weights, limits, options));
  return std::unique_ptr<Executor>(std::move(e));
}

class CpuRunnerFixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CpuRunnerFixtureTest, ConcurrentChunkedGreedyGenerationsMatchTheReference) {
  testing::expect_runner_parity(GetParam(), make_cpu);
}

INSTANTIATE_TEST_SUITE_P(Architectures, CpuRunnerFixtureTest,
                         ::testing::ValuesIn(testing::fixture_names()), testing::fixture_test_name);

// 1024 cells of kjv-small (context 256) shared by need: 16 concurrent generations of
// 60 positions each (more than the 1024 / 256 = 4 that fixed context-sized slots
// hold), through the real Runner and scheduler, each delivering the tokens it
// delivers alone; no step fails and every cell comes back.
TEST(CpuRunnerSharedPoolTest, SixteenGenerationsInAPoolOfFourContextsMatchTheirSoloRuns) {
  const auto weights = testing::load_kjv_small();
  ASSERT_EQ(weights->config().max_position_embeddings(), 256);
  // The factory's geometry is ignored but for the resident sessions and the width.
  const testing::ExecutorFactory shared = [](std::shared_ptr<const ModelWeights> w,
                                             int32_t sessions, int32_t,
                                             int32_t width) -> Result<std::unique_ptr<Executor>> {
    ExecutorLimits limits;
    limits.capacity_rule = false;
    limits.max_sessions = sessions;
    limits.max_session_tokens = 0;  // the model's context
    limits.max_cells = 1024;
    limits.step_width = width;
    CpuExecutorOptions options;
    options.initial_cells = 64;
    options.num_threads = 2;
    CELLM_ASSIGN_OR_RETURN(std::unique_ptr<CpuExecutor> e,
                           CpuExecutor::create(std::move(w), limits, options));
    EXPECT_EQ(e->limits().max_session_tokens, 256);
    return std::unique_ptr<Executor>(std::move(e));
  };
  // 37-token prompts and 24 new tokens: 37 + 23 committed positions each.
  constexpr size_t kPrompt = 37, kCommitted = kPrompt + testing::kNewTokens - 1;
  static_assert(kCommitted == 60);
  const std::vector<std::vector<Token>> prompts = testing::kjv_prompts(16, kPrompt, 11);
  const testing::Outcome all = testing::run_concurrently(shared, weights, prompts);
  ASSERT_EQ(all.tokens.size(), prompts.size());
  EXPECT_EQ(all.engine.steps_failed, 0);
  EXPECT_EQ(all.engine.peak_concurrent_generations, 16);  // 4 x the 1024 / 256 slots
  EXPECT_EQ(all.kv_open.cells_in_use, static_cast<int64_t>(16 * kCommitted));
  EXPECT_EQ(all.kv_after_probe.cells_in_use, 1);
  EXPECT_EQ(all.kv_final.cells_in_use, 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(all.finish[i], FinishReason::kNewTokenLimit) << "generation " << i;
    EXPECT_EQ(all.positions[i], static_cast<Position>(kCommitted)) << "generation " << i;
    const testing::Outcome solo = testing::run_concurrently(shared, weights, {prompts[i]});
    ASSERT_EQ(solo.tokens.size(), 1u);
    EXPECT_EQ(solo.tokens[0].size(), static_cast<size_t>(testing::kNewTokens));
    EXPECT_EQ(all.tokens[i], solo.tokens[0]) << "generation " << i;
  }
}

}  // namespace
}  // namespace cellm
