// Shared helpers of the attention tests (attention_decode_test.cpp,
// attention_prefill_test.cpp, attention_split_test.cpp): scenarios of scattered K/V cells
// with NaN spares, their device copies, and the comparison with the CPU twin.
#pragma once

#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpu/kernels/attention.h"
#include "cpu/kernels/thread_pool.h"
#include "cuda/kernels/attention.h"
#include "device_array.h"
#include "gpu_test.h"

namespace cellm::cuda::attention_test {

using testing::DeviceArray;
using testing::expect_all_close;
using testing::random_nonzero;
using testing::round_to;

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Tolerances against the CPU twin (f32 math both sides, different summation
// order): f32 output within 1e-5 relative + 1e-5 absolute; bf16 output is the f32
// result rounded once to bf16 (2^-9 relative), checked within 1e-2 relative + 1e-3 absolute.
template <typename T>
inline constexpr float kRelTol = std::is_same_v<T, float> ? 1e-5f : 1e-2f;
template <typename T>
inline constexpr float kAbsTol = std::is_same_v<T, float> ? 1e-5f : 1e-3f;

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
inline std::vector<float> cpu_attention(const Scenario& s) {
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

inline float default_scale(int64_t head_dim) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

// The workspace's int32 split counters, at its start (attention.h).
inline constexpr size_t kCounterBytes = sizeof(int32_t) * kAttentionWorkspaceCounters;

inline void check_cuda(cudaError_t err) {
  CELLM_CHECK_MSG(err == cudaSuccess, std::string("CUDA: ") + cudaGetErrorString(err));
}

// The partials (everything past the counters) = NaN, so a read of a partial that no
// block wrote shows up in the output. The counters are left as they are.
inline void poison_partials(DeviceArray<float>& ws) {
  if (ws.size() == 0) return;
  CELLM_CHECK(ws.size() * sizeof(float) > kCounterBytes);
  check_cuda(cudaMemset(reinterpret_cast<unsigned char*>(ws.get()) + kCounterBytes, 0xff,
                        ws.size() * sizeof(float) - kCounterBytes));
}

// A workspace as the contract wants it before its first launch: counters zero (and
// the partials NaN).
inline void prepare_workspace(DeviceArray<float>& ws) {
  if (ws.size() == 0) return;
  check_cuda(cudaMemset(ws.get(), 0, kCounterBytes));
  poison_partials(ws);
}

// Every completed launch leaves the counters zero.
inline void expect_counters_zero(const DeviceArray<float>& ws) {
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

inline std::string describe(const Geometry& g, int32_t context, int64_t n_rows) {
  return "head_dim=" + std::to_string(g.head_dim) + " heads=" + std::to_string(g.n_heads) + "/" +
         std::to_string(g.n_kv_heads) + " window=" + std::to_string(g.window) +
         " context=" + std::to_string(context) + " max_context=" + std::to_string(g.max_context) +
         " n_rows=" + std::to_string(n_rows) + " splits=" +
         std::to_string(attention_num_splits(n_rows, g.n_heads, g.n_kv_heads, g.max_context));
}

// Decode: row r is the last position of its own sequence r. Sequence 0 has the
// full context; sequence 1 clones half of it; others have varied lengths (most
// ending mid-chunk), every third a clone of a prefix of sequence 0.
inline void decode_layout(int32_t context, int64_t n_rows, std::mt19937& rng,
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

// The tensor-core path (bf16, head_dim 64 or 128, group <= 16): every case must
// route there, and match the CPU twin within the bf16 tolerance.
using Bf16 = __nv_bfloat16;

// `block_warps` and `fresh_positions` as in AttentionParams: every K/V of a scenario is
// written before the launch, so any count of fresh positions is true of it.
inline void expect_tensor_cores_match_cpu(const Scenario& s,
                                          AttentionPath path = AttentionPath::kAuto,
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

}  // namespace cellm::cuda::attention_test
