// The CPU executor under the real Runner: see runner_parity.h.
#include <gtest/gtest.h>

#include "cellm/cpu_executor.h"
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

}  // namespace
}  // namespace cellm
