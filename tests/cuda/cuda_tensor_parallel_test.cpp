// Tensor parallelism on the CUDA executor (CudaExecutorOptions::tensor_parallel,
// cuda/tensor_parallel_engine.h), on the tiny fixtures (4 heads, 2 kv heads):
//   - a group of one GPU (CudaTuning::group_of_one: NCCL, the all-reduces and the logits
//     gather over one rank) gives the plain engine's tokens and logprobs bit for bit, in
//     f32 and bf16, from the decode graphs (with the step ahead) and eagerly;
//   - 2 and 4 GPUs continue as one GPU does: f32 greedy tokens equal the fixture's
//     reference continuation wherever its top-1 leads by 1e-3, and bf16's top-1 logprob
//     under teacher forcing (one GPU's tokens fed) stays within 0.1 nats of one GPU's,
//     with its token wherever one GPU's top-1 leads by 0.2 nats.
// Each test skips without a GPU, or with fewer GPUs than it splits over, or without NCCL.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "cellm/cuda_executor.h"
#include "cellm/model_weights.h"
#include "executor_driver.h"
#include "fixture_model.h"
#include "gpu_test.h"

namespace cellm {
namespace {

using testing::Fixture;

int DeviceCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

std::shared_ptr<const ModelWeights> load_weights(const Fixture& f) {
  Result<ModelWeights> w = ModelWeights::load(f.dir);
  CELLM_CHECK_MSG(w.ok(), w.status().to_string());
  return std::make_shared<const ModelWeights>(std::move(*w));
}

ExecutorLimits limits() {
  ExecutorLimits l;
  l.max_sessions = 8;
  l.max_session_tokens = 128;
  l.step_width = 16;
  return l;
}

struct Mode {
  CudaPrecision precision = CudaPrecision::kF32;
  bool graphs = true;
  int world = 1;
  bool group_of_one = false;
};

// The executor of `mode`, or null with the reason in `why` when NCCL is missing.
std::unique_ptr<CudaExecutor> make(std::shared_ptr<const ModelWeights> w, const Mode& mode,
                                   std::string* why) {
  CudaExecutorOptions o;
  o.precision = mode.precision;
  o.cuda_graph_for_decode = mode.graphs;
  o.overlap_decode = mode.graphs;
  o.tensor_parallel = mode.world;
  o.tuning.group_of_one = mode.group_of_one;
  Result<std::unique_ptr<CudaExecutor>> e = CudaExecutor::create(std::move(w), limits(), o);
  if (!e.ok() && e.status().code() == StatusCode::kNotSupported) {
    *why = e.status().to_string();
    return nullptr;
  }
  CELLM_CHECK_MSG(e.ok(), e.status().to_string());
  const Status init = (*e)->initialize();
  CELLM_CHECK_MSG(init.ok(), init.to_string());
  return std::move(*e);
}

std::vector<std::vector<Token>> prompts_of(const Fixture& f) {
  std::vector<std::vector<Token>> p;
  for (const auto& fp : f.prompts) p.push_back(fp.ids);
  return p;
}

std::vector<SamplingParams> greedy_with_logprobs(size_t n) {
  SamplingParams sp;
  sp.num_logprobs = 2;
  return std::vector<SamplingParams>(n, sp);
}

class CudaTensorParallelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaTensorParallelTest, AGroupOfOneGivesThePlainEnginesBits) {
  CELLM_SKIP_WITHOUT_GPU();
  const Fixture f = testing::load_fixture(GetParam());
  const std::shared_ptr<const ModelWeights> w = load_weights(f);
  const std::vector<std::vector<Token>> prompts = prompts_of(f);
  const std::vector<SamplingParams> params = greedy_with_logprobs(prompts.size());
  constexpr size_t kSteps = 12;
  for (const CudaPrecision precision : {CudaPrecision::kF32, CudaPrecision::kBF16}) {
    for (const bool graphs : {true, false}) {
      const std::string what = std::string(precision == CudaPrecision::kF32 ? "f32" : "bf16") +
                               (graphs ? " graphs" : " eager");
      std::string why;
      std::unique_ptr<CudaExecutor> plain = make(w, {precision, graphs, 1, false}, &why);
      std::unique_ptr<CudaExecutor> one = make(w, {precision, graphs, 1, true}, &why);
      if (!one) GTEST_SKIP() << why;
      const auto want = testing::drive_outputs(*plain, prompts, 5, kSteps, params);
      const auto got = testing::drive_outputs(*one, prompts, 5, kSteps, params);
      testing::expect_same_outputs(want, got, what, kSteps);
      if (graphs) {
        EXPECT_GT(one->method_calls().decode_graph_replays, 0) << what;
      }
    }
  }
}

// f32 greedy over `world` GPUs: the fixture's reference continuation wherever it is clear.
void ExpectF32GreedyFollowsTheReference(const std::string& fixture, int world) {
  const Fixture f = testing::load_fixture(fixture);
  const std::shared_ptr<const ModelWeights> w = load_weights(f);
  std::string why;
  std::unique_ptr<CudaExecutor> e = make(w, {CudaPrecision::kF32, true, world, false}, &why);
  if (!e) GTEST_SKIP() << why;
  for (size_t p = 0; p < f.prompts.size(); ++p) {
    const testing::FixturePrompt& fp = f.prompts[p];
    if (fp.greedy.empty()) continue;
    // Teacher-forced with the reference's tokens, so one near tie does not end the check.
    const std::vector<std::vector<Token>> forced = {fp.greedy};
    const auto got = testing::drive_outputs(*e, {fp.ids}, 5, fp.greedy.size(), {}, &forced);
    ASSERT_EQ(got.size(), 1u);
    ASSERT_EQ(got[0].size(), fp.greedy.size());
    for (size_t s = 0; s < fp.greedy.size(); ++s) {
      if (s < fp.margins.size() && fp.margins[s] < 1e-3f) continue;
      EXPECT_EQ(got[0][s].tokens.at(0), fp.greedy[s])
          << fixture << " over " << world << " GPUs, prompt " << p << " step " << s;
    }
  }
}

// bf16 over `world` GPUs against bf16 on one, teacher-forced with one GPU's tokens.
void ExpectBf16LogprobsNearOneGpus(const std::string& fixture, int world) {
  const Fixture f = testing::load_fixture(fixture);
  const std::shared_ptr<const ModelWeights> w = load_weights(f);
  const std::vector<std::vector<Token>> prompts = prompts_of(f);
  const std::vector<SamplingParams> params = greedy_with_logprobs(prompts.size());
  constexpr size_t kSteps = 16;
  constexpr float kLogprobTol = 0.1f;  // nats: bf16 partial sums added in a different order
  constexpr float kMargin = 0.2f;
  std::string why;
  std::unique_ptr<CudaExecutor> one = make(w, {CudaPrecision::kBF16, true, 1, false}, &why);
  std::unique_ptr<CudaExecutor> split = make(w, {CudaPrecision::kBF16, true, world, false}, &why);
  if (!split) GTEST_SKIP() << why;
  const auto want = testing::drive_outputs(*one, prompts, 5, kSteps, params);
  const std::vector<std::vector<Token>> forced = testing::first_tokens(want);
  const auto got = testing::drive_outputs(*split, prompts, 5, kSteps, params, &forced);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].size(), want[i].size());
    for (size_t s = 0; s < want[i].size(); ++s) {
      const auto& wt = want[i][s].logprobs.at(0).top;
      const auto& gt = got[i][s].logprobs.at(0).top;
      ASSERT_EQ(wt.size(), 2u);
      ASSERT_EQ(gt.size(), 2u);
      const std::string where = fixture + " over " + std::to_string(world) + " GPUs, prompt " +
                                std::to_string(i) + " step " + std::to_string(s);
      if (wt[0].second - wt[1].second >= kMargin) {
        EXPECT_EQ(gt[0].first, wt[0].first) << where;
      }
      if (gt[0].first == wt[0].first) {
        EXPECT_NEAR(gt[0].second, wt[0].second, kLogprobTol) << where;
      }
    }
  }
}

TEST_P(CudaTensorParallelTest, TwoGpusContinueAsOneDoes) {
  CELLM_SKIP_WITHOUT_GPU();
  if (DeviceCount() < 2) GTEST_SKIP() << "fewer than 2 GPUs";
  ExpectF32GreedyFollowsTheReference(GetParam(), 2);
  ExpectBf16LogprobsNearOneGpus(GetParam(), 2);
}

TEST_P(CudaTensorParallelTest, FourGpusContinueAsOneDoes) {
  CELLM_SKIP_WITHOUT_GPU();
  if (DeviceCount() < 4) GTEST_SKIP() << "fewer than 4 GPUs";
  ExpectF32GreedyFollowsTheReference(GetParam(), 4);
  ExpectBf16LogprobsNearOneGpus(GetParam(), 4);
}

// Refused before any device is looked at: runs without a GPU.
TEST(CudaTensorParallelErrorsTest, BadDegreesAreRefusedNamingTheSizes) {
  const Fixture f = testing::load_fixture("llama3-tiny");  // 4 heads, 2 kv heads
  const std::shared_ptr<const ModelWeights> w = load_weights(f);
  const auto refused = [&](int degree, const std::string& part) {
    CudaExecutorOptions o;
    o.tensor_parallel = degree;
    Result<std::unique_ptr<CudaExecutor>> e = CudaExecutor::create(w, limits(), o);
    ASSERT_FALSE(e.ok()) << degree;
    EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument) << e.status().to_string();
    EXPECT_NE(e.status().message().find(part), std::string::npos) << e.status().to_string();
  };
  refused(0, "--tensor-parallel 0: the degree must be at least 1");
  refused(-1, "--tensor-parallel -1: the degree must be at least 1");
  refused(3, "--tensor-parallel 3: the model's 4 heads and 2 kv heads do not split over 3 GPUs");
  refused(16, "--tensor-parallel 16: at most 8 GPUs");
}

TEST(CudaTensorParallelErrorsTest, MoreRanksThanGpusAreRefusedNamingTheCounts) {
  CELLM_SKIP_WITHOUT_GPU();
  const Fixture f = testing::load_fixture("llama3-tiny");
  CudaExecutorOptions o;
  o.tensor_parallel = 2;
  o.device = DeviceCount() - 1;  // one GPU left from here
  Result<std::unique_ptr<CudaExecutor>> e = CudaExecutor::create(load_weights(f), limits(), o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("--tensor-parallel 2"), std::string::npos)
      << e.status().to_string();
}

INSTANTIATE_TEST_SUITE_P(Architectures, CudaTensorParallelTest,
                         ::testing::ValuesIn(testing::fixture_names()), testing::fixture_test_name);

}  // namespace
}  // namespace cellm
