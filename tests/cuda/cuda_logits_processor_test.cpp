// Logits processors on the CUDA executor (CudaExecutor::set_logits_processor): the
// device applies each processor row's adjustments (cuda/logit_adjuster.h) before its
// sampler, and the tokens must be the CPU executor's (which applies them with
// apply_logit_adjustments on the host) with the same processors:
//   - greedy with a mask allowing 4 tokens a step (every token must be one of them),
//   - logit_bias forcing a token chosen by the step (every token must be it, in f32 and
//     bf16),
//   - seeded temperature sampling (plain, top-k, top-p with min-p) with a
//     repetition-penalty-like processor (edits from the history) and a large mask,
// among sessions without processors in the same batch (their tokens are those of a run
// without any processor), over the prefill path (each session's first token), the decode
// graph path (B > 1, a variant of the bucket's graph that stops at the logits), a lone
// decode and the eager decode path (graphs off). Each processor checks that prepare() and
// accept() alternate, and records its accepted tokens: they must be exactly the tokens
// returned for its session, in order. Log-probabilities stay those of the raw logits.
// With the step ahead on, no step runs ahead while a processor row is in the batch, and
// installing a processor on a session a step ahead holds settles that step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "cellm/cpu_executor.h"
#include "cellm/cuda_executor.h"
#include "cellm/logits_processor.h"
#include "executor_driver.h"
#include "fixture_model.h"
#include "gpu_test.h"

namespace cellm {
namespace {

using testing::Fixture;
using testing::make_input;
using testing::single_token;

// A deterministic processor whose adjustments depend on the step and, for kPenalty, on the
// tokens it accepted, so a token accepted out of order or twice changes later rows.
class ScriptedProcessor final : public LogitsProcessor {
 public:
  enum class Kind {
    kMask,     // allows 4 tokens, chosen by the step
    kForce,    // +1000 on one token chosen by the step (logit_bias)
    kPenalty,  // x 1/1.3 and -0.7 per use on every accepted token, and forbids id % 3 == salt
  };
  ScriptedProcessor(Kind kind, int64_t vocab, uint32_t salt)
      : kind_(kind), vocab_(vocab), salt_(salt) {}

  void prepare(LogitAdjustments& out) override {
    out.clear();
    EXPECT_EQ(prepares_, accepted_.size()) << "prepare() twice without accept()";
    ++prepares_;
    const size_t step = accepted_.size();
    switch (kind_) {
      case Kind::kMask:
        out.allowed.assign(static_cast<size_t>((vocab_ + 63) / 64), 0);
        for (Token t : allowed_at(step)) {
          out.allowed[static_cast<size_t>(t / 64)] |= uint64_t{1} << (t % 64);
        }
        break;
      case Kind::kForce:
        out.edits.push_back(LogitEdit{forced_at(step), 1.0f, 1000.0f});
        break;
      case Kind::kPenalty: {
        std::vector<Token> seen = accepted_;
        std::sort(seen.begin(), seen.end());
        for (size_t i = 0; i < seen.size();) {
          size_t j = i;
          while (j < seen.size() && seen[j] == seen[i]) ++j;
          out.edits.push_back(LogitEdit{seen[i], 1.3f, -0.7f * static_cast<float>(j - i)});
          i = j;
        }
        out.allowed.assign(static_cast<size_t>((vocab_ + 63) / 64), 0);
        for (int64_t t = 0; t < vocab_; ++t) {
          if (t % 3 != salt_ % 3)
            out.allowed[static_cast<size_t>(t / 64)] |= uint64_t{1} << (t % 64);
        }
        break;
      }
    }
  }

  void accept(Token token) override {
    EXPECT_EQ(prepares_, accepted_.size() + 1) << "accept() without prepare()";
    accepted_.push_back(token);
  }

  std::vector<Token> allowed_at(size_t step) const {
    std::vector<Token> t;
    for (uint64_t j = 0; j < 4; ++j) {
      t.push_back(static_cast<Token>((uint64_t{salt_} * 7919 + step * 104729 + j * 15485863) %
                                     static_cast<uint64_t>(vocab_)));
    }
    return t;
  }
  Token forced_at(size_t step) const {
    return static_cast<Token>((uint64_t{salt_} * 31 + step * 977 + 5) %
                              static_cast<uint64_t>(vocab_));
  }
  bool allows(Token t) const {
    return kind_ != Kind::kPenalty || static_cast<uint32_t>(t) % 3 != salt_ % 3;
  }

  const std::vector<Token>& accepted() const { return accepted_; }
  size_t prepares() const { return prepares_; }

 private:
  Kind kind_;
  int64_t vocab_;
  uint32_t salt_;
  size_t prepares_ = 0;
  std::vector<Token> accepted_;
};

using Kind = ScriptedProcessor::Kind;

// One session of a drive: its prompt, policy and processor (none: null).
struct Spec {
  std::vector<Token> prompt;
  SamplingParams params;
  uint64_t seed = 0;
  std::shared_ptr<ScriptedProcessor> processor;
};

// Prefills every prompt in one batch (chunks of `chunk` tokens), then decodes all
// sessions together for n_new - 1 steps; returns each session's outputs.
std::vector<std::vector<Output>> drive(Executor& e, const std::vector<Spec>& specs, size_t chunk,
                                       size_t n_new) {
  std::vector<SessionId> sids;
  BatchInput first;
  for (const Spec& s : specs) {
    const SessionId sid = *e.open_session();
    e.set_sampling(sid, s.params, s.seed);
    if (s.processor) {
      EXPECT_TRUE(e.set_logits_processor(sid, s.processor));
    }
    sids.push_back(sid);
    auto buf = std::make_shared<const std::vector<Token>>(s.prompt);
    for (size_t off = 0; off < s.prompt.size(); off += chunk) {
      const size_t n = std::min(chunk, s.prompt.size() - off);
      first.inputs.push_back(make_input(sid, buf, off, n, 0, off + n == s.prompt.size()));
    }
  }
  std::vector<std::vector<Output>> out(specs.size());
  BatchOutput o;
  const Status prefill = e.execute(first, o);
  EXPECT_TRUE(prefill.ok()) << prefill.to_string();
  size_t k = 0;
  for (size_t i = 0; i < first.inputs.size(); ++i) {
    if (!first.inputs[i].produce_output) continue;
    if (!o.outputs[i]) return out;
    out[k++].push_back(*o.outputs[i]);
  }
  for (size_t step = 1; step < n_new; ++step) {
    BatchInput b;
    for (size_t i = 0; i < specs.size(); ++i) {
      const auto pos = static_cast<Position>(specs[i].prompt.size() + step - 1);
      b.inputs.push_back(single_token(sids[i], out[i].back().tokens.at(0), pos));
    }
    const Status s = e.execute(b, o);
    EXPECT_TRUE(s.ok()) << s.to_string();
    for (size_t i = 0; i < specs.size(); ++i) {
      if (!o.outputs[i]) return out;
      out[i].push_back(*o.outputs[i]);
    }
  }
  for (SessionId sid : sids) e.close_session(sid);
  return out;
}

std::vector<Token> tokens_of(const std::vector<Output>& outputs) {
  std::vector<Token> t;
  for (const Output& o : outputs) t.push_back(o.tokens.at(0));
  return t;
}

std::shared_ptr<const ModelWeights> load_weights(const Fixture& f) {
  Result<ModelWeights> w = ModelWeights::load(f.dir);
  CELLM_CHECK_MSG(w.ok(), w.status().to_string());
  return std::make_shared<const ModelWeights>(std::move(*w));
}

ExecutorLimits limits() {
  ExecutorLimits l;
  l.max_sessions = 10;
  l.max_session_tokens = 128;
  l.step_width = 16;
  return l;
}

// `at_start`: initialize() captures every bucket's graph first (as the runner does); else
// a bucket's first decode step warms it eagerly and its second captures it, with
// processor rows in both.
std::unique_ptr<CudaExecutor> make_gpu(std::shared_ptr<const ModelWeights> w,
                                       CudaPrecision precision, bool graphs, bool overlap,
                                       bool at_start = true) {
  CudaExecutorOptions o;
  o.precision = precision;
  o.cuda_graph_for_decode = graphs;
  o.overlap_decode = overlap;
  o.tuning.overlap_adaptive = false;
  Result<std::unique_ptr<CudaExecutor>> e = CudaExecutor::create(std::move(w), limits(), o);
  CELLM_CHECK_MSG(e.ok(), e.status().to_string());
  if (at_start) {
    const Status init = (*e)->initialize();
    CELLM_CHECK_MSG(init.ok(), init.to_string());
  }
  return std::move(*e);
}

std::unique_ptr<CpuExecutor> make_cpu(std::shared_ptr<const ModelWeights> w) {
  Result<std::unique_ptr<CpuExecutor>> e = CpuExecutor::create(std::move(w), limits(), {});
  CELLM_CHECK_MSG(e.ok(), e.status().to_string());
  return std::move(*e);
}

// The specs of a mixed batch: processors of `kinds` on prompts 0.., then sessions
// without processors on the fixture's prompts again; `sampled` gives the processor
// sessions seeded temperature sampling (plain, top-k, top-p with min-p in turn).
std::vector<Spec> mixed_specs(const Fixture& f, const std::vector<Kind>& kinds, bool sampled,
                              size_t plain) {
  std::vector<Spec> specs;
  for (size_t i = 0; i < kinds.size(); ++i) {
    Spec s;
    s.prompt = f.prompts[i % f.prompts.size()].ids;
    s.seed = 1000 + i;
    if (sampled) {
      s.params.temperature = 0.9f;
      if (i % 3 == 1) s.params.top_k = 40;
      if (i % 3 == 2) {
        s.params.top_p = 0.9f;
        s.params.min_p = 0.1f;
      }
    }
    s.processor =
        std::make_shared<ScriptedProcessor>(kinds[i], f.vocab_size, static_cast<uint32_t>(i + 1));
    specs.push_back(std::move(s));
  }
  for (size_t i = 0; i < plain; ++i) {
    Spec s;
    s.prompt = f.prompts[(i + 1) % f.prompts.size()].ids;
    s.seed = 7 + i;
    if (i % 2 == 1) {
      s.params.temperature = 0.7f;
      s.params.top_k = 20;
    }
    specs.push_back(std::move(s));
  }
  return specs;
}

// Fresh processors of the same kinds and salts (a drive consumes them).
std::vector<Spec> fresh(const std::vector<Spec>& specs) {
  std::vector<Spec> copy = specs;
  for (size_t i = 0; i < copy.size(); ++i) {
    if (!copy[i].processor) continue;
    copy[i].processor = std::make_shared<ScriptedProcessor>(*specs[i].processor);
  }
  return copy;
}

// The accept() log of every processor is the tokens returned for its session, in order,
// with one prepare() each; masked and forced tokens obey their processor.
void expect_processors_saw_their_tokens(const std::vector<Spec>& specs,
                                        const std::vector<std::vector<Output>>& got,
                                        const std::vector<Kind>& kinds, const std::string& mode) {
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!specs[i].processor) continue;
    const ScriptedProcessor& p = *specs[i].processor;
    const std::vector<Token> tokens = tokens_of(got[i]);
    EXPECT_EQ(p.accepted(), tokens)
        << mode << " session " << i << ": accept() must see each returned token once, in order";
    EXPECT_EQ(p.prepares(), tokens.size()) << mode << " session " << i;
    for (size_t step = 0; step < tokens.size(); ++step) {
      const Token t = tokens[step];
      if (kinds[i] == Kind::kMask) {
        const std::vector<Token> allowed = p.allowed_at(step);
        EXPECT_NE(std::find(allowed.begin(), allowed.end(), t), allowed.end())
            << mode << " session " << i << " step " << step << ": token " << t
            << " is outside the mask";
      } else if (kinds[i] == Kind::kForce) {
        EXPECT_EQ(t, p.forced_at(step)) << mode << " session " << i << " step " << step;
      } else {
        EXPECT_TRUE(p.allows(t)) << mode << " session " << i << " step " << step << ": token " << t
                                 << " is masked";
      }
    }
  }
}

class CudaLogitsProcessorTest : public ::testing::TestWithParam<std::string> {};

// Greedy masks, forced tokens and penalties with a mask, beside greedy and sampled
// sessions without processors: the CPU executor's tokens, on the graph path (graphs
// captured at start, or warmed and captured by the steps with processors) and the eager
// path.
TEST_P(CudaLogitsProcessorTest, F32GreedyProcessorsGiveTheCpuExecutorsTokens) {
  CELLM_SKIP_WITHOUT_GPU();
  const Fixture f = testing::load_fixture(GetParam());
  auto w = load_weights(f);
  const std::vector<Kind> kinds = {Kind::kMask, Kind::kForce, Kind::kPenalty, Kind::kMask};
  const std::vector<Spec> specs = mixed_specs(f, kinds, false, 3);
  constexpr size_t kSteps = 12;
  const std::vector<Spec> cpu_specs = fresh(specs);
  auto cpu = make_cpu(w);
  const auto want = drive(*cpu, cpu_specs, 5, kSteps);
  expect_processors_saw_their_tokens(cpu_specs, want, kinds, "cpu");
  // The sessions without processors decode as in a run without any processor.
  std::vector<Spec> plain(specs.begin() + static_cast<std::ptrdiff_t>(kinds.size()), specs.end());
  const auto plain_want = drive(*cpu, plain, 5, kSteps);
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(tokens_of(want[kinds.size() + i]), tokens_of(plain_want[i]))
        << "cpu: session without a processor " << i;
  }
  for (int m = 0; m < 3; ++m) {
    const bool graphs = m < 2;
    const std::string mode = m == 0 ? "graphs" : m == 1 ? "graphs captured by the steps" : "eager";
    auto gpu = make_gpu(w, CudaPrecision::kF32, graphs, true, m != 1);
    const std::vector<Spec> gpu_specs = fresh(specs);
    const auto got = drive(*gpu, gpu_specs, 5, kSteps);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(tokens_of(got[i]), tokens_of(want[i])) << mode << " session " << i;
    }
    expect_processors_saw_their_tokens(gpu_specs, got, kinds, mode);
    const CudaExecutor::MethodCalls calls = gpu->method_calls();
    EXPECT_EQ(calls.decode_steps_ahead_used + calls.decode_steps_ahead_dropped, 0)
        << mode << ": no step may run ahead of a batch with processor rows";
    // Every processor row of every step had something to apply.
    EXPECT_EQ(calls.adjusted_rows, static_cast<int64_t>(kinds.size() * kSteps)) << mode;
    if (graphs) {
      EXPECT_GT(calls.logits_graph_captures, 0)
          << mode << ": the decode steps ran the logits graph";
      // The batch's bucket and perhaps bucket 1 (a prompt's lone last token), one staging slot
      // (no step runs ahead, so the slot never changes).
      EXPECT_LE(calls.logits_graph_captures, 2) << mode;
    } else {
      EXPECT_EQ(calls.logits_graph_captures, 0);
      EXPECT_GT(calls.decode_eager, 0);
    }
    EXPECT_EQ(gpu->kv_metrics().cells_in_use, 0) << mode;
  }
}

// Seeded temperature sampling (plain, top-k, top-p with min-p) with penalties and a mask
// on some sessions and masked tokens on others: the CPU executor's tokens. The draws are
// keyed by (seed, position), so the same processors give the same tokens. The f32 logits
// of the two executors differ in their last bits, which can move a draw across a token
// boundary when the boundaries are dense (plain sampling over a whole vocabulary of a
// random model), so every sampled session here keeps few tokens: plain temperature only
// under a 4-token mask, penalties under top-k 40 or top-p with min-p.
TEST_P(CudaLogitsProcessorTest, F32SeededSamplingWithProcessorsGivesTheCpuExecutorsTokens) {
  CELLM_SKIP_WITHOUT_GPU();
  const Fixture f = testing::load_fixture(GetParam());
  auto w = load_weights(f);
  // Policies by index (mixed_specs): 0, 3 plain; 1, 4 top-k; 2 top-p with min-p.
  const std::vector<Kind> kinds = {Kind::kMask, Kind::kPenalty, Kind::kPenalty, Kind::kMask,
                                   Kind::kPenalty};
  const std::vector<Spec> specs = mixed_specs(f, kinds, true, 2);
  constexpr size_t kSteps = 16;
  const std::vector<Spec> cpu_specs = fresh(specs);
  auto cpu = make_cpu(w);
  const auto want = drive(*cpu, cpu_specs, 7, kSteps);
  auto gpu = make_gpu(w, CudaPrecision::kF32, true, true);
  const std::vector<Spec> gpu_specs = fresh(specs);
  const auto got = drive(*gpu, gpu_specs, 7, kSteps);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(tokens_of(got[i]), tokens_of(want[i])) << "session " << i;
  }
  expect_processors_saw_their_tokens(gpu_specs, got, kinds, "sampled");
}

// logit_bias forcing a token gives that token in bf16 too, where logits differ from the
// CPU's: the bias dominates.
TEST_P(CudaLogitsProcessorTest, Bf16ForcedTokensAreForced) {
  CELLM_SKIP_WITHOUT_GPU();
  const Fixture f = testing::load_fixture(GetParam());
  auto w = load_weights(f);
  const std::vector<Kind> kinds = {Kind::kForce, Kind::kForce, Kind::kMask};
  for (bool sampled : {false, true}) {
    std::vector<Spec> specs = mixed_specs(f, kinds, sampled, 4);
    auto gpu = make_gpu(w, CudaPrecision::kBF16, true, true);
    const auto got = drive(*gpu, specs, 16, 10);
    expect_processors_saw_their_tokens(specs, got, kinds, sampled ? "bf16 sampled" : "bf16");
  }
}

// Log-probabilities are those of the raw rows (the CPU executor's, within the f32
// tolerance of the logprobs test), while the token comes from the adjusted row.
TEST_P(CudaLogitsProcessorTest, F32LogprobsStayThoseOfTheRawLogits) {
  CELLM_SKIP_WITHOUT_GPU();
  constexpr float kTolerance = 1e-3f;
  const Fixture f = testing::load_fixture(GetParam());
  auto w = load_weights(f);
  const std::vector<Kind> kinds = {Kind::kForce, Kind::kPenalty};
  std::vector<Spec> specs = mixed_specs(f, kinds, false, 1);
  for (Spec& s : specs) s.params.num_logprobs = 3;
  const std::vector<Spec> cpu_specs = fresh(specs);
  auto cpu = make_cpu(w);
  const auto want = drive(*cpu, cpu_specs, 5, 8);
  for (bool graphs : {true, false}) {
    auto gpu = make_gpu(w, CudaPrecision::kF32, graphs, true);
    const std::vector<Spec> gpu_specs = fresh(specs);
    const auto got = drive(*gpu, gpu_specs, 5, 8);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].size(), want[i].size());
      for (size_t step = 0; step < got[i].size(); ++step) {
        const std::string where = std::string(graphs ? "graphs" : "eager") + " session " +
                                  std::to_string(i) + " step " + std::to_string(step);
        ASSERT_EQ(got[i][step].tokens, want[i][step].tokens) << where;
        ASSERT_EQ(got[i][step].logprobs.size(), 1u) << where;
        ASSERT_EQ(want[i][step].logprobs.size(), 1u) << where;
        const TokenLogprobs& g = got[i][step].logprobs[0];
        const TokenLogprobs& c = want[i][step].logprobs[0];
        EXPECT_NEAR(g.logprob, c.logprob, kTolerance) << where;
        ASSERT_EQ(g.top.size(), c.top.size()) << where;
        for (size_t k = 0; k < g.top.size(); ++k) {
          EXPECT_EQ(g.top[k].first, c.top[k].first) << where << " top " << k;
          EXPECT_NEAR(g.top[k].second, c.top[k].second, kTolerance) << where << " top " << k;
        }
      }
    }
    expect_processors_saw_their_tokens(gpu_specs, got, kinds, graphs ? "graphs" : "eager");
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, CudaLogitsProcessorTest,
                         ::testing::ValuesIn(testing::fixture_names()), testing::fixture_test_name);

// A lone session decoding (B = 1: the bucket-1 graph) with a processor, and the step
// ahead: sessions decode with it on until steps run ahead, then one of them gets a
// processor (the step ahead holding it is settled), and the tokens after that are the
// CPU executor's with the same script; no step runs ahead while the processor is there.
TEST(CudaLogitsProcessorStepAheadTest, InstallingAProcessorSettlesTheStepAhead) {
  CELLM_SKIP_WITHOUT_GPU();
  const Fixture f = testing::load_fixture("mistral-tiny");
  auto w = load_weights(f);
  auto gpu = make_gpu(w, CudaPrecision::kF32, true, true);
  auto cpu = make_cpu(w);
  constexpr size_t kBefore = 8, kAfter = 10;
  struct Run {
    std::vector<std::vector<Token>> tokens;
    std::shared_ptr<ScriptedProcessor> processor;
    int64_t ahead_before = 0, ahead_after = 0;
  };
  const auto script = [&](Executor& e, CudaExecutor* cuda) {
    Run run;
    run.processor = std::make_shared<ScriptedProcessor>(Kind::kPenalty, f.vocab_size, 2);
    std::vector<SessionId> sids;
    std::vector<Position> pos;
    run.tokens.resize(3);
    BatchInput first;
    BatchOutput o;
    for (size_t i = 0; i < 3; ++i) {
      sids.push_back(*e.open_session());
      e.set_sampling(sids[i], SamplingParams{}, 0);
      auto buf = std::make_shared<const std::vector<Token>>(f.prompts[i].ids);
      first.inputs.push_back(make_input(sids[i], buf, 0, buf->size(), 0, true));
      pos.push_back(static_cast<Position>(buf->size()));
    }
    EXPECT_TRUE(e.execute(first, o).ok());
    for (size_t i = 0; i < 3; ++i) run.tokens[i].push_back(o.outputs[i]->tokens[0]);
    for (size_t step = 0; step < kBefore + kAfter; ++step) {
      if (step == kBefore) {
        if (cuda != nullptr) run.ahead_before = cuda->method_calls().decode_steps_ahead_used;
        EXPECT_TRUE(e.set_logits_processor(sids[1], run.processor));
      }
      BatchInput b;
      for (size_t i = 0; i < 3; ++i) {
        b.inputs.push_back(single_token(sids[i], run.tokens[i].back(), pos[i]++));
      }
      EXPECT_TRUE(e.execute(b, o).ok());
      for (size_t i = 0; i < 3; ++i) run.tokens[i].push_back(o.outputs[i]->tokens[0]);
    }
    if (cuda != nullptr) run.ahead_after = cuda->method_calls().decode_steps_ahead_used;
    // Session 1 alone, with its processor: a lone decode.
    for (size_t step = 0; step < 4; ++step) {
      BatchInput b;
      b.inputs.push_back(single_token(sids[1], run.tokens[1].back(), pos[1]++));
      EXPECT_TRUE(e.execute(b, o).ok());
      run.tokens[1].push_back(o.outputs[0]->tokens[0]);
    }
    for (SessionId sid : sids) e.close_session(sid);
    return run;
  };
  const Run want = script(*cpu, nullptr);
  const Run got = script(*gpu, gpu.get());
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_GT(got.ahead_before, 0) << "steps ran ahead before the processor was installed";
  EXPECT_EQ(got.ahead_after, got.ahead_before)
      << "no step may run ahead while a session of the batch has a processor";
  // accept() saw exactly session 1's tokens sampled after installation, in order.
  const std::vector<Token> after(got.tokens[1].begin() + 1 + kBefore, got.tokens[1].end());
  EXPECT_EQ(got.processor->accepted(), after);
  EXPECT_EQ(want.processor->accepted(), after);
  EXPECT_GT(gpu->method_calls().adjusted_rows, 0);
  EXPECT_EQ(gpu->kv_metrics().cells_in_use, 0);
}

// A processor is refused for an unknown session or one without a sampling policy, as on
// the CPU executor, and set_sampling removes it (the next steps have no adjustments).
TEST(CudaLogitsProcessorStepAheadTest, RefusedWithoutAPolicyAndRemovedBySetSampling) {
  CELLM_SKIP_WITHOUT_GPU();
  const Fixture f = testing::load_fixture("mistral-tiny");
  auto gpu = make_gpu(load_weights(f), CudaPrecision::kF32, true, false);
  auto p = std::make_shared<ScriptedProcessor>(Kind::kForce, f.vocab_size, 3);
  EXPECT_FALSE(gpu->set_logits_processor(12345, p));
  const SessionId sid = *gpu->open_session();
  EXPECT_FALSE(gpu->set_logits_processor(sid, p)) << "no sampling policy yet";
  gpu->set_sampling(sid, SamplingParams{}, 0);
  EXPECT_TRUE(gpu->set_logits_processor(sid, p));
  auto buf = std::make_shared<const std::vector<Token>>(f.prompts[0].ids);
  BatchInput first;
  first.inputs.push_back(make_input(sid, buf, 0, buf->size(), 0, true));
  BatchOutput o;
  ASSERT_TRUE(gpu->execute(first, o).ok());
  EXPECT_EQ(o.outputs[0]->tokens[0], p->forced_at(0));
  EXPECT_EQ(p->accepted().size(), 1u);
  gpu->set_sampling(sid, SamplingParams{}, 0);
  const int64_t adjusted = gpu->method_calls().adjusted_rows;
  BatchInput next;
  next.inputs.push_back(
      single_token(sid, o.outputs[0]->tokens[0], static_cast<Position>(buf->size())));
  ASSERT_TRUE(gpu->execute(next, o).ok());
  EXPECT_EQ(p->accepted().size(), 1u) << "set_sampling removed the processor";
  EXPECT_EQ(gpu->method_calls().adjusted_rows, adjusted);
  gpu->close_session(sid);
}

}  // namespace
}  // namespace cellm
