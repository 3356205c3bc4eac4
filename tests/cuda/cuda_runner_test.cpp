// The CUDA executor (f32 precision, decode graphs on) under the real Runner: see
// runner_parity.h. Skips without a GPU.
#include <gtest/gtest.h>

#include "cellm/cuda_executor.h"
#include "gpu_test.h"
#include "runner_parity.h"

namespace cellm {
namespace {

Result<std::unique_ptr<Executor>> make_cuda(std::shared_ptr<const ModelWeights> weights,
                                            int32_t sessions, int32_t tokens, int32_t width) {
  ExecutorLimits limits;
  limits.max_sessions = sessions;
  limits.max_session_tokens = tokens;
  limits.step_width = width;
  CudaExecutorOptions options;
  options.precision = CudaPrecision::kF32;
  CELLM_ASSIGN_OR_RETURN(std::unique_ptr<CudaExecutor> e,
                         CudaExecutor::create(weights, limits, options));
  return std::unique_ptr<Executor>(std::move(e));
}

class CudaRunnerFixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaRunnerFixtureTest, ConcurrentChunkedGreedyGenerationsMatchTheReference) {
  CELLM_SKIP_WITHOUT_GPU();
  testing::expect_runner_parity(GetParam(), make_cuda);
}

INSTANTIATE_TEST_SUITE_P(Architectures, CudaRunnerFixtureTest,
                         ::testing::ValuesIn(testing::fixture_names()), testing::fixture_test_name);

}  // namespace
}  // namespace cellm
