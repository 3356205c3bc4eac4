// Runner: what a generation asks the executor for beyond tokens is refused
// cleanly by an executor that cannot do it: prompt scoring
// (GenConfig::score_prompt) and logits processors (GenConfig::processor). The
// generation fails naming what was asked; the session stays usable.
#include <gtest/gtest.h>

#include <memory>

#include "cellm/runner.h"
#include "support/fake_executor.h"
#include "support/runner_harness.h"

namespace cellm::testing {
namespace {

// A processor that changes nothing.
class NeutralProcessor final : public LogitsProcessor {
 public:
  void prepare(LogitAdjustments& out) override { out.clear(); }
  void accept(Token) override {}
};

TEST(RunnerScoringTest, AnExecutorWithoutScoringFailsTheGenerationNamingIt) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  GenConfig cfg = config(2);
  cfg.score_prompt = true;
  auto refused = std::make_shared<Updates>();
  generate(session, tokens(3), cfg, refused);
  ASSERT_TRUE(refused->wait());
  EXPECT_EQ(refused->finish(), FinishReason::kFailed);
  EXPECT_NE(refused->error_message().find("cannot score prompts"), std::string::npos)
      << refused->error_message();
  EXPECT_TRUE(refused->tokens().empty());

  // The same session then generates without scoring.
  auto plain = std::make_shared<Updates>();
  generate(session, tokens(3), config(2), plain);
  ASSERT_TRUE(plain->wait());
  EXPECT_EQ(plain->finish(), FinishReason::kNewTokenLimit);
  EXPECT_EQ(plain->tokens().size(), 2u);
}

TEST(RunnerScoringTest, AnExecutorWithoutProcessorsFailsTheGenerationNamingIt) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  GenConfig cfg = config(2);
  cfg.processor = std::make_shared<NeutralProcessor>();
  auto refused = std::make_shared<Updates>();
  generate(session, tokens(3), cfg, refused);
  ASSERT_TRUE(refused->wait());
  EXPECT_EQ(refused->finish(), FinishReason::kFailed);
  EXPECT_NE(refused->error_message().find("cannot apply logits processors"), std::string::npos)
      << refused->error_message();

  auto plain = std::make_shared<Updates>();
  generate(session, tokens(3), config(2), plain);
  ASSERT_TRUE(plain->wait());
  EXPECT_EQ(plain->finish(), FinishReason::kNewTokenLimit);
}

}  // namespace
}  // namespace cellm::testing
