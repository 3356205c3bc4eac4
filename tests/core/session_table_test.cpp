#include "core/session_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace cellm {
namespace {

using Rows = std::vector<std::optional<int32_t>>;

// An input over a whole buffer [offset, offset + size) based at `position`.
Input MakeInput(SessionId sid, std::vector<Token> tokens, Position position, size_t offset,
                size_t size, bool produce_output) {
  Input in;
  in.sid = sid;
  in.produce_output = produce_output;
  in.offset = offset;
  in.size = size;
  in.tokens = std::make_shared<const std::vector<Token>>(std::move(tokens));
  in.position = position;
  return in;
}

// An input holding exactly `tokens` at [start, start + tokens.size()).
Input Slice(SessionId sid, std::vector<Token> tokens, Position start, bool produce_output = false) {
  const size_t n = tokens.size();
  return MakeInput(sid, std::move(tokens), start, 0, n, produce_output);
}

BatchInput Batch(std::vector<Input> inputs) {
  BatchInput batch;
  batch.inputs = std::move(inputs);
  return batch;
}

class SessionTableTest : public ::testing::Test {
 protected:
  static constexpr int32_t kCells = 64;
  static constexpr int32_t kSessions = 3;
  static constexpr int32_t kSessionTokens = 16;
  static constexpr int32_t kVocab = 8;

  // Packs and declares the batch, as an executor does for one forward.
  void Commit(const BatchInput& batch) {
    Result<PackedStep> step = table.pack(batch);
    ASSERT_TRUE(step.ok()) << step.status().to_string();
    ASSERT_TRUE(pool.declare_step(step->seq_ids).has_value());
    pool.check_invariants();
  }
  Position PosOf(SessionId sid) const { return pool.pos(*table.seq_of(sid)); }

  CellPool pool{kCells};
  SessionTable table{pool, kSessions, kSessionTokens, kVocab};
};

TEST_F(SessionTableTest, PacksInputsInOrderWithTheirRows) {
  const SessionId a = *table.open();
  const SessionId b = *table.open();
  Result<PackedStep> step =
      table.pack(Batch({Slice(a, {1, 2, 3}, 0, true), Slice(b, {4, 5}, 0, false)}));
  ASSERT_TRUE(step.ok()) << step.status().to_string();
  const SeqId sa = *table.seq_of(a);
  const SeqId sb = *table.seq_of(b);
  EXPECT_NE(sa, sb);
  EXPECT_EQ(step->tokens, (std::vector<Token>{1, 2, 3, 4, 5}));
  EXPECT_EQ(step->positions, (std::vector<Position>{0, 1, 2, 0, 1}));
  EXPECT_EQ(step->seq_ids, (std::vector<SeqId>{sa, sa, sa, sb, sb}));
  EXPECT_EQ(step->sids, (std::vector<SessionId>{a, a, a, b, b}));
  EXPECT_EQ(step->output_rows, (Rows{2, std::nullopt}));
  // pack declares nothing.
  EXPECT_EQ(pool.used_cells(), 0);
  EXPECT_EQ(PosOf(a), 0);
  // A slice of a larger buffer takes its tokens and positions from the buffer base.
  Result<PackedStep> mid = table.pack(Batch({MakeInput(a, {9, 8, 7, 6}, -2, 2, 2, true)}));
  ASSERT_TRUE(mid.ok()) << mid.status().to_string();
  EXPECT_EQ(mid->tokens, (std::vector<Token>{7, 6}));
  EXPECT_EQ(mid->positions, (std::vector<Position>{0, 1}));
  EXPECT_EQ(mid->output_rows, (Rows{1}));
}

TEST_F(SessionTableTest, ConsecutiveChunksOfOnePromptAbut) {
  const SessionId a = *table.open();
  const std::vector<Token> prompt = {1, 2, 3, 4, 5, 6, 7};
  Result<PackedStep> step = table.pack(
      Batch({MakeInput(a, prompt, 0, 0, 3, false), MakeInput(a, prompt, 0, 3, 3, false)}));
  ASSERT_TRUE(step.ok()) << step.status().to_string();
  EXPECT_EQ(step->tokens, (std::vector<Token>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(step->positions, (std::vector<Position>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(step->output_rows, (Rows{std::nullopt, std::nullopt}));
  Commit(Batch({MakeInput(a, prompt, 0, 0, 3, false), MakeInput(a, prompt, 0, 3, 3, false)}));
  EXPECT_EQ(PosOf(a), 6);
  // The last chunk continues where the committed ones stopped.
  Result<PackedStep> last = table.pack(Batch({MakeInput(a, prompt, 0, 6, 1, true)}));
  ASSERT_TRUE(last.ok()) << last.status().to_string();
  EXPECT_EQ(last->positions, (std::vector<Position>{6}));
  EXPECT_EQ(last->output_rows, (Rows{0}));
}

TEST_F(SessionTableTest, RewindsOnlyAfterEveryInputChecks) {
  const SessionId a = *table.open();
  const SessionId b = *table.open();
  Commit(Batch({Slice(a, {1, 2, 3, 4, 5}, 0)}));
  ASSERT_EQ(PosOf(a), 5);
  ASSERT_EQ(pool.used_cells(), 5);
  // a rewinds to 2, but b's input leaves a gap: the batch is refused before any rewind.
  Result<PackedStep> refused = table.pack(Batch({Slice(a, {9}, 2, true), Slice(b, {7}, 1)}));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(),
            "input 1 of session " + std::to_string(b) +
                ": starts at position 1 but the session continues at 0 (a gap)");
  EXPECT_EQ(PosOf(a), 5);
  EXPECT_EQ(pool.used_cells(), 5);
  // Without the gap the rewind truncates a to 2 and frees its cells.
  Result<PackedStep> step = table.pack(Batch({Slice(a, {9}, 2, true), Slice(b, {7}, 0)}));
  ASSERT_TRUE(step.ok()) << step.status().to_string();
  EXPECT_EQ(PosOf(a), 2);
  EXPECT_EQ(pool.used_cells(), 2);
  EXPECT_EQ(step->positions, (std::vector<Position>{2, 0}));
  ASSERT_TRUE(pool.declare_step(step->seq_ids).has_value());
  EXPECT_EQ(PosOf(a), 3);
  pool.check_invariants();
}

TEST_F(SessionTableTest, RefusesOverlapsRestartsAndOverruns) {
  const SessionId a = *table.open();
  const SessionId b = *table.open();
  Commit(Batch({Slice(a, {1, 2, 3}, 0)}));
  const std::string sa = "session " + std::to_string(a);
  const std::string sb = "session " + std::to_string(b);
  struct Case {
    BatchInput batch;
    StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {Batch({Slice(a, {4}, 3), Slice(99, {1}, 0)}), StatusCode::kInvalidArgument,
       "input 1: session 99 is not open"},
      {Batch({MakeInput(a, {4, 5}, 3, 1, 0, false)}), StatusCode::kInvalidArgument,
       "input 0 of " + sa + ": empty slice"},
      {Batch({MakeInput(a, {4, 5}, 3, 1, 2, false)}), StatusCode::kInvalidArgument,
       "input 0 of " + sa + ": slice [1, 3) lies outside its token buffer of 2 tokens"},
      {Batch({Slice(b, {1, 2}, 0), Slice(b, {3}, 1)}), StatusCode::kInvalidArgument,
       "input 1 of " + sb +
           ": starts at position 1, overlapping the batch's earlier input that ends at 2"},
      {Batch({Slice(a, {1, 2}, 0)}), StatusCode::kInvalidArgument,
       "input 0 of " + sa + ": reopens from the start (position 0) a session of 3 tokens"},
      {Batch({Slice(b, {1}, 0), Slice(a, std::vector<Token>(14, 1), 3)}),
       StatusCode::kOutOfResources,
       "input 1 of " + sa + ": slice [3, 17) ends past max_session_tokens 16"},
  };
  for (const Case& c : cases) {
    Result<PackedStep> step = table.pack(c.batch);
    ASSERT_FALSE(step.ok()) << c.message;
    EXPECT_EQ(step.status().code(), c.code) << c.message;
    EXPECT_EQ(step.status().message(), c.message);
    // Nothing changed.
    EXPECT_EQ(PosOf(a), 3);
    EXPECT_EQ(PosOf(b), 0);
    EXPECT_EQ(pool.used_cells(), 3);
    pool.check_invariants();
  }
  // Filling the budget exactly is fine.
  EXPECT_TRUE(table.pack(Batch({Slice(a, std::vector<Token>(13, 1), 3)})).ok());
}

TEST_F(SessionTableTest, SessionsAreBoundedAndIdsNeverReused) {
  EXPECT_EQ(table.open(), SessionId{1});
  EXPECT_EQ(table.open(), SessionId{2});
  EXPECT_EQ(table.open(), SessionId{3});
  EXPECT_EQ(table.size(), 3);
  EXPECT_FALSE(table.open().has_value());
  EXPECT_FALSE(table.clone(1, 0).has_value());
  Commit(Batch({Slice(2, {1, 2}, 0)}));
  table.close(2);
  table.close(2);   // unknown now: ignored
  table.close(77);  // never open: ignored
  EXPECT_EQ(table.size(), 2);
  EXPECT_FALSE(table.seq_of(2).has_value());
  EXPECT_EQ(pool.used_cells(), 0);
  EXPECT_EQ(pool.num_seqs(), 2);
  EXPECT_EQ(table.open(), SessionId{4});
  EXPECT_FALSE(table.open().has_value());
  table.close(1);
  const std::optional<SessionId> clone = table.clone(3, 0);
  EXPECT_EQ(clone, SessionId{5});
  pool.check_invariants();
}

TEST_F(SessionTableTest, CloneSharesTheSourcePrefix) {
  const SessionId a = *table.open();
  Commit(Batch({Slice(a, {1, 2, 3, 4, 5}, 0)}));
  const std::optional<SessionId> c = table.clone(a, 3);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(PosOf(*c), 3);
  EXPECT_EQ(pool.used_cells(), 5);
  const std::span<const CellId> src = pool.cells_of(*table.seq_of(a));
  const std::span<const CellId> shared = pool.cells_of(*table.seq_of(*c));
  EXPECT_TRUE(std::equal(shared.begin(), shared.end(), src.begin()));
  // The clone continues at 3; a gap past it is refused; the source is untouched.
  EXPECT_FALSE(table.pack(Batch({Slice(*c, {9}, 4)})).ok());
  Commit(Batch({Slice(*c, {9}, 3, true)}));
  EXPECT_EQ(PosOf(*c), 4);
  EXPECT_EQ(PosOf(a), 5);
  EXPECT_EQ(pool.used_cells(), 6);
  // Beyond the source, negative, or from an unknown session: refused.
  EXPECT_FALSE(table.clone(a, 6).has_value());
  EXPECT_FALSE(table.clone(a, -1).has_value());
  EXPECT_FALSE(table.clone(42, 0).has_value());
  EXPECT_EQ(table.size(), 2);
  // A clone at the full length shares everything.
  const std::optional<SessionId> d = table.clone(a, 5);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(PosOf(*d), 5);
  EXPECT_EQ(pool.used_cells(), 6);
  pool.check_invariants();
}

TEST_F(SessionTableTest, SamplesEachSessionsRowWithItsOwnPolicy) {
  const SessionId greedy = *table.open();
  const SessionId sampled = *table.open();
  const SessionId bare = *table.open();
  SamplingParams top2;
  top2.temperature = 1.0f;
  top2.top_k = 2;
  table.set_sampling(greedy, SamplingParams{}, 5);
  table.set_sampling(sampled, top2, 11);
  table.set_sampling(99, top2, 1);  // unknown: ignored
  const std::vector<float> row = {0.0f, 1.0f, 0.5f, 3.0f, 2.9f, -1.0f, 0.2f, 0.1f};
  EXPECT_EQ(table.sample(greedy, row, 0), Token{3});
  EXPECT_EQ(table.sample(greedy, row, 9), Token{3});
  std::set<Token> drawn;
  std::vector<float> scratch;
  for (Position p = 0; p < 40; ++p) {
    const std::optional<Token> t = table.sample(sampled, row, p);
    ASSERT_TRUE(t.has_value());
    EXPECT_EQ(*t, sample_token(row, top2, sampling_uniform(11, p), scratch));
    drawn.insert(*t);
  }
  EXPECT_EQ(drawn, (std::set<Token>{3, 4}));
  ASSERT_NE(table.policy_of(sampled), nullptr);
  EXPECT_EQ(table.policy_of(sampled)->seed, 11u);
  EXPECT_EQ(table.policy_of(sampled)->params.top_k, 2);
  // No policy, an unknown session, or a row that is not vocab-wide: nullopt.
  EXPECT_EQ(table.policy_of(bare), nullptr);
  EXPECT_FALSE(table.sample(bare, row, 0).has_value());
  EXPECT_FALSE(table.sample(99, row, 0).has_value());
  EXPECT_FALSE(table.sample(greedy, std::span<const float>(row).first(7), 0).has_value());
  // Without a seed a random one is drawn and kept.
  table.set_sampling(bare, top2, std::nullopt);
  ASSERT_NE(table.policy_of(bare), nullptr);
  EXPECT_TRUE(table.sample(bare, row, 0).has_value());
}

TEST_F(SessionTableTest, ASeededSessionSamplesBySeedAndPositionWhateverElseIsSampled) {
  const SessionId a = *table.open();
  const SessionId b = *table.open();
  const SessionId other = *table.open();
  SamplingParams params;
  params.temperature = 1.0f;
  table.set_sampling(a, params, 2024);
  table.set_sampling(b, params, 2024);
  table.set_sampling(other, params, 7);
  const std::vector<float> flat(kVocab, 0.0f);
  // a alone, in order; b interleaved with another session and in reverse order.
  std::vector<Token> alone;
  for (Position p = 0; p < 32; ++p) alone.push_back(*table.sample(a, flat, p));
  std::vector<Token> crowded(32);
  std::vector<Token> others;
  for (Position p = 31; p >= 0; --p) {
    others.push_back(*table.sample(other, flat, p));
    crowded[static_cast<size_t>(p)] = *table.sample(b, flat, p);
  }
  EXPECT_EQ(alone, crowded);
  std::reverse(others.begin(), others.end());
  EXPECT_NE(others, alone);  // a different seed draws differently
}

TEST_F(SessionTableTest, SamplesWithLogprobsOnlyWhenThePolicyAsksForThem) {
  const SessionId with = *table.open();
  const SessionId without = *table.open();
  const SessionId bare = *table.open();
  SamplingParams top2;
  top2.temperature = 1.0f;
  top2.num_logprobs = 3;
  table.set_sampling(with, top2, 11);
  table.set_sampling(without, SamplingParams{}, 11);
  const std::vector<float> row = {0.0f, 1.0f, 0.5f, 3.0f, 2.9f, -1.0f, 0.2f, 0.1f};
  std::vector<float> scratch;
  for (Position p = 0; p < 20; ++p) {
    const std::optional<SampledToken> got = table.sample_with_logprobs(with, row, p);
    ASSERT_TRUE(got.has_value());
    // The same draw as sample(), and the raw row's log-softmax (no temperature).
    EXPECT_EQ(got->token, sample_token(row, top2, sampling_uniform(11, p), scratch));
    ASSERT_TRUE(got->logprobs.has_value());
    const TokenLogprobs want = token_logprobs(row, got->token, 3, scratch);
    EXPECT_EQ(got->logprobs->logprob, want.logprob);
    EXPECT_EQ(got->logprobs->top, want.top);
  }
  EXPECT_TRUE(table.wants_logprobs(with));
  EXPECT_FALSE(table.wants_logprobs(without));
  EXPECT_FALSE(table.wants_logprobs(bare));
  const std::optional<SampledToken> greedy = table.sample_with_logprobs(without, row, 0);
  ASSERT_TRUE(greedy.has_value());
  EXPECT_EQ(greedy->token, Token{3});
  EXPECT_FALSE(greedy->logprobs.has_value());
  // A token sampled elsewhere: its logprobs from the row, or nullopt when none
  // are asked for, the session has no policy, or the row is not vocab-wide.
  const std::optional<TokenLogprobs> elsewhere = table.logprobs(with, row, 5);
  ASSERT_TRUE(elsewhere.has_value());
  EXPECT_EQ(elsewhere->logprob, token_logprobs(row, 5, 3, scratch).logprob);
  ASSERT_EQ(elsewhere->top.size(), 3u);
  EXPECT_EQ(elsewhere->top[0].first, 3);
  EXPECT_FALSE(table.logprobs(without, row, 5).has_value());
  EXPECT_FALSE(table.logprobs(bare, row, 5).has_value());
  EXPECT_FALSE(table.logprobs(with, std::span<const float>(row).first(7), 5).has_value());
  EXPECT_FALSE(table.sample_with_logprobs(bare, row, 0).has_value());
}

TEST(SelectRowsTest, KeepsOnlyTheSlicesWantedRows) {
  PackedStep step;
  step.tokens.assign(10, 0);
  step.output_rows = {2, std::nullopt, 6, 9};
  SliceRows head = select_rows(step, 0, 4);
  EXPECT_EQ(head.selector, (std::vector<int32_t>{2}));
  EXPECT_EQ(head.inputs, (std::vector<int32_t>{0}));
  SliceRows middle = select_rows(step, 4, 4);
  EXPECT_EQ(middle.selector, (std::vector<int32_t>{2}));
  EXPECT_EQ(middle.inputs, (std::vector<int32_t>{2}));
  SliceRows tail = select_rows(step, 8, 2);
  EXPECT_EQ(tail.selector, (std::vector<int32_t>{1}));
  EXPECT_EQ(tail.inputs, (std::vector<int32_t>{3}));
  SliceRows all = select_rows(step, 0, 10);
  EXPECT_EQ(all.selector, (std::vector<int32_t>{2, 6, 9}));
  EXPECT_EQ(all.inputs, (std::vector<int32_t>{0, 2, 3}));
  // None wanted: the last row, answering no input.
  SliceRows none = select_rows(step, 3, 3);
  EXPECT_EQ(none.selector, (std::vector<int32_t>{2}));
  EXPECT_TRUE(none.inputs.empty());
  SliceRows single = select_rows(step, 7, 1);
  EXPECT_EQ(single.selector, (std::vector<int32_t>{0}));
  EXPECT_TRUE(single.inputs.empty());
}

}  // namespace
}  // namespace cellm
