#include "cuda/kernels/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu/kernels/attention.h"
#include "cpu/kernels/thread_pool.h"
#include "cuda/kernels/attention_mma.h"
#include "cuda/kernels/kv_write.h"
#include "cuda/launch_control.h"
#include "device_array.h"
#include "gpu_test.h"

namespace cellm::cuda {
namespace {

using testing::DeviceArray;
using testing::expect_all_close;
using testing::random_nonzero;
using testing::round_to;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Tolerances against the CPU twin (f32 math both sides, different summation
// order): f32 output within 1e-5 relative + 1e-5 absolute; bf16 output is the f32
// result rounded once to bf16 (2^-9 relative), checked within 1e-2 relative + 1e-3 absolute.
template <typename T>
constexpr float kRelTol = std::is_same_v<T, float> ? 1e-5f : 1e-2f;
template <typename T>
constexpr float kAbsTol = std::is_same_v<T, float> ? 1e-5f : 1e-3f;

struct Geometry {
  int64_t n_heads, n_kv_heads, head_dim;
  int32_t window, max_context;
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  int64_t q_dim() const { return n_heads * head_dim; }
  // Fused rows: K | V | Q | 8 NaN columns (over-reads show up as NaN).
  int64_t k_offset() const { return 0; }
  int64_t v_offset() const { return kv_dim(); }
  int64_t q_offset() const { return 2 * kv_dim(); }
  int64_t row_stride() const { return 2 * kv_dim() + q_dim() + 8; }
};

// A sequence of `length` positions; a clone shares the cells of positions
// [0, shared) of sequence `clone_of` (shared < both lengths) and owns the rest.
struct SequenceSpec {
  int32_t length;
  int32_t clone_of = -1;
  int32_t shared = 0;
};

// A pool whose sequences own scattered cells (a shuffled permutation), clones
// sharing prefixes, and a few spare cells whose K/V are NaN: table entries past
// a sequence's length name a spare cell, so any read outside [lo, q] gives NaN.
struct Scenario {
  Geometry geo;
  int64_t max_cells = 0;
  int64_t table_stride = 0;
  int32_t spare_cell = 0;
  std::vector<std::vector<int32_t>> sequences;  // cell of each position
  std::vector<int32_t> table;                   // [sequences, table_stride]
  std::vector<int32_t> row_seq, positions;      // [n_rows]
  std::vector<float> k_pool, v_pool;            // [max_cells, kv_dim], values as stored in T
  std::vector<float> qkv;                       // [n_rows, row_stride], values as stored in T
  int64_t n_rows() const { return static_cast<int64_t>(positions.size()); }
};

template <typename T>
Scenario make_scenario(const Geometry& geo, const std::vector<SequenceSpec>& specs,
                       const std::vector<std::pair<int32_t, int32_t>>& rows, uint32_t seed) {
  std::mt19937 rng(seed);
  Scenario s;
  s.geo = geo;
  int64_t owned = 0;
  for (const SequenceSpec& spec : specs) owned += spec.length - spec.shared;
  constexpr int64_t kSpare = 11;
  s.max_cells = owned + kSpare;
  std::vector<int32_t> order(static_cast<size_t>(s.max_cells));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  size_t next = 0;
  for (const SequenceSpec& spec : specs) {
    std::vector<int32_t> cells;
    if (spec.clone_of >= 0) {
      const std::vector<int32_t>& src = s.sequences[static_cast<size_t>(spec.clone_of)];
      CELLM_CHECK(spec.shared < spec.length && spec.shared < static_cast<int32_t>(src.size()));
      cells.assign(src.begin(), src.begin() + spec.shared);
    }
    while (static_cast<int32_t>(cells.size()) < spec.length) cells.push_back(order[next++]);
    s.sequences.push_back(std::move(cells));
  }
  s.spare_cell = order[next];

  int32_t longest = 0;
  for (const auto& cells : s.sequences)
    longest = std::max(longest, static_cast<int32_t>(cells.size()));
  s.table_stride = std::max(longest, geo.max_context) + 3;
  s.table.assign(s.sequences.size() * static_cast<size_t>(s.table_stride), s.spare_cell);
  for (size_t q = 0; q < s.sequences.size(); ++q) {
    std::copy(s.sequences[q].begin(), s.sequences[q].end(),
              s.table.begin() + static_cast<int64_t>(q) * s.table_stride);
  }

  const int64_t kv_dim = geo.kv_dim();
  s.k_pool.assign(static_cast<size_t>(s.max_cells * kv_dim), kNaN);
  s.v_pool.assign(s.k_pool.size(), kNaN);
  std::vector<bool> used(static_cast<size_t>(s.max_cells), false);
  for (const auto& cells : s.sequences) {
    for (int32_t c : cells) used[static_cast<size_t>(c)] = true;
  }
  for (int64_t c = 0; c < s.max_cells; ++c) {
    if (!used[static_cast<size_t>(c)]) continue;
    for (int64_t i = 0; i < kv_dim; ++i) {
      s.k_pool[static_cast<size_t>(c * kv_dim + i)] = round_to<T>(random_nonzero(rng, 0.05f, 1.f));
      s.v_pool[static_cast<size_t>(c * kv_dim + i)] = round_to<T>(random_nonzero(rng, 0.05f, 1.f));
    }
  }

  for (const auto& [seq, pos] : rows) {
    CELLM_CHECK(pos >= 0 &&
                pos < static_cast<int32_t>(s.sequences[static_cast<size_t>(seq)].size()));
    CELLM_CHECK(pos < geo.max_context);
    s.row_seq.push_back(seq);
    s.positions.push_back(pos);
  }
  s.qkv.assign(static_cast<size_t>(s.n_rows() * geo.row_stride()), kNaN);
  for (int64_t r = 0; r < s.n_rows(); ++r) {
    float* row = s.qkv.data() + r * geo.row_stride();
    for (int64_t i = 0; i < 2 * kv_dim; ++i) row[i] = round_to<T>(random_nonzero(rng, 0.05f, 1.f));
    // Larger queries make the softmax peaked rather than nearly uniform.
    for (int64_t i = 0; i < geo.q_dim(); ++i) {
      row[geo.q_offset() + i] = round_to<T>(random_nonzero(rng, 0.25f, 3.f));
    }
  }
  return s;
}

// The CPU twin over the scenario's (already T-rounded) values: [n_rows, q_dim].
std::vector<float> cpu_attention(const Scenario& s) {
  static cpu::ThreadPool pool(0);
  const Geometry& g = s.geo;
  std::vector<float> q(static_cast<size_t>(s.n_rows() * g.q_dim()));
  for (int64_t r = 0; r < s.n_rows(); ++r) {
    std::copy_n(s.qkv.begin() + r * g.row_stride() + g.q_offset(), g.q_dim(),
                q.begin() + r * g.q_dim());
  }
  std::vector<std::span<const int32_t>> cells_of_row;
  for (int32_t seq : s.row_seq) cells_of_row.emplace_back(s.sequences[static_cast<size_t>(seq)]);
  std::vector<float> out(q.size(), kNaN);
  cpu::attention(pool, cpu::AttentionArgs{.q = q.data(),
                                          .n_rows = s.n_rows(),
                                          .n_heads = g.n_heads,
                                          .n_kv_heads = g.n_kv_heads,
                                          .head_dim = g.head_dim,
                                          .k_cells = s.k_pool.data(),
                                          .v_cells = s.v_pool.data(),
                                          .max_cells = s.max_cells,
                                          .q_pos = s.positions,
                                          .cells_of_row = cells_of_row,
                                          .window = g.window,
                                          .out = out.data()});
  return out;
}

float default_scale(int64_t head_dim) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

// The workspace's int32 split counters, at its start (attention.h).
constexpr size_t kCounterBytes = sizeof(int32_t) * kAttentionWorkspaceCounters;

void check_cuda(cudaError_t err) {
  CELLM_CHECK_MSG(err == cudaSuccess, std::string("CUDA: ") + cudaGetErrorString(err));
}

// The partials (everything past the counters) = NaN, so a read of a partial that no
// block wrote shows up in the output. The counters are left as they are.
void poison_partials(DeviceArray<float>& ws) {
  if (ws.size() == 0) return;
  CELLM_CHECK(ws.size() * sizeof(float) > kCounterBytes);
  check_cuda(cudaMemset(reinterpret_cast<unsigned char*>(ws.get()) + kCounterBytes, 0xff,
                        ws.size() * sizeof(float) - kCounterBytes));
}

// A workspace as the contract wants it before its first launch: counters zero (and
// the partials NaN).
void prepare_workspace(DeviceArray<float>& ws) {
  if (ws.size() == 0) return;
  check_cuda(cudaMemset(ws.get(), 0, kCounterBytes));
  poison_partials(ws);
}

// Every completed launch leaves the counters zero.
void expect_counters_zero(const DeviceArray<float>& ws) {
  if (ws.size() == 0) return;
  std::vector<int32_t> counters(static_cast<size_t>(kAttentionWorkspaceCounters));
  check_cuda(cudaMemcpy(counters.data(), ws.get(), kCounterBytes, cudaMemcpyDeviceToHost));
  size_t nonzero = 0;
  for (int32_t c : counters) nonzero += c != 0 ? 1 : 0;
  EXPECT_EQ(nonzero, 0u) << "split counters left nonzero";
}

// Device copies of a scenario, with the output and the workspace's partials poisoned
// with NaN (and its counters zero).
template <typename T>
struct DeviceScenario {
  explicit DeviceScenario(const Scenario& s)
      : qkv(testing::to_typed<T>(s.qkv)),
        k_pool(testing::to_typed<T>(s.k_pool)),
        v_pool(testing::to_typed<T>(s.v_pool)),
        table(s.table),
        row_seq(s.row_seq),
        positions(s.positions),
        out(static_cast<size_t>(s.n_rows() * s.geo.q_dim())),
        workspace(attention_workspace_bytes(s.n_rows(), s.geo.n_heads, s.geo.n_kv_heads,
                                            s.geo.head_dim, s.geo.max_context) /
                  sizeof(float)) {
    out.fill_bytes(0xff);
    prepare_workspace(workspace);
  }

  AttentionParams<T> params(const Scenario& s) const {
    const Geometry& g = s.geo;
    AttentionParams<T> p;
    p.qkv = qkv.get();
    p.row_stride = g.row_stride();
    p.q_offset = g.q_offset();
    p.n_rows = s.n_rows();
    p.n_heads = g.n_heads;
    p.n_kv_heads = g.n_kv_heads;
    p.head_dim = g.head_dim;
    p.k_pool = k_pool.get();
    p.v_pool = v_pool.get();
    p.table = table.get();
    p.table_stride = s.table_stride;
    p.row_seq = row_seq.get();
    p.positions = positions.get();
    p.window = g.window;
    p.scale = default_scale(g.head_dim);
    p.max_context = g.max_context;
    p.workspace = workspace.size() > 0 ? workspace.get() : nullptr;
    p.out = out.get();
    return p;
  }

  DeviceArray<T> qkv, k_pool, v_pool;
  DeviceArray<int32_t> table, row_seq, positions;
  DeviceArray<T> out;
  DeviceArray<float> workspace;
};

template <typename T>
void expect_gpu_matches_cpu(const Scenario& s) {
  DeviceScenario<T> d(s);
  CELLM_ASSERT_CUDA(launch_attention<T>(d.params(s), nullptr));
  CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
  expect_all_close(testing::to_floats(d.out.download()), cpu_attention(s), kAbsTol<T>, kRelTol<T>,
                   "attention out");
  expect_counters_zero(d.workspace);
}

std::string describe(const Geometry& g, int32_t context, int64_t n_rows) {
  return "head_dim=" + std::to_string(g.head_dim) + " heads=" + std::to_string(g.n_heads) + "/" +
         std::to_string(g.n_kv_heads) + " window=" + std::to_string(g.window) +
         " context=" + std::to_string(context) + " max_context=" + std::to_string(g.max_context) +
         " n_rows=" + std::to_string(n_rows) + " splits=" +
         std::to_string(attention_num_splits(n_rows, g.n_heads, g.n_kv_heads, g.max_context));
}

// Decode: row r is the last position of its own sequence r. Sequence 0 has the
// full context; sequence 1 clones half of it; others have varied lengths (most
// ending mid-chunk), every third a clone of a prefix of sequence 0.
void decode_layout(int32_t context, int64_t n_rows, std::mt19937& rng,
                   std::vector<SequenceSpec>* specs,
                   std::vector<std::pair<int32_t, int32_t>>* rows) {
  for (int64_t r = 0; r < n_rows; ++r) {
    SequenceSpec spec{context};
    if (r == 1 && context > 1) spec = {context, 0, context / 2};
    if (r >= 2) {
      spec.length = 1 + static_cast<int32_t>(rng() % static_cast<uint32_t>(context));
      const int32_t max_shared = std::min(spec.length, context) - 1;
      if (r % 3 == 0 && max_shared > 0) {
        spec.clone_of = 0;
        spec.shared = 1 + static_cast<int32_t>(rng() % static_cast<uint32_t>(max_shared));
      }
    }
    specs->push_back(spec);
    rows->emplace_back(static_cast<int32_t>(r), spec.length - 1);
  }
}

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

// Prefill: 37 rows of one step, the last 20 positions of a clone (sequence 1,
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

// The tensor-core path (bf16, head_dim 64 or 128, group <= 16): every case must
// route there, and match the CPU twin within the bf16 tolerance.
using Bf16 = __nv_bfloat16;

// `block_warps` and `fresh_positions` as in AttentionParams: every K/V of a scenario is
// written before the launch, so any count of fresh positions is true of it.
void expect_tensor_cores_match_cpu(const Scenario& s, AttentionPath path = AttentionPath::kAuto,
                                   int32_t block_warps = 0, int32_t fresh_positions = 0) {
  DeviceScenario<Bf16> d(s);
  AttentionParams<Bf16> p = d.params(s);
  p.path = path;
  p.block_warps = block_warps;
  p.fresh_positions = fresh_positions;
  ASSERT_EQ(attention_uses_tensor_cores(p), path == AttentionPath::kAuto);
  CELLM_ASSERT_CUDA(launch_attention<Bf16>(p, nullptr));
  CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
  expect_all_close(testing::to_floats(d.out.download()), cpu_attention(s), kAbsTol<Bf16>,
                   kRelTol<Bf16>, "attention out");
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

// Host-only: needs no device, so it also runs on machines without a GPU.
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
}  // namespace cellm::cuda
