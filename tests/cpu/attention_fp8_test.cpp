// The e4m3 KV cache's CPU kernels: the quantize-on-write (write_kv_e4m3 against its
// scalar definition quantize_kv_head_e4m3, element by element) and attention over e4m3
// K/V (every output element against the f64 reference over the dequantized K/V).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "cpu/kernels/attention.h"
#include "cpu/kernels/e4m3.h"
#include "cpu/kernels/reference.h"
#include "kernel_test_util.h"
#include "model/fp8.h"

namespace cellm::cpu {
namespace {

using testing::all_close;
using testing::random_floats;

TEST(QuantizeKvHeadE4m3Test, TheScaleIsTheSmallestPowerOfTwoAtLeastAmaxOver448) {
  EXPECT_EQ(kv_scale_e4m3(448.0f), 1.0f);
  EXPECT_EQ(kv_scale_e4m3(449.0f), 2.0f);
  EXPECT_EQ(kv_scale_e4m3(224.0f), 0.5f);
  EXPECT_EQ(kv_scale_e4m3(225.0f), 1.0f);
  EXPECT_EQ(kv_scale_e4m3(7.0f), 0x1p-6f);  // 7 / 448 = 2^-6 exactly
  EXPECT_EQ(kv_scale_e4m3(0.0f), 1.0f);
}

TEST(QuantizeKvHeadE4m3Test, EveryValueRoundsToItsNearestCodeAndTheLargestLandsHigh) {
  std::mt19937 rng(11);
  for (float range : {1e-4f, 0.5f, 3.0f, 700.0f}) {
    const std::vector<float> x = random_floats(rng, 64, -range, range);
    std::vector<uint8_t> codes(x.size());
    const float scale = quantize_kv_head_e4m3(x.data(), 64, codes.data());
    float amax = 0.0f;
    for (float v : x) amax = std::fmax(amax, std::fabs(v));
    EXPECT_EQ(scale, kv_scale_e4m3(amax));
    int e = 0;
    EXPECT_EQ(std::frexp(scale, &e), 0.5f) << "a power of two";
    EXPECT_GT(amax / scale, 224.0f);
    EXPECT_LE(amax / scale, kE4M3Max);
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(codes[i], f32_to_e4m3(x[i] / scale)) << i;
      // Round to nearest: within half a step of 3 mantissa bits (2^-4 relative), or half
      // the subnormal step 2^-10 of the scaled value.
      const double err = std::fabs(double{e4m3_to_f32(codes[i])} * scale - x[i]);
      EXPECT_LE(err, std::fmax(0x1p-4 * std::fabs(x[i]), 0x1p-10 * scale) * (1 + 1e-6)) << i;
    }
  }
}

TEST(QuantizeKvHeadE4m3Test, AnAllZeroRowGetsScaleOneAndZeroCodes) {
  const std::vector<float> x(16, 0.0f);
  std::vector<uint8_t> codes(16, 0xAA);
  EXPECT_EQ(quantize_kv_head_e4m3(x.data(), 16, codes.data()), 1.0f);
  for (uint8_t c : codes) EXPECT_EQ(c, 0);
}

TEST(DecodeE4m3Test, EveryCodeDecodesToItsTableValueAtEveryOffsetAndLength) {
  // All 256 codes, shifted through every offset so each lands in every vector lane and in
  // the scalar tail, at lengths that are and are not multiples of 16.
  std::vector<uint8_t> codes(256 + 32);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(i * 37 + 11);
  const std::array<float, 256>& table = e4m3_table();
  for (int64_t offset = 0; offset < 17; ++offset) {
    for (const int64_t n : {int64_t{1}, int64_t{15}, int64_t{16}, int64_t{64}, int64_t{257}}) {
      std::vector<float> out(static_cast<size_t>(n), -1.0f);
      decode_e4m3(codes.data() + offset, n, out.data());
      for (int64_t i = 0; i < n; ++i) {
        const float want = table[codes[static_cast<size_t>(offset + i)]];
        const float got = out[static_cast<size_t>(i)];
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(got)) << "code " << int{codes[static_cast<size_t>(offset + i)]};
        } else {
          EXPECT_EQ(got, want) << "code " << int{codes[static_cast<size_t>(offset + i)]};
        }
      }
    }
  }
}

TEST(WriteKvE4m3Test, EachHeadRowLandsInItsCellAsItsScalarDefinitionAndNothingElseChanges) {
  const int64_t heads = 3, hd = 20, row = heads * hd, max_cells = 6, n = 3;
  std::mt19937 rng(5);
  std::vector<float> k = random_floats(rng, n * row, -3.0f, 3.0f);
  const std::vector<float> v = random_floats(rng, n * row, -0.01f, 0.01f);
  for (int64_t i = 0; i < hd; ++i) k[static_cast<size_t>(row + hd + i)] = 0.0f;  // row 1, head 1
  std::vector<uint8_t> kc(max_cells * row, 0x11), vc(max_cells * row, 0x22);
  std::vector<float> ks(max_cells * heads, -1.0f), vs(max_cells * heads, -2.0f);
  const std::vector<int32_t> cells = {5, 0, 3};
  write_kv_e4m3(k.data(), v.data(), n, heads, hd, cells, kc.data(), ks.data(), vc.data(), vs.data(),
                max_cells);
  for (int64_t c = 0; c < max_cells; ++c) {
    const int64_t r = c == 5 ? 0 : c == 0 ? 1 : c == 3 ? 2 : -1;
    for (int64_t g = 0; g < heads; ++g) {
      const size_t s = static_cast<size_t>(c * heads + g);
      if (r < 0) {
        EXPECT_EQ(ks[s], -1.0f);
        EXPECT_EQ(vs[s], -2.0f);
        for (int64_t i = 0; i < hd; ++i) {
          EXPECT_EQ(kc[static_cast<size_t>(c * row + g * hd + i)], 0x11);
          EXPECT_EQ(vc[static_cast<size_t>(c * row + g * hd + i)], 0x22);
        }
        continue;
      }
      uint8_t want_k[hd], want_v[hd];
      EXPECT_EQ(ks[s], quantize_kv_head_e4m3(k.data() + r * row + g * hd, hd, want_k));
      EXPECT_EQ(vs[s], quantize_kv_head_e4m3(v.data() + r * row + g * hd, hd, want_v));
      for (int64_t i = 0; i < hd; ++i) {
        EXPECT_EQ(kc[static_cast<size_t>(c * row + g * hd + i)], want_k[i]) << c << "," << g;
        EXPECT_EQ(vc[static_cast<size_t>(c * row + g * hd + i)], want_v[i]) << c << "," << g;
      }
    }
  }
  EXPECT_EQ(ks[1], 1.0f);  // cell 0 holds row 1, whose head 1 is all zero
}

struct Scenario {
  int64_t n_heads, n_kv_heads, head_dim, max_cells;
  std::vector<std::vector<int32_t>> sequences;  // cell list of each sequence
  std::vector<int32_t> row_seq;                 // sequence of each query row
  std::vector<int32_t> row_pos;                 // position of each query row
};

// Three sequences in 200 cells (lengths 1, 37, 150), cells interleaved and out of order;
// a decode, a 3-token prefill chunk, a decode at the end and a query mid-sequence.
Scenario mixed_batch(int64_t n_heads, int64_t n_kv_heads, int64_t head_dim) {
  Scenario s{n_heads, n_kv_heads, head_dim, 200, {}, {0, 1, 1, 1, 2, 2}, {0, 34, 35, 36, 149, 64}};
  size_t next = 0;
  for (int32_t len : {1, 37, 150}) {
    std::vector<int32_t> cells;
    for (int32_t i = 0; i < len; ++i) cells.push_back(static_cast<int32_t>((next++ * 73) % 200));
    s.sequences.push_back(cells);
  }
  return s;
}

// K/V written through write_kv_e4m3 into every cell, attended, and compared with
// reference::attention_one over the dequantized values (code x scale, exact in f32).
void expect_matches_reference(const Scenario& s, int32_t window, int threads, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t rows = static_cast<int64_t>(s.row_pos.size());
  const int64_t stride = s.n_kv_heads * s.head_dim;
  std::vector<float> k = random_floats(rng, s.max_cells * stride, -2.0f, 2.0f);
  const std::vector<float> v = random_floats(rng, s.max_cells * stride);
  // Head rows of very different magnitudes, as real K/V have: each its own scale.
  for (size_t i = 0; i < k.size(); ++i) k[i] *= std::ldexp(1.0f, static_cast<int>(i / 7 % 9) - 4);
  const std::vector<float> q = random_floats(rng, rows * s.n_heads * s.head_dim, -2.0f, 2.0f);
  std::vector<int32_t> all_cells(static_cast<size_t>(s.max_cells));
  for (int32_t c = 0; c < s.max_cells; ++c) all_cells[static_cast<size_t>(c)] = c;
  std::vector<uint8_t> kc(k.size()), vc(v.size());
  std::vector<float> ks(static_cast<size_t>(s.max_cells * s.n_kv_heads)), vs(ks.size());
  write_kv_e4m3(k.data(), v.data(), s.max_cells, s.n_kv_heads, s.head_dim, all_cells, kc.data(),
                ks.data(), vc.data(), vs.data(), s.max_cells);
  std::vector<float> kd(k.size()), vd(v.size());
  for (size_t i = 0; i < k.size(); ++i) {
    const size_t scale = i / static_cast<size_t>(s.head_dim);
    kd[i] = e4m3_to_f32(kc[i]) * ks[scale];
    vd[i] = e4m3_to_f32(vc[i]) * vs[scale];
  }
  std::vector<std::span<const int32_t>> cells_of_row;
  for (int32_t seq : s.row_seq) cells_of_row.emplace_back(s.sequences[static_cast<size_t>(seq)]);

  std::vector<float> got(q.size(), NAN);
  ThreadPool pool(threads);
  attention(pool, AttentionArgs{.q = q.data(),
                                .n_rows = rows,
                                .n_heads = s.n_heads,
                                .n_kv_heads = s.n_kv_heads,
                                .head_dim = s.head_dim,
                                .max_cells = s.max_cells,
                                .q_pos = s.row_pos,
                                .cells_of_row = cells_of_row,
                                .window = window,
                                .out = got.data(),
                                .k_codes = kc.data(),
                                .v_codes = vc.data(),
                                .k_scales = ks.data(),
                                .v_scales = vs.data()});
  std::vector<float> want(q.size());
  const int64_t group = s.n_heads / s.n_kv_heads;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < s.n_heads; ++h) {
      const int64_t off = (r * s.n_heads + h) * s.head_dim;
      reference::attention_one(q.data() + off, s.head_dim, kd.data(), vd.data(), stride, h / group,
                               s.row_pos[static_cast<size_t>(r)],
                               cells_of_row[static_cast<size_t>(r)], window, want.data() + off);
    }
  }
  // Convex combinations of V in [-1, 1], f32 online softmax against f64: as the f32
  // attention test (2e-6 absolute); the scales only change where rounding happens.
  EXPECT_TRUE(all_close(got, want, 0.0, 2e-6)) << "window " << window << " threads " << threads;
}

TEST(AttentionE4m3Test, FullHistoryMatchesTheReferenceOverTheDequantizedKv) {
  expect_matches_reference(mixed_batch(4, 4, 64), 0, 3, 1);
}

TEST(AttentionE4m3Test, GroupedQueryHeadsReadTheirSharedKvHeadAndItsScale) {
  expect_matches_reference(mixed_batch(8, 2, 32), 0, 2, 2);
  expect_matches_reference(mixed_batch(6, 1, 17), 0, 1, 3);
  expect_matches_reference(mixed_batch(3, 1, 48), 0, 2, 8);
  expect_matches_reference(mixed_batch(9, 3, 64), 0, 2, 9);  // SmolLM2-135M's heads
}

TEST(AttentionE4m3Test, SlidingWindowAndOddShapesMatch) {
  for (int32_t window : {1, 5, 33, 1000})
    expect_matches_reference(mixed_batch(4, 2, 64), window, 2, 4);
  Scenario s{3, 3, 7, 9, {{4, 2, 8, 0, 1}}, {0}, {4}};
  expect_matches_reference(s, 0, 1, 5);
  Scenario big{2, 1, 128, 300, {{}}, {0}, {299}};
  for (int32_t c = 299; c >= 0; --c) big.sequences[0].push_back(c);
  expect_matches_reference(big, 0, 2, 6);
}

}  // namespace
}  // namespace cellm::cpu
