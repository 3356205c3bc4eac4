// Runner under concurrent producers: threads open sessions, generate, cancel,
// clone and destroy sessions while the engine runs, then the runner stops.
// Everything must settle and the metrics must balance. Run it under TSan.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "cellm/runner.h"
#include "support/fake_executor.h"
#include "support/runner_harness.h"

namespace cellm::testing {
namespace {

constexpr int kProducers = 4;
constexpr int kRoundsPerProducer = 30;
constexpr Token kStop = 7;

// One producer's work: a random mix of every public operation. Returns the
// handles it started; `sessions_opened` counts successful opens and clones.
std::vector<GenerationHandle> produce(Runner& runner, unsigned seed, bool wait_each,
                                      std::atomic<int>& sessions_opened) {
  std::mt19937 rng(seed);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  std::vector<GenerationHandle> handles;
  std::vector<Session> kept;
  for (int round = 0; round < kRoundsPerProducer; ++round) {
    auto opened = runner.open_session_async();
    std::optional<Session> session = settle(opened);
    if (!session) continue;  // refused: capacity or stopping
    sessions_opened++;
    GenConfig cfg = config(1 + pick(6));
    cfg.stop_tokens = {kStop};
    cfg.seed = rng();
    std::vector<Token> delta = tokens(1 + pick(20), static_cast<Token>(10 + pick(5)));
    GenerationHandle handle = session->generate_async(delta, cfg, [](const GenerationUpdate&) {});
    handles.push_back(handle);
    switch (pick(5)) {
      case 0:
        handle.cancel();
        break;
      case 1:
        session.reset();
        break;  // destroy mid-generation
      case 2: {
        if (wait_each) handle.wait();
        auto cloned = session->clone_async(session->position());
        std::optional<Session> child = settle(cloned);
        if (child) {
          sessions_opened++;
          handles.push_back(child->generate_async(tokens(3), config(2), nullptr));
          if (pick(2) == 0) kept.push_back(std::move(*child));
        }
        break;
      }
      case 3:
        kept.push_back(std::move(*session));
        break;
      default:
        break;
    }
    if (wait_each) handle.wait();
    if (kept.size() > 3) kept.erase(kept.begin());
  }
  return handles;
}

bool settles(const GenerationHandle& handle) {
  auto waiter = std::async(std::launch::async, [handle] { handle.wait(); });
  return waiter.wait_for(kTimeout) == std::future_status::ready;
}

void check_balanced(const Runner& runner, const FakeExecutor& executor, size_t n_handles) {
  const EngineMetrics m = runner.metrics();
  EXPECT_EQ(m.generations_completed, m.generations_started);
  EXPECT_EQ(
      m.finished_stop_token + m.finished_token_limit + m.finished_cancelled + m.finished_failed,
      m.generations_completed);
  EXPECT_LE(m.generations_started, static_cast<int64_t>(n_handles));
  EXPECT_EQ(m.finished_failed, 0);
  EXPECT_EQ(m.steps_failed, 0);
  EXPECT_EQ(m.decode_only_latency_sum_us + m.mixed_latency_sum_us + m.prefill_only_latency_sum_us,
            m.step_latency_sum_us);
  EXPECT_EQ(executor.open_count(), 0);
  std::vector<SessionId> opened = executor.opened();
  std::vector<SessionId> closed = executor.closed();
  std::sort(opened.begin(), opened.end());
  std::sort(closed.begin(), closed.end());
  EXPECT_EQ(closed, opened) << "every executor session closed exactly once";
  EXPECT_TRUE(executor.violations().empty()) << executor.violations().front();
}

TEST(RunnerConcurrencyTest, ProducersSettleBeforeShutdown) {
  FakeExecutor executor;
  executor.set_capacity(24);
  executor.script_tokens(3, {1, 2, kStop});
  Fixture fixture(executor, 4, 8);
  std::atomic<int> sessions_opened{0};
  std::vector<std::future<std::vector<GenerationHandle>>> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.push_back(std::async(std::launch::async, [&, p] {
      return produce(fixture.runner, 100u + static_cast<unsigned>(p), true, sessions_opened);
    }));
  }
  std::vector<GenerationHandle> handles;
  for (auto& producer : producers) {
    std::vector<GenerationHandle> hs = producer.get();
    handles.insert(handles.end(), hs.begin(), hs.end());
  }
  for (const GenerationHandle& handle : handles) ASSERT_TRUE(settles(handle));
  fixture.runner.shutdown();
  for (const GenerationHandle& handle : handles) {
    ASSERT_TRUE(handle.finish_reason().has_value());
  }
  EXPECT_GT(sessions_opened.load(), kProducers * kRoundsPerProducer / 2);
  const EngineMetrics m = fixture.runner.metrics();
  EXPECT_EQ(m.generations_started, static_cast<int64_t>(handles.size()))
      << "nothing was refused synchronously before the stop";
  EXPECT_GT(m.total_generated_tokens, 0);
  check_balanced(fixture.runner, executor, handles.size());
}

TEST(RunnerConcurrencyTest, ShutdownRacingProducersSettlesEverything) {
  FakeExecutor executor;
  executor.set_capacity(24);
  Fixture fixture(executor, 4, 8);
  std::atomic<int> sessions_opened{0};
  std::vector<std::future<std::vector<GenerationHandle>>> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.push_back(std::async(std::launch::async, [&, p] {
      return produce(fixture.runner, 200u + static_cast<unsigned>(p), false, sessions_opened);
    }));
  }
  while (sessions_opened.load() < 8) std::this_thread::yield();
  fixture.runner.shutdown();
  std::vector<GenerationHandle> handles;
  for (auto& producer : producers) {
    std::vector<GenerationHandle> hs = producer.get();
    handles.insert(handles.end(), hs.begin(), hs.end());
  }
  for (const GenerationHandle& handle : handles) {
    ASSERT_TRUE(settles(handle));
    ASSERT_TRUE(handle.finish_reason().has_value());
  }
  check_balanced(fixture.runner, executor, handles.size());
}

}  // namespace
}  // namespace cellm::testing
