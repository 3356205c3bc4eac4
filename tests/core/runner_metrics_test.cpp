// Runner: engine and generation metrics as the runner fills them, and the
// derived values and reports of metrics.h.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>
#include <thread>

#include "cellm/metrics.h"
#include "cellm/runner.h"
#include "support/fake_executor.h"
#include "support/runner_harness.h"

namespace cellm::testing {
namespace {

TEST(EngineMetricsTest, CountsStepsSequencesAndTokens) {
  FakeExecutor executor;
  Fixture fixture(executor, 4, 8);  // budget 20: the 10-token prompt is 8 + 2 in one step
  Session session = open_session(fixture.runner);
  auto updates = std::make_shared<Updates>();
  GenerationHandle handle = generate(session, tokens(10), config(3), updates);
  handle.wait();
  fixture.runner.shutdown();

  EXPECT_EQ(executor.batch_sizes(), (std::vector<int>{2, 1, 1}));
  const EngineMetrics m = fixture.runner.metrics();
  EXPECT_EQ(m.steps, 3);
  EXPECT_EQ(m.steps_failed, 0);
  EXPECT_EQ(m.prefill_sessions_total, 1) << "two chunks, one session, one step";
  EXPECT_EQ(m.decode_sessions_total, 2);
  EXPECT_EQ(m.prefill_tokens_total, 10);
  EXPECT_EQ(m.decode_tokens_total, 2);
  EXPECT_EQ(m.decode_only_tokens, 2);
  EXPECT_EQ(m.steps_with_prefill, 1);
  EXPECT_EQ(m.steps_with_decode, 2);
  EXPECT_EQ(m.prefill_only_steps(), 1);
  EXPECT_EQ(m.decode_only_steps(), 2);
  EXPECT_EQ(m.mixed_steps(), 0);
  EXPECT_EQ(m.ready_total, 2) << "ready in both decode steps";
  EXPECT_EQ(m.total_prompt_tokens, 10);
  EXPECT_EQ(m.total_generated_tokens, 3);
  EXPECT_EQ(m.model_input_tokens(), 12);
  EXPECT_EQ(m.total_tokens(), 13);
  EXPECT_DOUBLE_EQ(m.mean_step_tokens(), 4.0);
  EXPECT_EQ(m.context_sum, 10 + 11 + 12);
  EXPECT_EQ(m.context_max, 12);
  EXPECT_EQ(m.peak_concurrent_generations, 1);
  EXPECT_EQ(m.ttft_count, 1);

  const GenerationMetrics g = handle.metrics();
  EXPECT_EQ(g.sid, session.id());
  EXPECT_EQ(g.n_prompt_tokens, 10);
  EXPECT_EQ(g.n_generated_tokens, 3);
  EXPECT_EQ(g.n_prefill_steps, 1);
  EXPECT_EQ(g.n_decode_steps, 2);
  EXPECT_EQ(g.itl_count, 2);
  EXPECT_GT(g.t_submit_us, 0);
  EXPECT_LE(g.t_submit_us, g.t_first_step_us);
  EXPECT_LE(g.t_first_step_us, g.t_first_token_us);
  EXPECT_LE(g.t_first_token_us, g.t_end_us);
  EXPECT_EQ(g.ttft_us(), g.t_first_token_us - g.t_submit_us);
  EXPECT_EQ(m.ttft_sum_us, g.ttft_us());
  EXPECT_LE(g.min_itl_us(), g.itl_max_us);
  EXPECT_EQ(g.e2e_us(), g.t_end_us - g.t_submit_us);
}

TEST(EngineMetricsTest, StartsAndCompletionsBalanceAcrossMixedOutcomes) {
  FakeExecutor executor;
  executor.script_tokens(1, {999});
  Fixture fixture(executor);
  Session stopper = open_session(fixture.runner);
  Session limited = open_session(fixture.runner);
  Session cancelled = open_session(fixture.runner);
  GenConfig stop_cfg = config(5);
  stop_cfg.stop_tokens = {999};
  std::vector<GenerationHandle> handles;
  handles.push_back(generate(stopper, tokens(2), stop_cfg, std::make_shared<Updates>()));
  handles.push_back(generate(limited, tokens(2), config(2), std::make_shared<Updates>()));
  handles.push_back(generate(limited, {}, config(2), std::make_shared<Updates>()));  // failed
  GenerationHandle live =
      generate(cancelled, tokens(2), config(100000), std::make_shared<Updates>());
  handles.push_back(live);
  for (size_t i = 0; i < 3; ++i) handles[i].wait();
  live.cancel();
  live.wait();
  fixture.runner.shutdown();
  const EngineMetrics m = fixture.runner.metrics();
  EXPECT_EQ(m.generations_started, 4);
  EXPECT_EQ(m.generations_completed, 4);
  EXPECT_EQ(m.finished_stop_token, 1);
  EXPECT_EQ(m.finished_token_limit, 1);
  EXPECT_EQ(m.finished_failed, 1);
  EXPECT_EQ(m.finished_cancelled, 1);
}

TEST(EngineMetricsTest, FailedBatchIsCountedWithoutCreditingItsTokens) {
  FakeExecutor executor;
  executor.fail_batches_from(0);
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  GenerationHandle handle = generate(session, tokens(5), config(2), std::make_shared<Updates>());
  handle.wait();
  fixture.runner.shutdown();
  const EngineMetrics m = fixture.runner.metrics();
  EXPECT_EQ(m.steps, 1);
  EXPECT_EQ(m.steps_failed, 1);
  EXPECT_EQ(m.prefill_tokens_total, 0);
  EXPECT_EQ(m.decode_tokens_total, 0);
  EXPECT_EQ(m.total_generated_tokens, 0);
  EXPECT_EQ(m.finished_failed, 1);
  EXPECT_EQ(m.ttft_count, 0);
  EXPECT_EQ(m.min_ttft_us(), 0);
  EXPECT_EQ(handle.metrics().n_generated_tokens, 0);
  EXPECT_EQ(handle.metrics().n_prefill_steps, 1);
}

TEST(EngineMetricsTest, SingleTokenGenerationReportsZeroMinimumItl) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  GenerationHandle single = generate(session, tokens(2), config(1), std::make_shared<Updates>());
  single.wait();
  const GenerationMetrics g = single.metrics();
  EXPECT_EQ(g.itl_count, 0);
  EXPECT_EQ(g.itl_min_us, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(g.min_itl_us(), 0);
  EXPECT_EQ(g.itl_mean_us(), 0.0);
  EXPECT_EQ(g.decode_tokens_per_sec(), 0.0);

  // A first burst of three tokens adds two zero-time samples.
  executor.set_tokens_per_output(3);
  GenerationHandle burst = generate(session, {300}, config(3), std::make_shared<Updates>());
  burst.wait();
  const GenerationMetrics b = burst.metrics();
  EXPECT_EQ(b.n_generated_tokens, 3);
  EXPECT_EQ(b.itl_count, 2);
  EXPECT_EQ(b.itl_sum_us, 0);
  EXPECT_EQ(b.min_itl_us(), 0);
  EXPECT_TRUE(std::isinf(b.decode_tokens_per_sec()));
}

TEST(EngineMetricsTest, CallbackExceptionIsCountedAsACompletedFailure) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  GenerationHandle handle = session.generate_async(
      tokens(2), config(5), [](const GenerationUpdate&) { throw std::runtime_error("boom"); });
  handle.wait();
  fixture.runner.shutdown();
  const EngineMetrics m = fixture.runner.metrics();
  EXPECT_EQ(m.generations_started, 1);
  EXPECT_EQ(m.generations_completed, 1);
  EXPECT_EQ(m.finished_failed, 1);
  EXPECT_EQ(m.total_generated_tokens, 1);
  EXPECT_EQ(m.steps, 1) << "the continuation was never run";
}

TEST(EngineMetricsTest, LatencyBucketsPartitionTotalStepTime) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session a = open_session(fixture.runner);
  Session b = open_session(fixture.runner);
  GenerationHandle hb;
  bool started = false;
  executor.hold();
  // B starts from A's first update, so step 1 mixes A's decode with B's prefill.
  GenerationHandle ha = a.generate_async(tokens(2), config(3), [&](const GenerationUpdate& u) {
    if (!u.finish_reason && !started) {
      started = true;
      hb = b.generate_async(tokens(2), config(1), nullptr);
    }
  });
  executor.release();
  ha.wait();
  fixture.runner.shutdown();
  hb.wait();
  EXPECT_EQ(executor.calls()[6], "execute [1@2+1!,2@0+2!]");
  const EngineMetrics m = fixture.runner.metrics();
  EXPECT_EQ(m.steps, 3);
  EXPECT_EQ(m.prefill_only_steps(), 1);
  EXPECT_EQ(m.mixed_steps(), 1);
  EXPECT_EQ(m.decode_only_steps(), 1);
  EXPECT_EQ(m.decode_only_latency_sum_us + m.mixed_latency_sum_us + m.prefill_only_latency_sum_us,
            m.step_latency_sum_us);
  EXPECT_EQ(m.decode_only_tokens, 1) << "only the decode of the decode-only step";
  EXPECT_EQ(m.decode_tokens_total, 2);
  EXPECT_LE(m.step_latency_max_us, m.step_latency_sum_us);
  EXPECT_GE(m.wall_us(), m.step_latency_sum_us);
  EXPECT_GE(m.idle_fraction(), 0.0);
  EXPECT_LE(m.idle_fraction(), 1.0);
}

TEST(EngineMetricsTest, ReportsContextConcurrencyAndRefusals) {
  FakeExecutor executor;
  executor.set_capacity(2);
  Fixture fixture(executor);
  Session a = open_session(fixture.runner);
  Session b = open_session(fixture.runner);
  auto refused = fixture.runner.open_session_async();
  EXPECT_FALSE(settle(refused).has_value());
  executor.hold();
  GenerationHandle ha = generate(a, tokens(3), config(2), std::make_shared<Updates>());
  ASSERT_TRUE(executor.wait_in_execute());
  GenerationHandle hb = generate(b, tokens(5), config(1), std::make_shared<Updates>());
  executor.release();
  ha.wait();
  hb.wait();
  fixture.runner.shutdown();
  EXPECT_EQ(executor.batch_sizes(), (std::vector<int>{1, 2}));
  const EngineMetrics m = fixture.runner.metrics();
  EXPECT_EQ(m.sessions_refused, 1);
  EXPECT_EQ(m.peak_concurrent_generations, 2);
  EXPECT_EQ(m.context_sum, 3 + (4 + 5));
  EXPECT_EQ(m.context_max, 5);
  EXPECT_DOUBLE_EQ(m.mean_context_per_step(), 6.0);
  EXPECT_EQ(m.ready_total, 1) << "A was past its first token in step 1";
  EXPECT_EQ(m.decode_sessions_total, 1);
  EXPECT_EQ(m.prefill_sessions_total, 2);
  EXPECT_DOUBLE_EQ(m.mean_step_sessions(), 1.5);
  EXPECT_DOUBLE_EQ(m.admitted_ratio(), 1.0);
  EXPECT_EQ(m.ttft_count, 2);
  EXPECT_LE(m.ttft_min_us, m.ttft_max_us);
}

TEST(EngineMetricsTest, MultiChunkPromptCountsContextOncePerSession) {
  FakeExecutor executor;
  Fixture fixture(executor, 2, 4);  // budget 10: chunks 4 + 4 + 2 in one step
  Session session = open_session(fixture.runner);
  GenerationHandle handle = generate(session, tokens(10), config(1), std::make_shared<Updates>());
  handle.wait();
  fixture.runner.shutdown();
  const EngineMetrics m = fixture.runner.metrics();
  EXPECT_EQ(m.steps, 1);
  EXPECT_EQ(m.context_sum, 10) << "the furthest chunk end, not 4 + 8 + 10";
  EXPECT_EQ(m.prefill_sessions_total, 1);
  EXPECT_EQ(handle.metrics().n_prefill_steps, 1);
}

TEST(EngineMetricsTest, InitializationIsTimedAndKeptOutOfTheWall) {
  FakeExecutor executor;
  executor.hold_initialize();
  Fixture fixture(executor);
  ASSERT_TRUE(executor.wait_in_initialize());
  const int64_t t_held = now_us();
  while (now_us() - t_held < 2000) {
  }
  const int64_t t_release = now_us();
  executor.release();
  Session session = open_session(fixture.runner);
  GenerationHandle handle = generate(session, tokens(2), config(2), std::make_shared<Updates>());
  handle.wait();
  fixture.runner.shutdown();
  const EngineMetrics m = fixture.runner.metrics();
  EXPECT_GE(m.init_us, 2000);
  EXPECT_GE(m.t_first_step_us, t_release) << "the wall starts at the first step";
  EXPECT_EQ(m.wall_us(), m.t_last_step_us - m.t_first_step_us);
  EXPECT_LT(m.wall_us(), now_us() - t_release);
}

TEST(EngineMetricsTest, KvMetricsAreSampledAgainAtTheStop) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  EXPECT_EQ(fixture.runner.kv_metrics().cells_in_use, 0);
  GenerationHandle handle = generate(session, tokens(5), config(1), std::make_shared<Updates>());
  handle.wait();
  fixture.runner.shutdown();
  // Sampled after the step (5 cells) and again after the stop closed the session.
  EXPECT_EQ(fixture.runner.kv_metrics().cells_in_use, 0);
  EXPECT_EQ(fixture.runner.kv_metrics().bytes_per_cell, 64);
}

TEST(EngineMetricsTest, KvMetricsReflectTheLatestStep) {
  FakeExecutor executor;
  Fixture fixture(executor);
  Session session = open_session(fixture.runner);
  GenerationHandle handle = generate(session, tokens(5), config(2), std::make_shared<Updates>());
  handle.wait();
  Session probe = open_session(fixture.runner);  // a command round trip after the last step
  const KvMetrics kv = fixture.runner.kv_metrics();
  EXPECT_EQ(kv.cells_in_use, 6) << "5 prompt cells and the fed-back first token";
  EXPECT_EQ(kv.allocated_bytes, 6 * 64);
}

TEST(EngineMetricsTest, KvMetricsFollowAClosedSessionWithoutAnotherStep) {
  FakeExecutor executor;
  Fixture fixture(executor);
  std::optional<Session> session = open_session(fixture.runner);
  GenerationHandle handle = generate(*session, tokens(5), config(2), std::make_shared<Updates>());
  handle.wait();
  session.reset();  // queues the close; no generation runs after it
  const int64_t t_deadline = now_us() + 2'000'000;
  while (fixture.runner.kv_metrics().cells_in_use != 0 && now_us() < t_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(fixture.runner.kv_metrics().cells_in_use, 0) << "the close is sampled by itself";
}

// --- metrics.h: derived values and reports ----------------------------------

TEST(GenerationMetricsTest, DerivedValuesFollowTheTimestamps) {
  GenerationMetrics g;
  EXPECT_EQ(g.ttft_us(), 0);
  EXPECT_EQ(g.e2e_us(), 0);
  g.t_submit_us = 1000;
  g.t_first_step_us = 1500;
  g.t_first_token_us = 3000;
  g.t_end_us = 7000;
  g.n_prompt_tokens = 30;
  g.itl_count = 4;
  g.itl_sum_us = 4000;
  g.itl_min_us = 500;
  g.itl_max_us = 2000;
  EXPECT_EQ(g.ttft_us(), 2000);
  EXPECT_EQ(g.queue_wait_us(), 500);
  EXPECT_EQ(g.prefill_span_us(), 1500);
  EXPECT_EQ(g.decode_span_us(), 4000);
  EXPECT_EQ(g.e2e_us(), 6000);
  EXPECT_DOUBLE_EQ(g.itl_mean_us(), 1000.0);
  EXPECT_EQ(g.min_itl_us(), 500);
  EXPECT_DOUBLE_EQ(g.decode_tokens_per_sec(), 1000.0);
  EXPECT_DOUBLE_EQ(g.prefill_tokens_per_sec(), 20000.0);
}

TEST(EngineMetricsTest, DerivedValuesAreRatiosOfTheCounters) {
  EngineMetrics m;
  EXPECT_EQ(m.mean_step_tokens(), 0.0);
  EXPECT_EQ(m.idle_fraction(), 0.0);
  m.steps = 4;
  m.steps_with_decode = 3;
  m.steps_with_prefill = 2;
  m.decode_sessions_total = 6;
  m.prefill_sessions_total = 2;
  m.ready_total = 8;
  m.decode_tokens_total = 6;
  m.prefill_tokens_total = 10;
  m.decode_only_tokens = 4;
  m.step_latency_sum_us = 800;
  m.decode_only_latency_sum_us = 400;
  m.mixed_latency_sum_us = 300;
  m.prefill_only_latency_sum_us = 100;
  m.context_sum = 40;
  m.t_first_step_us = 1000;
  m.t_last_step_us = 2000;
  m.total_generated_tokens = 5;
  m.ttft_count = 2;
  m.ttft_sum_us = 300;
  m.ttft_min_us = 100;
  EXPECT_EQ(m.wall_us(), 1000);
  EXPECT_DOUBLE_EQ(m.idle_fraction(), 0.2);
  EXPECT_EQ(m.model_input_tokens(), 16);
  EXPECT_DOUBLE_EQ(m.mean_step_tokens(), 4.0);
  EXPECT_DOUBLE_EQ(m.generated_tokens_per_sec(), 5000.0);
  EXPECT_DOUBLE_EQ(m.model_input_tokens_per_sec(), 16000.0);
  EXPECT_DOUBLE_EQ(m.mean_admitted_decode_sessions(), 2.0);
  EXPECT_DOUBLE_EQ(m.mean_ready_decode_sessions(), 2.0);
  EXPECT_DOUBLE_EQ(m.mean_decode_step_sessions(), 1.5);
  EXPECT_DOUBLE_EQ(m.mean_step_sessions(), 2.0);
  EXPECT_DOUBLE_EQ(m.admitted_ratio(), 0.75);
  EXPECT_EQ(m.mixed_steps(), 1);
  EXPECT_EQ(m.decode_only_steps(), 2);
  EXPECT_EQ(m.prefill_only_steps(), 1);
  EXPECT_DOUBLE_EQ(m.mean_decode_only_step_us(), 200.0);
  EXPECT_DOUBLE_EQ(m.mean_mixed_step_us(), 300.0);
  EXPECT_DOUBLE_EQ(m.mean_prefill_only_step_us(), 100.0);
  EXPECT_DOUBLE_EQ(m.decode_only_tokens_per_sec(), 10000.0);
  EXPECT_DOUBLE_EQ(m.mean_decode_us_per_token(), 100.0);
  EXPECT_DOUBLE_EQ(m.mean_context_per_step(), 10.0);
  EXPECT_DOUBLE_EQ(m.mean_ttft_us(), 150.0);
  EXPECT_EQ(m.min_ttft_us(), 100);
}

TEST(MetricsReportTest, JsonIsOneObjectWithCountersAndDerivedValues) {
  EngineMetrics m;
  m.steps = 3;
  m.decode_tokens_total = 2;
  m.prefill_tokens_total = 10;
  const std::string json = to_json(m);
  ASSERT_FALSE(json.empty());
  EXPECT_EQ(json.front(), '{');
  EXPECT_EQ(json.back(), '}');
  EXPECT_NE(json.find("\"steps\":3,"), std::string::npos);
  EXPECT_NE(json.find("\"model_input_tokens\":12"), std::string::npos);
  EXPECT_NE(json.find("\"mean_step_tokens\":4"), std::string::npos);
  EXPECT_NE(json.find("\"ttft_min_us\":0"), std::string::npos) << "no sentinel leaks";
  EXPECT_EQ(json.find('\n'), std::string::npos);

  GenerationMetrics g;
  g.itl_count = 2;  // zero sum: an infinite rate, written as null
  EXPECT_NE(to_json(g).find("\"decode_tokens_per_sec\":null"), std::string::npos);
  KvMetrics kv;
  kv.cells_in_use = 7;
  EXPECT_NE(to_json(kv).find("\"cells_in_use\":7"), std::string::npos);
}

TEST(MetricsReportTest, TextReportNamesEveryCounterOnItsOwnLine) {
  EngineMetrics m;
  m.steps = 3;
  const std::string text = format_report(m);
  EXPECT_EQ(text.rfind("engine\n", 0), 0u);
  EXPECT_NE(text.find("steps"), std::string::npos);
  EXPECT_NE(text.find("decode_only_tokens_per_sec"), std::string::npos);
  EXPECT_NE(format_report(GenerationMetrics{}).find("ttft_us"), std::string::npos);
  EXPECT_NE(format_report(KvMetrics{}).find("allocated_bytes"), std::string::npos);
}

}  // namespace
}  // namespace cellm::testing
