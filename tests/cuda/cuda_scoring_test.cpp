// Prompt scoring (GenConfig::score_prompt, Input::score) on the CUDA executor under
// the real Runner: every fed token's log-probability after the first, and its top
// alternatives, equal the CPU executor's on kjv-small, with the CUDA prompt split over
// several prefill chunks (the CPU prompt in one). f32 precision within the decode /
// prefill bound, bf16 within bf16's. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "cellm/cpu_executor.h"
#include "cellm/cuda_executor.h"
#include "cellm/decode_first_scheduler.h"
#include "cellm/runner.h"
#include "gpu_test.h"
#include "kjv_prompts.h"

namespace cellm {
namespace {

constexpr int32_t kTop = 3;
constexpr size_t kPromptTokens = 40;

struct Scored {
  std::vector<TokenLogprobs> prompt_logprobs;
  std::vector<Token> tokens;
  FinishReason reason = FinishReason::kFailed;
  std::string error;
};

Scored score(Executor& executor, size_t chunk, const std::vector<Token>& prompt) {
  auto scheduler = DecodeFirstScheduler::create(chunk + 32, 32, chunk);
  EXPECT_TRUE(scheduler.ok()) << scheduler.status().message();
  Runner runner(executor, std::move(*scheduler));
  std::optional<Session> session = runner.open_session_async().get();
  EXPECT_TRUE(session.has_value());
  GenConfig config;
  config.max_new_tokens = 2;
  config.sampling.num_logprobs = kTop;
  config.seed = 1;
  config.score_prompt = true;
  Scored out;
  GenerationHandle h = session->generate_async(prompt, config, [&](const GenerationUpdate& u) {
    if (!u.prompt_logprobs.empty()) out.prompt_logprobs = u.prompt_logprobs;
    out.tokens.insert(out.tokens.end(), u.tokens.begin(), u.tokens.end());
    if (u.finish_reason) {
      out.reason = *u.finish_reason;
      out.error = u.error_message;
    }
  });
  h.wait();
  return out;
}

ExecutorLimits limits() {
  ExecutorLimits l;
  l.max_sessions = 2;
  l.max_session_tokens = 128;
  l.step_width = 64;
  return l;
}

Scored score_on_cuda(const std::shared_ptr<const ModelWeights>& weights, CudaPrecision precision,
                     size_t chunk, const std::vector<Token>& prompt) {
  CudaExecutorOptions options;
  options.precision = precision;
  options.capture_graphs_at_start = false;
  options.warm_prefill_gemms = false;
  options.tune_gemm = false;
  auto cuda = CudaExecutor::create(weights, limits(), options);
  EXPECT_TRUE(cuda.ok()) << cuda.status().message();
  if (!cuda.ok()) return {};
  EXPECT_TRUE((*cuda)->supports_scoring());
  return score(**cuda, chunk, prompt);
}

// Entry by entry: the token's log-probability and the alternatives' values (in rank
// order, so a near-tie swapped by rounding still matches) within `tol`; an alternative's
// id must match where its value stands clear of its neighbours' by more than 2 tol.
void expect_same_scores(const Scored& got, const Scored& want, double tol,
                        const std::string& what) {
  ASSERT_EQ(got.reason, FinishReason::kNewTokenLimit) << what << ": " << got.error;
  ASSERT_EQ(got.prompt_logprobs.size(), kPromptTokens - 1) << what;
  ASSERT_EQ(got.prompt_logprobs.size(), want.prompt_logprobs.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < want.prompt_logprobs.size(); ++i) {
    const TokenLogprobs& g = got.prompt_logprobs[i];
    const TokenLogprobs& w = want.prompt_logprobs[i];
    if (std::abs(g.logprob - w.logprob) > tol && ++bad <= 5) {
      ADD_FAILURE() << what << " token " << i + 1 << ": " << g.logprob << " vs " << w.logprob;
    }
    ASSERT_EQ(g.top.size(), static_cast<size_t>(kTop)) << what;
    ASSERT_EQ(w.top.size(), static_cast<size_t>(kTop)) << what;
    for (size_t k = 0; k < w.top.size(); ++k) {
      if (std::abs(g.top[k].second - w.top[k].second) > tol && ++bad <= 5) {
        ADD_FAILURE() << what << " token " << i + 1 << " alternative " << k << ": "
                      << g.top[k].second << " vs " << w.top[k].second;
      }
      const bool clear = (k == 0 || w.top[k - 1].second - w.top[k].second > 2 * tol) &&
                         (k + 1 == w.top.size() || w.top[k].second - w.top[k + 1].second > 2 * tol);
      if (clear && g.top[k].first != w.top[k].first && ++bad <= 5) {
        ADD_FAILURE() << what << " token " << i + 1 << " alternative " << k << ": id "
                      << g.top[k].first << " vs " << w.top[k].first;
      }
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

TEST(CudaScoringTest, ChunkedPromptScoresEqualTheCpuExecutors) {
  CELLM_SKIP_WITHOUT_GPU();
  const auto weights = testing::load_kjv_small();
  const std::vector<Token> prompt = testing::kjv_prompts(1, kPromptTokens, 0).front();
  ASSERT_EQ(prompt.size(), kPromptTokens);

  CpuExecutorOptions cpu_options;
  cpu_options.num_threads = 2;
  auto cpu = CpuExecutor::create(weights, limits(), cpu_options);
  ASSERT_TRUE(cpu.ok()) << cpu.status().message();
  const Scored want = score(**cpu, 64, prompt);
  ASSERT_EQ(want.reason, FinishReason::kNewTokenLimit) << want.error;
  ASSERT_EQ(want.prompt_logprobs.size(), kPromptTokens - 1);

  // 16-token chunks: the prompt is fed in three slices, each scoring its own rows and
  // the last also sampling.
  const Scored f32 = score_on_cuda(weights, CudaPrecision::kF32, 16, prompt);
  expect_same_scores(f32, want, 5e-3, "f32");
  EXPECT_EQ(f32.tokens, want.tokens);
  const Scored bf16 = score_on_cuda(weights, CudaPrecision::kBF16, 16, prompt);
  expect_same_scores(bf16, want, 0.15, "bf16");
}

}  // namespace
}  // namespace cellm
