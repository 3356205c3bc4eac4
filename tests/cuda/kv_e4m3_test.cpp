// The e4m3 KV cache's device kernels (src/cuda/kernels/kv_e4m3.h) against their CPU
// twins, every element. The rope + e4m3 K/V write: qkv ends bit for bit as the bf16/f32
// fused kernel (launch_rope_kv_write, itself tested against rope then kv_write) leaves it,
// and so does the cell table; every code and scale equals cpu::quantize_kv_head_e4m3 of
// the rotated k / the v head row; cells no row writes keep their poison. The decode
// attention: cpu::attention over the same codes and scales (AttentionArgs::k_codes), GQA
// and equal heads, head_dim 64/128/40, windows, cells through a table, q read from
// fused qkv rows.
#include "cuda/kernels/kv_e4m3.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "cpu/kernels/attention.h"
#include "cpu/kernels/thread_pool.h"
#include "cuda/kernels/rope_kv_write.h"
#include "device_test_util.h"
#include "gpu_test.h"
#include "model/rope.h"

namespace cellm::cuda {
namespace {

using testing::DeviceArray;
using testing::expect_bitwise_equal;
using testing::from_f32;
using testing::random_nonzero;
using testing::to_f32;

template <typename T>
class KvE4m3Test : public ::testing::Test {};
using ElementTypes = ::testing::Types<float, __nv_bfloat16>;
TYPED_TEST_SUITE(KvE4m3Test, ElementTypes, testing::TypeNames);

struct WriteShape {
  int64_t head_dim, n_heads, n_kv_heads, n_rows;
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  int64_t row_stride() const { return (n_heads + 2 * n_kv_heads) * head_dim + 3; }
  int64_t max_cells() const { return n_rows + 11; }
};

template <typename T>
void check_write(const WriteShape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<T> qkv(static_cast<size_t>(s.n_rows * s.row_stride()));
  for (T& x : qkv) x = from_f32<T>(random_nonzero(rng, 0.01f, 4.0f));
  // Row 0's first v head all zero: scale 1, codes 0.
  const int64_t v_offset = (s.n_heads + s.n_kv_heads) * s.head_dim;
  for (int64_t i = 0; i < s.head_dim; ++i) qkv[static_cast<size_t>(v_offset + i)] = from_f32<T>(0);
  std::vector<int32_t> positions, all_cells(static_cast<size_t>(s.max_cells()));
  // Distinct non-negative positions (each row stores its own table entry), up to 11,074.
  for (int64_t r = 0; r < s.n_rows; ++r) positions.push_back(static_cast<int32_t>(11 + 37 * r));
  std::iota(all_cells.begin(), all_cells.end(), 0);
  std::shuffle(all_cells.begin(), all_cells.end(), rng);
  const std::vector<int32_t> cells(all_cells.begin(), all_cells.begin() + s.n_rows);
  const std::vector<float> inv_freq = rope_inv_freq(10000.0, s.head_dim);

  // The reference: the fused bf16/f32 kernel, whose pools hold the rotated k and the v.
  DeviceArray<T> ref_qkv(qkv), k_pool(static_cast<size_t>(s.max_cells() * s.kv_dim())),
      v_pool(k_pool.size());
  DeviceArray<int32_t> d_positions(positions), d_cells(cells);
  DeviceArray<float> d_inv_freq(inv_freq);
  RopeKvWriteParams<T> rp;
  rp.qkv = ref_qkv.get();
  rp.n_rows = s.n_rows;
  rp.row_stride = s.row_stride();
  rp.q_offset = 0;
  rp.n_heads = s.n_heads;
  rp.k_offset = s.n_heads * s.head_dim;
  rp.v_offset = v_offset;
  rp.n_kv_heads = s.n_kv_heads;
  rp.head_dim = s.head_dim;
  rp.positions = d_positions.get();
  rp.inv_freq = d_inv_freq.get();
  rp.cells = d_cells.get();
  rp.k_pool = k_pool.get();
  rp.v_pool = v_pool.get();
  // Both store each row's cell in a table of two sequences, rows alternating.
  const int64_t table_stride = 11 + 37 * s.n_rows;
  std::vector<int32_t> row_seq;
  for (int64_t r = 0; r < s.n_rows; ++r) row_seq.push_back(static_cast<int32_t>(r % 2));
  DeviceArray<int32_t> d_row_seq(row_seq), ref_table(static_cast<size_t>(2 * table_stride)),
      got_table(ref_table.size());
  ref_table.fill_bytes(0xFF);
  got_table.fill_bytes(0xFF);
  rp.table = ref_table.get();
  rp.table_stride = table_stride;
  rp.row_seq = d_row_seq.get();
  CELLM_ASSERT_CUDA(launch_rope_kv_write<T>(rp, nullptr));

  DeviceArray<T> got_qkv(qkv);
  DeviceArray<uint8_t> k_codes(k_pool.size()), v_codes(k_pool.size());
  DeviceArray<float> k_scales(static_cast<size_t>(s.max_cells() * s.n_kv_heads)),
      v_scales(k_scales.size());
  k_codes.fill_bytes(0x5A);
  v_codes.fill_bytes(0x5A);
  k_scales.fill_bytes(0xFF);
  v_scales.fill_bytes(0xFF);
  RopeKvWriteE4m3Params<T> p;
  p.qkv = got_qkv.get();
  p.n_rows = s.n_rows;
  p.row_stride = s.row_stride();
  p.q_offset = 0;
  p.n_heads = s.n_heads;
  p.k_offset = rp.k_offset;
  p.v_offset = v_offset;
  p.n_kv_heads = s.n_kv_heads;
  p.head_dim = s.head_dim;
  p.positions = d_positions.get();
  p.inv_freq = d_inv_freq.get();
  p.cells = d_cells.get();
  p.k_codes = k_codes.get();
  p.v_codes = v_codes.get();
  p.k_scales = k_scales.get();
  p.v_scales = v_scales.get();
  p.table = got_table.get();
  p.table_stride = table_stride;
  p.row_seq = d_row_seq.get();
  CELLM_ASSERT_CUDA(launch_rope_kv_write_e4m3<T>(p, nullptr));
  CELLM_ASSERT_CUDA(cudaDeviceSynchronize());

  expect_bitwise_equal(got_qkv.download(), ref_qkv.download(), "qkv");
  EXPECT_EQ(got_table.download(), ref_table.download()) << "the cell table";
  const std::vector<float> k_ref = testing::to_floats(k_pool.download());
  const std::vector<float> v_ref = testing::to_floats(v_pool.download());
  const std::vector<uint8_t> kc = k_codes.download(), vc = v_codes.download();
  const std::vector<float> ks = k_scales.download(), vs = v_scales.download();
  std::vector<bool> written(static_cast<size_t>(s.max_cells()), false);
  for (int32_t c : cells) written[static_cast<size_t>(c)] = true;
  const auto hd = static_cast<size_t>(s.head_dim);
  size_t bad = 0;
  for (int64_t c = 0; c < s.max_cells(); ++c) {
    for (int64_t g = 0; g < s.n_kv_heads; ++g) {
      const auto at = static_cast<size_t>(c * s.n_kv_heads + g);
      if (!written[static_cast<size_t>(c)]) {
        for (size_t i = 0; i < hd; ++i)
          bad += (kc[at * hd + i] != 0x5A) + (vc[at * hd + i] != 0x5A);
        continue;
      }
      std::vector<uint8_t> want_k(hd), want_v(hd);
      const float sk =
          cpu::quantize_kv_head_e4m3(k_ref.data() + at * hd, s.head_dim, want_k.data());
      const float sv =
          cpu::quantize_kv_head_e4m3(v_ref.data() + at * hd, s.head_dim, want_v.data());
      EXPECT_EQ(ks[at], sk) << "cell " << c << " head " << g;
      EXPECT_EQ(vs[at], sv) << "cell " << c << " head " << g;
      for (size_t i = 0; i < hd; ++i) {
        bad += (kc[at * hd + i] != want_k[i]) + (vc[at * hd + i] != want_v[i]);
      }
    }
  }
  EXPECT_EQ(bad, 0u) << "codes that differ from cpu::quantize_kv_head_e4m3 or lost their poison";
  EXPECT_EQ(vs[static_cast<size_t>(cells[0]) * static_cast<size_t>(s.n_kv_heads)], 1.0f);
}

TYPED_TEST(KvE4m3Test, RopeKvWriteQuantizesEachHeadRowAsItsCpuTwin) {
  CELLM_SKIP_WITHOUT_GPU();
  check_write<TypeParam>({64, 9, 3, 7}, 1);
  check_write<TypeParam>({128, 32, 8, 3}, 2);
  check_write<TypeParam>({40, 4, 4, 300}, 3);
}

struct AttentionShape {
  int64_t head_dim, n_heads, n_kv_heads;
  int32_t window;
};

// q_pad > 0: q's rows sit q_pad elements apart beyond their heads (the q columns of fused
// qkv rows, AttentionE4m3Params::q_row_stride).
template <typename T>
void check_attention(const AttentionShape& s, uint32_t seed, int64_t q_pad = 0) {
  std::mt19937 rng(seed);
  const int64_t max_cells = 400, stride = 512;
  const int64_t kv_dim = s.n_kv_heads * s.head_dim;
  // K/V quantized on the host by the CPU twin of the write.
  std::vector<float> k(static_cast<size_t>(max_cells * kv_dim)), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = random_nonzero(rng, 0.001f, 2.0f) * static_cast<float>(1 + i / 97 % 5);
    v[i] = random_nonzero(rng, 0.001f, 1.0f);
  }
  std::vector<int32_t> all(static_cast<size_t>(max_cells));
  std::iota(all.begin(), all.end(), 0);
  std::vector<uint8_t> kc(k.size()), vc(k.size());
  std::vector<float> ks(static_cast<size_t>(max_cells * s.n_kv_heads)), vs(ks.size());
  cpu::write_kv_e4m3(k.data(), v.data(), max_cells, s.n_kv_heads, s.head_dim, all, kc.data(),
                     ks.data(), vc.data(), vs.data(), max_cells);
  // Two sequences of 250 and 150 cells, shuffled; a decode at the end of each, rows in
  // their middle, and position 0.
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<int32_t> table(static_cast<size_t>(2 * stride), -1);
  std::copy_n(all.begin(), 250, table.begin());
  std::copy_n(all.begin() + 250, 150, table.begin() + stride);
  const std::vector<int32_t> row_seq = {0, 1, 0, 1, 0};
  const std::vector<int32_t> positions = {249, 149, 100, 0, 31};
  const auto n_rows = static_cast<int64_t>(positions.size());
  std::vector<float> q(static_cast<size_t>(n_rows * s.n_heads * s.head_dim));
  for (float& x : q) x = testing::round_to<T>(random_nonzero(rng, 0.01f, 2.0f));

  cpu::ThreadPool pool(1);
  std::vector<std::span<const int32_t>> cells_of_row;
  for (int32_t seq : row_seq) {
    cells_of_row.emplace_back(table.data() + static_cast<size_t>(seq) * stride,
                              static_cast<size_t>(stride));
  }
  std::vector<float> want(q.size());
  cpu::AttentionArgs a;
  a.q = q.data();
  a.n_rows = n_rows;
  a.n_heads = s.n_heads;
  a.n_kv_heads = s.n_kv_heads;
  a.head_dim = s.head_dim;
  a.max_cells = max_cells;
  a.q_pos = positions;
  a.cells_of_row = cells_of_row;
  a.window = s.window;
  a.out = want.data();
  a.k_codes = kc.data();
  a.v_codes = vc.data();
  a.k_scales = ks.data();
  a.v_scales = vs.data();
  cpu::attention(pool, a);

  const int64_t q_width = s.n_heads * s.head_dim;
  std::vector<float> q_rows(static_cast<size_t>(n_rows * (q_width + q_pad)), 1e30f);
  for (int64_t r = 0; r < n_rows; ++r) {
    std::copy_n(q.begin() + r * q_width, q_width, q_rows.begin() + r * (q_width + q_pad));
  }
  DeviceArray<T> d_q(testing::to_typed<T>(q_rows)), d_out(q.size());
  d_out.fill_bytes(0xFF);
  DeviceArray<uint8_t> d_kc(kc), d_vc(vc);
  DeviceArray<float> d_ks(ks), d_vs(vs);
  DeviceArray<int32_t> d_table(table), d_row_seq(row_seq), d_positions(positions);
  AttentionE4m3Params<T> p;
  p.q = d_q.get();
  p.q_row_stride = q_pad > 0 ? q_width + q_pad : 0;
  p.out = d_out.get();
  p.n_rows = n_rows;
  p.n_heads = s.n_heads;
  p.n_kv_heads = s.n_kv_heads;
  p.head_dim = s.head_dim;
  p.k_codes = d_kc.get();
  p.v_codes = d_vc.get();
  p.k_scales = d_ks.get();
  p.v_scales = d_vs.get();
  p.table = d_table.get();
  p.table_stride = stride;
  p.row_seq = d_row_seq.get();
  p.positions = d_positions.get();
  p.window = s.window;
  CELLM_ASSERT_CUDA(launch_attention_decode_e4m3<T>(p, nullptr));
  CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
  // f32: the summation orders and exp differ, outputs are convex combinations of V in
  // [-1, 1]: 1e-5 absolute. bf16: the output's rounding besides (2^-8 relative).
  const bool bf16 = !std::is_same_v<T, float>;
  testing::expect_all_close(
      testing::to_floats(d_out.download()), want, 1e-5f, bf16 ? 0x1p-8f : 0.0f,
      "head_dim " + std::to_string(s.head_dim) + " window " + std::to_string(s.window));
}

TYPED_TEST(KvE4m3Test, DecodeAttentionMatchesTheCpuAttentionOverTheSameCodes) {
  CELLM_SKIP_WITHOUT_GPU();
  check_attention<TypeParam>({64, 9, 3, 0}, 4);
  check_attention<TypeParam>({128, 32, 8, 0}, 5);
  check_attention<TypeParam>({40, 4, 4, 0}, 6);
  check_attention<TypeParam>({64, 8, 2, 33}, 7);
  check_attention<TypeParam>({64, 9, 3, 0}, 8, 3 * 64 * 2);  // q in fused qkv rows
}

TEST(KvE4m3LaunchTest, MalformedCallsAreRefused) {
  RopeKvWriteE4m3Params<float> w;
  w.n_rows = 1;
  w.n_kv_heads = 1;
  w.head_dim = 3;  // odd
  EXPECT_EQ(launch_rope_kv_write_e4m3<float>(w, nullptr), cudaErrorInvalidValue);
  AttentionE4m3Params<float> a;
  a.n_rows = 1;
  a.n_heads = 3;
  a.n_kv_heads = 2;  // does not divide
  a.head_dim = 64;
  EXPECT_EQ(launch_attention_decode_e4m3<float>(a, nullptr), cudaErrorInvalidValue);
  a.n_kv_heads = 3;
  a.q_row_stride = 3 * 64 - 1;  // narrower than the q heads
  EXPECT_EQ(launch_attention_decode_e4m3<float>(a, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace cellm::cuda
