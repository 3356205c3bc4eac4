// launch_attention over an e4m3 KV cache (AttentionParams::k_codes, v_codes, k_scales,
// v_scales) against cpu::attention over the same codes and scales, every element: the
// tensor-core split kernel's e4m3 variant (bf16, head_dim 64 and 128, groups 1, 4, 8, 16,
// windows, rows of one chunk to one per split, every block size, with and without the
// cluster fold, decode rows), the prefill kernel's (row_runs, groups 1 to 16), and the
// CUDA-core e4m3 kernel where the tensor cores do not serve (head_dim 40,
// AttentionPath::kCudaCores).
//
// Tolerance: the bf16 attention tests' (1e-2 relative + 1e-3 absolute). The scores' f16
// MMA takes the queries rounded to f16, which is exact for these bf16 queries (|q| in
// [0.25, 3]: a bf16's 8 significant bits fit an f16's 11 above 2^-14); what differs
// from the CPU twin is the summation order, P as two bf16 terms, and the output's
// rounding to bf16. Cells no row may read hold the e4m3 NaN code and a NaN scale.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "attention_test_util.h"
#include "cpu/kernels/attention.h"
#include "cpu/kernels/thread_pool.h"
#include "cuda/kernels/attention.h"
#include "device_array.h"
#include "gpu_test.h"

namespace cellm::cuda::attention_test {
namespace {

// The scenario's pools quantized as the cache's write does (cpu::quantize_kv_head_e4m3
// per (cell, kv head) row); NaN rows (spare and unused cells) get code 0x7f and scale NaN.
struct E4m3Pool {
  std::vector<uint8_t> k_codes, v_codes;
  std::vector<float> k_scales, v_scales;
};

E4m3Pool quantize(const Scenario& s) {
  const int64_t hd = s.geo.head_dim;
  const int64_t rows = s.max_cells * s.geo.n_kv_heads;
  E4m3Pool e;
  e.k_codes.assign(static_cast<size_t>(rows * hd), 0x7f);
  e.v_codes.assign(e.k_codes.size(), 0x7f);
  e.k_scales.assign(static_cast<size_t>(rows), kNaN);
  e.v_scales.assign(e.k_scales.size(), kNaN);
  for (int64_t i = 0; i < rows; ++i) {
    const auto at = static_cast<size_t>(i * hd);
    if (std::isnan(s.k_pool[at])) continue;
    e.k_scales[static_cast<size_t>(i)] =
        cpu::quantize_kv_head_e4m3(s.k_pool.data() + at, hd, e.k_codes.data() + at);
    e.v_scales[static_cast<size_t>(i)] =
        cpu::quantize_kv_head_e4m3(s.v_pool.data() + at, hd, e.v_codes.data() + at);
  }
  return e;
}

std::vector<float> cpu_attention_e4m3(const Scenario& s, const E4m3Pool& e) {
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
  cpu::AttentionArgs a;
  a.q = q.data();
  a.n_rows = s.n_rows();
  a.n_heads = g.n_heads;
  a.n_kv_heads = g.n_kv_heads;
  a.head_dim = g.head_dim;
  a.max_cells = s.max_cells;
  a.q_pos = s.positions;
  a.cells_of_row = cells_of_row;
  a.window = g.window;
  a.out = out.data();
  a.k_codes = e.k_codes.data();
  a.v_codes = e.v_codes.data();
  a.k_scales = e.k_scales.data();
  a.v_scales = e.v_scales.data();
  cpu::attention(pool, a);
  return out;
}

struct Launch {
  bool tensor_cores = true;  // what attention_uses_tensor_cores must say
  AttentionPath path = AttentionPath::kAuto;
  int32_t block_warps = 0;
  bool cluster_fold = true;
  int64_t target_blocks = 0;  // 0: the default; else min_blocks too
  bool row_runs = false;
};

void expect_e4m3_matches_cpu(const Scenario& s, const Launch& l, const std::string& what) {
  SCOPED_TRACE(what);
  const E4m3Pool e = quantize(s);
  DeviceScenario<Bf16> d(s);
  DeviceArray<uint8_t> kc(e.k_codes), vc(e.v_codes);
  DeviceArray<float> ks(e.k_scales), vs(e.v_scales);
  const int64_t target = l.target_blocks == 0 ? kAttentionTargetBlocks : l.target_blocks;
  const int64_t min_blocks = l.target_blocks == 0 ? kAttentionMinBlocks : l.target_blocks;
  DeviceArray<float> ws(attention_workspace_bytes(s.n_rows(), s.geo.n_heads, s.geo.n_kv_heads,
                                                  s.geo.head_dim, s.geo.max_context, target,
                                                  min_blocks) /
                        sizeof(float));
  prepare_workspace(ws);
  AttentionParams<Bf16> p = d.params(s);
  p.k_pool = nullptr;
  p.v_pool = nullptr;
  p.k_codes = kc.get();
  p.v_codes = vc.get();
  p.k_scales = ks.get();
  p.v_scales = vs.get();
  p.workspace = ws.size() > 0 ? ws.get() : nullptr;
  p.path = l.path;
  p.block_warps = l.block_warps;
  p.cluster_fold = l.cluster_fold;
  p.target_blocks = l.target_blocks;
  p.min_blocks = l.target_blocks;
  p.row_runs = l.row_runs;
  ASSERT_EQ(attention_uses_tensor_cores(p), l.tensor_cores);
  // Twice on one workspace: the counters come back to zero.
  for (int i = 0; i < 2; ++i) CELLM_ASSERT_CUDA(launch_attention<Bf16>(p, nullptr));
  CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
  expect_all_close(testing::to_floats(d.out.download()), cpu_attention_e4m3(s, e), kAbsTol<Bf16>,
                   kRelTol<Bf16>, "attention out");
  expect_counters_zero(ws);
}

Scenario decode_scenario(const Geometry& geo, int32_t context, int64_t n_rows, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<SequenceSpec> specs;
  std::vector<std::pair<int32_t, int32_t>> rows;
  decode_layout(context, n_rows, rng, &specs, &rows);
  return make_scenario<Bf16>(geo, specs, rows, seed);
}

TEST(AttentionE4m3Test, TensorCoreDecodeMatchesTheCpuAttentionOverTheSameCodes) {
  CELLM_SKIP_WITHOUT_GPU();
  uint32_t seed = 700;
  for (const int64_t head_dim : {64, 128}) {
    for (const int64_t group : {1, 4, 8, 16}) {
      for (const int32_t window : {0, 100}) {
        for (const int64_t n_rows : {1, 5, 16}) {
          const Geometry geo{2 * group, 2, head_dim, window, 4096};
          const Scenario s = decode_scenario(geo, 1500, n_rows, seed++);
          expect_e4m3_matches_cpu(s, {}, describe(geo, 1500, n_rows));
          if (::testing::Test::HasFailure()) return;
        }
      }
    }
  }
}

TEST(AttentionE4m3Test, EverySplitCountBlockSizeAndFoldMatchTheCpuAttention) {
  CELLM_SKIP_WITHOUT_GPU();
  // Rows of 1 position to 4,096 at a target of 512 blocks kept at least: each row folds
  // its own count of chunks; every block size; the cluster fold on and off.
  const std::vector<int32_t> lengths = {1, 17, 200, 257, 600, 1000, 2049, 4096};
  uint32_t seed = 800;
  for (const auto& [group, head_dim] :
       std::vector<std::pair<int64_t, int64_t>>{{4, 128}, {16, 128}, {8, 64}, {1, 64}}) {
    const Geometry geo{2 * group, 2, head_dim, 0, 4096};
    std::vector<SequenceSpec> specs;
    std::vector<std::pair<int32_t, int32_t>> rows;
    for (const int32_t length : lengths) {
      rows.emplace_back(static_cast<int32_t>(specs.size()), length - 1);
      specs.push_back({length});
    }
    const Scenario s = make_scenario<Bf16>(geo, specs, rows, seed++);
    for (const int32_t warps : {0, 2, 4, 8}) {
      Launch l;
      l.block_warps = warps;
      l.target_blocks = 512;
      expect_e4m3_matches_cpu(s, l, describe(geo, 4096, 8) + " warps " + std::to_string(warps));
    }
    // One row: few blocks, so the cluster fold where the device has clusters.
    const Scenario one = decode_scenario(geo, 3000, 1, seed++);
    for (const bool cluster : {true, false}) {
      Launch l;
      l.cluster_fold = cluster;
      expect_e4m3_matches_cpu(one, l, describe(geo, 3000, 1) + (cluster ? " cluster" : ""));
    }
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(AttentionE4m3Test, PrefillRunsMatchTheCpuAttention) {
  CELLM_SKIP_WITHOUT_GPU();
  // row_runs: the prefill kernel's e4m3 variant takes every group it serves (1, 2, 4, 8,
  // 16); a chunk of 40 consecutive rows ending at position 299 of one sequence and one of
  // 20 rows from position 0 of another (a block holding rows of both), with and without a
  // window; the same rows through the split kernel (row_runs off) too.
  uint32_t seed = 900;
  for (const int64_t head_dim : {64, 128}) {
    for (const int64_t group : {1, 2, 4, 8, 16}) {
      for (const int32_t window : {0, 64}) {
        const Geometry geo{2 * group, 2, head_dim, window, 1024};
        std::vector<std::pair<int32_t, int32_t>> rows;
        for (int32_t pos = 260; pos < 300; ++pos) rows.emplace_back(0, pos);
        for (int32_t pos = 0; pos < 20; ++pos) rows.emplace_back(1, pos);
        const Scenario s = make_scenario<Bf16>(geo, {{300}, {20}}, rows, seed++);
        for (const bool runs : {true, false}) {
          Launch l;
          l.row_runs = runs;
          expect_e4m3_matches_cpu(s, l, describe(geo, 300, 60) + (runs ? " prefill" : " split"));
        }
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

TEST(AttentionE4m3Test, OtherShapesRunTheCudaCoreE4m3Kernel) {
  CELLM_SKIP_WITHOUT_GPU();
  const Geometry geo40{8, 2, 40, 0, 2048};
  Launch cuda_cores;
  cuda_cores.tensor_cores = false;
  expect_e4m3_matches_cpu(decode_scenario(geo40, 700, 3, 1000), cuda_cores, "head_dim 40");
  const Geometry geo128{8, 2, 128, 0, 2048};
  cuda_cores.path = AttentionPath::kCudaCores;
  expect_e4m3_matches_cpu(decode_scenario(geo128, 700, 3, 1001), cuda_cores, "forced cuda cores");
}

TEST(AttentionE4m3LaunchTest, AHalfSetE4m3CacheIsRefused) {
  AttentionParams<Bf16> p;
  p.n_rows = 1;
  p.n_heads = 2;
  p.n_kv_heads = 1;
  p.head_dim = 64;
  p.row_stride = 128;
  p.max_context = 16;
  p.table_stride = 16;
  std::vector<uint8_t> codes(64);
  std::vector<float> scales(1);
  std::vector<int32_t> ints(16);
  std::vector<Bf16> rows(128);
  p.qkv = rows.data();
  p.out = rows.data();
  p.table = ints.data();
  p.row_seq = ints.data();
  p.positions = ints.data();
  p.k_codes = codes.data();
  p.v_codes = codes.data();
  p.k_scales = scales.data();  // v_scales missing
  EXPECT_EQ(launch_attention<Bf16>(p, nullptr), cudaErrorInvalidValue);
  p.v_scales = scales.data();
  p.k_pool = rows.data();  // a T pool besides
  EXPECT_EQ(launch_attention<Bf16>(p, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace cellm::cuda::attention_test
