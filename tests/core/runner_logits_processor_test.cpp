// Runner: GenConfig::processor reaches the executor; an executor that refuses
// it fails the generation naming why; one that accepts it tells the processor
// each delivered token once, in order; through the real SessionTable
// (HistoryExecutor) masks, logit_bias and seeded penalties act on the output.
#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "cellm/logits_processor.h"
#include "cellm/runner.h"
#include "support/fake_executor.h"
#include "support/history_executor.h"
#include "support/runner_harness.h"

namespace cellm::testing {
namespace {

// Records its calls; optionally allows only `allowed` (a bitset over [0, 64)).
class RecordingProcessor final : public LogitsProcessor {
 public:
  explicit RecordingProcessor(uint64_t allowed = 0) : allowed_(allowed) {}
  void prepare(LogitAdjustments& out) override {
    std::lock_guard<std::mutex> lock(mu_);
    out.clear();
    if (allowed_ != 0) out.allowed = {allowed_};
    ++prepares_;
    if (prepares_ != static_cast<int>(accepted_.size()) + 1) order_broken_ = true;
  }
  void accept(Token token) override {
    std::lock_guard<std::mutex> lock(mu_);
    accepted_.push_back(token);
    if (prepares_ != static_cast<int>(accepted_.size())) order_broken_ = true;
  }
  std::vector<Token> accepted() const {
    std::lock_guard<std::mutex> lock(mu_);
    return accepted_;
  }
  int prepares() const {
    std::lock_guard<std::mutex> lock(mu_);
    return prepares_;
  }
  // True if a prepare() was not followed by exactly one accept().
  bool order_broken() const {
    std::lock_guard<std::mutex> lock(mu_);
    return order_broken_;
  }

 private:
  mutable std::mutex mu_;
  uint64_t allowed_;
  int prepares_ = 0;
  std::vector<Token> accepted_;
  bool order_broken_ = false;
};

TEST(RunnerLogitsProcessorTest, AnExecutorThatRefusesTheProcessorFailsTheGeneration) {
  FakeExecutor executor;  // refuses processors by default
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  GenConfig cfg = config(4);
  auto proc = std::make_shared<RecordingProcessor>();
  cfg.processor = proc;
  auto updates = std::make_shared<Updates>();
  GenerationHandle handle = generate(session, tokens(3), cfg, updates);
  ASSERT_TRUE(updates->wait());
  handle.wait();
  EXPECT_EQ(handle.finish_reason(), FinishReason::kFailed);
  EXPECT_NE(handle.error_message().find("cannot apply logits processors"), std::string::npos)
      << handle.error_message();
  EXPECT_TRUE(updates->tokens().empty());
  EXPECT_EQ(proc->prepares(), 0);
  EXPECT_EQ(count_calls(executor, "set_logits_processor"), 1u);

  // The session stays usable for a generation without a processor.
  auto plain = std::make_shared<Updates>();
  GenerationHandle again = generate(session, tokens(2), config(2), plain);
  ASSERT_TRUE(plain->wait());
  again.wait();
  EXPECT_EQ(again.finish_reason(), FinishReason::kNewTokenLimit) << again.error_message();
  EXPECT_EQ(plain->tokens().size(), 2u);
}

TEST(RunnerLogitsProcessorTest, AnAcceptingExecutorTellsTheProcessorEachDeliveredToken) {
  FakeExecutor executor;
  executor.set_accepts_processors(true);
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  GenConfig cfg = config(7);
  auto proc = std::make_shared<RecordingProcessor>();
  cfg.processor = proc;
  auto updates = std::make_shared<Updates>();
  GenerationHandle handle = generate(session, tokens(5), cfg, updates);
  ASSERT_TRUE(updates->wait());
  handle.wait();
  EXPECT_EQ(handle.finish_reason(), FinishReason::kNewTokenLimit) << handle.error_message();
  ASSERT_EQ(updates->tokens().size(), 7u);
  EXPECT_EQ(proc->accepted(), updates->tokens());
  EXPECT_EQ(proc->prepares(), 7);
  EXPECT_FALSE(proc->order_broken());

  // The next generation without a processor: set_sampling dropped it.
  auto next = std::make_shared<Updates>();
  GenerationHandle second = generate(session, tokens(1), config(3), next);
  ASSERT_TRUE(next->wait());
  second.wait();
  EXPECT_EQ(next->tokens().size(), 3u);
  EXPECT_EQ(proc->accepted().size(), 7u);
}

HistoryExecutorOptions history_options() {
  HistoryExecutorOptions o;
  o.vocab_size = 64;
  return o;
}

TEST(RunnerLogitsProcessorTest, TheSessionTableSamplesFromTheMaskedRow) {
  HistoryExecutor executor(history_options());
  Runner runner(executor, make_scheduler());
  Session session = open_session(runner);
  const std::set<Token> allowed = {4, 9, 33};
  uint64_t bits = 0;
  for (Token t : allowed) bits |= uint64_t{1} << t;
  GenConfig cfg = config(12);
  cfg.sampling.temperature = 1.0f;
  cfg.seed = 3;
  auto proc = std::make_shared<RecordingProcessor>(bits);
  cfg.processor = proc;
  auto updates = std::make_shared<Updates>();
  GenerationHandle handle = generate(session, tokens(6, 1), cfg, updates);
  ASSERT_TRUE(updates->wait());
  handle.wait();
  EXPECT_EQ(handle.finish_reason(), FinishReason::kNewTokenLimit) << handle.error_message();
  const std::vector<Token> out = updates->tokens();
  ASSERT_EQ(out.size(), 12u);
  for (Token t : out) EXPECT_TRUE(allowed.count(t)) << t;
  EXPECT_EQ(proc->accepted(), out);
  EXPECT_FALSE(proc->order_broken());
}

std::vector<Token> generate_with(HistoryExecutor& executor, const GenConfig& cfg,
                                 std::vector<Token> prompt) {
  Runner runner(executor, make_scheduler());
  Session session = open_session(runner);
  auto updates = std::make_shared<Updates>();
  GenerationHandle handle = generate(session, std::move(prompt), cfg, updates);
  EXPECT_TRUE(updates->wait());
  handle.wait();
  EXPECT_EQ(handle.finish_reason(), FinishReason::kNewTokenLimit) << handle.error_message();
  return updates->tokens();
}

TEST(RunnerLogitsProcessorTest, LogitBiasAndSeededPenaltiesThroughTheRunner) {
  HistoryExecutor executor(history_options());
  const std::vector<Token> prompt = tokens(5, 1);

  // +100 on one token under greedy: that token every step.
  PenaltyParams bias;
  bias.logit_bias = {{17, 100.0f}};
  ASSERT_TRUE(validate_penalties(bias, 64).ok());
  GenConfig greedy = config(6);
  greedy.processor = make_penalty_processor(bias, prompt);
  EXPECT_EQ(generate_with(executor, greedy, prompt), std::vector<Token>(6, 17));

  // A seeded temperature-1 generation with penalties repeats itself exactly,
  // and the penalties change what it samples.
  PenaltyParams pen;
  pen.frequency_penalty = 2.0f;
  pen.presence_penalty = 1.0f;
  pen.repetition_penalty = 1.5f;
  auto seeded = [&](bool with_penalties) {
    GenConfig cfg = config(24);
    cfg.sampling.temperature = 1.0f;
    cfg.seed = 11;
    if (with_penalties) cfg.processor = make_penalty_processor(pen, prompt);
    return generate_with(executor, cfg, prompt);
  };
  const std::vector<Token> first = seeded(true);
  EXPECT_EQ(first.size(), 24u);
  EXPECT_EQ(seeded(true), first);
  EXPECT_NE(seeded(false), first);
}

}  // namespace
}  // namespace cellm::testing
