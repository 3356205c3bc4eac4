// The attention of prompt rows against its CPU twin: a step's prefill rows on either split
// kernel, and the prefill kernel (AttentionParams::row_runs) over whole steps or the row
// ranges attention_row_ranges cuts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attention_test_util.h"
#include "cuda/kernels/attention.h"

namespace cellm::cuda::attention_test {
namespace {

template <typename T>
class AttentionTest : public ::testing::Test {};
using ElementTypes = ::testing::Types<float, __nv_bfloat16>;
TYPED_TEST_SUITE(AttentionTest, ElementTypes);

// sharing half of sequence 0) followed by the first 17 positions of sequence 0.
TYPED_TEST(AttentionTest, PrefillRowsMatchTheCpuTwin) {
  CELLM_SKIP_WITHOUT_GPU();
  uint32_t seed = 200;
  for (const int64_t head_dim : {8, 64, 128, 20}) {
    for (const int64_t ratio : {1, 4}) {
      for (const int32_t window : {0, 5}) {
        for (const int32_t context : {37, 300, 2049}) {
          for (const int32_t max_context : {context, 3000}) {
            const Geometry geo{2 * ratio, 2, head_dim, window, max_context};
            SCOPED_TRACE(describe(geo, context, 37));
            const std::vector<SequenceSpec> specs = {{context}, {context, 0, context / 2}};
            std::vector<std::pair<int32_t, int32_t>> rows;
            for (int32_t i = 0; i < 20; ++i) rows.emplace_back(1, context - 20 + i);
            for (int32_t i = 0; i < 17; ++i) rows.emplace_back(0, i);
            expect_gpu_matches_cpu<TypeParam>(make_scenario<TypeParam>(geo, specs, rows, seed++));
            if (::testing::Test::HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

TEST(AttentionTensorCoreTest, PrefillRowsMatchTheCpuTwin) {
  CELLM_SKIP_WITHOUT_GPU();
  // As PrefillRowsMatchTheCpuTwin, at the groups that test does not reach.
  uint32_t seed = 800;
  for (const int64_t head_dim : {64, 128}) {
    for (const int64_t group : {8, 12, 16}) {
      for (const int32_t window : {0, 40}) {
        for (const int32_t context : {37, 300, 2049}) {
          const Geometry geo{2 * group, 2, head_dim, window, 3000};
          SCOPED_TRACE(describe(geo, context, 37));
          const std::vector<SequenceSpec> specs = {{context}, {context, 0, context / 2}};
          std::vector<std::pair<int32_t, int32_t>> rows;
          for (int32_t i = 0; i < 20; ++i) rows.emplace_back(1, context - 20 + i);
          for (int32_t i = 0; i < 17; ++i) rows.emplace_back(0, i);
          // A prefill's rows of a sequence are its newest positions: 20 of them here.
          expect_tensor_cores_match_cpu(make_scenario<Bf16>(geo, specs, rows, seed++),
                                        AttentionPath::kAuto, 0, 20);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
}

// The prefill kernel (row_runs) over every row of a scenario, or over the ranges
// attention_row_ranges cuts (each launched on its rows alone, as the CUDA forward does).
void expect_row_runs_match_cpu(const Scenario& s, bool by_ranges) {
  DeviceScenario<Bf16> d(s);
  const AttentionParams<Bf16> p = d.params(s);
  ASSERT_TRUE(attention_uses_tensor_cores(p));
  if (by_ranges) {
    for (const AttentionRowRange& range : attention_row_ranges(s.row_seq)) {
      AttentionParams<Bf16> rows = attention_rows(p, range.begin, range.end);
      rows.row_runs = range.runs;
      CELLM_ASSERT_CUDA(launch_attention<Bf16>(rows, nullptr));
    }
  } else {
    AttentionParams<Bf16> runs = p;
    runs.row_runs = true;
    CELLM_ASSERT_CUDA(launch_attention<Bf16>(runs, nullptr));
  }
  CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
  expect_all_close(testing::to_floats(d.out.download()), cpu_attention(s), kAbsTol<Bf16>,
                   kRelTol<Bf16>, "attention out");
  expect_counters_zero(d.workspace);
}

// The rows of a step the prefill kernel must serve: one sequence's chunk, two chunks
// (a clone's newest positions, then the first of the sequence it clones), and rows of
// many sequences (decode rows) with a sequence's rows interleaved with another's.
enum class RowsLayout { kChunk, kTwoChunks, kMixed };

Scenario prefill_scenario(const Geometry& geo, RowsLayout layout, int32_t context, int32_t n_rows,
                          uint32_t seed) {
  std::vector<SequenceSpec> specs;
  std::vector<std::pair<int32_t, int32_t>> rows;
  switch (layout) {
    case RowsLayout::kChunk:
      specs = {{context}};
      for (int32_t i = 0; i < n_rows; ++i) rows.emplace_back(0, context - n_rows + i);
      break;
    case RowsLayout::kTwoChunks:
      specs = {{context}, {context, 0, context / 2}};
      for (int32_t i = 0; i < n_rows / 2; ++i) rows.emplace_back(1, context - n_rows / 2 + i);
      for (int32_t i = 0; i < n_rows - n_rows / 2; ++i) rows.emplace_back(0, i);
      break;
    case RowsLayout::kMixed: {
      std::mt19937 rng(seed);
      decode_layout(context, n_rows / 2, rng, &specs, &rows);
      // Sequence 0's newest positions alternate with sequence 1's.
      for (int32_t i = 0; i < n_rows - n_rows / 2; ++i) {
        const int32_t seq = i % 2;
        const int32_t length = specs[static_cast<size_t>(seq)].length;
        rows.emplace_back(seq, std::max(0, length - 1 - i / 2));
      }
      break;
    }
  }
  return make_scenario<Bf16>(geo, specs, rows, seed);
}

TEST(AttentionPrefillTest, RowRunsMatchTheCpuTwinAtEveryGroupAndLayout) {
  CELLM_SKIP_WITHOUT_GPU();
  // Groups 1-16 (64 / group rows a block; 12 is not one the prefill kernel takes, and
  // falls back to the split kernel), rows that end mid-block, contexts around the
  // 64-key stage, windows that cut inside a block's rows.
  uint32_t seed = 1200;
  for (const int64_t head_dim : {64, 128}) {
    for (const int64_t group : {1, 2, 4, 8, 12, 16}) {
      for (const int32_t window : {0, 40}) {
        for (const int32_t context : {37, 64, 65, 300, 1100}) {
          for (const RowsLayout layout :
               {RowsLayout::kChunk, RowsLayout::kTwoChunks, RowsLayout::kMixed}) {
            const Geometry geo{2 * group, 2, head_dim, window, 2048};
            const int32_t n_rows = std::min(context, 37);
            SCOPED_TRACE(describe(geo, context, n_rows) +
                         " layout=" + std::to_string(static_cast<int>(layout)));
            expect_row_runs_match_cpu(prefill_scenario(geo, layout, context, n_rows, seed++),
                                      false);
            if (::testing::Test::HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

TEST(AttentionPrefillTest, AStepCutIntoRangesMatchesTheCpuTwin) {
  CELLM_SKIP_WITHOUT_GPU();
  // Llama shapes (32 query heads over 8 kv heads): a step as the scheduler packs one:
  // 5 decode rows, a 300-row chunk of a long prompt, a 3-row chunk (under the run
  // length: the split kernel), and the first 70 rows of a new prompt.
  uint32_t seed = 1300;
  for (const int64_t head_dim : {64, 128}) {
    const Geometry geo{32, 8, head_dim, 0, 4096};
    std::vector<SequenceSpec> specs = {{1500}, {900}, {70}};
    std::vector<std::pair<int32_t, int32_t>> rows;
    for (int32_t i = 0; i < 5; ++i) {
      specs.push_back({100 + 317 * i});
      rows.emplace_back(3 + i, 100 + 317 * i - 1);
    }
    for (int32_t i = 0; i < 300; ++i) rows.emplace_back(0, 1200 + i);
    for (int32_t i = 0; i < 3; ++i) rows.emplace_back(1, 897 + i);
    for (int32_t i = 0; i < 70; ++i) rows.emplace_back(2, i);
    const Scenario s = make_scenario<Bf16>(geo, specs, rows, seed++);
    SCOPED_TRACE("head_dim=" + std::to_string(head_dim));
    expect_row_runs_match_cpu(s, true);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// Host-only.
TEST(AttentionPrefillTest, RowRangesKeepRunsOfSixteenRowsOfOneSequence) {
  using R = AttentionRowRange;
  auto same = [](const std::vector<R>& got, const std::vector<R>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].begin, want[i].begin) << i;
      EXPECT_EQ(got[i].end, want[i].end) << i;
      EXPECT_EQ(got[i].runs, want[i].runs) << i;
    }
  };
  EXPECT_TRUE(attention_row_ranges({}).empty());
  // Decode rows only: one range of single rows.
  same(attention_row_ranges(std::vector<int32_t>{4, 1, 7}), {{0, 3, false}});
  // 3 decode rows, 20 rows of sequence 9, 5 of 2 (too few), 16 of 3 then 16 of 4
  // (neighbouring runs: one range).
  std::vector<int32_t> seqs = {4, 1, 7};
  seqs.insert(seqs.end(), 20, 9);
  seqs.insert(seqs.end(), 5, 2);
  seqs.insert(seqs.end(), 16, 3);
  seqs.insert(seqs.end(), 16, 4);
  same(attention_row_ranges(seqs), {{0, 3, false}, {3, 23, true}, {23, 28, false}, {28, 60, true}});
  // One prompt's chunk; the run length is a parameter.
  same(attention_row_ranges(std::vector<int32_t>(512, 0)), {{0, 512, true}});
  same(attention_row_ranges(std::vector<int32_t>{5, 5, 6}, 2), {{0, 2, true}, {2, 3, false}});
}

}  // namespace
}  // namespace cellm::cuda::attention_test
