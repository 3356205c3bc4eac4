// The CUDA executor's step ahead (CudaExecutorOptions::overlap_decode): a decode step
// queued before execute() returns, fed on the device with the tokens just sampled. The
// same scripted calls to two executors, one with the overlap and one without, must give
// the same tokens and logprobs bit for bit and the same cells in use after every call,
// whether the next batch is the step ahead or part of it (used) or not (dropped): a
// session pausing (part: the others' rows are used) and resuming, a token other than the
// sampled one, a rewind, a clone, a close (the closed session's row is left padded in the
// steps after it), a new policy, a session asking for logprobs, a prefill arriving; and
// an executor destroyed with a step still queued leaves the device healthy. With the prefix
// cache on, releasing a session the step ahead holds settles the step first, and the
// session resumes from its cached cells.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "cellm/cuda_executor.h"
#include "executor_driver.h"
#include "fixture_model.h"
#include "gpu_test.h"

namespace cellm {
namespace {

using testing::Fixture;
using testing::single_token;

// `at_start`: capture every bucket's graphs in initialize() (as the runner does); else
// each bucket warms and captures in its first two steps, between steps that may have run
// from either staging slot.
std::unique_ptr<CudaExecutor> make(const Fixture& f, bool overlap, CudaPrecision precision,
                                   bool at_start, bool adaptive = false,
                                   bool prefix_cache = false) {
  Result<ModelWeights> w = ModelWeights::load(f.dir);
  CELLM_CHECK_MSG(w.ok(), w.status().to_string());
  ExecutorLimits l;
  l.max_sessions = 8;
  l.max_session_tokens = 96;
  l.step_width = 16;
  l.prefix_cache = prefix_cache;
  CudaExecutorOptions o;
  o.precision = precision;
  o.overlap_decode = overlap;
  o.tuning.overlap_adaptive = adaptive;
  Result<std::unique_ptr<CudaExecutor>> e =
      CudaExecutor::create(std::make_shared<const ModelWeights>(std::move(*w)), l, o);
  CELLM_CHECK_MSG(e.ok(), e.status().to_string());
  if (at_start) {
    const Status init = (*e)->initialize();
    CELLM_CHECK_MSG(init.ok(), init.to_string());
  }
  return std::move(*e);
}

// What one executor answered over the script: every output, and the cells in use after
// every call.
struct Transcript {
  std::vector<Output> outputs;
  std::vector<int32_t> cells_in_use;
};

// Runs the script on `e`. Sessions are named by their index in `sids`; `pos[i]` is the
// position session i's next input starts at and `next[i]` the token it feeds.
class Script {
 public:
  explicit Script(CudaExecutor& e) : e_(e) {}

  size_t open(const SamplingParams& params, uint64_t seed, const std::vector<Token>& prompt) {
    const SessionId sid = *e_.open_session();
    e_.set_sampling(sid, params, seed);
    sids_.push_back(sid);
    pos_.push_back(0);
    next_.push_back(0);
    prompts_.push_back(prompt);
    history_.emplace_back();
    return sids_.size() - 1;
  }

  // One batch: a prefill of every session in `prefills` (whole prompts, one chunk),
  // then a one-token decode of every session in `decodes`, in that order.
  void step(const std::vector<size_t>& decodes, const std::vector<size_t>& prefills = {}) {
    BatchInput b;
    for (size_t i : prefills) {
      auto buf = std::make_shared<const std::vector<Token>>(prompts_[i]);
      b.inputs.push_back(testing::make_input(sids_[i], buf, 0, buf->size(), pos_[i], true));
    }
    for (size_t i : decodes) b.inputs.push_back(single_token(sids_[i], next_[i], pos_[i]));
    BatchOutput o;
    const Status executed = e_.execute(b, o);
    ASSERT_TRUE(executed.ok()) << executed.to_string();
    ASSERT_EQ(o.outputs.size(), b.inputs.size());
    std::vector<size_t> order = prefills;
    order.insert(order.end(), decodes.begin(), decodes.end());
    for (size_t k = 0; k < order.size(); ++k) {
      ASSERT_TRUE(o.outputs[k].has_value());
      const size_t i = order[k];
      std::vector<Token>& h = history_[i];
      h.resize(static_cast<size_t>(pos_[i]));
      for (size_t t = 0; t < b.inputs[k].size; ++t) h.push_back(b.inputs[k].token(t));
      pos_[i] += static_cast<Position>(b.inputs[k].size);
      next_[i] = o.outputs[k]->tokens.at(0);
      t_.outputs.push_back(*o.outputs[k]);
    }
    t_.cells_in_use.push_back(e_.kv_metrics().cells_in_use);
  }

  void feed(size_t i, Token t) { next_[i] = t; }
  void rewind(size_t i, Position p) {
    pos_[i] = p;
    history_[i].resize(static_cast<size_t>(p));
  }
  size_t clone(size_t i) {
    std::optional<SessionId> child = e_.clone(sids_[i], pos_[i]);
    CELLM_CHECK(child.has_value());
    sids_.push_back(*child);
    pos_.push_back(pos_[i]);
    next_.push_back(next_[i]);
    prompts_.push_back({});
    history_.push_back(history_[i]);
    t_.cells_in_use.push_back(e_.kv_metrics().cells_in_use);
    return sids_.size() - 1;
  }
  void close(size_t i) {
    e_.close_session(sids_[i]);
    t_.cells_in_use.push_back(e_.kv_metrics().cells_in_use);
  }
  // Releases session i's cells to the prefix cache (the only cached ones) and attaches
  // them back: it continues where it was, with its policy.
  void release_and_attach(size_t i) {
    ASSERT_TRUE(e_.release_cells(sids_[i]));
    EXPECT_EQ(e_.kv_metrics().cells_cached, pos_[i]);
    EXPECT_EQ(e_.attach_prefix(sids_[i], history_[i]), pos_[i]);
    EXPECT_EQ(e_.kv_metrics().cells_cached, 0);
    t_.cells_in_use.push_back(e_.kv_metrics().cells_in_use);
  }
  void set_sampling(size_t i, const SamplingParams& p, uint64_t seed) {
    e_.set_sampling(sids_[i], p, seed);
  }
  const Transcript& transcript() const { return t_; }

 private:
  CudaExecutor& e_;
  std::vector<SessionId> sids_;
  std::vector<Position> pos_;
  std::vector<Token> next_;
  std::vector<std::vector<Token>> prompts_;
  std::vector<std::vector<Token>> history_;  // committed tokens of each session
  Transcript t_;
};

SamplingParams sampled(float temperature, float top_p) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_p = top_p;
  return p;
}

// The script: every way the next batch can differ from the step ahead, each between runs
// of unchanged batches. A run of k unchanged decode batches, after a change, runs its first
// step alone (the batch before it had other sessions or did not decode) or queued (same
// sessions), and each later one from the step ahead: the counts in the comments, used
// (u) and dropped (d), 21 and 6 in all.
void run_script(Script& s, const Fixture& f, int64_t vocab) {
  const auto& p = f.prompts;
  const size_t a = s.open(SamplingParams{}, 0, p[0].ids);
  const size_t b = s.open(sampled(0.8f, 0.9f), 7, p[1].ids);
  const size_t c = s.open(SamplingParams{}, 0, p[2].ids);
  s.step({}, {a, b, c});
  for (int k = 0; k < 6; ++k) s.step({a, b, c});  // 4u
  // b pauses: the step ahead answers a and c (1u) and gives b's cell back; a and c fit
  // a smaller bucket, so the next step runs alone there, queued (same sessions): 2u.
  for (int k = 0; k < 4; ++k) s.step({a, c});
  for (int k = 0; k < 3; ++k) s.step({a, b, c});             // 1d, 1u
  s.feed(a, static_cast<Token>((p[0].ids[0] + 1) % vocab));  // not the sampled token
  for (int k = 0; k < 3; ++k) s.step({a, b, c});             // 1d, 2u
  s.rewind(c, static_cast<Position>(p[2].ids.size()) + 2);   // c goes back to a position
  for (int k = 0; k < 3; ++k) s.step({a, b, c});             // 1d, 2u
  const size_t d = s.clone(c);  // at c's committed position, with the step ahead holding c: 1d
  s.set_sampling(d, SamplingParams{}, 0);
  for (int k = 0; k < 4; ++k) s.step({a, b, c, d});  // 2u
  s.close(b);  // b's row stays in the step ahead, padded in the steps after it
  for (int k = 0; k < 3; ++k) s.step({a, c, d});  // 3u (the bucket of 4 rows still)
  s.set_sampling(a, sampled(1.0f, 1.0f), 9);      // 1d
  for (int k = 0; k < 3; ++k) s.step({a, c, d});  // 2u
  SamplingParams with_logprobs;
  with_logprobs.num_logprobs = 3;
  s.set_sampling(d, with_logprobs, 0);  // 1d; no step ahead while d wants logprobs
  for (int k = 0; k < 3; ++k) s.step({a, c, d});
  s.set_sampling(d, SamplingParams{}, 0);
  const size_t e = s.open(SamplingParams{}, 0, p[3].ids);
  s.step({a, c, d}, {e});                            // a prefill arrives
  for (int k = 0; k < 4; ++k) s.step({a, c, d, e});  // 2u
}

void expect_same(const Transcript& x, const Transcript& y) {
  ASSERT_EQ(x.outputs.size(), y.outputs.size());
  for (size_t k = 0; k < x.outputs.size(); ++k) {
    EXPECT_EQ(x.outputs[k].sid, y.outputs[k].sid) << "output " << k;
    EXPECT_EQ(x.outputs[k].tokens, y.outputs[k].tokens) << "output " << k;
    ASSERT_EQ(x.outputs[k].logprobs.size(), y.outputs[k].logprobs.size()) << "output " << k;
    for (size_t t = 0; t < x.outputs[k].logprobs.size(); ++t) {
      EXPECT_EQ(x.outputs[k].logprobs[t].logprob, y.outputs[k].logprobs[t].logprob);
      EXPECT_EQ(x.outputs[k].logprobs[t].top, y.outputs[k].logprobs[t].top);
    }
  }
  EXPECT_EQ(x.cells_in_use, y.cells_in_use);
}

class OverlapDecodeTest : public ::testing::TestWithParam<std::string> {};

TEST_P(OverlapDecodeTest, TheStepAheadChangesNoOutputAndNoCellCountUsedOrDropped) {
  CELLM_SKIP_WITHOUT_GPU();
  const Fixture f = testing::load_fixture(GetParam());
  for (const auto& [precision, at_start] :
       {std::pair{CudaPrecision::kF32, true}, std::pair{CudaPrecision::kF32, false},
        std::pair{CudaPrecision::kBF16, true}}) {
    const std::string mode = std::string(precision == CudaPrecision::kF32 ? "f32" : "bf16") +
                             (at_start ? ", graphs at start" : ", graphs on first use");
    std::map<bool, Transcript> got;
    for (bool overlap : {false, true}) {
      auto e = make(f, overlap, precision, at_start);
      Script s(*e);
      run_script(s, f, f.vocab_size);
      got[overlap] = s.transcript();
      const CudaExecutor::MethodCalls calls = e->method_calls();
      if (overlap) {
        // Unchanged batches ran from the step ahead (from the second of a run of them
        // on); every kind of change but a pause, a close, a new session or a policy
        // without logprobs dropped one (run_script's comments count them). Graphs
        // captured on first use take the first two steps of each bucket synchronously:
        // one used step fewer in bucket 4's first run, two in bucket 2's.
        EXPECT_EQ(calls.decode_steps_ahead_used, at_start ? 21 : 18) << mode;
        EXPECT_EQ(calls.decode_steps_ahead_dropped, 6) << mode;
      } else {
        EXPECT_EQ(calls.decode_steps_ahead_used, 0) << mode;
        EXPECT_EQ(calls.decode_steps_ahead_dropped, 0) << mode;
      }
    }
    SCOPED_TRACE(mode);
    expect_same(got[true], got[false]);
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, OverlapDecodeTest,
                         ::testing::ValuesIn(testing::fixture_names()), testing::fixture_test_name);

// The adaptive policy (the default): batches that change every third step stop the
// queueing after the first dropped step (the threshold doubles to 4 batches), and a run of
// unchanged batches long enough starts it again; the outputs stay those of an executor
// without the overlap. (A session leaving the batch drops nothing, one joining it does.)
TEST(OverlapDecodeAdaptiveTest, BatchesThatKeepChangingSoonStopTheStepsAhead) {
  CELLM_SKIP_WITHOUT_GPU();
  const Fixture f = testing::load_fixture("mistral-tiny");
  std::map<bool, Transcript> got;
  for (bool overlap : {false, true}) {
    auto e = make(f, overlap, CudaPrecision::kF32, /*at_start=*/true, /*adaptive=*/true);
    Script s(*e);
    const size_t a = s.open(SamplingParams{}, 0, f.prompts[0].ids);
    const size_t b = s.open(SamplingParams{}, 0, f.prompts[1].ids);
    const size_t c = s.open(SamplingParams{}, 0, f.prompts[2].ids);
    s.step({}, {a, b, c});
    for (int round = 0; round < 6; ++round) {
      for (int k = 0; k < 3; ++k) s.step({a, b, c});  // round 0: 1 used; round 1: 1 dropped
      for (int k = 0; k < 3; ++k) s.step({a, c});     // round 0: 2 used; then none
    }
    for (int k = 0; k < 10; ++k) s.step({a, b, c});  // the 4th queues: 6 used
    got[overlap] = s.transcript();
    if (overlap) {
      EXPECT_EQ(e->method_calls().decode_steps_ahead_used, 9);
      EXPECT_EQ(e->method_calls().decode_steps_ahead_dropped, 1);
    }
  }
  expect_same(got[true], got[false]);
}

// A session released while the step ahead holds it: the step is settled (dropped), the
// tokens the steps ahead committed are in the session's history, so all of it is cached
// and attached back, and the outputs after it are those of an executor without the overlap.
TEST(OverlapDecodePrefixTest, ReleasingASessionTheStepAheadHoldsSettlesItAndResumes) {
  CELLM_SKIP_WITHOUT_GPU();
  const Fixture f = testing::load_fixture("llama3-tiny");
  std::map<bool, Transcript> got;
  for (bool overlap : {false, true}) {
    auto e = make(f, overlap, CudaPrecision::kF32, /*at_start=*/true, /*adaptive=*/false,
                  /*prefix_cache=*/true);
    Script s(*e);
    const size_t a = s.open(SamplingParams{}, 0, f.prompts[0].ids);
    const size_t b = s.open(sampled(0.8f, 0.9f), 7, f.prompts[1].ids);
    s.step({}, {a, b});
    for (int k = 0; k < 5; ++k) s.step({a, b});
    const CudaExecutor::MethodCalls before = e->method_calls();
    s.release_and_attach(a);
    const CudaExecutor::MethodCalls after = e->method_calls();
    if (overlap) {
      EXPECT_GT(before.decode_steps_ahead_used, 0);
      EXPECT_EQ(after.decode_steps_ahead_dropped, before.decode_steps_ahead_dropped + 1);
    }
    for (int k = 0; k < 5; ++k) s.step({a, b});
    got[overlap] = s.transcript();
  }
  expect_same(got[true], got[false]);
}

// An executor destroyed while its step ahead may still run: the device stays usable and
// a new executor gives the same tokens.
TEST(OverlapDecodeTeardownTest, DestroyingTheExecutorWithAStepQueuedLeavesTheDeviceHealthy) {
  CELLM_SKIP_WITHOUT_GPU();
  const Fixture f = testing::load_fixture("llama3-tiny");
  std::vector<std::vector<Token>> first;
  for (int round = 0; round < 2; ++round) {
    auto e = make(f, true, CudaPrecision::kF32, round == 0);
    Script s(*e);
    const size_t a = s.open(SamplingParams{}, 0, f.prompts[0].ids);
    s.step({}, {a});
    for (int k = 0; k < 8; ++k) s.step({a});
    EXPECT_GT(e->method_calls().decode_steps_ahead_used, 0);
    std::vector<Token> tokens;
    for (const Output& o : s.transcript().outputs) tokens.push_back(o.tokens.at(0));
    first.push_back(tokens);
    // e goes with its step ahead queued and its session open.
  }
  EXPECT_EQ(first[0], first[1]);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace cellm
