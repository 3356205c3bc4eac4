// Runner under KvPolicy::kOvercommit over a HistoryExecutor (real CellPool and
// SessionTable; a logits row hashes the whole committed history, so any lost,
// repeated or misplaced token changes the stream) with a pool of about one
// and a half generations: generations are preempted mid-prefill, mid-decode
// and with a pending token carried from an earlier turn, greedy and seeded,
// and every delivered stream equals the unpreempted run exactly. Also cancel,
// close and clone while preempted, and the oldest generation's step failing
// as under kNone when it alone cannot fit.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cellm/runner.h"
#include "support/history_executor.h"
#include "support/runner_harness.h"

namespace cellm::testing {
namespace {

constexpr int32_t kContext = 64;

HistoryExecutorOptions pool_of(int32_t capacity, bool prefix_cache) {
  HistoryExecutorOptions o;
  o.max_sessions = 24;
  o.max_session_tokens = kContext;
  o.max_cells = capacity + 1;  // one cell is the scratch row
  o.prefix_cache = prefix_cache;
  return o;
}

RunnerOptions overcommit() {
  return RunnerOptions{KvPolicy::kOvercommit};
}

GenConfig seeded(int32_t max_new_tokens, uint64_t seed) {
  GenConfig c = config(max_new_tokens);
  c.sampling.temperature = 0.9f;
  c.sampling.top_k = 16;
  c.seed = seed;
  return c;
}

struct Job {
  std::vector<Token> prompt;
  GenConfig config;
};

// The stream a job delivers alone in a pool that never runs short.
std::vector<Token> unpreempted(const Job& job) {
  HistoryExecutor executor(pool_of(1024, false));
  Runner runner(executor, make_scheduler(4, 4));
  Session s = open_session(runner);
  auto updates = std::make_shared<Updates>();
  generate(s, job.prompt, job.config, updates);
  EXPECT_TRUE(updates->wait());
  return updates->tokens();
}

// How a session's inputs went: a resume shows as an input that starts below
// the end of the one before it; that one tells what the generation was doing
// when it was preempted.
struct Phases {
  bool mid_prefill = false;  // feeding a chunk that wanted no output
  bool mid_decode = false;   // decoding (its last output token pending)
};
Phases phases_of(const HistoryExecutor& executor, SessionId sid) {
  Phases p;
  std::optional<HistoryInput> last;
  for (const HistoryInput& in : executor.inputs_of(sid)) {
    if (last && in.start < last->start + static_cast<Position>(last->tokens.size())) {
      (last->produce_output ? p.mid_decode : p.mid_prefill) = true;
    }
    last = in;
  }
  return p;
}

struct Outcome {
  std::vector<std::vector<Token>> streams;
  std::vector<std::vector<std::vector<Token>>> bursts;
  std::vector<FinishReason> finish;
  std::vector<GenerationMetrics> metrics;
  std::vector<SessionId> sids;
};

// Records a generation's updates and closes its session at the terminal one,
// from the callback, as a server does: the close runs before the next step,
// so a finished generation's cells never keep others out.
struct Closing {
  std::shared_ptr<Updates> updates = std::make_shared<Updates>();
  std::shared_ptr<std::optional<Session>> session;
  GenerationCallback callback() const {
    return [updates = updates, session = session](const GenerationUpdate& u) {
      (*updates)(u);
      if (u.finish_reason) session->reset();
    };
  }
};

// Parks the engine inside a one-token probe's step, so that every command the
// caller queues next reaches the engine in one drain. Returns the probe's
// updates; the probe's session closes when it ends.
std::shared_ptr<Updates> park_engine(HistoryExecutor& executor, Runner& runner) {
  Closing probe;
  probe.session = std::make_shared<std::optional<Session>>(open_session(runner));
  executor.hold();
  (*probe.session)->generate_async({1}, config(1), probe.callback());
  EXPECT_TRUE(executor.wait_parked());
  return probe.updates;
}

// Starts every job on its own session in one engine drain.
Outcome run_together(HistoryExecutor& executor, Runner& runner, const std::vector<Job>& jobs) {
  Outcome o;
  std::vector<Closing> closing(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    closing[i].session = std::make_shared<std::optional<Session>>(open_session(runner));
    o.sids.push_back((*closing[i].session)->id());
  }
  std::shared_ptr<Updates> probe = park_engine(executor, runner);
  std::vector<GenerationHandle> handles;
  for (size_t i = 0; i < jobs.size(); ++i) {
    handles.push_back((*closing[i].session)
                          ->generate_async(jobs[i].prompt, jobs[i].config, closing[i].callback()));
  }
  executor.release();
  EXPECT_TRUE(probe->wait());
  for (size_t i = 0; i < jobs.size(); ++i) {
    EXPECT_TRUE(closing[i].updates->wait()) << "job " << i;
    handles[i].wait();
    o.streams.push_back(closing[i].updates->tokens());
    o.bursts.push_back(closing[i].updates->bursts());
    o.finish.push_back(closing[i].updates->finish().value_or(FinishReason::kFailed));
    o.metrics.push_back(handles[i].metrics());
    EXPECT_EQ(handles[i].error_message(), "") << "job " << i;
  }
  return o;
}

// After the load: no cell owned by a session; the pool is free or cached.
void expect_pool_settled(const HistoryExecutor& executor, int64_t capacity) {
  EXPECT_TRUE(executor.wait_open_count(0));
  const KvBudget budget = executor.kv_budget();
  EXPECT_EQ(executor.kv_metrics().cells_in_use, 0);
  EXPECT_EQ(budget.reserved, 0);
  EXPECT_EQ(budget.free + budget.cached, capacity);
}

class PreemptionTest : public ::testing::TestWithParam<bool> {
 protected:
  bool prefix_cache() const { return GetParam(); }
};

TEST_P(PreemptionTest, PreemptedGenerationsDeliverTheUnpreemptedStreams) {
  constexpr int32_t kCapacity = 48;
  HistoryExecutor executor(pool_of(kCapacity, prefix_cache()));
  // Prompts go in two tokens a chunk, so a long one takes several steps.
  Runner runner(executor, make_scheduler(/*max_decode_sequences=*/4, /*chunk=*/2), overcommit());
  // Ends of 44, 40, 34 and 32 positions in a pool of 48 cells: three
  // decoders grow while the fourth, admitted last, is still feeding its
  // prompt, then the decoders outgrow the pool.
  const std::vector<Job> jobs = {
      {tokens(4, 100), config(40)},
      {tokens(4, 200), seeded(36, 11)},
      {tokens(4, 300), config(30)},
      {tokens(24, 400), seeded(8, 12)},
  };
  const Outcome o = run_together(executor, runner, jobs);

  Phases seen;
  for (size_t i = 0; i < jobs.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "job " << i);
    EXPECT_EQ(o.finish[i], FinishReason::kNewTokenLimit);
    EXPECT_EQ(o.streams[i], unpreempted(jobs[i]));
    if (jobs[i].config.sampling.temperature == 0.0f) {
      EXPECT_EQ(o.streams[i],
                executor.greedy_continuation(jobs[i].prompt, jobs[i].config.max_new_tokens));
    }
    for (const std::vector<Token>& burst : o.bursts[i]) {
      EXPECT_LE(burst.size(), 1u) << "one token per update, none repeated";
    }
    const Phases p = phases_of(executor, o.sids[i]);
    EXPECT_EQ(p.mid_prefill || p.mid_decode, o.metrics[i].n_preemptions > 0);
    seen.mid_prefill |= p.mid_prefill;
    seen.mid_decode |= p.mid_decode;
  }
  EXPECT_EQ(o.metrics[0].n_preemptions, 0) << "the oldest is never preempted";
  EXPECT_TRUE(seen.mid_prefill) << "a generation was preempted mid-prefill";
  EXPECT_TRUE(seen.mid_decode) << "a generation was preempted mid-decode";

  expect_pool_settled(executor, kCapacity);
  runner.shutdown();
  const EngineMetrics m = runner.metrics();
  EXPECT_EQ(m.steps_failed, 0);
  EXPECT_TRUE(executor.errors().empty());
  EXPECT_GT(m.preemptions, 0);
  EXPECT_GT(m.recomputed_tokens, 0);
  int64_t per_generation = 0;
  for (const GenerationMetrics& g : o.metrics) per_generation += g.n_preemptions;
  EXPECT_EQ(per_generation, m.preemptions);
  EXPECT_EQ(m.generations_waiting, 0);
  if (prefix_cache()) {
    EXPECT_GT(executor.kv_metrics().prefix_hit_tokens, 0);
  }
}

TEST_P(PreemptionTest, APendingTokenFromAnEarlierTurnSurvivesPreemption) {
  constexpr int32_t kCapacity = 48;
  HistoryExecutor executor(pool_of(kCapacity, prefix_cache()));
  Runner runner(executor, make_scheduler(/*max_decode_sequences=*/4, /*chunk=*/2), overcommit());
  // First turn alone: 6 + 3 tokens, the last one pending.
  std::optional<Session> b = open_session(runner);
  auto turn1 = std::make_shared<Updates>();
  generate(*b, tokens(6, 500), seeded(3, 21), turn1);
  ASSERT_TRUE(turn1->wait());
  ASSERT_EQ(b->position(), 8);

  // Three decoders run; when the first has delivered kTrigger tokens its
  // callback starts B's second turn, which is admitted with little room to
  // spare and preempted while its feed (the pending token first) goes in.
  constexpr int kTrigger = 6;
  std::vector<Closing> decoders(3);
  auto ub = std::make_shared<Updates>();
  int delivered = 0;  // engine thread only
  for (Closing& d : decoders) {
    d.session = std::make_shared<std::optional<Session>>(open_session(runner));
  }
  std::shared_ptr<Updates> probe = park_engine(executor, runner);
  for (size_t i = 0; i < decoders.size(); ++i) {
    Closing& d = decoders[i];
    GenerationCallback callback = d.callback();
    if (i == 0) {
      callback = [inner = callback, &delivered, &b, ub](const GenerationUpdate& u) {
        inner(u);
        delivered += static_cast<int>(u.tokens.size());
        if (delivered == kTrigger) b->generate_async(tokens(12, 600), seeded(8, 21), into(ub));
      };
    }
    (*d.session)
        ->generate_async(tokens(2, static_cast<Token>(100 * (i + 1))), config(24), callback);
  }
  executor.release();
  for (Closing& d : decoders) {
    ASSERT_TRUE(d.updates->wait());
    EXPECT_EQ(d.updates->finish(), FinishReason::kNewTokenLimit);
  }
  ASSERT_TRUE(ub->wait());
  EXPECT_EQ(ub->finish(), FinishReason::kNewTokenLimit);
  EXPECT_GT(runner.metrics().preemptions, 0);
  EXPECT_TRUE(phases_of(executor, b->id()).mid_prefill);

  // The same two turns on one session in a pool that never runs short.
  HistoryExecutor big(pool_of(1024, false));
  Runner reference(big, make_scheduler(4, 2));
  Session r = open_session(reference);
  auto r1 = std::make_shared<Updates>();
  generate(r, tokens(6, 500), seeded(3, 21), r1);
  ASSERT_TRUE(r1->wait());
  auto r2 = std::make_shared<Updates>();
  generate(r, tokens(12, 600), seeded(8, 21), r2);
  ASSERT_TRUE(r2->wait());
  EXPECT_EQ(turn1->tokens(), r1->tokens());
  EXPECT_EQ(ub->tokens(), r2->tokens());
  EXPECT_EQ(b->position(), r.position());
  EXPECT_TRUE(probe->wait());
  b.reset();
  expect_pool_settled(executor, kCapacity);
}

// A (oldest) and B run in a pool of 40 until B is preempted; A then finishes
// and its idle session keeps B waiting, preempted, until the test closes it.
struct PreemptedPair {
  explicit PreemptedPair(bool prefix_cache)
      : executor(pool_of(40, prefix_cache)), runner(executor, make_scheduler(4, 4), overcommit()) {
    a = open_session(runner);
    b = open_session(runner);
    std::shared_ptr<Updates> probe = park_engine(executor, runner);
    generate(*a, tokens(4, 100), config(30), ua);
    hb = generate(*b, tokens(8, 200), config(30), ub);
    executor.release();
    EXPECT_TRUE(probe->wait());
    EXPECT_TRUE(ua->wait());
    EXPECT_EQ(ua->finish(), FinishReason::kNewTokenLimit);
  }
  bool b_is_preempted() {
    return runner.metrics().preemptions == 1 && !ub->finish().has_value() &&
           executor.history(b->id()).empty();
  }
  HistoryExecutor executor;
  Runner runner;
  std::optional<Session> a;
  std::optional<Session> b;
  std::shared_ptr<Updates> ua = std::make_shared<Updates>();
  std::shared_ptr<Updates> ub = std::make_shared<Updates>();
  GenerationHandle hb;
};

std::vector<Token> concat(std::vector<Token> a, const std::vector<Token>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST_P(PreemptionTest, CancelWhilePreemptedKeepsTheSessionUsable) {
  PreemptedPair pair(prefix_cache());
  ASSERT_TRUE(pair.b_is_preempted());
  const Position position = pair.b->position();
  EXPECT_GT(position, 8) << "B was decoding";

  auto clone = pair.b->clone_async(4);
  EXPECT_FALSE(settle(clone).has_value()) << "a preempted session is not cloned";

  pair.hb.cancel();
  ASSERT_TRUE(pair.ub->wait());
  EXPECT_EQ(pair.ub->finish(), FinishReason::kCancelled);
  const std::vector<Token> delivered = pair.ub->tokens();
  EXPECT_EQ(delivered,
            pair.executor.greedy_continuation(tokens(8, 200), static_cast<int>(delivered.size())));
  EXPECT_EQ(pair.b->position(), position) << "it still resumes where it stopped";

  // Its next turn feeds the history again, then its pending token, then the
  // new tokens.
  pair.a.reset();
  auto next = std::make_shared<Updates>();
  generate(*pair.b, {7, 8}, config(5), next);
  ASSERT_TRUE(next->wait());
  EXPECT_EQ(next->finish(), FinishReason::kNewTokenLimit);
  EXPECT_EQ(next->tokens(), pair.executor.greedy_continuation(
                                concat(concat(tokens(8, 200), delivered), {7, 8}), 5));
  auto after = pair.b->clone_async(4);
  EXPECT_TRUE(settle(after).has_value()) << "resumed, it can be cloned again";
  pair.b.reset();
  expect_pool_settled(pair.executor, 40);
  pair.runner.shutdown();
  EXPECT_EQ(pair.runner.metrics().steps_failed, 0);
}

TEST_P(PreemptionTest, CloseWhilePreemptedCancelsAndClosesTheSession) {
  PreemptedPair pair(prefix_cache());
  ASSERT_TRUE(pair.b_is_preempted());
  const SessionId b = pair.b->id();
  pair.b.reset();
  ASSERT_TRUE(pair.ub->wait());
  EXPECT_EQ(pair.ub->finish(), FinishReason::kCancelled);
  EXPECT_TRUE(pair.executor.wait_closed(b));
  pair.a.reset();
  expect_pool_settled(pair.executor, 40);
  pair.runner.shutdown();
  const EngineMetrics m = pair.runner.metrics();
  EXPECT_EQ(m.steps_failed, 0);
  EXPECT_EQ(m.generations_waiting, 0);
  EXPECT_EQ(m.finished_cancelled, 1);
}

TEST_P(PreemptionTest, ShutdownWhilePreemptedCancels) {
  PreemptedPair pair(prefix_cache());
  ASSERT_TRUE(pair.b_is_preempted());
  pair.runner.shutdown();
  ASSERT_TRUE(pair.ub->wait());
  EXPECT_EQ(pair.ub->finish(), FinishReason::kCancelled);
  EXPECT_EQ(pair.runner.metrics().generations_waiting, 0);
}

TEST_P(PreemptionTest, TheOldestAloneFailsItsStepAsWithoutAPolicy) {
  HistoryExecutor executor(pool_of(40, prefix_cache()));
  Runner runner(executor, make_scheduler(4, 4), overcommit());
  // An idle session holds 20 cells; idle sessions are never preempted.
  Session idle = open_session(runner);
  auto warm = std::make_shared<Updates>();
  generate(idle, tokens(20, 900), config(1), warm);
  ASSERT_TRUE(warm->wait());
  const std::vector<Token> idle_history = executor.history(idle.id());
  ASSERT_EQ(idle_history.size(), 20u);

  // 4 + 30 fits the pool, not beside the idle session.
  std::optional<Session> a = open_session(runner);
  auto ua = std::make_shared<Updates>();
  generate(*a, tokens(4, 100), config(30), ua);
  ASSERT_TRUE(ua->wait());
  EXPECT_EQ(ua->finish(), FinishReason::kFailed);
  EXPECT_NE(ua->error_message().find("cell pool refused"), std::string::npos)
      << ua->error_message();
  const std::vector<Token> delivered = ua->tokens();
  EXPECT_EQ(delivered,
            executor.greedy_continuation(tokens(4, 100), static_cast<int>(delivered.size())));
  EXPECT_EQ(executor.history(idle.id()), idle_history);
  a.reset();  // the failed session still holds its cells

  auto again = std::make_shared<Updates>();
  generate(idle, {5}, config(2), again);
  ASSERT_TRUE(again->wait());
  EXPECT_EQ(again->finish(), FinishReason::kNewTokenLimit) << again->error_message();
  runner.shutdown();
  EXPECT_EQ(runner.metrics().steps_failed, 1);
  EXPECT_EQ(runner.metrics().preemptions, 0);
}

TEST_P(PreemptionTest, RandomizedLoadLosesAndRepeatsNoToken) {
  constexpr int32_t kCapacity = 72;
  HistoryExecutor executor(pool_of(kCapacity, prefix_cache()));
  Runner runner(executor, make_scheduler(4, 4), overcommit());
  std::mt19937 rng(prefix_cache() ? 5 : 6);
  const auto uniform = [&rng](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  for (int wave = 0; wave < 4; ++wave) {
    std::vector<Job> jobs;
    for (int i = 0; i < 6; ++i) {
      const int32_t n = uniform(8, 30);
      std::vector<Token> prompt = tokens(uniform(1, 24), static_cast<Token>(uniform(0, 1000)));
      jobs.push_back({std::move(prompt), uniform(0, 1) == 0
                                             ? config(n)
                                             : seeded(n, static_cast<uint64_t>(uniform(1, 99)))});
    }
    const Outcome o = run_together(executor, runner, jobs);
    for (size_t i = 0; i < jobs.size(); ++i) {
      EXPECT_EQ(o.finish[i], FinishReason::kNewTokenLimit) << "wave " << wave << " job " << i;
      EXPECT_EQ(o.streams[i], unpreempted(jobs[i])) << "wave " << wave << " job " << i;
    }
  }
  expect_pool_settled(executor, kCapacity);
  runner.shutdown();
  EXPECT_EQ(runner.metrics().steps_failed, 0);
  EXPECT_GT(runner.metrics().preemptions, 0);
}

INSTANTIATE_TEST_SUITE_P(CacheOffAndOn, PreemptionTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("Cache") : std::string("NoCache");
                         });

}  // namespace
}  // namespace cellm::testing
