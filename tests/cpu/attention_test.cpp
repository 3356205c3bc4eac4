#include "cpu/kernels/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <span>
#include <vector>

#include "cpu/kernels/reference.h"
#include "kernel_test_util.h"

namespace cellm::cpu {
namespace {

using testing::all_close;
using testing::random_floats;

// A small KV pool holding several sequences whose cells interleave (as the
// lowest-free-cell policy leaves them), plus query rows at chosen positions.
struct Scenario {
  int64_t n_heads, n_kv_heads, head_dim, max_cells;
  std::vector<std::vector<int32_t>> sequences;  // cell list of each sequence
  std::vector<int32_t> row_seq;                 // sequence of each query row
  std::vector<int32_t> row_pos;                 // position of each query row
};

void expect_matches_reference(const Scenario& s, int32_t window, int threads, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t rows = static_cast<int64_t>(s.row_pos.size());
  const int64_t kv_stride = s.n_kv_heads * s.head_dim;
  const std::vector<float> k_cells = random_floats(rng, s.max_cells * kv_stride, -2.0f, 2.0f);
  const std::vector<float> v_cells = random_floats(rng, s.max_cells * kv_stride);
  const std::vector<float> q = random_floats(rng, rows * s.n_heads * s.head_dim, -2.0f, 2.0f);
  std::vector<std::span<const int32_t>> cells_of_row;
  for (int32_t seq : s.row_seq) cells_of_row.emplace_back(s.sequences[static_cast<size_t>(seq)]);

  std::vector<float> got(q.size(), NAN);
  ThreadPool pool(threads);
  attention(pool, AttentionArgs{.q = q.data(),
                                .n_rows = rows,
                                .n_heads = s.n_heads,
                                .n_kv_heads = s.n_kv_heads,
                                .head_dim = s.head_dim,
                                .k_cells = k_cells.data(),
                                .v_cells = v_cells.data(),
                                .max_cells = s.max_cells,
                                .q_pos = s.row_pos,
                                .cells_of_row = cells_of_row,
                                .window = window,
                                .out = got.data()});

  std::vector<float> want(q.size());
  const int64_t group = s.n_heads / s.n_kv_heads;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < s.n_heads; ++h) {
      const int64_t off = (r * s.n_heads + h) * s.head_dim;
      reference::attention_one(q.data() + off, s.head_dim, k_cells.data(), v_cells.data(),
                               kv_stride, h / group, s.row_pos[static_cast<size_t>(r)],
                               cells_of_row[static_cast<size_t>(r)], window, want.data() + off);
    }
  }
  // Outputs are convex combinations of V entries in [-1, 1]: 2e-6 absolute.
  EXPECT_TRUE(all_close(got, want, 0.0, 2e-6)) << "window " << window << " threads " << threads;
}

// Three sequences sharing a pool of 200 cells: lengths 1, 37 (ends mid score
// block) and 150, cells interleaved and out of order.
Scenario mixed_batch(int64_t n_heads, int64_t n_kv_heads, int64_t head_dim) {
  Scenario s{n_heads, n_kv_heads, head_dim, 200, {}, {}, {}};
  std::vector<int32_t> free_cells(200);
  for (int32_t c = 0; c < 200; ++c) free_cells[static_cast<size_t>(c)] = (c * 73) % 200;
  size_t next = 0;
  for (int32_t len : {1, 37, 150}) {
    std::vector<int32_t> cells;
    for (int32_t i = 0; i < len; ++i) cells.push_back(free_cells[next++]);
    s.sequences.push_back(cells);
  }
  // A decode of sequence 0, a 3-token prefill chunk ending sequence 1, a decode
  // at the end of sequence 2 and a query in its middle (a chunk mid-prompt).
  s.row_seq = {0, 1, 1, 1, 2, 2};
  s.row_pos = {0, 34, 35, 36, 149, 64};
  return s;
}

TEST(AttentionTest, FullHistoryMatchesTheReferenceForEveryRowAndHead) {
  expect_matches_reference(mixed_batch(4, 4, 64), 0, 3, 1);
}

TEST(AttentionTest, GroupedQueryHeadsReadTheirSharedKvHead) {
  expect_matches_reference(mixed_batch(8, 2, 32), 0, 2, 2);
  expect_matches_reference(mixed_batch(6, 1, 17), 0, 1, 3);
  // Whole vectors without a register-accumulator instantiation (3 x 16 lanes).
  expect_matches_reference(mixed_batch(3, 1, 48), 0, 2, 8);
  // Groups of 2, 3 (SmolLM2's 9 heads over 3), 4 and 3 query heads a KV head, at head_dim
  // 64, 128 and 32.
  expect_matches_reference(mixed_batch(8, 4, 64), 0, 2, 9);
  expect_matches_reference(mixed_batch(9, 3, 64), 0, 2, 10);
  expect_matches_reference(mixed_batch(12, 3, 64), 0, 2, 11);
  expect_matches_reference(mixed_batch(8, 2, 128), 0, 2, 12);
  expect_matches_reference(mixed_batch(6, 2, 32), 0, 3, 13);
}

TEST(AttentionTest, SlidingWindowAttendsOnlyTheLastWindowPositions) {
  for (int32_t window : {1, 5, 33, 64, 1000})
    expect_matches_reference(mixed_batch(4, 2, 64), window, 2, 4);
}

TEST(AttentionTest, OddHeadDimsAndASingleRowMatch) {
  Scenario s{3, 3, 7, 9, {{4, 2, 8, 0, 1}}, {0}, {4}};
  expect_matches_reference(s, 0, 1, 5);
  Scenario big{2, 1, 128, 300, {{}}, {0}, {299}};
  for (int32_t c = 299; c >= 0; --c) big.sequences[0].push_back(c);
  expect_matches_reference(big, 0, 2, 6);
  expect_matches_reference(big, 100, 2, 7);
}

TEST(AttentionTest, LaterPositionsAndOtherSequencesDoNotLeakIn) {
  // Row at position 1 of a 3-cell sequence: poisoning cell 2 (position 2) and
  // every cell of another sequence must not change its output.
  const int64_t hd = 4;
  std::vector<float> k(6 * hd, 0.5f), v(6 * hd, 0.0f);
  for (int c = 0; c < 6; ++c) {
    for (int i = 0; i < hd; ++i) v[c * hd + i] = static_cast<float>(c);
  }
  for (int i = 0; i < hd; ++i) {
    k[2 * hd + i] = 1e30f;
    v[2 * hd + i] = NAN;
    v[5 * hd + i] = NAN;
  }
  const std::vector<int32_t> seq_a = {0, 3, 2};  // positions 0, 1, 2
  const std::vector<std::span<const int32_t>> cells = {seq_a};
  const std::vector<int32_t> pos = {1};
  const std::vector<float> q(hd, 1.0f);
  std::vector<float> out(hd, NAN);
  ThreadPool pool(1);
  attention(pool, AttentionArgs{.q = q.data(),
                                .n_rows = 1,
                                .n_heads = 1,
                                .n_kv_heads = 1,
                                .head_dim = hd,
                                .k_cells = k.data(),
                                .v_cells = v.data(),
                                .max_cells = 6,
                                .q_pos = pos,
                                .cells_of_row = cells,
                                .window = 0,
                                .out = out.data()});
  // Equal scores over cells 0 and 3: the mean of their values, 1.5.
  for (float o : out) EXPECT_FLOAT_EQ(o, 1.5f);
}

TEST(WriteKvTest, RowsLandInTheirCellsAndNothingElseChanges) {
  const int64_t row = 6, max_cells = 5;
  std::vector<float> k_cells(max_cells * row, -1.0f), v_cells(max_cells * row, -2.0f);
  std::vector<float> k(3 * row), v(3 * row);
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = static_cast<float>(i);
    v[i] = 100.0f + static_cast<float>(i);
  }
  const std::vector<int32_t> cells = {4, 0, 2};
  write_kv(k.data(), v.data(), 3, row, cells, k_cells.data(), v_cells.data(), max_cells);
  for (int64_t c = 0; c < max_cells; ++c) {
    for (int64_t i = 0; i < row; ++i) {
      const int64_t r = c == 4 ? 0 : c == 0 ? 1 : c == 2 ? 2 : -1;
      EXPECT_EQ(k_cells[c * row + i], r < 0 ? -1.0f : k[r * row + i]) << c << "," << i;
      EXPECT_EQ(v_cells[c * row + i], r < 0 ? -2.0f : v[r * row + i]) << c << "," << i;
    }
  }
}

}  // namespace
}  // namespace cellm::cpu
