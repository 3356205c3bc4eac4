// How the attention cuts a launch: which kernel takes it, the split count, the warps a
// block and the cluster fold (host-only cases run without a GPU), and the cluster fold's
// bits against the workspace fold's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "attention_test_util.h"
#include "cuda/kernels/attention.h"
#include "cuda/kernels/attention_mma.h"

namespace cellm::cuda::attention_test {
namespace {

// Host-only: needs no device, so it also runs on machines without a GPU.
TEST(AttentionPathTest, TensorCoresTakeBf16HeadDims64And128UpToGroup16WhenAligned) {
  // The pointers are never dereferenced: only their alignment matters.
  auto params = [](int64_t n_heads, int64_t n_kv_heads, int64_t head_dim) {
    AttentionParams<Bf16> p;
    p.qkv = p.k_pool = p.v_pool = reinterpret_cast<const Bf16*>(uintptr_t{0x10000});
    p.n_heads = n_heads;
    p.n_kv_heads = n_kv_heads;
    p.head_dim = head_dim;
    p.q_offset = 2 * n_kv_heads * head_dim;
    p.row_stride = p.q_offset + n_heads * head_dim + 8;
    return p;
  };
  EXPECT_TRUE(attention_uses_tensor_cores(params(32, 8, 128)));
  EXPECT_TRUE(attention_uses_tensor_cores(params(2, 2, 64)));
  EXPECT_TRUE(attention_uses_tensor_cores(params(32, 2, 128)));   // group 16
  EXPECT_FALSE(attention_uses_tensor_cores(params(34, 2, 128)));  // group 17
  EXPECT_FALSE(attention_uses_tensor_cores(params(8, 2, 8)));
  EXPECT_FALSE(attention_uses_tensor_cores(params(8, 2, 96)));
  AttentionParams<Bf16> p = params(32, 8, 128);
  p.path = AttentionPath::kCudaCores;
  EXPECT_FALSE(attention_uses_tensor_cores(p));
  p = params(32, 8, 128);
  p.q_offset += 4;  // queries not 16-byte aligned
  EXPECT_FALSE(attention_uses_tensor_cores(p));
  p = params(32, 8, 128);
  p.k_pool += 1;
  EXPECT_FALSE(attention_uses_tensor_cores(p));
  AttentionParams<float> f;
  f.qkv = f.k_pool = f.v_pool = reinterpret_cast<const float*>(uintptr_t{0x10000});
  f.n_heads = 32;
  f.n_kv_heads = 8;
  f.head_dim = 128;
  f.row_stride = 8192;
  EXPECT_FALSE(attention_uses_tensor_cores(f));  // f32 stays on CUDA cores
}

// Host-only, as above.
TEST(AttentionSplitTest, WarpsPerBlockFollowTheLaunchsBlocksAndTheSms) {
  // 132 SMs: one wave is 396 blocks of 4 warps, 792 of 2; 8 warps while a block has an
  // SM of its own.
  EXPECT_EQ(detail::attention_mma_block_warps(1, 1, 8, 132), 8);
  EXPECT_EQ(detail::attention_mma_block_warps(1, 16, 8, 132), 8);  // 128 blocks
  EXPECT_EQ(detail::attention_mma_block_warps(16, 1, 8, 132), 8);
  EXPECT_EQ(detail::attention_mma_block_warps(17, 1, 8, 132), 4);  // 136 blocks
  EXPECT_EQ(detail::attention_mma_block_warps(1, 17, 8, 132), 4);
  EXPECT_EQ(detail::attention_mma_block_warps(6, 3, 8, 132), 4);    // 144 blocks
  EXPECT_EQ(detail::attention_mma_block_warps(16, 4, 8, 132), 4);   // splits: 4
  EXPECT_EQ(detail::attention_mma_block_warps(49, 1, 8, 132), 4);   // 392 blocks fit
  EXPECT_EQ(detail::attention_mma_block_warps(64, 1, 8, 132), 2);   // 512: 1.3 waves of 4
  EXPECT_EQ(detail::attention_mma_block_warps(99, 1, 8, 132), 2);   // 792 fit
  EXPECT_EQ(detail::attention_mma_block_warps(100, 1, 8, 132), 4);  // beyond one wave
  EXPECT_EQ(detail::attention_mma_block_warps(256, 1, 8, 132), 4);
}

// Host-only, as above.
TEST(AttentionSplitTest, AFewRowsFoldInClustersOfAtMostEightSplitsThatFitAtOnce) {
  // One row of 8 kv heads: 16 splits come down to 8 (64 one-SM blocks, 8 clusters).
  EXPECT_EQ(detail::attention_mma_cluster_splits(1, 16, 8, 132, 16), 8);
  EXPECT_EQ(detail::attention_mma_cluster_splits(1, 4, 8, 132, 16), 4);
  EXPECT_EQ(detail::attention_mma_cluster_splits(2, 8, 8, 132, 16), 8);  // 128 blocks
  // No split, clusters that do not all fit at once, blocks that share SMs: the workspace.
  EXPECT_EQ(detail::attention_mma_cluster_splits(1, 1, 8, 132, 16), 0);
  EXPECT_EQ(detail::attention_mma_cluster_splits(1, 16, 8, 132, 7), 0);
  EXPECT_EQ(detail::attention_mma_cluster_splits(1, 16, 8, 132, 0), 0);
  EXPECT_EQ(detail::attention_mma_cluster_splits(3, 8, 8, 132, 64), 0);  // 192 blocks
}

TEST(AttentionTensorCoreTest, ClusterFoldMatchesTheWorkspaceFoldBitForBit) {
  CELLM_SKIP_WITHOUT_GPU();
  int device = 0, major = 0;
  CELLM_ASSERT_CUDA(cudaGetDevice(&device));
  CELLM_ASSERT_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (major < 9) GTEST_SKIP() << "thread-block clusters need sm_90";
  // A launch of 8 clusters of 8 one-SM blocks either way (a target and a minimum of 64
  // blocks: 8 splits; one row of 8 kv heads, or two of 4; clusters of 4 at group 16), so
  // both folds merge the same
  // partials: the same operations in the same order, the same bits. Rows of 1 to 8
  // chunks (a cluster's blocks past a short row idle through its barriers), head_dim 64
  // and 128, groups 1, 4 and 16, a window; and the cluster launch leaves the
  // workspace's partials untouched (NaN).
  constexpr int64_t kBlocks = 64;
  uint32_t seed = 950;
  for (const int64_t head_dim : {64, 128}) {
    for (const int64_t group : {1, 4, 16}) {
      for (const int32_t window : {0, 700}) {
        for (const auto& lengths : std::vector<std::vector<int32_t>>{
                 {300}, {1000}, {2049}, {4096}, {4096, 300}, {2049, 700}, {257, 1000}}) {
          const int64_t n_rows = static_cast<int64_t>(lengths.size());
          const Geometry geo{8 / n_rows * group, 8 / n_rows, head_dim, window, 4096};
          SCOPED_TRACE(describe(geo, lengths[0], n_rows) +
                       " last=" + std::to_string(lengths.back()));
          // 8 splits (4 at group 16: the CUDA-core kernel's two head tiles count).
          const int32_t splits =
              attention_num_splits(n_rows, geo.n_heads, geo.n_kv_heads, 4096, kBlocks, kBlocks);
          ASSERT_EQ(splits, group == 16 ? 4 : 8);
          std::vector<SequenceSpec> specs;
          std::vector<std::pair<int32_t, int32_t>> rows;
          for (const int32_t length : lengths) {
            rows.emplace_back(static_cast<int32_t>(specs.size()), length - 1);
            specs.push_back({length});
          }
          const Scenario s = make_scenario<Bf16>(geo, specs, rows, seed++);
          std::vector<float> outs[2];
          for (const bool cluster : {true, false}) {
            DeviceScenario<Bf16> d(s);
            AttentionParams<Bf16> p = d.params(s);
            p.cluster_fold = cluster;
            p.target_blocks = kBlocks;
            p.min_blocks = kBlocks;
            for (int i = 0; i < 2; ++i) CELLM_ASSERT_CUDA(launch_attention<Bf16>(p, nullptr));
            CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
            outs[cluster ? 0 : 1] = testing::to_floats(d.out.download());
            expect_all_close(outs[cluster ? 0 : 1], cpu_attention(s), kAbsTol<Bf16>, kRelTol<Bf16>,
                             cluster ? "cluster fold" : "workspace fold");
            expect_counters_zero(d.workspace);
            const std::vector<float> ws = d.workspace.download();
            const auto written = std::count_if(ws.begin() + kAttentionWorkspaceCounters, ws.end(),
                                               [](float x) { return !std::isnan(x); });
            if (cluster) {
              EXPECT_EQ(written, 0) << "the cluster fold wrote workspace partials";
            } else {
              EXPECT_GT(written, 0) << "the workspace fold wrote no partial";
            }
          }
          ASSERT_EQ(outs[0].size(), outs[1].size());
          size_t differ = 0;
          for (size_t i = 0; i < outs[0].size(); ++i) differ += outs[0][i] != outs[1][i] ? 1 : 0;
          EXPECT_EQ(differ, 0u) << "outputs where the two folds differ";
          if (::testing::Test::HasFailure()) return;
        }
      }
    }
  }
}

TEST(AttentionTensorCoreTest, OneLongRowFoldsInEightSplitsAndMatchesTheCpuTwin) {
  CELLM_SKIP_WITHOUT_GPU();
  // One row of 8 kv heads would take 16 splits; the cluster fold takes it in at most 8
  // chunks (chunks of 128 keys and longer). Lengths at and around the chunk edges of
  // the long bench row (1,024-1,280 keys), a window, and a budget of 32k.
  uint32_t seed = 980;
  for (const int64_t head_dim : {64, 128}) {
    for (const int32_t max_context : {4096, 32768}) {
      for (const int32_t length : {257, 1024, 1025, 1152, 1280, 4096}) {
        for (const int32_t window : {0, 1000}) {
          const Geometry geo{32, 8, head_dim, window, max_context};
          SCOPED_TRACE(describe(geo, length, 1));
          const Scenario s = make_scenario<Bf16>(geo, {{length}}, {{0, length - 1}}, seed++);
          expect_tensor_cores_match_cpu(s, AttentionPath::kAuto, 0, 1);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST(AttentionSplitTest, SplitCountDependsOnlyOnTheShape) {
  // Budgets of at most 32 positions never split.
  EXPECT_EQ(attention_num_splits(1, 32, 8, 1), 1);
  EXPECT_EQ(attention_num_splits(1, 32, 8, 32), 1);
  // One row of 8 kv heads (group 4: one tile each): 8 blocks per split; at most one
  // split per 32 budget positions, ~512 blocks and 64 splits in all, and no more than a
  // row can use: max(~128 blocks' worth, a chunk per 1,024 budget positions).
  EXPECT_EQ(attention_num_splits(1, 32, 8, 33), 2);
  EXPECT_EQ(attention_num_splits(1, 32, 8, 300), 10);
  EXPECT_EQ(attention_num_splits(1, 32, 8, 8192), 16);
  EXPECT_EQ(attention_num_splits(1, 32, 8, 32768), 32);
  EXPECT_EQ(attention_num_splits(1, 32, 2, 8192), 32);  // group 16: two tiles
  EXPECT_EQ(attention_num_splits(1, 32, 8, 8192, 4096), 16);
  EXPECT_EQ(attention_num_splits(1, 32, 8, 8192, 4096, 4096), 64);
  // More rows: fewer splits; 128 blocks a split and a budget of 1,024 do not split.
  EXPECT_EQ(attention_num_splits(4, 32, 8, 8192), 8);
  EXPECT_EQ(attention_num_splits(16, 32, 8, 1024), 1);
  EXPECT_EQ(attention_num_splits(16, 32, 8, 2048), 2);
  EXPECT_EQ(attention_num_splits(16, 32, 8, 8192), 4);
  EXPECT_EQ(attention_num_splits(64, 32, 8, 8192), 1);
  // Group 12 takes two tiles of 8 heads per kv head: twice the blocks per split.
  EXPECT_EQ(attention_num_splits(4, 24, 2, 8192), 8);
  EXPECT_EQ(attention_num_splits(16, 24, 2, 8192), 8);
  // The least chunks of a row above 256 positions: ~128 blocks, within [1, n_splits].
  EXPECT_EQ(attention_min_chunks(1, 32, 8, 16), 16);
  EXPECT_EQ(attention_min_chunks(1, 32, 8, 10), 10);
  EXPECT_EQ(attention_min_chunks(4, 32, 8, 8), 4);
  EXPECT_EQ(attention_min_chunks(16, 32, 8, 4), 1);
  EXPECT_EQ(attention_min_chunks(4, 32, 8, 8, 4096), 8);
  EXPECT_EQ(attention_min_chunks(1, 32, 8, 1), 1);
  // The workspace: int32 counters, then f32 acc, max and sum of every (row, head, split).
  EXPECT_EQ(attention_workspace_bytes(4096, 32, 8, 128, 32), 0u);
  EXPECT_EQ(attention_workspace_bytes(1, 32, 8, 128, 8192),
            sizeof(int32_t) * kAttentionWorkspaceCounters + sizeof(float) * 16 * 32 * (128 + 2));
  for (const int64_t rows : {1, 2, 7, 37, 256, 1000}) {
    for (const int32_t budget : {1, 100, 256, 257, 2049, 8192, 131072}) {
      const int32_t splits = attention_num_splits(rows, 8, 2, budget);
      EXPECT_GE(splits, 1);
      EXPECT_LE(splits, 64);
      // The workspace for `rows` serves every smaller launch.
      const size_t bytes = attention_workspace_bytes(rows, 8, 2, 64, budget);
      for (int64_t fewer = 1; fewer <= rows; fewer += 1 + fewer / 3) {
        const int32_t s = attention_num_splits(fewer, 8, 2, budget);
        if (s > 1) {
          EXPECT_GE(bytes, sizeof(int32_t) * kAttentionWorkspaceCounters +
                               sizeof(float) * static_cast<size_t>(fewer * 8 * s * 66));
          // Every (row, kv head, head tile) of a launch that splits has a counter.
          EXPECT_LE(fewer * 2, kAttentionWorkspaceCounters);
        }
      }
    }
  }
}

}  // namespace
}  // namespace cellm::cuda::attention_test
