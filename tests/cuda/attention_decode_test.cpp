// The decode attention (launch_attention, cuda/kernels/attention.h) against its CPU twin:
// decode rows of both kernels (CUDA cores and tensor cores), their splits and folds, and a
// captured graph replayed over new tables and positions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attention_test_util.h"
#include "cuda/kernels/attention.h"
#include "cuda/kernels/kv_write.h"
#include "cuda/launch_control.h"

namespace cellm::cuda::attention_test {
namespace {

template <typename T>
class AttentionTest : public ::testing::Test {};
using ElementTypes = ::testing::Types<float, __nv_bfloat16>;
TYPED_TEST_SUITE(AttentionTest, ElementTypes);

TYPED_TEST(AttentionTest, DecodeRowsMatchTheCpuTwin) {
  CELLM_SKIP_WITHOUT_GPU();
  uint32_t seed = 100;
  for (const int64_t head_dim : {8, 64, 128, 20}) {
    for (const int64_t ratio : {1, 4, 12}) {
      for (const int32_t window : {0, 5}) {
        for (const int32_t context : {1, 13, 2049}) {
          for (const int64_t n_rows : {1, 37}) {
            for (const int32_t max_context : {context, 3000}) {
              const Geometry geo{2 * ratio, 2, head_dim, window, max_context};
              SCOPED_TRACE(describe(geo, context, n_rows));
              std::mt19937 rng(seed);
              std::vector<SequenceSpec> specs;
              std::vector<std::pair<int32_t, int32_t>> rows;
              decode_layout(context, n_rows, rng, &specs, &rows);
              expect_gpu_matches_cpu<TypeParam>(make_scenario<TypeParam>(geo, specs, rows, seed++));
              if (::testing::Test::HasFatalFailure()) return;
            }
          }
        }
      }
    }
  }
}

TYPED_TEST(AttentionTest, BatchOfOneAtEveryChunkEdge) {
  CELLM_SKIP_WITHOUT_GPU();
  // max_context 4096 with one row: 64 splits; the chunk is a multiple of 64 cut from the
  // row's length (one chunk up to 256 positions), so contexts around multiples of 16 (a
  // tile), 64, 256 and 64 * 64 straddle tile and chunk edges.
  uint32_t seed = 300;
  for (const int32_t context :
       {1, 15, 16, 17, 63, 64, 65, 255, 256, 257, 1023, 1024, 1025, 1040, 1041, 4095, 4096}) {
    const Geometry geo{8, 2, 128, 0, 4096};
    SCOPED_TRACE(describe(geo, context, 1));
    const std::vector<SequenceSpec> specs = {{context}};
    expect_gpu_matches_cpu<TypeParam>(
        make_scenario<TypeParam>(geo, specs, {{0, context - 1}}, seed++));
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// Chunks the kernels cut the context of a row at `pos` into (attention_span.cuh).
int32_t active_chunks(int32_t pos, int32_t window, int32_t n_splits, int32_t min_chunks) {
  const int64_t hi = int64_t{pos} + 1;
  const int64_t len = hi - (window > 0 ? std::max<int64_t>(0, hi - window) : 0);
  const int64_t chunks =
      len <= 256 ? 1 : std::min<int64_t>(n_splits, std::max<int64_t>(min_chunks, len / 1024));
  const int64_t chunk = ((len + chunks - 1) / chunks + 63) / 64 * 64;
  return static_cast<int32_t>((len + chunk - 1) / chunk);
}

TYPED_TEST(AttentionTest, RowsWithDifferentChunkCountsFoldInOneLaunch) {
  CELLM_SKIP_WITHOUT_GPU();
  // Eight decode rows at a budget of 4096, a target of 512 blocks (32 or 16 splits) and
  // as many kept at least (every row above 256 positions takes the split count before
  // the rounding), of 1 chunk to one per split: each row's last block folds its own
  // count of partials while other rows write directly. Three launches back to back on one stream
  // and workspace (with and without programmatic launch), for the tensor-core kernel (bf16 at
  // head_dim 64 and 128, groups up to 16) and the CUDA-core one (f32, forced bf16, head_dim 20;
  // group 12: two head tiles per kv head).
  using T = TypeParam;
  const std::vector<int32_t> lengths = {1, 200, 257, 400, 600, 1000, 2049, 4096};
  constexpr int64_t kTarget = 512;
  uint32_t seed = 350;
  struct RestorePdl {
    ~RestorePdl() { set_programmatic_launch(true); }
  } restore;
  for (const bool pdl : {true, false}) {
    set_programmatic_launch(pdl);
    for (const auto& [group, head_dim] :
         std::vector<std::pair<int64_t, int64_t>>{{4, 128}, {16, 128}, {12, 64}, {3, 20}}) {
      for (const AttentionPath path : {AttentionPath::kAuto, AttentionPath::kCudaCores}) {
        if (std::is_same_v<T, float> && path == AttentionPath::kCudaCores) continue;  // the same
        const Geometry geo{2 * group, 2, head_dim, 0, 4096};
        const int64_t n_rows = static_cast<int64_t>(lengths.size());
        SCOPED_TRACE(describe(geo, 4096, n_rows) + (pdl ? " pdl" : " no pdl") +
                     (path == AttentionPath::kAuto ? " auto" : " cuda cores"));
        const int32_t n_splits =
            attention_num_splits(n_rows, geo.n_heads, geo.n_kv_heads, 4096, kTarget, kTarget);
        const int32_t min_chunks =
            attention_min_chunks(n_rows, geo.n_heads, geo.n_kv_heads, n_splits, kTarget);
        EXPECT_EQ(min_chunks, n_splits);
        std::vector<SequenceSpec> specs;
        std::vector<std::pair<int32_t, int32_t>> rows;
        std::vector<int32_t> active;
        for (const int32_t length : lengths) {
          rows.emplace_back(static_cast<int32_t>(specs.size()), length - 1);
          specs.push_back({length});
          active.push_back(active_chunks(length - 1, geo.window, n_splits, min_chunks));
        }
        EXPECT_EQ(active.front(), 1);
        EXPECT_EQ(active.back(), n_splits);
        EXPECT_GE(std::set<int32_t>(active.begin(), active.end()).size(), 6u);
        const Scenario s = make_scenario<T>(geo, specs, rows, seed++);
        DeviceScenario<T> d(s);
        d.workspace =
            DeviceArray<float>(attention_workspace_bytes(n_rows, geo.n_heads, geo.n_kv_heads,
                                                         geo.head_dim, 4096, kTarget, kTarget) /
                               sizeof(float));
        prepare_workspace(d.workspace);
        AttentionParams<T> p = d.params(s);
        p.path = path;
        p.target_blocks = kTarget;
        p.min_blocks = kTarget;
        for (int i = 0; i < 3; ++i) CELLM_ASSERT_CUDA(launch_attention<T>(p, nullptr));
        CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
        expect_all_close(testing::to_floats(d.out.download()), cpu_attention(s), kAbsTol<T>,
                         kRelTol<T>, "attention out");
        expect_counters_zero(d.workspace);
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

TYPED_TEST(AttentionTest, ALargerTargetSplitsManyRowsAndStillMatches) {
  CELLM_SKIP_WITHOUT_GPU();
  // 64 decode rows of 8 kv heads are 512 blocks: no split at the default target, 8
  // splits at a target of 4096 with as many blocks kept at least (the workspace sized
  // for them), rows of 1 to 8 chunks.
  using T = TypeParam;
  const Geometry geo{32, 8, 128, 0, 1024};
  constexpr int64_t kTarget = 4096;
  ASSERT_EQ(attention_num_splits(64, geo.n_heads, geo.n_kv_heads, geo.max_context), 1);
  // The target alone does not split: at most a chunk per 1,024 positions of the budget.
  ASSERT_EQ(attention_num_splits(64, geo.n_heads, geo.n_kv_heads, geo.max_context, kTarget), 1);
  const int32_t n_splits =
      attention_num_splits(64, geo.n_heads, geo.n_kv_heads, geo.max_context, kTarget, kTarget);
  ASSERT_EQ(n_splits, 8);
  std::vector<SequenceSpec> specs;
  std::vector<std::pair<int32_t, int32_t>> rows;
  for (int32_t i = 0; i < 64; ++i) {
    const int32_t length = 1 + (i * 37) % 1000;
    rows.emplace_back(static_cast<int32_t>(specs.size()), length - 1);
    specs.push_back({length});
  }
  const Scenario s = make_scenario<T>(geo, specs, rows, 371);
  DeviceScenario<T> d(s);
  d.workspace =
      DeviceArray<float>(attention_workspace_bytes(64, geo.n_heads, geo.n_kv_heads, geo.head_dim,
                                                   geo.max_context, kTarget, kTarget) /
                         sizeof(float));
  prepare_workspace(d.workspace);
  AttentionParams<T> p = d.params(s);
  p.target_blocks = kTarget;
  p.min_blocks = kTarget;
  for (int i = 0; i < 2; ++i) CELLM_ASSERT_CUDA(launch_attention<T>(p, nullptr));
  CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
  expect_all_close(testing::to_floats(d.out.download()), cpu_attention(s), kAbsTol<T>, kRelTol<T>,
                   "attention out");
  expect_counters_zero(d.workspace);
  p.target_blocks = kAttentionWorkspaceCounters + 1;
  EXPECT_EQ(launch_attention<T>(p, nullptr), cudaErrorInvalidValue);
  p.target_blocks = kTarget;
  p.block_warps = 3;
  EXPECT_EQ(launch_attention<T>(p, nullptr), cudaErrorInvalidValue);
  p.block_warps = 0;
  p.fresh_positions = -1;
  EXPECT_EQ(launch_attention<T>(p, nullptr), cudaErrorInvalidValue);
  p.fresh_positions = 0;
  p.min_blocks = -1;
  EXPECT_EQ(launch_attention<T>(p, nullptr), cudaErrorInvalidValue);
}

TYPED_TEST(AttentionTest, LongRowsTakeChunksByTheirLength) {
  CELLM_SKIP_WITHOUT_GPU();
  // The default cut: four rows of 8 kv heads at a budget of 8192 are 32 blocks a split,
  // 8 splits (a chunk per 1,024 positions of the budget), at least 4 chunks (~128
  // blocks) for a row above 256 positions, one more per 1,024 positions.
  using T = TypeParam;
  const Geometry geo{32, 8, 128, 0, 8192};
  const int32_t n_splits = attention_num_splits(4, geo.n_heads, geo.n_kv_heads, geo.max_context);
  ASSERT_EQ(n_splits, 8);
  const int32_t min_chunks = attention_min_chunks(4, geo.n_heads, geo.n_kv_heads, n_splits);
  ASSERT_EQ(min_chunks, 4);
  const std::vector<int32_t> lengths = {300, 3000, 5000, 8192};
  const std::vector<int32_t> expected_chunks = {3, 4, 4, 8};  // 3: 128-key chunks of 300
  std::vector<SequenceSpec> specs;
  std::vector<std::pair<int32_t, int32_t>> rows;
  for (size_t i = 0; i < lengths.size(); ++i) {
    EXPECT_EQ(active_chunks(lengths[i] - 1, 0, n_splits, min_chunks), expected_chunks[i]);
    rows.emplace_back(static_cast<int32_t>(specs.size()), lengths[i] - 1);
    specs.push_back({lengths[i]});
  }
  const Scenario s = make_scenario<T>(geo, specs, rows, 380);
  DeviceScenario<T> d(s);
  AttentionParams<T> p = d.params(s);
  for (int i = 0; i < 2; ++i) CELLM_ASSERT_CUDA(launch_attention<T>(p, nullptr));
  CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
  expect_all_close(testing::to_floats(d.out.download()), cpu_attention(s), kAbsTol<T>, kRelTol<T>,
                   "attention out");
  expect_counters_zero(d.workspace);
}

TYPED_TEST(AttentionTest, CapturedGraphFollowsNewTablesAndPositions) {
  CELLM_SKIP_WITHOUT_GPU();
  // One graph: kv_write (with the table) then attention twice on one workspace, as the
  // executor's layers 0 and 1. Each replay is a new step of four decode rows: new
  // sequences, cells, table and positions uploaded into the same buffers; the rows' own
  // K/V and table entries are written by the captured kv_write. The workspace's
  // counters are zeroed once, before the first replay: a launch that left one nonzero
  // would break the next launch's fold (the second layer, or the next replay).
  const Geometry geo{8, 2, 64, 0, 1024};
  constexpr int64_t kRows = 4;
  constexpr int64_t kCapacityCells = 4 * 1024 + 16;
  using T = TypeParam;
  DeviceArray<T> qkv(static_cast<size_t>(kRows * geo.row_stride()));
  DeviceArray<T> k_pool(static_cast<size_t>(kCapacityCells * geo.kv_dim()));
  DeviceArray<T> v_pool(k_pool.size());
  const int64_t table_stride = geo.max_context + 3;
  DeviceArray<int32_t> table(static_cast<size_t>(kRows * table_stride));
  DeviceArray<int32_t> cells(kRows), row_seq(kRows), positions(kRows);
  DeviceArray<T> out(static_cast<size_t>(kRows * geo.q_dim())), out2(out.size());
  DeviceArray<float> workspace(
      attention_workspace_bytes(kRows, geo.n_heads, geo.n_kv_heads, geo.head_dim, geo.max_context) /
      sizeof(float));
  ASSERT_GT(workspace.size(), 0u) << "the graph test should cover the split path";
  prepare_workspace(workspace);

  AttentionParams<T> p;
  p.qkv = qkv.get();
  p.row_stride = geo.row_stride();
  p.q_offset = geo.q_offset();
  p.n_rows = kRows;
  p.n_heads = geo.n_heads;
  p.n_kv_heads = geo.n_kv_heads;
  p.head_dim = geo.head_dim;
  p.k_pool = k_pool.get();
  p.v_pool = v_pool.get();
  p.table = table.get();
  p.table_stride = table_stride;
  p.row_seq = row_seq.get();
  p.positions = positions.get();
  p.window = geo.window;
  p.scale = default_scale(geo.head_dim);
  p.max_context = geo.max_context;
  p.workspace = workspace.get();
  p.out = out.get();
  // Decode rows: the tensor-core kernel loads each row's older K/V before its wait, the
  // row's own (NaN until the captured kv_write) after.
  p.fresh_positions = 1;

  Result<Stream> stream = Stream::create();
  ASSERT_TRUE(stream.ok()) << stream.status().to_string();
  cudaGraph_t graph = nullptr;
  CELLM_ASSERT_CUDA(cudaStreamBeginCapture(stream->get(), cudaStreamCaptureModeThreadLocal));
  CELLM_ASSERT_CUDA(launch_kv_write<T>(qkv.get(), kRows, geo.row_stride(), geo.k_offset(),
                                       geo.v_offset(), geo.kv_dim(), cells.get(), row_seq.get(),
                                       positions.get(), k_pool.get(), v_pool.get(), table.get(),
                                       table_stride, stream->get()));
  // bf16 at head_dim 64, group 4: the graph holds the tensor-core kernel.
  EXPECT_EQ(attention_uses_tensor_cores(p), (std::is_same_v<T, __nv_bfloat16>));
  CELLM_ASSERT_CUDA(launch_attention<T>(p, stream->get()));
  AttentionParams<T> p2 = p;
  p2.out = out2.get();
  CELLM_ASSERT_CUDA(launch_attention<T>(p2, stream->get()));
  CELLM_ASSERT_CUDA(cudaStreamEndCapture(stream->get(), &graph));
  cudaGraphExec_t raw_exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&raw_exec, graph, 0);
  cudaGraphDestroy(graph);
  CELLM_ASSERT_CUDA(inst);
  GraphExec exec(raw_exec);

  std::mt19937 rng(400);
  for (int step = 0; step < 8; ++step) {
    SCOPED_TRACE("replay " + std::to_string(step));
    // Lengths vary per step (1 on the first; every row of one chunk on step 3, so no
    // fold runs at all); sequence 2 clones a prefix of sequence 1. Every length stays
    // <= max_context, so the table stride is the captured one.
    std::vector<SequenceSpec> specs;
    for (int64_t r = 0; r < kRows; ++r) {
      const int32_t length = step == 0 && r == 0 ? 1
                             : step == 3         ? 1 + static_cast<int32_t>(rng() % 14)
                                         : 1 + static_cast<int32_t>(rng() % (geo.max_context - 2));
      specs.push_back({length});
    }
    specs[2] = {specs[2].length + 2, 1, std::min(specs[1].length - 1, specs[2].length + 1)};
    if (specs[2].shared == 0) specs[2] = {specs[2].length};
    std::vector<std::pair<int32_t, int32_t>> rows;
    for (int64_t r = 0; r < kRows; ++r) {
      rows.emplace_back(static_cast<int32_t>(r), specs[static_cast<size_t>(r)].length - 1);
    }
    Scenario s = make_scenario<T>(geo, specs, rows, 500 + static_cast<uint32_t>(step));
    ASSERT_LE(s.max_cells, kCapacityCells);
    ASSERT_EQ(s.table_stride, table_stride);

    // Before the step: the rows' own cells hold NaN and their table entries the spare cell.
    std::vector<int32_t> step_cells;
    std::vector<float> k_before = s.k_pool, v_before = s.v_pool;
    std::vector<int32_t> table_before = s.table;
    for (int64_t r = 0; r < kRows; ++r) {
      const int32_t pos = s.positions[static_cast<size_t>(r)];
      const int32_t cell = s.sequences[static_cast<size_t>(r)][static_cast<size_t>(pos)];
      step_cells.push_back(cell);
      table_before[static_cast<size_t>(r * table_stride + pos)] = s.spare_cell;
      float* qkv_row = s.qkv.data() + r * geo.row_stride();
      for (int64_t i = 0; i < geo.kv_dim(); ++i) {
        const size_t at = static_cast<size_t>(cell * geo.kv_dim() + i);
        qkv_row[geo.k_offset() + i] = s.k_pool[at];
        qkv_row[geo.v_offset() + i] = s.v_pool[at];
        k_before[at] = v_before[at] = kNaN;
      }
    }
    k_before.resize(k_pool.size(), kNaN);
    v_before.resize(v_pool.size(), kNaN);
    qkv.upload(testing::to_typed<T>(s.qkv));
    k_pool.upload(testing::to_typed<T>(k_before));
    v_pool.upload(testing::to_typed<T>(v_before));
    table.upload(table_before);
    cells.upload(step_cells);
    row_seq.upload(s.row_seq);
    positions.upload(s.positions);
    out.fill_bytes(0xff);
    out2.fill_bytes(0xff);
    poison_partials(workspace);
    // The fills run on the legacy stream, which the replay's stream does not wait for.
    CELLM_ASSERT_CUDA(cudaDeviceSynchronize());

    CELLM_ASSERT_CUDA(cudaGraphLaunch(exec.get(), stream->get()));
    CELLM_ASSERT_CUDA(cudaStreamSynchronize(stream->get()));
    EXPECT_EQ(table.download(), s.table);
    const std::vector<float> got = testing::to_floats(out.download());
    expect_all_close(got, cpu_attention(s), kAbsTol<T>, kRelTol<T>, "graph replay out");
    // The fold reads every chunk's partial in chunk order, whichever block is last:
    // the second launch gives the same bits.
    EXPECT_EQ(testing::to_floats(out2.download()), got);
    expect_counters_zero(workspace);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TYPED_TEST(AttentionTest, AnEmptyStepSucceedsAndAMalformedOneIsRefused) {
  CELLM_SKIP_WITHOUT_GPU();
  AttentionParams<TypeParam> p;
  EXPECT_EQ(launch_attention<TypeParam>(p, nullptr), cudaSuccess);  // n_rows 0
  p.n_rows = 1;
  p.n_heads = 6;
  p.n_kv_heads = 4;  // does not divide n_heads
  p.head_dim = 64;
  EXPECT_EQ(launch_attention<TypeParam>(p, nullptr), cudaErrorInvalidValue);
}

TEST(AttentionTensorCoreTest, DecodeRowsAtEveryGroupAndTileEdgeMatchTheCpuTwin) {
  CELLM_SKIP_WITHOUT_GPU();
  // Contexts around the 16-key tile and the 4 warps' 64 keys; groups from 1 to 16 (the
  // padded rows of the 16-row MMA); budgets that do and do not split.
  uint32_t seed = 600;
  for (const int64_t head_dim : {64, 128}) {
    for (const int64_t group : {1, 4, 8, 12, 16}) {
      for (const int32_t context : {1, 15, 16, 17, 31, 33, 255, 2049}) {
        for (const int32_t window : {0, 40}) {
          for (const int64_t n_rows : {1, 37}) {
            for (const int32_t max_context : {context, 4096}) {
              const Geometry geo{2 * group, 2, head_dim, window, max_context};
              std::mt19937 rng(seed);
              std::vector<SequenceSpec> specs;
              std::vector<std::pair<int32_t, int32_t>> rows;
              decode_layout(context, n_rows, rng, &specs, &rows);
              const Scenario s = make_scenario<Bf16>(geo, specs, rows, seed++);
              // Blocks of 2, 4 and 8 warps (chunks of 32, 64 and 128 keys), the first
              // tiles loaded before and after the wait.
              for (const int32_t warps : {2, 4, 8}) {
                SCOPED_TRACE(describe(geo, context, n_rows) + " warps=" + std::to_string(warps));
                expect_tensor_cores_match_cpu(s, AttentionPath::kAuto, warps, warps == 2 ? 1 : 0);
                if (::testing::Test::HasFatalFailure()) return;
              }
            }
          }
        }
      }
    }
  }
}

TEST(AttentionTensorCoreTest, ManyRowsOfLlamaShapesMatchTheCpuTwin) {
  CELLM_SKIP_WITHOUT_GPU();
  // 32 query heads over 8 kv heads, head_dim 128: 300 decode rows (one split at a
  // budget of 1024) and 16 rows (several splits).
  uint32_t seed = 700;
  for (const int64_t n_rows : {300, 16}) {
    for (const int32_t context : {255, 1000}) {
      const Geometry geo{32, 8, 128, 0, 1024};
      SCOPED_TRACE(describe(geo, context, n_rows));
      std::mt19937 rng(seed);
      std::vector<SequenceSpec> specs;
      std::vector<std::pair<int32_t, int32_t>> rows;
      decode_layout(context, n_rows, rng, &specs, &rows);
      const Scenario s = make_scenario<Bf16>(geo, specs, rows, seed++);
      for (const int32_t warps : {0, 2, 4, 8}) {
        SCOPED_TRACE("warps=" + std::to_string(warps));
        expect_tensor_cores_match_cpu(s, AttentionPath::kAuto, warps, 1);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

TEST(AttentionTensorCoreTest, ForcedCudaCoresPathStillMatchesTheCpuTwin) {
  CELLM_SKIP_WITHOUT_GPU();
  // The benchmark's baseline: the same shapes on the CUDA-core kernel.
  uint32_t seed = 900;
  for (const int32_t context : {17, 2049}) {
    const Geometry geo{32, 8, 128, 0, 4096};
    SCOPED_TRACE(describe(geo, context, 5));
    std::mt19937 rng(seed);
    std::vector<SequenceSpec> specs;
    std::vector<std::pair<int32_t, int32_t>> rows;
    decode_layout(context, 5, rng, &specs, &rows);
    expect_tensor_cores_match_cpu(make_scenario<Bf16>(geo, specs, rows, seed++),
                                  AttentionPath::kCudaCores);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace cellm::cuda::attention_test
