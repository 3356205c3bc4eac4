// Logits processors on the CPU executor, end to end through the Runner with a
// tiny model (tests/fixtures/models/qwen3-tiny): a mask keeps every output
// token among the allowed ones, logit_bias +100 forces its token under greedy,
// min_tokens holds a stop token back, and a seeded temperature-1 generation
// with penalties repeats itself exactly.
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cellm/cpu_executor.h"
#include "cellm/decode_first_scheduler.h"
#include "cellm/logits_processor.h"
#include "cellm/model_weights.h"
#include "cellm/runner.h"
#include "fixture_model.h"

namespace cellm {
namespace {

// Allows only `allowed`, and records the tokens it is told.
class AllowListProcessor final : public LogitsProcessor {
 public:
  AllowListProcessor(const std::set<Token>& allowed, int64_t vocab)
      : mask_(static_cast<size_t>((vocab + 63) / 64), 0) {
    for (Token t : allowed) mask_[static_cast<size_t>(t) / 64] |= uint64_t{1} << (t % 64);
  }
  void prepare(LogitAdjustments& out) override {
    out.clear();
    out.allowed = mask_;
  }
  void accept(Token token) override { accepted_.push_back(token); }
  // Read only after the generation ended (the engine thread calls accept()).
  const std::vector<Token>& accepted() const { return accepted_; }

 private:
  std::vector<uint64_t> mask_;
  std::vector<Token> accepted_;
};

struct Generated {
  std::vector<Token> tokens;
  FinishReason finish = FinishReason::kFailed;
  std::string error;
};

class CpuLogitsProcessorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    fixture_ = new testing::Fixture(testing::load_fixture("qwen3-tiny"));
    Result<ModelWeights> w = ModelWeights::load(fixture_->dir);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    weights_ = new std::shared_ptr<const ModelWeights>(
        std::make_shared<const ModelWeights>(std::move(w).value()));
  }
  static void TearDownTestSuite() {
    delete weights_;
    delete fixture_;
  }
  void SetUp() override { ASSERT_NE(weights_, nullptr); }

  // One generation on a fresh CPU executor and runner.
  static Generated generate(const std::vector<Token>& prompt, const GenConfig& config) {
    Generated g;
    ExecutorLimits limits;
    limits.max_sessions = 2;
    limits.max_session_tokens = 96;
    limits.step_width = 8;
    CpuExecutorOptions options;
    options.initial_cells = 16;
    options.num_threads = 2;
    Result<std::unique_ptr<CpuExecutor>> cpu = CpuExecutor::create(*weights_, limits, options);
    EXPECT_TRUE(cpu.ok()) << cpu.status().to_string();
    if (!cpu.ok()) return g;
    Result<std::unique_ptr<DecodeFirstScheduler>> scheduler = DecodeFirstScheduler::create(8, 4, 4);
    EXPECT_TRUE(scheduler.ok());
    if (!scheduler.ok()) return g;
    Runner runner(**cpu, std::move(*scheduler));
    std::optional<Session> session = runner.open_session_async().get();
    EXPECT_TRUE(session.has_value());
    if (!session) return g;
    // The callback runs on the engine thread; the test reads after wait().
    GenerationHandle handle =
        session->generate_async(prompt, config, [&g](const GenerationUpdate& u) {
          g.tokens.insert(g.tokens.end(), u.tokens.begin(), u.tokens.end());
        });
    handle.wait();
    g.finish = handle.finish_reason().value_or(FinishReason::kFailed);
    g.error = handle.error_message();
    session.reset();
    runner.shutdown();
    return g;
  }

  static const std::vector<Token>& prompt() { return fixture_->prompts.at(0).ids; }
  static int64_t vocab() { return fixture_->vocab_size; }

  static inline testing::Fixture* fixture_ = nullptr;
  static inline std::shared_ptr<const ModelWeights>* weights_ = nullptr;
};

GenConfig make_config(int32_t max_new_tokens, float temperature, std::optional<uint64_t> seed) {
  GenConfig c;
  c.max_new_tokens = max_new_tokens;
  c.sampling.temperature = temperature;
  c.seed = seed;
  return c;
}

TEST_F(CpuLogitsProcessorTest, AMaskKeepsEveryTokenAmongTheAllowed) {
  const std::set<Token> allowed = {5, 77, 300, 4097, static_cast<Token>(vocab() - 1)};
  for (const float temperature : {0.0f, 1.0f}) {
    SCOPED_TRACE(::testing::Message() << "temperature " << temperature);
    GenConfig config = make_config(12, temperature, 7);
    auto processor = std::make_shared<AllowListProcessor>(allowed, vocab());
    config.processor = processor;
    const Generated g = generate(prompt(), config);
    EXPECT_EQ(g.finish, FinishReason::kNewTokenLimit) << g.error;
    ASSERT_EQ(g.tokens.size(), 12u);
    for (Token t : g.tokens) EXPECT_TRUE(allowed.count(t)) << t;
    EXPECT_EQ(processor->accepted(), g.tokens);
  }
}

TEST_F(CpuLogitsProcessorTest, LogitBiasOfOneHundredForcesItsTokenUnderGreedy) {
  const Generated plain = generate(prompt(), make_config(6, 0.0f, std::nullopt));
  ASSERT_EQ(plain.tokens.size(), 6u) << plain.error;
  const Token forced = 1234;
  ASSERT_NE(plain.tokens[0], forced);
  PenaltyParams bias;
  bias.logit_bias = {{forced, 100.0f}};
  ASSERT_TRUE(validate_penalties(bias, static_cast<int32_t>(vocab())).ok());
  GenConfig config = make_config(6, 0.0f, std::nullopt);
  config.processor = make_penalty_processor(bias, prompt());
  const Generated g = generate(prompt(), config);
  EXPECT_EQ(g.finish, FinishReason::kNewTokenLimit) << g.error;
  EXPECT_EQ(g.tokens, std::vector<Token>(6, forced));
}

TEST_F(CpuLogitsProcessorTest, MinTokensHoldsTheStopTokenBack) {
  // The greedy first token, made a stop token, ends a plain generation at once.
  const Generated plain = generate(prompt(), make_config(8, 0.0f, std::nullopt));
  ASSERT_FALSE(plain.tokens.empty()) << plain.error;
  const Token stop = plain.tokens[0];
  GenConfig stopping = make_config(8, 0.0f, std::nullopt);
  stopping.stop_tokens = {stop};
  const Generated early = generate(prompt(), stopping);
  EXPECT_EQ(early.finish, FinishReason::kStopToken) << early.error;
  EXPECT_EQ(early.tokens, std::vector<Token>{stop});

  PenaltyParams p;
  p.min_tokens = 4;
  p.stop_tokens = {stop};
  GenConfig held = stopping;
  held.processor = make_penalty_processor(p, prompt());
  const Generated g = generate(prompt(), held);
  ASSERT_GE(g.tokens.size(), 5u) << g.error;
  for (size_t i = 0; i < 4; ++i) EXPECT_NE(g.tokens[i], stop) << i;
  if (g.finish == FinishReason::kStopToken) {
    EXPECT_EQ(g.tokens.back(), stop);
  }
}

TEST_F(CpuLogitsProcessorTest, SeededPenalizedSamplingIsReproducible) {
  auto run = [&](bool with_penalties) {
    GenConfig config = make_config(24, 1.0f, 20261206);
    if (with_penalties) {
      PenaltyParams p;
      p.presence_penalty = 1.5f;
      p.frequency_penalty = 1.0f;
      p.repetition_penalty = 1.3f;
      p.logit_bias = {{prompt().back(), -5.0f}};
      EXPECT_TRUE(validate_penalties(p, static_cast<int32_t>(vocab())).ok());
      config.processor = make_penalty_processor(p, prompt());
    }
    const Generated g = generate(prompt(), config);
    EXPECT_EQ(g.finish, FinishReason::kNewTokenLimit) << g.error;
    EXPECT_EQ(g.tokens.size(), 24u);
    return g.tokens;
  };
  const std::vector<Token> first = run(true);
  EXPECT_EQ(run(true), first);
  EXPECT_NE(run(false), first) << "the penalties change the draws";
}

}  // namespace
}  // namespace cellm
