// The serving library as an embedder uses it, without HTTP: an Engine over the bundled
// model, a ServeEngine over its runner and tokenizer, and jobs run to a JobSink.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cellm/engine.h"
#include "cellm/metrics.h"
#include "cellm/serve.h"

namespace cellm::serve {
namespace {

// Gathers every choice's text and finish reason.
class CollectSink final : public JobSink {
 public:
  explicit CollectSink(int32_t n) : text(static_cast<size_t>(n)), finish(static_cast<size_t>(n)) {}
  bool deliver(const ChoiceDelta& d) override {
    text[static_cast<size_t>(d.index)] += d.text;
    tokens += static_cast<int64_t>(d.tokens.size());
    if (d.finish_reason) finish[static_cast<size_t>(d.index)] = *d.finish_reason;
    return true;
  }
  bool alive() override { return true; }

  std::vector<std::string> text, finish;
  int64_t tokens = 0;
};

Result<Engine> small_engine() {
  EngineOptions options;  // the bundled model
  options.executor = ExecutorKind::kCpu;
  options.limits.max_sessions = 8;
  options.limits.max_session_tokens = 128;
  options.limits.max_cells = 2048;
  options.limits.capacity_rule = false;  // one pool shared by need, as `cellm serve` runs it
  options.limits.prefix_cache = true;
  options.limits.step_width = 64;
  options.runner.policy = KvPolicy::kReserve;
  options.cpu.num_threads = 2;
  return Engine::create(options);
}

JobSpec spec_for(const Engine& engine, int32_t n) {
  JobSpec spec;
  spec.prompt = engine.tokenizer()->encode("In the beginning God created", true);
  spec.max_tokens = 6;  // greedy, no stop tokens: every choice runs to its length
  spec.n = n;
  return spec;
}

TEST(ServeEngineTest, RunsAJobOfSeveralChoicesAndReusesItsPromptFromThePrefixCache) {
  Result<Engine> engine = small_engine();
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  ASSERT_NE(engine->tokenizer(), nullptr);
  ServeMetrics metrics;
  ServeEngine serving(engine->runner(), *engine->tokenizer(), metrics);

  Result<std::unique_ptr<Job>> first = serving.start(spec_for(*engine, 2), {}, now_us());
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  CollectSink a(2);
  const JobSummary sa = (*first)->run(a);
  first->reset();  // ends the job: its cells enter the prefix cache
  EXPECT_EQ(sa.completion_tokens, 12);
  EXPECT_EQ(a.finish, (std::vector<std::string>{"length", "length"}));
  EXPECT_FALSE(a.text[0].empty());
  EXPECT_EQ(a.text[0], a.text[1]);  // greedy: a clone continues as its source does
  EXPECT_EQ(sa.prompt_tokens_cached, 0);

  Result<std::unique_ptr<Job>> second = serving.start(spec_for(*engine, 1), {}, now_us());
  ASSERT_TRUE(second.ok()) << second.status().to_string();
  CollectSink b(1);
  const JobSummary sb = (*second)->run(b);
  // The whole prompt but its last token, which is fed again to sample.
  EXPECT_EQ(sb.prompt_tokens_cached, static_cast<int64_t>(spec_for(*engine, 1).prompt.size()) - 1);
  EXPECT_EQ(b.text[0], a.text[0]);
}

TEST(ServeEngineTest, RefusesJobsOnceCancelled) {
  Result<Engine> engine = small_engine();
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  ServeMetrics metrics;
  ServeEngine serving(engine->runner(), *engine->tokenizer(), metrics);
  serving.cancel_all();
  Result<std::unique_ptr<Job>> job = serving.start(spec_for(*engine, 1), {}, now_us());
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), StatusCode::kInvalidState);
}

}  // namespace
}  // namespace cellm::serve
