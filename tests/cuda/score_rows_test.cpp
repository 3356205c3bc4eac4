// The CUDA executor's choice of rows to score (cuda/score_rows.h): host logic, so it
// runs without a GPU. Every fed token of a scored input with a successor in its buffer
// is scored; the selection merges those rows with the sampling ones, in slice order.
#include "cuda/score_rows.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

namespace cellm::cuda {
namespace {

Input make_input(SessionId sid, std::vector<Token> buffer, size_t offset, size_t size, bool score,
                 bool produce_output) {
  Input in;
  in.sid = sid;
  in.tokens = std::make_shared<const std::vector<Token>>(std::move(buffer));
  in.offset = offset;
  in.size = size;
  in.score = score;
  in.produce_output = produce_output;
  return in;
}

// A: a scored chunk in the middle of its prompt (every row has a successor); B: an
// unscored decode; C: the scored last chunk of a prompt (its last row has none).
BatchInput batch() {
  BatchInput b;
  b.inputs.push_back(make_input(1, {10, 11, 12, 13, 14, 15, 16, 17, 18, 19}, 0, 6, true, false));
  b.inputs.push_back(make_input(2, {20}, 0, 1, false, true));
  b.inputs.push_back(make_input(3, {30, 31, 32, 33, 34}, 2, 3, true, true));
  return b;
}

TEST(ScoreRowsTest, NoScoredInputMeansNoTargets) {
  BatchInput b = batch();
  for (Input& in : b.inputs) in.score = false;
  EXPECT_FALSE(score_targets(b).has_value());
  const std::vector<int32_t> sampling = {6, 9};
  const SliceSelection sel = select_with_scores(sampling, nullptr, 0, 10);
  EXPECT_EQ(sel.rows, sampling);
  EXPECT_EQ(sel.sampling, (std::vector<int32_t>{0, 1}));
  EXPECT_TRUE(sel.scored.empty());
}

TEST(ScoreRowsTest, TargetsAreEachScoredRowsSuccessor) {
  const std::optional<ScoreTargets> t = score_targets(batch());
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->input, (std::vector<int32_t>{0, 0, 0, 0, 0, 0, 1, 2, 2, 2}));
  EXPECT_EQ(t->target, (std::vector<Token>{11, 12, 13, 14, 15, 16, -1, 33, 34, -1}));
}

TEST(ScoreRowsTest, TheSelectionMergesSamplingAndScoredRowsInOrder) {
  const std::optional<ScoreTargets> t = score_targets(batch());
  ASSERT_TRUE(t.has_value());
  // The whole step in one slice: B's row 6 and C's row 9 sample.
  SliceSelection sel = select_with_scores(std::vector<int32_t>{6, 9}, &*t, 0, 10);
  EXPECT_EQ(sel.rows, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(sel.sampling, (std::vector<int32_t>{6, 9}));
  EXPECT_EQ(sel.scored, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 7, 8}));
  EXPECT_EQ(sel.scored_at, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 7, 8}));
  // Packed rows [4, 8) as one slice: slice row 2 (packed 6) samples; slice rows 0, 1
  // and 3 (packed 4, 5, 7) are scored.
  sel = select_with_scores(std::vector<int32_t>{2}, &*t, 4, 4);
  EXPECT_EQ(sel.rows, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(sel.sampling, (std::vector<int32_t>{2}));
  EXPECT_EQ(sel.scored, (std::vector<int32_t>{0, 1, 3}));
  EXPECT_EQ(sel.scored_at, (std::vector<int32_t>{4, 5, 7}));
  // Packed rows [8, 10): row 8 is scored, row 9 (the end of C's buffer) only samples.
  sel = select_with_scores(std::vector<int32_t>{1}, &*t, 8, 2);
  EXPECT_EQ(sel.rows, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(sel.sampling, (std::vector<int32_t>{1}));
  EXPECT_EQ(sel.scored, (std::vector<int32_t>{0}));
  EXPECT_EQ(sel.scored_at, (std::vector<int32_t>{8}));
}

}  // namespace
}  // namespace cellm::cuda
