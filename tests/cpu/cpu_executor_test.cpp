// The CPU executor driven directly through the executor seam on the reference
// fixtures: greedy continuations equal the reference's, alone, batched with
// other sessions, and with prompts cut into chunks and forwards cut by the
// step width; plus create()'s refusals, cell reuse, clones and bad input; and a
// pool shared by need (capacity rule off), sized by cells or by memory.
#include "cellm/cpu_executor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "executor_driver.h"
#include "fixture_model.h"
#include "kjv_prompts.h"

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

// A pool shared by need (capacity rule off): 1024 cells of kjv-small (context 256)
// serve 16 sessions of 60 positions at once, more than the 1024 / 256 = 4 a pool of
// fixed context-sized slots could, and each session's tokens are those it produces
// alone.
TEST(CpuExecutorSharedPoolTest, SixteenSessionsOfAPoolOfFourContextsMatchTheirSoloRuns) {
  const auto weights = testing::load_kjv_small();
  ASSERT_EQ(weights->config().max_position_embeddings(), 256);
  ExecutorLimits l;
  l.max_sessions = 16;
  l.max_session_tokens = 0;  // the model's context
  l.max_cells = 1024;
  l.step_width = 64;
  CpuExecutorOptions o;
  o.initial_cells = 64;
  o.num_threads = 2;
  // Fixed slots of the whole context cannot hold 16 sessions in 1024 cells.
  const Result<std::unique_ptr<CpuExecutor>> by_rule = CpuExecutor::create(weights, l, o);
  ASSERT_FALSE(by_rule.ok());
  EXPECT_NE(by_rule.status().message().find("16 x max_session_tokens 256 = 4096 cells"),
            std::string::npos)
      << by_rule.status().message();

  l.capacity_rule = false;
  Result<std::unique_ptr<CpuExecutor>> created = CpuExecutor::create(weights, l, o);
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  CpuExecutor& e = **created;
  EXPECT_EQ(e.limits().max_session_tokens, 256);
  EXPECT_EQ(e.limits().max_cells, 1024);
  EXPECT_EQ(e.kv_budget().capacity, 1023);
  EXPECT_EQ(e.kv_budget().max_context, 256);

  // 20-token prompts and 41 outputs: 20 + 40 committed positions each, 960 cells.
  constexpr size_t kPrompt = 20, kOutputs = 41;
  const std::vector<std::vector<Token>> prompts = testing::kjv_prompts(16, kPrompt, 13);
  const std::vector<std::vector<Token>> together = testing::drive(e, prompts, 8, kOutputs);
  EXPECT_EQ(e.kv_metrics().cells_in_use, 0);
  EXPECT_GE(e.kv_metrics().rows_allocated, 16 * 60);  // every session's cells at once
  ASSERT_EQ(together.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(together[i].size(), kOutputs) << "session " << i;
    const std::vector<std::vector<Token>> alone = testing::drive(e, {prompts[i]}, 8, kOutputs);
    EXPECT_EQ(together[i], alone[0]) << "session " << i;
  }
  EXPECT_EQ(e.kv_metrics().cells_in_use, 0);
}

// One cell's K and V over every layer, in f32.
int64_t cell_bytes(const ModelConfig& c) {
  return 2 * c.num_layers() * c.kv_dim() * static_cast<int64_t>(sizeof(float));
}

TEST_F(CpuExecutorCreateTest, APoolSizedByMemoryHasTheBudgetsCells) {
  const int64_t per_cell = cell_bytes(weights_->config());
  ExecutorLimits l;
  l.capacity_rule = false;
  l.max_sessions = 4;
  l.max_session_tokens = 0;
  l.step_width = 32;
  l.kv_memory_bytes = 700 * per_cell + per_cell / 2;  // whole cells only
  CpuExecutorOptions o;
  o.initial_cells = 16;
  Result<std::unique_ptr<CpuExecutor>> e = CpuExecutor::create(weights_, l, o);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_EQ((*e)->kv_bytes_per_cell(), per_cell);
  EXPECT_EQ((*e)->kv_metrics().bytes_per_cell, per_cell);
  EXPECT_EQ((*e)->limits().max_cells, 700);
  EXPECT_EQ((*e)->limits().max_session_tokens, 512);  // the model's context
  EXPECT_EQ((*e)->kv_budget().capacity, 699);
  // The storage grows as sessions fill it, not up front.
  EXPECT_EQ((*e)->kv_metrics().rows_allocated, 16);

  // A pool smaller than one context caps the context.
  l.kv_memory_bytes = 300 * per_cell;
  e = CpuExecutor::create(weights_, l, o);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_EQ((*e)->limits().max_cells, 300);
  EXPECT_EQ((*e)->limits().max_session_tokens, 299);

  // A cap given explicitly stays; max_cells given wins over the budget.
  l.max_session_tokens = 100;
  e = CpuExecutor::create(weights_, l, o);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_EQ((*e)->limits().max_session_tokens, 100);
  l.max_cells = 128;
  e = CpuExecutor::create(weights_, l, o);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_EQ((*e)->limits().max_cells, 128);

  // A budget far past what the sessions could fill stops at 16 x 4 sessions x 512.
  l = ExecutorLimits{};
  l.capacity_rule = false;
  l.max_sessions = 4;
  l.max_session_tokens = 0;
  l.kv_memory_bytes = int64_t{1} << 50;
  e = CpuExecutor::create(weights_, l, o);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_EQ((*e)->limits().max_cells, 16 * 4 * 512);

  // In rule mode the budget sizes the pool and the rule still holds.
  l.capacity_rule = true;
  l.max_session_tokens = 64;
  l.kv_memory_bytes = 4 * 64 * per_cell;  // 256 cells: not above 4 x 64
  e = CpuExecutor::create(weights_, l, o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("= 256 cells must be below max_cells 256"), std::string::npos)
      << e.status().message();
  l.kv_memory_bytes += per_cell;
  e = CpuExecutor::create(weights_, l, o);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_EQ((*e)->limits().max_cells, 257);
}

TEST_F(CpuExecutorCreateTest, RefusesBadMemorySizesNamingThem) {
  const int64_t per_cell = cell_bytes(weights_->config());
  const auto refusal = [this](const ExecutorLimits& l) {
    Result<std::unique_ptr<CpuExecutor>> e = CpuExecutor::create(weights_, l, {});
    EXPECT_FALSE(e.ok());
    if (e.ok()) return std::string();
    EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(e.status().message().rfind("CpuExecutor: ", 0), 0u) << e.status().message();
    return e.status().message();
  };
  const auto expect_has = [](const std::string& message, const std::string& part) {
    EXPECT_NE(message.find(part), std::string::npos) << message << "\nlacks: " << part;
  };
  ExecutorLimits base;
  base.capacity_rule = false;
  base.max_sessions = 4;
  base.max_session_tokens = 0;
  base.step_width = 16;
  base.kv_memory_bytes = 1000 * per_cell;

  for (double f : {-0.5, 1.5, std::nan("")}) {
    ExecutorLimits l = base;
    l.kv_memory_fraction = f;
    expect_has(refusal(l), "must be in (0, 1]");
  }
  ExecutorLimits l = base;
  l.kv_memory_fraction = 1.5;
  expect_has(refusal(l), "kv_memory_fraction 1.5");
  l = base;
  l.kv_memory_bytes = -1;
  expect_has(refusal(l), "kv_memory_bytes -1 must be positive");
  l = base;
  l.kv_memory_bytes = 0;
  expect_has(refusal(l), "sized by max_cells or kv_memory_bytes, and both are 0");
  // An explicit cap the budget cannot hold: one context does not fit.
  l = base;
  l.max_session_tokens = 128;
  l.kv_memory_bytes = 100 * per_cell;
  const std::string cap = refusal(l);
  expect_has(cap, "max_session_tokens 128 needs 129 cells");
  expect_has(cap, "max_cells 100 (kv_memory_bytes " + std::to_string(100 * per_cell) + " at " +
                      std::to_string(per_cell) + " bytes a cell)");
  l.kv_memory_bytes = 0;
  l.max_cells = 128;
  expect_has(refusal(l),
             "max_session_tokens 128 needs 129 cells (one is the scratch row) but "
             "the pool holds max_cells 128");
  // A budget below one forward, or below a cell.
  l = base;
  l.kv_memory_bytes = 10 * per_cell;
  expect_has(refusal(l), "step_width 16 exceeds max_cells 10 (kv_memory_bytes");
  l.step_width = 1;
  l.kv_memory_bytes = per_cell + 1;
  expect_has(refusal(l), "max_cells 1 (kv_memory_bytes " + std::to_string(per_cell + 1) + " at " +
                             std::to_string(per_cell) +
                             " bytes a cell) leaves no cell for a session");
  l.kv_memory_bytes = per_cell - 1;
  expect_has(refusal(l), "max_cells 0 (kv_memory_bytes");
  // Past the model's context, with the rule off as well.
  l = base;
  l.max_session_tokens = 513;
  expect_has(refusal(l), "exceeds the model's context of 512");
}

TEST_F(CpuExecutorCreateTest, AZeroCapMeansTheModelsContextInRuleModeToo) {
  ExecutorLimits l;
  l.max_sessions = 2;
  l.max_session_tokens = 0;
  Result<std::unique_ptr<CpuExecutor>> e = CpuExecutor::create(weights_, l, {});
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_EQ((*e)->limits().max_session_tokens, 512);
  EXPECT_EQ((*e)->limits().max_cells, 2 * 512 + 1);
}

}  // namespace
}  // namespace cellm
