// Runner under KvPolicy::kReserve over a HistoryExecutor (real CellPool and
// SessionTable) with a small pool: a generation is admitted only when the pool
// can reserve its feed plus max_new_tokens, strictly in FIFO order; one that
// can never fit fails at once; no step ever runs out of cells; and after the
// load every cell is free or cached. Also open_session_async(prefix_of) and
// the published kv_budget().
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

HistoryExecutorOptions small_pool(int32_t capacity, int32_t max_session_tokens = 256,
                                  bool prefix_cache = false) {
  HistoryExecutorOptions o;
  o.max_sessions = 16;
  o.max_session_tokens = max_session_tokens;
  o.max_cells = capacity + 1;  // one cell is the scratch row
  o.prefix_cache = prefix_cache;
  return o;
}

RunnerOptions reserve() {
  return RunnerOptions{KvPolicy::kReserve};
}

// Index of the first and last execute() call that carried `sid`; -1 if none.
int64_t first_batch(const HistoryExecutor& e, SessionId sid) {
  const std::vector<HistoryInput> in = e.inputs_of(sid);
  return in.empty() ? -1 : in.front().batch;
}
int64_t last_batch(const HistoryExecutor& e, SessionId sid) {
  const std::vector<HistoryInput> in = e.inputs_of(sid);
  return in.empty() ? -1 : in.back().batch;
}

// After the load: no cell owned by a session, none reserved; the rest of the
// pool is free or cached.
void expect_pool_settled(const HistoryExecutor& e, int64_t capacity) {
  const KvMetrics kv = e.kv_metrics();
  const KvBudget budget = e.kv_budget();
  EXPECT_EQ(kv.cells_in_use, 0);
  EXPECT_EQ(kv.cells_reserved, 0);
  EXPECT_EQ(budget.capacity, capacity);
  EXPECT_EQ(budget.free + budget.cached, capacity);
}

TEST(RunnerAdmissionTest, PolicyNamesAreStable) {
  EXPECT_STREQ(to_string(KvPolicy::kNone), "none");
  EXPECT_STREQ(to_string(KvPolicy::kReserve), "reserve");
}

TEST(RunnerAdmissionTest, TheBudgetIsPublishedAfterInitialization) {
  HistoryExecutor executor(small_pool(40, 32));
  Runner runner(executor, make_scheduler(), reserve());
  Session s = open_session(runner);  // answered after initialize()
  const KvBudget budget = runner.kv_budget();
  EXPECT_EQ(budget.capacity, 40);
  EXPECT_EQ(budget.free, 40);
  EXPECT_EQ(budget.max_context, 32);
}

TEST(RunnerAdmissionTest, AGenerationThatCanNeverFitFailsAtOnceNamingTheSizes) {
  HistoryExecutor executor(small_pool(40, 32));
  Runner runner(executor, make_scheduler(), reserve());
  Session s = open_session(runner);

  // 20 + 21 = 41 positions: past the session's 32 positions.
  auto too_long = std::make_shared<Updates>();
  generate(s, tokens(20), config(21), too_long);
  ASSERT_TRUE(too_long->wait());
  EXPECT_EQ(too_long->finish(), FinishReason::kFailed);
  EXPECT_NE(too_long->error_message().find("41 positions"), std::string::npos)
      << too_long->error_message();
  EXPECT_NE(too_long->error_message().find("32 positions"), std::string::npos);
  EXPECT_NE(too_long->error_message().find("40 cells"), std::string::npos);
  EXPECT_TRUE(too_long->tokens().empty());

  // Exactly the session's positions fits, and runs.
  auto fits = std::make_shared<Updates>();
  generate(s, tokens(20), config(12), fits);
  ASSERT_TRUE(fits->wait());
  EXPECT_EQ(fits->finish(), FinishReason::kNewTokenLimit) << fits->error_message();
  EXPECT_EQ(fits->tokens(), executor.greedy_continuation(tokens(20), 12));

  // The pool is the bound when it is smaller than a session.
  HistoryExecutor tiny(small_pool(24, 256));
  Runner tiny_runner(tiny, make_scheduler(), reserve());
  Session t = open_session(tiny_runner);
  auto past_pool = std::make_shared<Updates>();
  generate(t, tokens(10), config(15), past_pool);
  ASSERT_TRUE(past_pool->wait());
  EXPECT_EQ(past_pool->finish(), FinishReason::kFailed);
  EXPECT_NE(past_pool->error_message().find("25 positions"), std::string::npos)
      << past_pool->error_message();
  EXPECT_NE(past_pool->error_message().find("24 cells"), std::string::npos);
  EXPECT_TRUE(tiny.inputs().empty()) << "nothing ran";

  tiny_runner.shutdown();
  runner.shutdown();
  EXPECT_EQ(runner.metrics().steps_failed, 0);
  EXPECT_EQ(runner.metrics().finished_failed, 1);
}

TEST(RunnerAdmissionTest, WaitingGenerationsAreAdmittedInFifoOrder) {
  HistoryExecutor executor(small_pool(40));
  Runner runner(executor, make_scheduler(), reserve());
  std::optional<Session> a = open_session(runner);
  Session b = open_session(runner);
  Session c = open_session(runner);
  const SessionId a_sid = a->id();

  // A reserves 10 + 20 of 40 cells. B needs 15 and waits; C needs only 5,
  // which would fit, but must not pass B.
  auto ua = std::make_shared<Updates>();
  auto ub = std::make_shared<Updates>();
  auto uc = std::make_shared<Updates>();
  // A's first step waits until B and C have started, so they queue while A runs.
  executor.hold();
  generate(*a, tokens(10), config(20), ua);
  generate(b, tokens(5, 200), config(10), ub);
  generate(c, tokens(2, 300), config(3), uc);
  executor.release();
  ASSERT_TRUE(ua->wait());
  EXPECT_EQ(ua->finish(), FinishReason::kNewTokenLimit);
  EXPECT_EQ(first_batch(executor, b.id()), -1) << "B waits behind A's cells";
  EXPECT_EQ(first_batch(executor, c.id()), -1) << "C waits behind B";

  // A's idle session still holds 29 cells; closing it lets both in, B first.
  a.reset();
  ASSERT_TRUE(ub->wait());
  ASSERT_TRUE(uc->wait());
  EXPECT_EQ(ub->finish(), FinishReason::kNewTokenLimit);
  EXPECT_EQ(uc->finish(), FinishReason::kNewTokenLimit);
  EXPECT_EQ(ub->tokens(), executor.greedy_continuation(tokens(5, 200), 10));
  EXPECT_EQ(uc->tokens(), executor.greedy_continuation(tokens(2, 300), 3));
  EXPECT_GT(first_batch(executor, b.id()), last_batch(executor, a_sid));
  EXPECT_GE(first_batch(executor, c.id()), first_batch(executor, b.id()));

  runner.shutdown();
  const EngineMetrics m = runner.metrics();
  EXPECT_EQ(m.steps_failed, 0);
  EXPECT_EQ(m.admission_waits, 2);
  EXPECT_GT(m.admission_wait_us_sum, 0);
  EXPECT_EQ(m.generations_waiting, 0);
  EXPECT_EQ(m.generations_completed, 3);
}

TEST(RunnerAdmissionTest, CancelCloseAndShutdownEndWaitingGenerations) {
  HistoryExecutor executor(small_pool(40));
  Runner runner(executor, make_scheduler(), reserve());
  std::optional<Session> holder = open_session(runner);
  Session b = open_session(runner);
  std::optional<Session> c = open_session(runner);
  const SessionId c_sid = c->id();

  auto uh = std::make_shared<Updates>();
  generate(*holder, tokens(10), config(25), uh);  // 35 of 40 cells
  auto ub = std::make_shared<Updates>();
  auto uc = std::make_shared<Updates>();
  GenerationHandle hb = generate(b, tokens(10, 200), config(10), ub);
  generate(*c, tokens(10, 300), config(10), uc);
  ASSERT_TRUE(uh->wait());

  hb.cancel();
  ASSERT_TRUE(ub->wait());
  EXPECT_EQ(ub->finish(), FinishReason::kCancelled);
  c.reset();
  ASSERT_TRUE(uc->wait());
  EXPECT_EQ(uc->finish(), FinishReason::kCancelled);
  EXPECT_TRUE(executor.inputs_of(b.id()).empty());
  EXPECT_TRUE(executor.inputs_of(c_sid).empty());

  // The queue is empty again: a generation that fits beside the idle holder
  // (34 cells) runs at once.
  auto small = std::make_shared<Updates>();
  generate(b, tokens(2, 400), config(3), small);
  ASSERT_TRUE(small->wait());
  EXPECT_EQ(small->finish(), FinishReason::kNewTokenLimit);

  // One that does not fit waits until shutdown, which cancels it.
  auto stuck = std::make_shared<Updates>();
  generate(b, tokens(10, 500), config(10), stuck);
  EXPECT_FALSE(stuck->finish().has_value());
  runner.shutdown();
  ASSERT_TRUE(stuck->wait());
  EXPECT_EQ(stuck->finish(), FinishReason::kCancelled);
  EXPECT_EQ(runner.metrics().steps_failed, 0);
  EXPECT_EQ(runner.metrics().generations_waiting, 0);
}

TEST(RunnerAdmissionTest, WaitingSessionsGiveTheirCellsBackWhenNothingElseCanRun) {
  HistoryExecutor executor(small_pool(40, 64, /*prefix_cache=*/true));
  Runner runner(executor, make_scheduler(), reserve());
  const std::vector<Token> p1 = tokens(15, 100);
  const std::vector<Token> p2 = tokens(15, 300);
  for (const std::vector<Token>& prompt : {p1, p2}) {
    Session s = open_session(runner);
    auto updates = std::make_shared<Updates>();
    generate(s, prompt, config(1), updates);
    ASSERT_TRUE(updates->wait());
  }  // each closed: 15 cached cells
  ASSERT_TRUE(executor.wait_open_count(0));

  // Two sessions attach those 30 cells; 10 stay free.
  std::vector<Token> w1_prompt = p1;
  w1_prompt.push_back(7);
  std::vector<Token> w2_prompt = p2;
  w2_prompt.push_back(9);
  auto f1 = runner.open_session_async(w1_prompt);
  auto f2 = runner.open_session_async(w2_prompt);
  std::optional<Session> w1 = settle(f1);
  std::optional<Session> w2 = settle(f2);
  ASSERT_TRUE(w1 && w2);
  ASSERT_EQ(w1->position(), 15);
  ASSERT_EQ(w2->position(), 15);

  // H needs 25 cells and heads the queue; W1 and W2 wait behind it. Nothing
  // runs, so W2 (the newest waiting) gives its cells back and H fits.
  std::optional<Session> h = open_session(runner);
  auto uh = std::make_shared<Updates>();
  auto u1 = std::make_shared<Updates>();
  auto u2 = std::make_shared<Updates>();
  generate(*h, tokens(20, 500), config(5), uh);
  generate(*w1, {7}, config(4), u1);
  generate(*w2, {9}, config(4), u2);
  ASSERT_TRUE(uh->wait());
  EXPECT_EQ(uh->tokens(), executor.greedy_continuation(tokens(20, 500), 5));
  h.reset();  // its idle cells would keep W1 out
  ASSERT_TRUE(u1->wait());
  ASSERT_TRUE(u2->wait());
  EXPECT_EQ(u1->tokens(), executor.greedy_continuation(w1_prompt, 4));
  EXPECT_EQ(u2->tokens(), executor.greedy_continuation(w2_prompt, 4));
  // The newest waiting session when H was tried gave its cells back (W2, or
  // W1 if H was tried before W2 started); H's step evicted most of them.
  const Position start1 = executor.inputs_of(w1->id()).front().start;
  const Position start2 = executor.inputs_of(w2->id()).front().start;
  EXPECT_EQ(std::min(start1, start2) < 15, std::max(start1, start2) == 15)
      << "exactly one kept its cells: " << start1 << ", " << start2;

  w1.reset();
  w2.reset();
  ASSERT_TRUE(executor.wait_open_count(0));
  runner.shutdown();
  const EngineMetrics m = runner.metrics();
  EXPECT_EQ(m.steps_failed, 0);
  EXPECT_EQ(m.recomputed_tokens, 15 - std::min(start1, start2));
  EXPECT_GT(m.recomputed_tokens, 0);
  expect_pool_settled(executor, 40);
}

TEST(RunnerAdmissionTest, AClonedSessionCarriesItsHistory) {
  // The clone's history is the source's prefix: once released, the clone
  // recomputes exactly it (the cache is off), which the oracle checks.
  HistoryExecutor executor(small_pool(40, 64, /*prefix_cache=*/false));
  Runner runner(executor, make_scheduler(), reserve());
  std::optional<Session> source = open_session(runner);
  auto first = std::make_shared<Updates>();
  generate(*source, tokens(12, 100), config(3), first);
  ASSERT_TRUE(first->wait());
  auto future = source->clone_async(10);
  std::optional<Session> child = settle(future);
  ASSERT_TRUE(child.has_value());
  source.reset();  // the child alone holds the 10 cells

  // A generation of 35 cells heads the queue; the waiting child gives its
  // cells back so it fits.
  std::optional<Session> big = open_session(runner);
  auto ub = std::make_shared<Updates>();
  auto uc = std::make_shared<Updates>();
  generate(*big, tokens(25, 700), config(10), ub);
  generate(*child, {42}, config(3), uc);
  ASSERT_TRUE(ub->wait());
  EXPECT_EQ(ub->tokens(), executor.greedy_continuation(tokens(25, 700), 10));
  big.reset();
  ASSERT_TRUE(uc->wait());
  std::vector<Token> child_prompt = tokens(10, 100);
  child_prompt.push_back(42);
  EXPECT_EQ(uc->tokens(), executor.greedy_continuation(child_prompt, 3));
  EXPECT_EQ(executor.inputs_of(child->id()).front().start, 0);
  runner.shutdown();
  EXPECT_EQ(runner.metrics().steps_failed, 0);
  EXPECT_EQ(runner.metrics().recomputed_tokens, 10);
}

TEST(RunnerAdmissionTest, AnExecutorThatDoesNotKnowItsPoolKeepsThePolicyOff) {
  FakeExecutor executor;
  Runner runner(executor, make_scheduler(), reserve());
  Session s = open_session(runner);
  EXPECT_EQ(runner.kv_budget().capacity, 0);
  auto updates = std::make_shared<Updates>();
  generate(s, tokens(3), config(1000), updates);
  ASSERT_TRUE(updates->wait());
  EXPECT_EQ(updates->finish(), FinishReason::kNewTokenLimit);
}

TEST(RunnerAdmissionTest, OpenFromAPrefixAttachesAllButTheLastToken) {
  for (const KvPolicy policy : {KvPolicy::kNone, KvPolicy::kReserve}) {
    SCOPED_TRACE(to_string(policy));
    HistoryExecutor executor(small_pool(200, 64, /*prefix_cache=*/true));
    Runner runner(executor, make_scheduler(), RunnerOptions{policy});
    const std::vector<Token> prompt = tokens(12, 7);
    {
      Session first = open_session(runner);
      auto updates = std::make_shared<Updates>();
      generate(first, prompt, config(5), updates);
      ASSERT_TRUE(updates->wait());
    }  // closed: its committed 16 tokens go to the cache
    ASSERT_TRUE(executor.wait_open_count(0));

    // Nothing cached for another prompt: position 0.
    auto cold = runner.open_session_async(tokens(6, 40));
    std::optional<Session> fresh = settle(cold);
    ASSERT_TRUE(fresh.has_value());
    EXPECT_EQ(fresh->position(), 0);

    // The whole prompt is cached, but its last token is fed again.
    auto warm = runner.open_session_async(prompt);
    std::optional<Session> hit = settle(warm);
    ASSERT_TRUE(hit.has_value());
    EXPECT_EQ(hit->position(), 11);
    auto updates = std::make_shared<Updates>();
    generate(*hit, {prompt.back()}, config(8), updates);
    ASSERT_TRUE(updates->wait());
    EXPECT_EQ(updates->tokens(), executor.greedy_continuation(prompt, 8));
    const std::vector<HistoryInput> inputs = executor.inputs_of(hit->id());
    ASSERT_FALSE(inputs.empty());
    EXPECT_EQ(inputs.front().start, 11);
    EXPECT_EQ(executor.kv_metrics().prefix_hit_tokens, 11);

    // A one-token prefix attaches nothing (its token must be fed).
    auto single = runner.open_session_async({prompt.front()});
    std::optional<Session> one = settle(single);
    ASSERT_TRUE(one.has_value());
    EXPECT_EQ(one->position(), 0);
  }
}

// One client of the randomized load: a conversation whose every turn opens a
// session from the whole prompt (attaching what the cache holds) and closes
// it as soon as the turn ends, so the next turn's prompt is the previous one
// plus its reply plus new tokens.
struct Client {
  std::vector<Token> conversation;
  std::optional<Session> session;
  std::vector<Token> prompt;
  GenConfig config;
  std::shared_ptr<Updates> updates;
  GenerationHandle handle;
  int cancel_after_polls = -1;  // -1: never
  bool fits = false;
};

class RandomizedReserveLoad : public ::testing::TestWithParam<bool> {};

TEST_P(RandomizedReserveLoad, NoStepFailsAndThePoolSettles) {
  constexpr int32_t kCapacity = 96;
  constexpr int32_t kContext = 64;
  constexpr int kClients = 6;
  constexpr int kGenerations = 90;
  const bool prefix_cache = GetParam();
  HistoryExecutor executor(small_pool(kCapacity, kContext, prefix_cache));
  Runner runner(executor, make_scheduler(/*max_decode_sequences=*/4, /*chunk=*/8), reserve());
  std::mt19937 rng(prefix_cache ? 20261206 : 7);
  const auto uniform = [&rng](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };

  std::vector<Client> clients(kClients);
  int started = 0;
  int refused = 0;
  int completed = 0;
  int greedy_checked = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    bool busy = false;
    for (Client& c : clients) {
      if (c.session && !c.updates->finish()) {
        busy = true;
        if (c.cancel_after_polls == 0) c.handle.cancel();
        if (c.cancel_after_polls >= 0) --c.cancel_after_polls;
        continue;
      }
      if (c.session) {  // its turn ended
        const FinishReason reason = *c.updates->finish();
        const std::vector<Token> reply = c.updates->tokens();
        if (reason == FinishReason::kFailed) {
          EXPECT_NE(c.updates->error_message().find("generation needs"), std::string::npos)
              << c.updates->error_message();
          EXPECT_FALSE(c.fits) << "a generation that fits failed";
          ++refused;
        } else {
          EXPECT_TRUE(c.fits || reason == FinishReason::kCancelled)
              << "a generation that cannot fit ran";
          EXPECT_LE(static_cast<int>(reply.size()), c.config.max_new_tokens);
        }
        if (reason == FinishReason::kStopToken || reason == FinishReason::kNewTokenLimit) {
          ++completed;
          if (c.config.sampling.temperature == 0.0f) {
            EXPECT_EQ(reply,
                      executor.greedy_continuation(c.prompt, static_cast<int>(reply.size())));
            ++greedy_checked;
          }
          c.conversation = c.prompt;
          c.conversation.insert(c.conversation.end(), reply.begin(), reply.end());
        } else {
          c.conversation.clear();
        }
        c.session.reset();  // closed at once: idle sessions would hold cells
      }
      if (started == kGenerations) continue;
      busy = true;
      ++started;
      if (c.conversation.size() > 40 || uniform(0, 4) == 0) c.conversation.clear();
      c.prompt = c.conversation;
      const std::vector<Token> fresh = tokens(uniform(1, 16), static_cast<Token>(uniform(0, 1000)));
      c.prompt.insert(c.prompt.end(), fresh.begin(), fresh.end());
      // Every 15th asks for the whole context on top of its prompt: never fits.
      c.config = config(started % 15 == 0 ? kContext : uniform(1, 24));
      if (uniform(0, 2) == 0) c.config.stop_tokens = {static_cast<Token>(uniform(0, 63))};
      if (uniform(0, 1) == 0) {
        c.config.sampling.temperature = 0.8f;
        c.config.seed = static_cast<uint64_t>(uniform(1, 1 << 20));
      }
      c.cancel_after_polls = uniform(0, 6) == 0 ? uniform(0, 5) : -1;
      c.fits = static_cast<int64_t>(c.prompt.size()) + c.config.max_new_tokens <= kContext;
      auto opened = runner.open_session_async(c.prompt);
      c.session = settle(opened);
      ASSERT_TRUE(c.session.has_value());
      const std::vector<Token> delta(c.prompt.begin() + c.session->position(), c.prompt.end());
      c.updates = std::make_shared<Updates>();
      c.handle = generate(*c.session, delta, c.config, c.updates);
    }
    if (!busy) break;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the load did not finish";
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(executor.wait_open_count(0));
  runner.shutdown();

  const EngineMetrics m = runner.metrics();
  EXPECT_EQ(m.steps_failed, 0);
  EXPECT_TRUE(executor.errors().empty()) << executor.errors().front();
  EXPECT_EQ(m.generations_started, kGenerations);
  EXPECT_EQ(m.generations_completed, kGenerations);
  EXPECT_EQ(m.finished_failed, refused);
  EXPECT_GT(refused, 0) << "the load had generations that never fit";
  EXPECT_GT(completed, kGenerations / 2);
  EXPECT_GT(greedy_checked, 0);
  EXPECT_GT(m.admission_waits, 0) << "the pool was short at times";
  EXPECT_EQ(m.generations_waiting, 0);
  expect_pool_settled(executor, kCapacity);
  if (prefix_cache) {
    EXPECT_GT(executor.kv_metrics().prefix_hit_tokens, 0);
    EXPECT_GT(executor.kv_metrics().cells_cached, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(CacheOffAndOn, RandomizedReserveLoad, ::testing::Bool());

}  // namespace
}  // namespace cellm::testing
