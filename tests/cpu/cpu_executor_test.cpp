// The CPU executor driven directly through the executor seam on the reference
// fixtures: greedy continuations equal the reference's, alone, batched with
// other sessions, and with prompts cut into chunks and forwards cut by the
// step width; plus create()'s refusals, cell reuse, clones and bad input.
#include "cellm/cpu_executor.h"

#include <gtest/gtest.h>

#include "executor_driver.h"
#include "fixture_model.h"

namespace cellm {
namespace {

using testing::drive;
using testing::Fixture;
using testing::make_input;

std::shared_ptr<const ModelWeights> load_weights(const Fixture& f) {
  Result<ModelWeights> w = ModelWeights::load(f.dir);
  CELLM_CHECK_MSG(w.ok(), w.status().to_string());
  return std::make_shared<const ModelWeights>(std::move(*w));
}

std::unique_ptr<CpuExecutor> make(std::shared_ptr<const ModelWeights> w, int32_t sessions,
                                  int32_t tokens, int32_t width) {
  ExecutorLimits l;
  l.max_sessions = sessions;
  l.max_session_tokens = tokens;
  l.step_width = width;
  CpuExecutorOptions o;
  o.initial_cells = 16;
  o.num_threads = 2;
  Result<std::unique_ptr<CpuExecutor>> e = CpuExecutor::create(std::move(w), l, o);
  CELLM_CHECK_MSG(e.ok(), e.status().to_string());
  return std::move(*e);
}

class CpuExecutorFixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CpuExecutorFixtureTest, EachPromptAloneContinuesLikeTheReference) {
  const Fixture f = testing::load_fixture(GetParam());
  auto e = make(load_weights(f), 2, 128, 64);
  for (const auto& p : f.prompts) {
    auto got = drive(*e, {p.ids}, p.ids.size(), p.greedy.size());
    EXPECT_EQ(got[0], p.greedy) << p.text;
  }
  EXPECT_EQ(e->kv_metrics().cells_in_use, 0);
}

TEST_P(CpuExecutorFixtureTest, ConcurrentChunkedPromptsContinueLikeTheReference) {
  const Fixture f = testing::load_fixture(GetParam());
  // Forwards of at most 7 tokens, prompts in chunks of 5, a duplicate prompt.
  auto e = make(load_weights(f), 8, 128, 7);
  std::vector<std::vector<Token>> prompts;
  for (const auto& p : f.prompts) prompts.push_back(p.ids);
  prompts.push_back(f.prompts[0].ids);
  auto got = drive(*e, prompts, 5, f.prompts[0].greedy.size());
  for (size_t i = 0; i < f.prompts.size(); ++i) {
    EXPECT_EQ(got[i], f.prompts[i].greedy) << f.prompts[i].text;
  }
  EXPECT_EQ(got.back(), f.prompts[0].greedy) << "duplicate prompt";
  const KvMetrics kv = e->kv_metrics();
  EXPECT_EQ(kv.cells_in_use, 0);
  EXPECT_GE(kv.growth_count, 1);
  EXPECT_EQ(kv.allocated_bytes, kv.rows_allocated * kv.bytes_per_cell);
}

TEST_P(CpuExecutorFixtureTest, ACloneDecodesFromTheSharedPrefix) {
  const Fixture f = testing::load_fixture(GetParam());
  auto e = make(load_weights(f), 4, 128, 64);
  const auto& p = f.prompts[1];
  const SessionId src = *e->open_session();
  e->set_sampling(src, SamplingParams{}, 0);
  BatchInput b;
  b.inputs.push_back(
      make_input(src, std::make_shared<const std::vector<Token>>(p.ids), 0, p.ids.size(), 0, true));
  BatchOutput o;
  const Status prefill = e->execute(b, o);
  ASSERT_TRUE(prefill.ok()) << prefill.to_string();
  ASSERT_EQ(o.outputs[0]->tokens[0], p.greedy[0]);
  const int64_t cells_before = e->kv_metrics().cells_in_use;

  std::optional<SessionId> child = e->clone(src, static_cast<Position>(p.ids.size()));
  ASSERT_TRUE(child.has_value());
  EXPECT_EQ(e->kv_metrics().cells_in_use, cells_before) << "clone shares, never copies";
  e->close_session(src);
  e->set_sampling(*child, SamplingParams{}, 0);
  std::vector<Token> got = {p.greedy[0]};
  Position pos = static_cast<Position>(p.ids.size());
  for (size_t step = 1; step < p.greedy.size(); ++step) {
    BatchInput d;
    d.inputs.push_back(make_input(
        *child, std::make_shared<const std::vector<Token>>(std::vector<Token>{got.back()}), 0, 1,
        pos++, true));
    const Status s = e->execute(d, o);
    ASSERT_TRUE(s.ok()) << s.to_string();
    got.push_back(o.outputs[0]->tokens[0]);
  }
  EXPECT_EQ(got, p.greedy);
  e->close_session(*child);
  EXPECT_EQ(e->kv_metrics().cells_in_use, 0);
}

TEST_P(CpuExecutorFixtureTest, SessionsReuseCellsAcrossRounds) {
  const Fixture f = testing::load_fixture(GetParam());
  auto e = make(load_weights(f), 4, 128, 16);
  std::vector<std::vector<Token>> prompts = {f.prompts[2].ids, f.prompts[3].ids};
  auto first = drive(*e, prompts, 16, 8);
  EXPECT_EQ(e->kv_metrics().cells_in_use, 0);
  auto second = drive(*e, {prompts[1], prompts[0]}, 16, 8);
  EXPECT_EQ(second[0], first[1]);
  EXPECT_EQ(second[1], first[0]);
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(first[0][i], f.prompts[2].greedy[i]);
}

// The reference's log-softmax at a prompt's last position: its recorded top
// logits minus its logsumexp (f64).
TEST_P(CpuExecutorFixtureTest, PromptLogprobsEqualTheReferencesLogSoftmax) {
  constexpr double kTolerance = 1e-4;
  constexpr int32_t kTop = 20;
  const Fixture f = testing::load_fixture(GetParam());
  auto e = make(load_weights(f), 8, 128, 7);
  // Every prompt in chunks of 5 in one batch, beside one that asks for none.
  std::vector<std::vector<Token>> prompts;
  std::vector<SamplingParams> params;
  for (const auto& p : f.prompts) {
    prompts.push_back(p.ids);
    params.push_back(SamplingParams{.num_logprobs = kTop});
  }
  prompts.push_back(f.prompts[0].ids);
  params.push_back(SamplingParams{});
  const auto got = testing::drive_outputs(*e, prompts, 5, 3, params);
  ASSERT_EQ(got.size(), prompts.size());
  for (size_t i = 0; i < f.prompts.size(); ++i) {
    const auto& p = f.prompts[i];
    ASSERT_EQ(got[i].size(), 3u);
    const Output& first = got[i][0];
    ASSERT_EQ(first.tokens, std::vector<Token>{p.argmax}) << p.text;
    ASSERT_EQ(first.logprobs.size(), 1u) << p.text;
    const TokenLogprobs& lp = first.logprobs[0];
    EXPECT_NEAR(lp.logprob, p.top_logits[0] - p.logsumexp, kTolerance) << p.text;
    ASSERT_EQ(lp.top.size(), static_cast<size_t>(kTop)) << p.text;
    for (size_t k = 0; k < lp.top.size(); ++k) {
      const double want = p.top_logits[k] - p.logsumexp;
      EXPECT_NEAR(lp.top[k].second, want, kTolerance) << p.text << " rank " << k;
      // Ids by rank where the reference's neighbours are clearly apart.
      const bool apart_above = k == 0 || p.top_logits[k - 1] - p.top_logits[k] > 1e-3f;
      const bool apart_below = p.top_logits[k] - p.top_logits[k + 1] > 1e-3f;
      if (apart_above && apart_below) {
        EXPECT_EQ(lp.top[k].first, p.top_ids[k]) << p.text << " rank " << k;
      }
    }
    // Decode steps carry them too: greedy takes the most likely token.
    for (size_t step = 1; step < got[i].size(); ++step) {
      const Output& o = got[i][step];
      ASSERT_EQ(o.logprobs.size(), 1u) << p.text << " step " << step;
      ASSERT_FALSE(o.logprobs[0].top.empty());
      EXPECT_EQ(o.logprobs[0].top[0].first, o.tokens[0]);
      EXPECT_EQ(o.logprobs[0].top[0].second, o.logprobs[0].logprob);
      EXPECT_LT(o.logprobs[0].logprob, 0.0f);
    }
  }
  for (const Output& o : got.back()) EXPECT_TRUE(o.logprobs.empty()) << "none asked for";
}

INSTANTIATE_TEST_SUITE_P(Architectures, CpuExecutorFixtureTest,
                         ::testing::ValuesIn(testing::fixture_names()), testing::fixture_test_name);

class CpuExecutorCreateTest : public ::testing::Test {
 protected:
  std::shared_ptr<const ModelWeights> weights_ =
      load_weights(testing::load_fixture("mistral-tiny"));  // context 512
};

TEST_F(CpuExecutorCreateTest, RefusesLimitsThePoolCannotHold) {
  ExecutorLimits l;
  l.max_sessions = 8;
  l.max_session_tokens = 64;
  l.max_cells = 512;
  Result<std::unique_ptr<CpuExecutor>> e = CpuExecutor::create(weights_, l, {});
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("must be below max_cells 512"), std::string::npos)
      << e.status().message();
  l.max_cells = 513;
  EXPECT_TRUE(CpuExecutor::create(weights_, l, {}).ok());
}

TEST_F(CpuExecutorCreateTest, RefusesABudgetPastTheModelsContext) {
  ExecutorLimits l;
  l.max_sessions = 1;
  l.max_session_tokens = 513;
  Result<std::unique_ptr<CpuExecutor>> e = CpuExecutor::create(weights_, l, {});
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("exceeds the model's context of 512"), std::string::npos)
      << e.status().message();
}

TEST_F(CpuExecutorCreateTest, RefusesNonPositiveLimitsAndAMissingModel) {
  ExecutorLimits l;
  l.max_sessions = 0;
  EXPECT_EQ(CpuExecutor::create(weights_, l, {}).status().code(), StatusCode::kInvalidArgument);
  l = ExecutorLimits{};
  l.step_width = 0;
  EXPECT_EQ(CpuExecutor::create(weights_, l, {}).status().code(), StatusCode::kInvalidArgument);
  CpuExecutorOptions o;
  o.num_threads = -1;
  EXPECT_EQ(CpuExecutor::create(weights_, {}, o).status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(CpuExecutor::create(nullptr, {}, {}).status().message().find("no model"),
            std::string::npos);
}

TEST_F(CpuExecutorCreateTest, ATokenOutsideTheVocabularyFailsTheBatchAndChangesNothing) {
  auto e = make(weights_, 2, 64, 16);
  const SessionId a = *e->open_session();
  e->set_sampling(a, SamplingParams{}, 0);
  BatchInput b;
  b.inputs.push_back(make_input(
      a, std::make_shared<const std::vector<Token>>(std::vector<Token>{1, 32000}), 0, 2, 0, true));
  BatchOutput o;
  const Status s = e->execute(b, o);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.message().rfind("CpuExecutor: ", 0), 0u) << s.to_string();
  EXPECT_NE(s.message().find("outside the vocabulary [0, 32000)"), std::string::npos)
      << s.to_string();
  EXPECT_EQ(e->kv_metrics().cells_in_use, 0);
}

TEST_F(CpuExecutorCreateTest, AGapInASessionFailsTheBatch) {
  auto e = make(weights_, 2, 64, 16);
  const SessionId a = *e->open_session();
  e->set_sampling(a, SamplingParams{}, 0);
  BatchInput b;
  b.inputs.push_back(make_input(
      a, std::make_shared<const std::vector<Token>>(std::vector<Token>{1, 2}), 0, 2, 5, true));
  BatchOutput o;
  const Status s = e->execute(b, o);
  EXPECT_FALSE(s.ok());
  EXPECT_FALSE(s.message().empty());
}

}  // namespace
}  // namespace cellm
