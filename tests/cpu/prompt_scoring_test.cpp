// Prompt scoring (GenConfig::score_prompt) on the CPU executor under the real
// Runner: the log-probability of every fed token after the first, from its
// predecessor's row. Checked against the log-probabilities the same model reports
// for tokens it generates (a greedy continuation fed back as a prompt must score
// what the sampler reported), across prefill chunk sizes and step widths.
#include <gtest/gtest.h>

#include <cmath>
#include <future>
#include <memory>
#include <vector>

#include "cellm/cpu_executor.h"
#include "cellm/decode_first_scheduler.h"
#include "cellm/runner.h"
#include "kjv_prompts.h"

namespace cellm {
namespace {

// kjv-small's logits agree within 2e-3 between a decode and a prefill of the
// same tokens (kjv_parity_test's bound); log-softmax keeps that order.
constexpr double kTolerance = 5e-3;

struct Outcome {
  std::vector<Token> tokens;
  std::vector<TokenLogprobs> logprobs;
  std::vector<TokenLogprobs> prompt_logprobs;
  FinishReason reason = FinishReason::kFailed;
  std::string error;
};

Outcome generate(const std::shared_ptr<const ModelWeights>& weights, size_t chunk, int32_t width,
                 const std::vector<Token>& prompt, const GenConfig& config) {
  ExecutorLimits limits;
  limits.max_sessions = 2;
  limits.max_session_tokens = 256;
  limits.step_width = width;
  CpuExecutorOptions options;
  options.num_threads = 2;
  auto executor = CpuExecutor::create(weights, limits, options);
  EXPECT_TRUE(executor.ok()) << executor.status().message();
  auto scheduler = DecodeFirstScheduler::create(chunk + 32, 32, chunk);
  EXPECT_TRUE(scheduler.ok()) << scheduler.status().message();
  Runner runner(**executor, std::move(*scheduler));
  std::optional<Session> session = runner.open_session_async().get();
  EXPECT_TRUE(session.has_value());
  Outcome run;
  std::promise<void> done;
  GenerationHandle handle = session->generate_async(prompt, config, [&](const GenerationUpdate& u) {
    run.tokens.insert(run.tokens.end(), u.tokens.begin(), u.tokens.end());
    run.logprobs.insert(run.logprobs.end(), u.logprobs.begin(), u.logprobs.end());
    if (!u.prompt_logprobs.empty()) {
      EXPECT_TRUE(run.prompt_logprobs.empty()) << "prompt_logprobs delivered twice";
      run.prompt_logprobs = u.prompt_logprobs;
    }
    if (u.finish_reason) {
      run.reason = *u.finish_reason;
      run.error = u.error_message;
    }
  });
  handle.wait();
  return run;
}

TEST(PromptScoringTest, ScoresEqualTheLogprobsOfTheSameTokensWhenGenerated) {
  const auto weights = testing::load_kjv_small();
  const std::vector<Token> prompt = testing::kjv_prompts(1, 40, 0).front();

  GenConfig greedy;
  greedy.max_new_tokens = 24;
  greedy.sampling.num_logprobs = 2;
  greedy.seed = 1;
  const Outcome generated = generate(weights, 256, 256, prompt, greedy);
  ASSERT_EQ(generated.reason, FinishReason::kNewTokenLimit) << generated.error;
  ASSERT_EQ(generated.tokens.size(), 24u);
  EXPECT_TRUE(generated.prompt_logprobs.empty());

  // Feed prompt + all but the last generated token, scored: the last 23 entries
  // score the generated tokens 0..22.
  std::vector<Token> fed = prompt;
  fed.insert(fed.end(), generated.tokens.begin(), generated.tokens.end() - 1);
  GenConfig scoring;
  scoring.max_new_tokens = 1;
  scoring.sampling.num_logprobs = 2;
  scoring.score_prompt = true;
  scoring.seed = 1;
  // Chunks of 256, 16 and 7 tokens; forwards of 256 and 5 rows.
  for (auto [chunk, width] : {std::pair<size_t, int32_t>{256, 256}, {16, 256}, {7, 5}}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk) + ", width " + std::to_string(width));
    const Outcome scored = generate(weights, chunk, width, fed, scoring);
    ASSERT_EQ(scored.reason, FinishReason::kNewTokenLimit) << scored.error;
    ASSERT_EQ(scored.prompt_logprobs.size(), fed.size() - 1);
    // The token it generates is the 24th greedy token.
    ASSERT_EQ(scored.tokens.size(), 1u);
    EXPECT_EQ(scored.tokens[0], generated.tokens.back());
    for (size_t g = 0; g + 1 < generated.tokens.size(); ++g) {
      const TokenLogprobs& want = generated.logprobs[g];
      const TokenLogprobs& got = scored.prompt_logprobs[prompt.size() - 1 + g];
      EXPECT_NEAR(got.logprob, want.logprob, kTolerance) << "generated token " << g;
      ASSERT_EQ(got.top.size(), 2u);
      // Greedy: the generated token is the most likely one.
      EXPECT_EQ(got.top[0].first, generated.tokens[g]) << "generated token " << g;
      EXPECT_NEAR(got.top[0].second, want.top[0].second, kTolerance);
    }
    for (const TokenLogprobs& lp : scored.prompt_logprobs) {
      EXPECT_LE(lp.logprob, 0.0f);
      EXPECT_TRUE(std::isfinite(lp.logprob));
    }
  }
}

TEST(PromptScoringTest, AllChunkingsGiveTheSameScores) {
  const auto weights = testing::load_kjv_small();
  const std::vector<Token> prompt = testing::kjv_prompts(1, 100, 3).front();
  GenConfig scoring;
  scoring.max_new_tokens = 1;
  scoring.score_prompt = true;
  scoring.seed = 1;
  const Outcome whole = generate(weights, 256, 256, prompt, scoring);
  ASSERT_EQ(whole.prompt_logprobs.size(), prompt.size() - 1) << whole.error;
  for (const TokenLogprobs& lp : whole.prompt_logprobs) EXPECT_TRUE(lp.top.empty());
  const Outcome chunked = generate(weights, 9, 4, prompt, scoring);
  ASSERT_EQ(chunked.prompt_logprobs.size(), prompt.size() - 1) << chunked.error;
  for (size_t i = 0; i < whole.prompt_logprobs.size(); ++i) {
    EXPECT_NEAR(chunked.prompt_logprobs[i].logprob, whole.prompt_logprobs[i].logprob, kTolerance)
        << "token " << i + 1;
  }
}

}  // namespace
}  // namespace cellm
