// models/kjv-small on the CPU executor under KvPolicy::kOvercommit with a pool
// too small for its generations: they are preempted and resumed (their KV
// recomputed, or attached from the prefix cache), and each delivered stream
// equals the stream of an unpreempted run with the same seeds, token by token,
// up to the first step whose top-1 minus top-2 logprob margin in the
// unpreempted run is within twice the logit tolerance (a near-tie the
// recomputation's rounding may flip; the comparison ends there, as in
// kjv_parity_test). Before that step the chosen tokens' logprobs agree within
// the tolerance too.
//
// The pool is made small with a reservation: the executor keeps its capacity
// rule (every session may fill max_session_tokens), and a ballast session
// that never runs reserves all but kRoom cells, which the pool then refuses
// to every other sequence, as a small pool would. Run with the prefix cache
// off (a resume recomputes its tokens) and on (it attaches the cells written
// before it was preempted).
//
// With logits processors (penalties, a mask) the same holds: a resume feeds
// the delivered tokens back as input, which the processor never sees, so it
// is told each delivered token exactly once, and the streams agree up to the
// first near-tie of the adjusted row.
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cellm/cpu_executor.h"
#include "cellm/decode_first_scheduler.h"
#include "cellm/logits_processor.h"
#include "cellm/model_weights.h"
#include "cellm/runner.h"

namespace cellm {
namespace {

// Logit magnitudes of kjv-small stay below ~20 (kjv_parity_test), so its
// relative tolerance of 1e-4 bounds logits within 2e-3.
constexpr double kTolerance = 2e-3;
constexpr int32_t kSessions = 6;
constexpr int32_t kSessionTokens = 80;
constexpr int64_t kRoom = 96;  // cells the generations may use together

// Forwards every verb to the CPU executor; holds execute() until open(), so
// every generation starts in the same engine drain; with a ballast, reserves
// all but kRoom cells for a session that never runs.
class SmallPoolExecutor final : public Executor {
 public:
  SmallPoolExecutor(Executor& inner, bool ballast) : inner_(inner), ballast_(ballast) {}
  void open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  Status initialize() override {
    CELLM_RETURN_IF_ERROR(inner_.initialize());
    if (!ballast_) return Status::Ok();
    const std::optional<SessionId> sid = inner_.open_session();
    if (!sid) return Internal("no session for the ballast");
    const KvBudget budget = inner_.kv_budget();
    if (!inner_.reserve(*sid, budget.capacity - kRoom)) return Internal("ballast refused");
    return Status::Ok();
  }
  size_t preferred_batch_tokens() const override { return inner_.preferred_batch_tokens(); }
  std::optional<SessionId> open_session() override { return inner_.open_session(); }
  void close_session(SessionId id) override { inner_.close_session(id); }
  std::optional<SessionId> clone(SessionId source, Position upto) override {
    return inner_.clone(source, upto);
  }
  void set_sampling(SessionId id, const SamplingParams& params,
                    std::optional<uint64_t> seed) override {
    inner_.set_sampling(id, params, seed);
  }
  bool set_logits_processor(SessionId id, std::shared_ptr<LogitsProcessor> processor) override {
    return inner_.set_logits_processor(id, std::move(processor));
  }
  Status execute(const BatchInput& batch, BatchOutput& out) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return open_; });
    }
    return inner_.execute(batch, out);
  }
  KvMetrics kv_metrics() const override { return inner_.kv_metrics(); }
  KvBudget kv_budget() const override { return inner_.kv_budget(); }
  Position attach_prefix(SessionId id, std::span<const Token> tokens) override {
    return inner_.attach_prefix(id, tokens);
  }
  bool release_cells(SessionId id) override { return inner_.release_cells(id); }
  bool reserve(SessionId id, int64_t cells) override { return inner_.reserve(id, cells); }

 private:
  Executor& inner_;
  const bool ballast_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;  // guarded by mu_
};

struct Job {
  std::vector<Token> prompt;
  GenConfig config;
};

struct Stream {
  std::vector<Token> tokens;
  std::vector<TokenLogprobs> logprobs;
  FinishReason finish = FinishReason::kFailed;
  std::string error;
  int64_t preemptions = 0;
};

struct Outcome {
  std::vector<Stream> streams;
  EngineMetrics engine;
  KvMetrics kv;
};

// Runs every job on its own session of one runner, all started together; each
// session closes from its terminal callback, as a server's does.
Outcome run(const std::shared_ptr<const ModelWeights>& weights, const std::vector<Job>& jobs,
            bool small_pool, bool prefix_cache) {
  Outcome o;
  ExecutorLimits limits;
  limits.max_sessions = kSessions;
  limits.max_session_tokens = kSessionTokens;
  limits.step_width = 8;
  limits.prefix_cache = prefix_cache;
  CpuExecutorOptions options;
  options.initial_cells = 64;
  options.num_threads = 2;
  Result<std::unique_ptr<CpuExecutor>> cpu = CpuExecutor::create(weights, limits, options);
  EXPECT_TRUE(cpu.ok()) << cpu.status().to_string();
  if (!cpu.ok()) return o;
  Result<std::unique_ptr<DecodeFirstScheduler>> scheduler = DecodeFirstScheduler::create(8, 4, 4);
  EXPECT_TRUE(scheduler.ok());
  if (!scheduler.ok()) return o;
  SmallPoolExecutor executor(**cpu, small_pool);
  Runner runner(executor, std::move(*scheduler), RunnerOptions{KvPolicy::kOvercommit});
  EXPECT_TRUE(runner.initialize_status().ok()) << runner.initialize_status().to_string();

  o.streams.resize(jobs.size());
  std::vector<std::shared_ptr<std::optional<Session>>> sessions;
  std::vector<GenerationHandle> handles;
  for (size_t i = 0; i < jobs.size(); ++i) {
    sessions.push_back(std::make_shared<std::optional<Session>>(runner.open_session_async().get()));
    EXPECT_TRUE(sessions.back()->has_value()) << "session " << i;
    if (!sessions.back()->has_value()) return o;
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    Stream& stream = o.streams[i];
    std::shared_ptr<std::optional<Session>> session = sessions[i];
    // Callbacks run on the engine thread only; the test reads after wait().
    handles.push_back((*session)->generate_async(
        jobs[i].prompt, jobs[i].config, [&stream, session](const GenerationUpdate& u) {
          stream.tokens.insert(stream.tokens.end(), u.tokens.begin(), u.tokens.end());
          stream.logprobs.insert(stream.logprobs.end(), u.logprobs.begin(), u.logprobs.end());
          if (u.finish_reason) session->reset();
        }));
  }
  executor.open();
  for (size_t i = 0; i < jobs.size(); ++i) {
    handles[i].wait();
    o.streams[i].finish = handles[i].finish_reason().value_or(FinishReason::kFailed);
    o.streams[i].error = handles[i].error_message();
    o.streams[i].preemptions = handles[i].metrics().n_preemptions;
  }
  runner.shutdown();
  o.engine = runner.metrics();
  o.kv = executor.kv_metrics();
  return o;
}

GenConfig gen_config(int32_t max_new_tokens, float temperature, uint64_t seed) {
  GenConfig c;
  c.max_new_tokens = max_new_tokens;
  c.sampling.temperature = temperature;
  c.sampling.num_logprobs = 2;  // the top two, for the margin
  c.seed = seed;
  return c;
}

class PreemptionParityTest : public ::testing::TestWithParam<bool> {
 protected:
  static void SetUpTestSuite() {
    Result<ModelWeights> w =
        ModelWeights::load(std::string(CELLM_SOURCE_DIR) + "/models/kjv-small");
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    weights_ = new std::shared_ptr<const ModelWeights>(
        std::make_shared<const ModelWeights>(std::move(w).value()));
    std::ifstream in(std::string(CELLM_SOURCE_DIR) + "/tests/fixtures/kjv_reference.json");
    const nlohmann::json j = nlohmann::json::parse(in);
    prompts_ = new std::vector<std::vector<Token>>();
    for (const nlohmann::json& g : j.at("greedy")) {
      prompts_->push_back(g.at("prompt_ids").get<std::vector<Token>>());
    }
    for (const nlohmann::json& s : j.at("snippets")) {
      std::vector<Token> ids = s.at("ids").get<std::vector<Token>>();
      ids.resize(std::min<size_t>(ids.size(), 24));
      prompts_->push_back(std::move(ids));
    }
  }
  static void TearDownTestSuite() {
    delete weights_;
    delete prompts_;
  }
  void SetUp() override { ASSERT_NE(weights_, nullptr); }

  static inline std::shared_ptr<const ModelWeights>* weights_ = nullptr;
  static inline std::vector<std::vector<Token>>* prompts_ = nullptr;
};

TEST_P(PreemptionParityTest, PreemptedGenerationsMatchAnUnpreemptedRun) {
  const bool prefix_cache = GetParam();
  const std::vector<std::vector<Token>>& p = *prompts_;
  ASSERT_GE(p.size(), 4u);
  // Ends of 52, 64, 55 and 56 positions: about two fit in kRoom at once.
  const std::vector<Job> jobs = {
      {p[0], gen_config(48, 0.0f, 1)},
      {p[3], gen_config(40, 0.0f, 2)},
      {p[1], gen_config(48, 0.8f, 20261206)},
      {p[2], gen_config(56 - static_cast<int32_t>(p[2].size()), 0.0f, 3)},
  };
  const Outcome reference = run(*weights_, jobs, /*small_pool=*/false, prefix_cache);
  const Outcome preempted = run(*weights_, jobs, /*small_pool=*/true, prefix_cache);
  ASSERT_EQ(reference.streams.size(), jobs.size());
  ASSERT_EQ(preempted.streams.size(), jobs.size());
  EXPECT_EQ(reference.engine.preemptions, 0);
  EXPECT_GT(preempted.engine.preemptions, 0) << "the pool was too small for all of them";
  EXPECT_EQ(preempted.engine.steps_failed, 0);

  int compared = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "job " << i);
    const Stream& want = reference.streams[i];
    const Stream& got = preempted.streams[i];
    EXPECT_EQ(want.finish, FinishReason::kNewTokenLimit) << want.error;
    EXPECT_EQ(got.finish, FinishReason::kNewTokenLimit) << got.error;
    ASSERT_EQ(want.tokens.size(), static_cast<size_t>(jobs[i].config.max_new_tokens));
    ASSERT_EQ(got.tokens.size(), want.tokens.size()) << "no token lost or repeated";
    ASSERT_EQ(want.logprobs.size(), want.tokens.size());
    ASSERT_EQ(got.logprobs.size(), got.tokens.size());
    for (size_t t = 0; t < want.tokens.size(); ++t) {
      const std::vector<std::pair<Token, float>>& top = want.logprobs[t].top;
      ASSERT_EQ(top.size(), 2u);
      if (double{top[0].second} - double{top[1].second} <= 2 * kTolerance) break;  // a near-tie
      ASSERT_EQ(got.tokens[t], want.tokens[t]) << "step " << t;
      EXPECT_NEAR(got.logprobs[t].logprob, want.logprobs[t].logprob, 2 * kTolerance)
          << "step " << t;
      ++compared;
    }
  }
  int preempted_generations = 0;
  for (const Stream& s : preempted.streams) preempted_generations += s.preemptions > 0 ? 1 : 0;
  EXPECT_GE(preempted_generations, 1);
  EXPECT_GT(compared, 3 * 40) << "most steps are compared";
  EXPECT_EQ(preempted.kv.cells_in_use, 0);
  if (prefix_cache) {
    // The ballast's cells are free but reserved, so nothing is evicted: every
    // resume attaches the cells written before its preemption.
    EXPECT_GT(preempted.kv.prefix_hit_tokens, 0) << "resumes attached cached cells";
  } else {
    EXPECT_GT(preempted.engine.recomputed_tokens, 0) << "resumes recomputed their tokens";
  }
}

// Wraps a processor and records what it gave and was told, for the test to read
// after the generation ended (the engine thread calls it).
class RecordingProcessor final : public LogitsProcessor {
 public:
  explicit RecordingProcessor(std::unique_ptr<LogitsProcessor> inner) : inner_(std::move(inner)) {}
  void prepare(LogitAdjustments& out) override {
    inner_->prepare(out);
    prepared.push_back(out);
  }
  void accept(Token token) override {
    inner_->accept(token);
    accepted.push_back(token);
  }
  std::vector<LogitAdjustments> prepared;
  std::vector<Token> accepted;

 private:
  std::unique_ptr<LogitsProcessor> inner_;
};

// Forbids `banned` (a mask over the vocabulary).
class BanProcessor final : public LogitsProcessor {
 public:
  BanProcessor(const std::vector<Token>& banned, int64_t vocab)
      : mask_(static_cast<size_t>((vocab + 63) / 64), ~uint64_t{0}) {
    for (Token t : banned) mask_[static_cast<size_t>(t) / 64] &= ~(uint64_t{1} << (t % 64));
  }
  void prepare(LogitAdjustments& out) override {
    out.clear();
    out.allowed = mask_;
  }
  void accept(Token) override {}

 private:
  std::vector<uint64_t> mask_;
};

// The top-1 minus top-2 margin of the adjusted row at one step, from the raw
// row's top logprobs and the step's adjustments; nullopt when the two best
// adjusted tokens may lie outside the recorded top (then the step counts as a
// near-tie). REQUIRES: additive edits only (scale 1) with bias <= 0, so no
// token outside the recorded top gains over its raw logprob.
std::optional<double> adjusted_margin(const TokenLogprobs& raw, const LogitAdjustments& adj) {
  std::vector<double> values;
  for (const auto& [token, logprob] : raw.top) {
    double v = logprob;
    for (const LogitEdit& e : adj.edits) {
      if (e.token == token) v += double{e.bias};
    }
    const auto t = static_cast<size_t>(token);
    if (!adj.allowed.empty() && ((adj.allowed[t / 64] >> (t % 64)) & 1u) == 0) {
      v = -std::numeric_limits<double>::infinity();
    }
    values.push_back(v);
  }
  std::sort(values.begin(), values.end(), std::greater<>());
  if (values.size() < 2 || raw.top.empty()) return std::nullopt;
  if (!(values[1] > double{raw.top.back().second})) return std::nullopt;
  return values[0] - values[1];
}

TEST_P(PreemptionParityTest, PreemptedGenerationsWithProcessorsMatchAnUnpreemptedRun) {
  const bool prefix_cache = GetParam();
  const std::vector<std::vector<Token>>& p = *prompts_;
  ASSERT_GE(p.size(), 4u);
  const auto vocab = static_cast<int32_t>((*weights_)->config().vocab_size());
  // Fresh processors for each run: a processor follows one generation.
  auto make_jobs = [&](std::vector<std::shared_ptr<RecordingProcessor>>& recorders) {
    std::vector<Job> jobs = {
        {p[0], gen_config(48, 0.0f, 1)},
        {p[3], gen_config(40, 0.0f, 2)},
        {p[1], gen_config(48, 0.8f, 20261206)},
        {p[2], gen_config(56 - static_cast<int32_t>(p[2].size()), 0.0f, 3)},
    };
    PenaltyParams penalties[4];
    penalties[0].frequency_penalty = 0.7f;
    penalties[0].presence_penalty = 0.5f;
    penalties[1].logit_bias = {{p[3][0], -3.0f}, {p[3][1], -2.0f}};
    penalties[2].frequency_penalty = 1.0f;
    penalties[3].presence_penalty = 1.2f;
    recorders.clear();
    for (size_t i = 0; i < jobs.size(); ++i) {
      EXPECT_TRUE(validate_penalties(penalties[i], vocab).ok());
      std::vector<std::unique_ptr<LogitsProcessor>> members;
      members.push_back(make_penalty_processor(penalties[i], jobs[i].prompt));
      if (i == 1 || i == 2) {
        members.push_back(std::make_unique<BanProcessor>(
            std::vector<Token>{jobs[i].prompt.back(), jobs[i].prompt.front()}, vocab));
      }
      recorders.push_back(
          std::make_shared<RecordingProcessor>(chain_logits_processors(std::move(members))));
      jobs[i].config.processor = recorders.back();
      jobs[i].config.sampling.num_logprobs = kMaxLogprobs;  // the top for adjusted_margin
    }
    return jobs;
  };
  std::vector<std::shared_ptr<RecordingProcessor>> want_rec, got_rec;
  const std::vector<Job> want_jobs = make_jobs(want_rec);
  const Outcome reference = run(*weights_, want_jobs, /*small_pool=*/false, prefix_cache);
  const std::vector<Job> got_jobs = make_jobs(got_rec);
  const Outcome preempted = run(*weights_, got_jobs, /*small_pool=*/true, prefix_cache);
  ASSERT_EQ(reference.streams.size(), want_jobs.size());
  ASSERT_EQ(preempted.streams.size(), got_jobs.size());
  EXPECT_EQ(reference.engine.preemptions, 0);
  EXPECT_GT(preempted.engine.preemptions, 0) << "the pool was too small for all of them";
  EXPECT_EQ(preempted.engine.steps_failed, 0);

  int compared = 0;
  for (size_t i = 0; i < want_jobs.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "job " << i);
    const Stream& want = reference.streams[i];
    const Stream& got = preempted.streams[i];
    EXPECT_EQ(want.finish, FinishReason::kNewTokenLimit) << want.error;
    EXPECT_EQ(got.finish, FinishReason::kNewTokenLimit) << got.error;
    ASSERT_EQ(want.tokens.size(), static_cast<size_t>(want_jobs[i].config.max_new_tokens));
    ASSERT_EQ(got.tokens.size(), want.tokens.size()) << "no token lost or repeated";
    // Each delivered token was told to the processor once, in order, and
    // nothing else: a resume's recomputed tokens are input, never accepted.
    EXPECT_EQ(want_rec[i]->accepted, want.tokens);
    EXPECT_EQ(got_rec[i]->accepted, got.tokens);
    ASSERT_EQ(want_rec[i]->prepared.size(), want.tokens.size());
    ASSERT_EQ(want.logprobs.size(), want.tokens.size());
    ASSERT_EQ(got.logprobs.size(), got.tokens.size());
    for (size_t t = 0; t < want.tokens.size(); ++t) {
      const LogitAdjustments& adj = want_rec[i]->prepared[t];
      for (const LogitEdit& e : adj.edits) {
        ASSERT_EQ(e.scale, 1.0f);
        ASSERT_LE(e.bias, 0.0f);
      }
      const std::optional<double> margin = adjusted_margin(want.logprobs[t], adj);
      if (!margin || *margin <= 2 * kTolerance) break;  // a near-tie of the adjusted row
      ASSERT_EQ(got.tokens[t], want.tokens[t]) << "step " << t;
      EXPECT_NEAR(got.logprobs[t].logprob, want.logprobs[t].logprob, 2 * kTolerance)
          << "step " << t;
      ++compared;
    }
  }
  int preempted_generations = 0;
  for (const Stream& s : preempted.streams) preempted_generations += s.preemptions > 0 ? 1 : 0;
  EXPECT_GE(preempted_generations, 1);
  EXPECT_GT(compared, 3 * 40) << "most steps are compared";
  EXPECT_EQ(preempted.kv.cells_in_use, 0);
}

INSTANTIATE_TEST_SUITE_P(CacheOffAndOn, PreemptionParityTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("Cache") : std::string("NoCache");
                         });

}  // namespace
}  // namespace cellm
