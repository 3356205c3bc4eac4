// Logits processors: the row transform against an element-by-element reference,
// the penalty processor against a straightforward recomputation from the whole
// history, validation, the chain, and SessionTable sampling with a processor.
#include "cellm/logits_processor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cellm/sampler.h"
#include "core/cell_pool.h"
#include "core/session_table.h"

namespace cellm {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Bitwise-equal floats, NaN equal to NaN.
bool SameFloat(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || a == b;
}

std::vector<uint64_t> MaskOf(const std::set<Token>& tokens, size_t words) {
  std::vector<uint64_t> mask(words, 0);
  for (Token t : tokens) mask[static_cast<size_t>(t) / 64] |= uint64_t{1} << (t % 64);
  return mask;
}

// The documented transform, one element at a time: its edit (if any), then the
// mask.
std::vector<float> ReferenceApply(std::vector<float> row, const LogitAdjustments& adj) {
  for (size_t t = 0; t < row.size(); ++t) {
    for (const LogitEdit& e : adj.edits) {
      if (e.token != static_cast<Token>(t)) continue;
      const float x = row[t];
      float scaled = x;
      if (x > 0.0f) scaled = x / e.scale;
      if (!(x > 0.0f)) scaled = x * e.scale;
      row[t] = scaled + e.bias;
    }
    if (adj.allowed.empty()) continue;
    bool allowed = false;
    if (t / 64 < adj.allowed.size()) allowed = ((adj.allowed[t / 64] >> (t % 64)) & 1u) == 1u;
    if (!allowed) row[t] = -kInf;
  }
  return row;
}

TEST(ApplyLogitAdjustmentsTest, ScaleFollowsTheSignOfTheLogit) {
  std::vector<float> row = {2.0f, -2.0f, 0.0f, 3.0f};
  LogitAdjustments adj;
  adj.edits = {{0, 2.0f, 0.0f}, {1, 2.0f, 0.0f}, {2, 2.0f, 0.5f}, {3, 0.5f, -1.0f}};
  apply_logit_adjustments(row, adj);
  EXPECT_EQ(row, (std::vector<float>{1.0f, -4.0f, 0.5f, 5.0f}));
}

TEST(ApplyLogitAdjustmentsTest, ShortMasksForbidUncoveredTokensAndOutOfRangeEditsAreIgnored) {
  std::vector<float> row(130, 1.0f);
  LogitAdjustments adj;
  adj.allowed = MaskOf({3, 64, 100}, 2);  // covers [0, 128)
  adj.edits = {{-1, 2.0f, 5.0f}, {130, 2.0f, 5.0f}, {3, 1.0f, 1.0f}};
  apply_logit_adjustments(row, adj);
  for (size_t t = 0; t < row.size(); ++t) {
    if (t == 3)
      EXPECT_EQ(row[t], 2.0f);
    else if (t == 64 || t == 100)
      EXPECT_EQ(row[t], 1.0f);
    else
      EXPECT_EQ(row[t], -kInf) << t;
  }
}

TEST(ApplyLogitAdjustmentsTest, MatchesTheElementwiseReferenceOnRandomRows) {
  std::mt19937 rng(1234);
  const std::vector<float> specials = {kInf, -kInf, kNaN, 0.0f, -0.0f};
  for (int trial = 0; trial < 400; ++trial) {
    const size_t vocab = 1 + rng() % 200;
    std::vector<float> row(vocab);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    for (float& x : row) x = (rng() % 10 == 0) ? specials[rng() % specials.size()] : normal(rng);
    LogitAdjustments adj;
    std::set<Token> edited;
    const int edits = static_cast<int>(rng() % 12);
    for (int i = 0; i < edits; ++i) {
      // Distinct tokens, some outside [0, vocab).
      const Token t = static_cast<Token>(rng() % (vocab + 20)) - 10;
      if (!edited.insert(t).second) continue;
      LogitEdit e;
      e.token = t;
      e.scale = (rng() % 3 == 0) ? 1.0f : 0.25f + static_cast<float>(rng() % 16) / 4.0f;
      e.bias = (rng() % 8 == 0) ? -kInf : normal(rng);
      adj.edits.push_back(e);
    }
    const int mask_kind = static_cast<int>(rng() % 4);  // none, exact, short, long
    if (mask_kind != 0) {
      size_t words = (vocab + 63) / 64;
      if (mask_kind == 2) words = rng() % words;
      if (mask_kind == 3) words += 1 + rng() % 2;
      adj.allowed.resize(words);
      for (uint64_t& w : adj.allowed) w = (uint64_t{rng()} << 32) | rng();
    }
    const std::vector<float> want = ReferenceApply(row, adj);
    std::vector<float> got = row;
    apply_logit_adjustments(got, adj);
    for (size_t t = 0; t < vocab; ++t) {
      ASSERT_TRUE(SameFloat(got[t], want[t]))
          << "trial " << trial << " token " << t << ": " << got[t] << " vs " << want[t];
    }
  }
}

// The penalties recomputed from the whole history for every token.
std::vector<float> ReferencePenalties(const std::vector<float>& row, const PenaltyParams& p,
                                      const std::vector<Token>& prompt,
                                      const std::vector<Token>& output) {
  std::vector<float> out = row;
  for (size_t t = 0; t < row.size(); ++t) {
    const Token tok = static_cast<Token>(t);
    int count = 0;
    for (Token o : output) count += (o == tok) ? 1 : 0;
    bool in_prompt = false;
    for (Token q : prompt) in_prompt = in_prompt || q == tok;
    float x = row[t];
    if (in_prompt || count > 0) x = x > 0.0f ? x / p.repetition_penalty : x * p.repetition_penalty;
    x -= p.frequency_penalty * static_cast<float>(count);
    if (count > 0) x -= p.presence_penalty;
    for (const auto& [bt, b] : p.logit_bias) {
      if (bt == tok) x += b;
    }
    for (Token s : p.stop_tokens) {
      if (s == tok && static_cast<int32_t>(output.size()) < p.min_tokens) x = -kInf;
    }
    out[t] = x;
  }
  return out;
}

TEST(PenaltyProcessorTest, MatchesAReferenceOverRandomSequences) {
  std::mt19937 rng(99);
  constexpr int32_t kVocab = 40;
  std::uniform_real_distribution<float> pen(-2.0f, 2.0f);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  for (int trial = 0; trial < 200; ++trial) {
    PenaltyParams p;
    if (rng() % 3 != 0) p.presence_penalty = pen(rng);
    if (rng() % 3 != 0) p.frequency_penalty = pen(rng);
    if (rng() % 3 != 0) p.repetition_penalty = 0.5f + static_cast<float>(rng() % 8) / 4.0f;
    std::set<Token> biased;
    for (int i = static_cast<int>(rng() % 5); i > 0; --i) {
      const Token t = static_cast<Token>(rng() % kVocab);
      if (biased.insert(t).second) p.logit_bias.push_back({t, pen(rng) * 50.0f});
    }
    if (rng() % 2 == 0) {
      p.min_tokens = static_cast<int32_t>(rng() % 10);
      for (int i = static_cast<int>(1 + rng() % 3); i > 0; --i)
        p.stop_tokens.push_back(static_cast<Token>(rng() % kVocab));
    }
    ASSERT_TRUE(validate_penalties(p, kVocab).ok()) << validate_penalties(p, kVocab).message();
    std::vector<Token> prompt(rng() % 30);
    for (Token& t : prompt) t = static_cast<Token>(rng() % (kVocab / 2));  // repeats
    std::unique_ptr<LogitsProcessor> proc = make_penalty_processor(p, prompt);
    std::vector<Token> output;
    LogitAdjustments adj;
    for (int step = 0; step < 30; ++step) {
      proc->prepare(adj);
      EXPECT_TRUE(adj.allowed.empty());
      std::set<Token> seen;
      for (const LogitEdit& e : adj.edits) {
        ASSERT_TRUE(e.token >= 0 && e.token < kVocab) << e.token;
        ASSERT_TRUE(seen.insert(e.token).second) << "two edits of token " << e.token;
      }
      std::vector<float> row(kVocab);
      for (float& x : row) x = normal(rng);
      row[rng() % kVocab] = 0.0f;
      const std::vector<float> want = ReferencePenalties(row, p, prompt, output);
      std::vector<float> got = row;
      apply_logit_adjustments(got, adj);
      for (int32_t t = 0; t < kVocab; ++t) {
        if (std::isinf(want[t])) {
          ASSERT_EQ(got[t], want[t]) << "trial " << trial << " step " << step << " token " << t;
        } else {
          ASSERT_NEAR(got[t], want[t], 1e-4f)
              << "trial " << trial << " step " << step << " token " << t;
        }
      }
      // Favour repeats and stop tokens so counts and min_tokens matter.
      Token next = static_cast<Token>(rng() % kVocab);
      if (!output.empty() && rng() % 3 == 0) next = output[rng() % output.size()];
      if (!p.stop_tokens.empty() && rng() % 5 == 0) next = p.stop_tokens[0];
      proc->accept(next);
      output.push_back(next);
    }
  }
}

TEST(PenaltyProcessorTest, MinTokensForbidsStopTokensUntilReached) {
  PenaltyParams p;
  p.min_tokens = 2;
  p.stop_tokens = {1, 4, 1};
  std::unique_ptr<LogitsProcessor> proc = make_penalty_processor(p, {});
  LogitAdjustments adj;
  for (int step = 0; step < 4; ++step) {
    proc->prepare(adj);
    if (step < 2) {
      ASSERT_EQ(adj.edits.size(), 2u);  // one edit per distinct stop token
      for (const LogitEdit& e : adj.edits) EXPECT_EQ(e.bias, -kInf);
    } else {
      EXPECT_TRUE(adj.edits.empty());
    }
    proc->accept(0);
  }
}

TEST(PenaltyProcessorTest, RepetitionCountsPromptTokensAndPresenceOnlyOutput) {
  PenaltyParams p;
  p.repetition_penalty = 2.0f;
  p.presence_penalty = 1.0f;
  const std::vector<Token> prompt = {5, 5, 7};
  std::unique_ptr<LogitsProcessor> proc = make_penalty_processor(p, prompt);
  LogitAdjustments adj;
  proc->prepare(adj);
  std::map<Token, LogitEdit> by_token;
  for (const LogitEdit& e : adj.edits) by_token[e.token] = e;
  ASSERT_EQ(by_token.size(), 2u);
  EXPECT_EQ(by_token[5].scale, 2.0f);
  EXPECT_EQ(by_token[5].bias, 0.0f);  // presence counts output tokens only
  proc->accept(5);
  proc->accept(9);
  proc->prepare(adj);
  by_token.clear();
  for (const LogitEdit& e : adj.edits) by_token[e.token] = e;
  ASSERT_EQ(by_token.size(), 3u);
  EXPECT_EQ(by_token[5].bias, -1.0f);
  EXPECT_EQ(by_token[9].scale, 2.0f);
  EXPECT_EQ(by_token[9].bias, -1.0f);
  EXPECT_EQ(by_token[7].bias, 0.0f);
}

TEST(ValidatePenaltiesTest, ErrorsNameTheField) {
  struct Case {
    PenaltyParams params;
    std::string field;
  };
  std::vector<Case> cases;
  auto add = [&](auto edit, std::string field) {
    PenaltyParams p;
    edit(p);
    cases.push_back({p, std::move(field)});
  };
  add([](PenaltyParams& p) { p.presence_penalty = 2.5f; }, "presence_penalty");
  add([](PenaltyParams& p) { p.presence_penalty = kNaN; }, "presence_penalty");
  add([](PenaltyParams& p) { p.frequency_penalty = -2.01f; }, "frequency_penalty");
  add([](PenaltyParams& p) { p.frequency_penalty = kInf; }, "frequency_penalty");
  add([](PenaltyParams& p) { p.repetition_penalty = 0.0f; }, "repetition_penalty");
  add([](PenaltyParams& p) { p.repetition_penalty = kInf; }, "repetition_penalty");
  add([](PenaltyParams& p) { p.min_tokens = -1; }, "min_tokens");
  add([](PenaltyParams& p) { p.logit_bias = {{10, 1.0f}}; }, "logit_bias");
  add([](PenaltyParams& p) { p.logit_bias = {{-1, 1.0f}}; }, "logit_bias");
  add([](PenaltyParams& p) { p.logit_bias = {{3, 1.0f}, {3, 2.0f}}; }, "logit_bias");
  add([](PenaltyParams& p) { p.logit_bias = {{3, 100.5f}}; }, "logit_bias");
  add([](PenaltyParams& p) { p.logit_bias = {{3, kNaN}}; }, "logit_bias");
  add([](PenaltyParams& p) { p.stop_tokens = {10}; }, "stop_tokens");
  for (const Case& c : cases) {
    const Status s = validate_penalties(c.params, 10);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(s.message().find(c.field), std::string::npos) << s.message();
  }
  PenaltyParams edge;
  edge.presence_penalty = -2.0f;
  edge.frequency_penalty = 2.0f;
  edge.repetition_penalty = 0.01f;
  edge.logit_bias = {{0, -100.0f}, {9, 100.0f}};
  edge.min_tokens = 5;
  edge.stop_tokens = {9};
  EXPECT_TRUE(validate_penalties(edge, 10).ok()) << validate_penalties(edge, 10).message();
  EXPECT_EQ(validate_penalties(PenaltyParams{}, 0).code(), StatusCode::kInvalidArgument);
}

TEST(ValidatePenaltiesTest, NeutralOnlyWhenNothingChanges) {
  PenaltyParams p;
  EXPECT_TRUE(penalties_are_neutral(p));
  p.logit_bias = {{1, 0.0f}};
  p.min_tokens = 3;  // no stop tokens: nothing to forbid
  EXPECT_TRUE(penalties_are_neutral(p));
  p.stop_tokens = {2};
  EXPECT_FALSE(penalties_are_neutral(p));
  p = {};
  p.logit_bias = {{1, -0.5f}};
  EXPECT_FALSE(penalties_are_neutral(p));
  p = {};
  p.repetition_penalty = 1.1f;
  EXPECT_FALSE(penalties_are_neutral(p));
  p = {};
  p.presence_penalty = 0.1f;
  EXPECT_FALSE(penalties_are_neutral(p));
  p = {};
  p.frequency_penalty = -0.1f;
  EXPECT_FALSE(penalties_are_neutral(p));
}

// Gives a fixed mask and edits, and records what it accepted.
class FixedProcessor final : public LogitsProcessor {
 public:
  FixedProcessor(std::vector<uint64_t> allowed, std::vector<LogitEdit> edits,
                 std::vector<Token>* accepted)
      : allowed_(std::move(allowed)), edits_(std::move(edits)), accepted_(accepted) {}
  void prepare(LogitAdjustments& out) override {
    out.clear();
    out.allowed = allowed_;
    out.edits = edits_;
  }
  void accept(Token token) override { accepted_->push_back(token); }

 private:
  std::vector<uint64_t> allowed_;
  std::vector<LogitEdit> edits_;
  std::vector<Token>* accepted_;
};

TEST(ChainLogitsProcessorsTest, IntersectsMasksAndConcatenatesEdits) {
  std::vector<Token> a_seen, b_seen, c_seen;
  std::vector<std::unique_ptr<LogitsProcessor>> members;
  members.push_back(std::make_unique<FixedProcessor>(
      MaskOf({1, 2, 70, 100}, 2), std::vector<LogitEdit>{{1, 2.0f, 0.0f}}, &a_seen));
  members.push_back(nullptr);  // dropped
  members.push_back(std::make_unique<FixedProcessor>(
      std::vector<uint64_t>{}, std::vector<LogitEdit>{{2, 1.0f, -1.0f}, {3, 1.0f, 1.0f}}, &b_seen));
  members.push_back(
      std::make_unique<FixedProcessor>(MaskOf({2, 3, 70}, 3), std::vector<LogitEdit>{}, &c_seen));
  std::unique_ptr<LogitsProcessor> chain = chain_logits_processors(std::move(members));
  LogitAdjustments adj;
  adj.edits = {{0, 5.0f, 5.0f}};  // cleared by prepare
  chain->prepare(adj);
  EXPECT_EQ(adj.allowed, MaskOf({2, 70}, 2));
  ASSERT_EQ(adj.edits.size(), 3u);
  EXPECT_EQ(adj.edits[0].token, 1);
  EXPECT_EQ(adj.edits[1].token, 2);
  EXPECT_EQ(adj.edits[2].token, 3);
  chain->accept(2);
  chain->accept(70);
  EXPECT_EQ(a_seen, (std::vector<Token>{2, 70}));
  EXPECT_EQ(b_seen, a_seen);
  EXPECT_EQ(c_seen, a_seen);
}

TEST(ChainLogitsProcessorsTest, DisjointMasksAllowNothingAndOneMemberIsItself) {
  std::vector<Token> seen;
  std::vector<std::unique_ptr<LogitsProcessor>> members;
  members.push_back(
      std::make_unique<FixedProcessor>(MaskOf({1}, 1), std::vector<LogitEdit>{}, &seen));
  members.push_back(
      std::make_unique<FixedProcessor>(MaskOf({2}, 1), std::vector<LogitEdit>{}, &seen));
  std::unique_ptr<LogitsProcessor> chain = chain_logits_processors(std::move(members));
  LogitAdjustments adj;
  chain->prepare(adj);
  ASSERT_FALSE(adj.allowed.empty());  // empty would mean "everything allowed"
  for (uint64_t w : adj.allowed) EXPECT_EQ(w, 0u);

  // An empty mask (everything allowed) leaves the other member's mask.
  members.clear();
  members.push_back(
      std::make_unique<FixedProcessor>(std::vector<uint64_t>{}, std::vector<LogitEdit>{}, &seen));
  members.push_back(
      std::make_unique<FixedProcessor>(MaskOf({5}, 1), std::vector<LogitEdit>{}, &seen));
  members.push_back(nullptr);
  std::unique_ptr<LogitsProcessor> chain2 = chain_logits_processors(std::move(members));
  chain2->prepare(adj);
  EXPECT_EQ(adj.allowed, MaskOf({5}, 1));

  members.clear();
  auto single = std::make_unique<FixedProcessor>(MaskOf({5}, 1), std::vector<LogitEdit>{}, &seen);
  LogitsProcessor* raw = single.get();
  members.push_back(std::move(single));
  EXPECT_EQ(chain_logits_processors(std::move(members)).get(), raw);

  // No member: a processor that changes nothing.
  std::unique_ptr<LogitsProcessor> none = chain_logits_processors({});
  adj.edits = {{0, 2.0f, 0.0f}};
  none->prepare(adj);
  EXPECT_TRUE(adj.empty());
}

TEST(SessionTableProcessorTest, SeededSamplesRepeatAndLogprobsAreOfTheRawRow) {
  constexpr int32_t kVocab = 70;
  CellPool pool{64};
  SessionTable table{pool, 4, 16, kVocab};
  SamplingParams params;
  params.temperature = 1.0f;
  params.num_logprobs = 2;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> rows(40, std::vector<float>(kVocab));
  for (auto& row : rows)
    for (float& x : row) x = normal(rng);

  const std::set<Token> allowed = {3, 8, 65, 66, 69};
  auto run = [&]() {
    const SessionId sid = *table.open();
    table.set_sampling(sid, params, 42);
    std::vector<std::unique_ptr<LogitsProcessor>> members;
    std::vector<Token> ignored;
    members.push_back(
        std::make_unique<FixedProcessor>(MaskOf(allowed, 2), std::vector<LogitEdit>{}, &ignored));
    PenaltyParams p;
    p.frequency_penalty = 1.5f;
    p.logit_bias = {{3, 2.0f}};
    members.push_back(make_penalty_processor(p, {}));
    EXPECT_TRUE(table.set_logits_processor(
        sid, std::shared_ptr<LogitsProcessor>(chain_logits_processors(std::move(members)))));
    EXPECT_NE(table.logits_processor(sid), nullptr);
    std::vector<SampledToken> out;
    std::vector<float> scratch;
    for (Position p = 0; p < static_cast<Position>(rows.size()); ++p) {
      const std::optional<SampledToken> got = table.sample_with_logprobs(sid, rows[p], p);
      EXPECT_TRUE(got.has_value());
      if (!got) break;
      EXPECT_TRUE(allowed.count(got->token)) << got->token;
      EXPECT_TRUE(got->logprobs.has_value());
      if (got->logprobs) {
        const TokenLogprobs want = token_logprobs(rows[p], got->token, 2, scratch);
        EXPECT_EQ(got->logprobs->logprob, want.logprob);
        EXPECT_EQ(got->logprobs->top, want.top);
      }
      out.push_back(*got);
    }
    table.close(sid);
    return out;
  };
  const std::vector<SampledToken> first = run();
  const std::vector<SampledToken> second = run();
  ASSERT_EQ(first.size(), rows.size());
  ASSERT_EQ(second.size(), rows.size());
  std::set<Token> distinct;
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ(first[i].token, second[i].token) << i;
    distinct.insert(first[i].token);
  }
  EXPECT_GT(distinct.size(), 1u);  // the frequency penalty spreads the draws

  // Without a processor the session samples the raw row; set_sampling drops it.
  const SessionId sid = *table.open();
  table.set_sampling(sid, params, 42);
  EXPECT_TRUE(table.set_logits_processor(sid, make_penalty_processor(PenaltyParams{}, {})));
  table.set_sampling(sid, params, 42);
  EXPECT_EQ(table.logits_processor(sid), nullptr);
  EXPECT_FALSE(table.set_logits_processor(99, make_penalty_processor(PenaltyParams{}, {})));
}

}  // namespace
}  // namespace cellm
