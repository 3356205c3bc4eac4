// The parity check of an executor under the real Runner and
// DecodeFirstScheduler, sized small (8 tokens per step: up to 4 decodes and
// prefill chunks of 4) so every prompt is split over several steps and shares
// them with other sessions. For a fixture architecture, all five reference
// prompts run concurrently with three extra sessions (other prompts, compared
// with their own solo runs): greedy continuations of 24 tokens with no stop
// tokens (--ignore-eos) equal the reference's, no step fails, steps are shared
// (fewer steps than generated tokens), and closing the sessions returns every
// KV cell to the pool. Used by the CPU and the CUDA executor tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cellm/decode_first_scheduler.h"
#include "cellm/executor.h"
#include "cellm/runner.h"
#include "fixture_model.h"

namespace cellm::testing {

// Forwards every verb to the executor under test, but holds execute() until
// open(): the test submits every generation while the first step waits, so all
// of them are active together from the second step on, however loaded the
// machine is.
class GatedExecutor final : public Executor {
 public:
  explicit GatedExecutor(Executor& inner) : inner_(inner) {}
  void open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  Status initialize() override { return inner_.initialize(); }
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
  Status execute(const BatchInput& batch, BatchOutput& out) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return open_; });
    }
    return inner_.execute(batch, out);
  }
  KvMetrics kv_metrics() const override { return inner_.kv_metrics(); }

 private:
  Executor& inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;  // guarded by mu_
};

// Makes the executor under test: (weights, max_sessions, max_session_tokens, step width).
using ExecutorFactory = std::function<Result<std::unique_ptr<Executor>>(
    std::shared_ptr<const ModelWeights>, int32_t, int32_t, int32_t)>;

constexpr int32_t kNewTokens = 24;
constexpr size_t kStepTokens = 8;
constexpr size_t kMaxDecodes = 4;
constexpr size_t kChunkTokens = kStepTokens - kMaxDecodes;

struct Outcome {
  std::vector<std::vector<Token>> tokens;  // per prompt, as delivered
  std::vector<GenerationMetrics> generations;
  std::vector<FinishReason> finish;
  EngineMetrics engine;
  std::vector<Position> positions;  // committed per session at the end
  KvMetrics kv_open;                // after the last step, sessions still open
  KvMetrics kv_after_probe;         // after the sessions closed and a 1-token probe ran
  KvMetrics kv_final;               // after shutdown
};

// Runs every prompt as its own session, all concurrently, through one Runner.
inline Outcome run_concurrently(const ExecutorFactory& make,
                                const std::shared_ptr<const ModelWeights>& weights,
                                const std::vector<std::vector<Token>>& prompts) {
  Outcome o;
  // + the barriers and the probe; 128 positions per session.
  Result<std::unique_ptr<Executor>> executor = make(
      weights, static_cast<int32_t>(prompts.size()) + 3, 128, static_cast<int32_t>(kStepTokens));
  EXPECT_TRUE(executor.ok()) << executor.status().to_string();
  if (!executor.ok()) return o;
  Result<std::unique_ptr<DecodeFirstScheduler>> scheduler =
      DecodeFirstScheduler::create(kStepTokens, kMaxDecodes, kChunkTokens);
  EXPECT_TRUE(scheduler.ok()) << scheduler.status().to_string();
  if (!scheduler.ok()) return o;

  GatedExecutor gate(**executor);
  Runner runner(gate, std::move(*scheduler));
  std::vector<Session> sessions;
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::optional<Session> s = runner.open_session_async().get();
    EXPECT_TRUE(s.has_value()) << "session " << i;
    if (!s) return o;
    sessions.push_back(std::move(*s));
  }
  GenConfig config;  // greedy, no stop tokens
  config.max_new_tokens = kNewTokens;
  o.tokens.resize(prompts.size());
  std::vector<GenerationHandle> handles;
  for (size_t i = 0; i < prompts.size(); ++i) {
    // Callbacks run on the engine thread only; the test reads after wait().
    handles.push_back(
        sessions[i].generate_async(prompts[i], config, [&o, i](const GenerationUpdate& u) {
          o.tokens[i].insert(o.tokens[i].end(), u.tokens.begin(), u.tokens.end());
        }));
  }
  gate.open();
  for (GenerationHandle& h : handles) {
    h.wait();
    o.finish.push_back(h.finish_reason().value_or(FinishReason::kFailed));
    o.generations.push_back(h.metrics());
    EXPECT_EQ(h.error_message(), "");
  }
  for (const Session& s : sessions) o.positions.push_back(s.position());
  // The KV metrics are published after each step, possibly after wait()
  // returned; a command answered afterwards (opening a session, which holds
  // no cells) proves the last step's numbers are out.
  const auto barrier = [&runner] {
    std::optional<Session> s = runner.open_session_async().get();
    EXPECT_TRUE(s.has_value());
  };
  barrier();
  o.kv_open = runner.kv_metrics();

  // Close every session, then run a one-token prompt: the step after the
  // closes samples the pool, which must hold only the probe's one cell.
  sessions.clear();
  std::optional<Session> probe = runner.open_session_async().get();
  EXPECT_TRUE(probe.has_value());
  if (probe) {
    GenConfig one;
    one.max_new_tokens = 1;
    probe->generate_async({prompts[0][0]}, one, nullptr).wait();
    barrier();
    o.kv_after_probe = runner.kv_metrics();
    probe.reset();
  }
  runner.shutdown();
  o.engine = runner.metrics();
  o.kv_final = runner.kv_metrics();
  return o;
}

inline std::vector<Token> concat(const std::vector<Token>& a, const std::vector<Token>& b) {
  std::vector<Token> out = a;
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

// Runs the whole check for `fixture` (a folder under tests/fixtures/models).
inline void expect_runner_parity(const std::string& fixture, const ExecutorFactory& make) {
  const Fixture f = load_fixture(fixture);
  Result<ModelWeights> w = ModelWeights::load(f.dir);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  const auto weights = std::make_shared<const ModelWeights>(std::move(w).value());

  std::vector<std::vector<Token>> prompts;
  for (const auto& p : f.prompts) prompts.push_back(p.ids);
  const size_t num_reference = prompts.size();
  ASSERT_EQ(num_reference, 5u);
  // Three extra sessions with prompts of their own (two reference prompts
  // back to back), longer than any reference prompt.
  std::vector<std::vector<Token>> extras;
  for (size_t k = 0; k < 3; ++k) {
    extras.push_back(concat(prompts[(k + 1) % num_reference], prompts[(k + 3) % num_reference]));
    prompts.push_back(extras.back());
  }

  const Outcome all = run_concurrently(make, weights, prompts);
  ASSERT_EQ(all.tokens.size(), prompts.size());
  for (size_t i = 0; i < num_reference; ++i) {
    EXPECT_EQ(all.tokens[i], f.prompts[i].greedy) << "prompt " << i << ": " << f.prompts[i].text;
  }
  for (size_t k = 0; k < extras.size(); ++k) {
    const Outcome solo = run_concurrently(make, weights, {extras[k]});
    ASSERT_EQ(solo.tokens.size(), 1u);
    EXPECT_EQ(solo.tokens[0].size(), static_cast<size_t>(kNewTokens));
    EXPECT_EQ(all.tokens[num_reference + k], solo.tokens[0]) << "extra " << k;
  }

  const int64_t generated = static_cast<int64_t>(prompts.size()) * kNewTokens;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE("prompt " + std::to_string(i));
    EXPECT_EQ(all.finish[i], FinishReason::kNewTokenLimit);
    EXPECT_EQ(all.generations[i].n_generated_tokens, kNewTokens);
    // A step takes at most kStepTokens, so a prompt longer than that spans
    // several steps (a step may take two chunks of one session).
    const auto min_steps =
        static_cast<int64_t>((prompts[i].size() + kStepTokens - 1) / kStepTokens);
    EXPECT_GE(all.generations[i].n_prefill_steps, min_steps);
  }
  // The probe adds one generation of one token.
  EXPECT_EQ(all.engine.steps_failed, 0);
  EXPECT_EQ(all.engine.generations_completed, static_cast<int64_t>(prompts.size()) + 1);
  EXPECT_EQ(all.engine.finished_token_limit, static_cast<int64_t>(prompts.size()) + 1);
  EXPECT_EQ(all.engine.total_generated_tokens, generated + 1);
  EXPECT_LT(all.engine.steps, generated);
  EXPECT_EQ(all.engine.peak_concurrent_generations, static_cast<int64_t>(prompts.size()));
  EXPECT_GT(all.engine.mean_decode_step_sessions(), 1.0);

  // Each session held its prompt and all but its last (pending) token, one
  // cell per position.
  int64_t held = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto committed = static_cast<Position>(prompts[i].size()) + kNewTokens - 1;
    EXPECT_EQ(all.positions.at(i), committed) << "prompt " << i;
    held += committed;
  }
  EXPECT_EQ(all.kv_open.cells_in_use, held);
  EXPECT_EQ(all.kv_after_probe.cells_in_use, 1);
  EXPECT_EQ(all.kv_final.cells_in_use, 0);
}

}  // namespace cellm::testing
