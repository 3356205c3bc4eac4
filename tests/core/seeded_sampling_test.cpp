// Seeded sampling through the whole stack: Runner +
// DecodeFirstScheduler + HistoryExecutor (real CellPool, SessionTable and
// sampler). The draw for a token is keyed by (seed, position), so a seeded
// generation gives the same tokens whatever shares its batches.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "cellm/runner.h"
#include "cellm/sampler.h"
#include "support/history_executor.h"
#include "support/runner_harness.h"

namespace cellm::testing {
namespace {

struct Job {
  std::vector<Token> prompt;
  GenConfig config;
};

struct Outcome {
  std::vector<std::vector<Token>> tokens;            // per job
  std::vector<std::vector<TokenLogprobs>> logprobs;  // per job
  std::vector<SessionId> sids;                       // per job
  std::vector<std::vector<SessionId>> batches;
};

HistoryExecutorOptions executor_options() {
  HistoryExecutorOptions o;
  o.max_sessions = 8;
  o.max_session_tokens = 128;
  o.vocab_size = 64;
  o.step_width = 8;
  return o;
}

GenConfig sampled(SamplingParams params, uint64_t seed, int32_t max_new_tokens) {
  GenConfig c;
  c.max_new_tokens = max_new_tokens;
  c.sampling = params;
  c.seed = seed;
  return c;
}

// Runs every job on its own session of one fresh runner. The engine is held
// while the generations start, so they share batches from the first step on.
Outcome run_jobs(const std::vector<Job>& jobs) {
  HistoryExecutor executor(executor_options());
  Runner runner(executor, make_scheduler(/*max_decode_sequences=*/4, /*chunk=*/4));
  std::vector<Session> sessions;
  for (size_t i = 0; i < jobs.size(); ++i) sessions.push_back(open_session(runner));
  std::vector<std::shared_ptr<Updates>> updates;
  std::vector<GenerationHandle> handles;
  executor.hold();
  for (size_t i = 0; i < jobs.size(); ++i) {
    updates.push_back(std::make_shared<Updates>());
    handles.push_back(generate(sessions[i], jobs[i].prompt, jobs[i].config, updates.back()));
  }
  executor.release();
  Outcome outcome;
  for (size_t i = 0; i < jobs.size(); ++i) {
    handles[i].wait();
    EXPECT_EQ(handles[i].finish_reason(), FinishReason::kNewTokenLimit)
        << "job " << i << ": " << handles[i].error_message();
    outcome.tokens.push_back(updates[i]->tokens());
    outcome.logprobs.push_back(updates[i]->logprobs());
    EXPECT_TRUE(updates[i]->logprobs_parallel()) << "job " << i;
    outcome.sids.push_back(sessions[i].id());
  }
  EXPECT_TRUE(executor.errors().empty());
  outcome.batches = executor.batches();
  return outcome;
}

// Batches in which `sid` ran beside at least one other session.
int shared_batches(const Outcome& outcome, SessionId sid) {
  int n = 0;
  for (const std::vector<SessionId>& batch : outcome.batches) {
    bool mine = false;
    bool other = false;
    for (SessionId s : batch) (s == sid ? mine : other) = true;
    n += mine && other ? 1 : 0;
  }
  return n;
}

TEST(SeededSamplingTest, ASeededSampledGenerationIsTheSameAloneOrBatched) {
  const std::vector<SamplingParams> policies = {
      {.temperature = 0.9f, .top_k = 20, .top_p = 1.0f, .min_p = 0.05f},
      {.temperature = 1.3f, .top_k = 0, .top_p = 0.9f, .min_p = 0.02f},
  };
  const std::vector<Token> prompt = tokens(13, 3);  // 4 chunks of at most 4
  constexpr uint64_t kSeed = 20240611;
  constexpr int32_t kNewTokens = 24;
  const HistoryExecutor oracle(executor_options());

  for (const SamplingParams& policy : policies) {
    SCOPED_TRACE(::testing::Message() << "top_k " << policy.top_k << " top_p " << policy.top_p);
    const Job target{prompt, sampled(policy, kSeed, kNewTokens)};
    const Outcome alone = run_jobs({target});
    ASSERT_EQ(alone.tokens[0].size(), static_cast<size_t>(kNewTokens));
    EXPECT_NE(alone.tokens[0], oracle.greedy_continuation(prompt, kNewTokens))
        << "the policy really samples";

    // Other prompts (chunked and not), seeds and policies, started together.
    const std::vector<Job> crowd = {
        {tokens(7, 40), sampled({.temperature = 0.7f, .top_k = 8}, 1, 30)},
        {tokens(22, 5), sampled({.temperature = 1.0f, .top_p = 0.8f}, 2, 12)},
        target,
        {tokens(3, 60), config(20)},  // greedy
        {tokens(10, 9), sampled({.temperature = 1.1f, .min_p = 0.1f}, kSeed + 7, 28)},
    };
    const Outcome batched = run_jobs(crowd);
    EXPECT_EQ(batched.tokens[2], alone.tokens[0]);
    EXPECT_GE(shared_batches(batched, batched.sids[2]), kNewTokens / 2)
        << "the target ran beside other sessions for most of its steps";
    EXPECT_EQ(batched.tokens[3], oracle.greedy_continuation(tokens(3, 60), 20));

    const Outcome reseeded = run_jobs({{prompt, sampled(policy, kSeed + 1, kNewTokens)}});
    EXPECT_NE(reseeded.tokens[0], alone.tokens[0]) << "another seed draws other tokens";
  }
}

// Logprobs ride with the sampled tokens through the runner: the raw row's
// log-softmax at each step, whatever shares the batches.
TEST(SeededSamplingTest, LogprobsOfASampledGenerationAreTheRawRowsAloneOrBatched) {
  const SamplingParams policy{.temperature = 1.2f, .top_k = 12, .num_logprobs = 5};
  const std::vector<Token> prompt = tokens(9, 3);
  constexpr int32_t kNewTokens = 16;
  const Job target{prompt, sampled(policy, 77, kNewTokens)};
  const Outcome alone = run_jobs({target});
  ASSERT_EQ(alone.tokens[0].size(), static_cast<size_t>(kNewTokens));
  ASSERT_EQ(alone.logprobs[0].size(), static_cast<size_t>(kNewTokens));

  // The oracle: token_logprobs over HistoryExecutor's row for the history so far.
  std::vector<Token> history = prompt;
  std::vector<float> scratch;
  bool outside_top = false;
  for (size_t i = 0; i < alone.tokens[0].size(); ++i) {
    const Token token = alone.tokens[0][i];
    const std::vector<float> row =
        HistoryExecutor::logits_for(history, executor_options().vocab_size);
    const TokenLogprobs want = token_logprobs(row, token, 5, scratch);
    EXPECT_EQ(alone.logprobs[0][i].logprob, want.logprob) << "token " << i;
    EXPECT_EQ(alone.logprobs[0][i].top, want.top) << "token " << i;
    bool in_top = false;
    for (const auto& [id, lp] : want.top) in_top = in_top || id == token;
    outside_top = outside_top || !in_top;
    history.push_back(token);
  }
  EXPECT_TRUE(outside_top) << "some sampled token lies outside the top 5 and still has its own";

  const Outcome batched =
      run_jobs({{tokens(7, 40), config(10)}, target, {tokens(11, 5), sampled(policy, 3, 12)}});
  EXPECT_EQ(batched.tokens[1], alone.tokens[0]);
  ASSERT_EQ(batched.logprobs[1].size(), alone.logprobs[0].size());
  for (size_t i = 0; i < alone.logprobs[0].size(); ++i) {
    EXPECT_EQ(batched.logprobs[1][i].logprob, alone.logprobs[0][i].logprob);
    EXPECT_EQ(batched.logprobs[1][i].top, alone.logprobs[0][i].top);
  }
  EXPECT_TRUE(batched.logprobs[0].empty()) << "a greedy job that asked for none";
  EXPECT_EQ(batched.logprobs[2].size(), 12u);
}

}  // namespace
}  // namespace cellm::testing
