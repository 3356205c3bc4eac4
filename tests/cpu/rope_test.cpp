#include "cpu/kernels/rope.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "cpu/kernels/reference.h"
#include "kernel_test_util.h"
#include "model/rope.h"
#include "rope_golden.h"

namespace cellm::cpu {
namespace {

using testing::all_close;

template <size_t N>
std::vector<float> from_bits(const uint32_t (&bits)[N]) {
  std::vector<float> v;
  for (uint32_t b : bits) v.push_back(std::bit_cast<float>(b));
  return v;
}

TEST(RopeInvFreqTest, DefaultThetaMatchesTransformersBitForBit) {
  EXPECT_EQ(rope_inv_freq(10000.0, 64), from_bits(kDefaultInvFreqBits));
}

TEST(RopeInvFreqTest, Llama31ScalingMatchesTransformersBitForBit) {
  const RopeScaling llama3{.type = RopeScalingType::kLlama3,
                           .factor = 8.0,
                           .low_freq_factor = 1.0,
                           .high_freq_factor = 4.0,
                           .original_max_position_embeddings = 8192};
  EXPECT_EQ(rope_inv_freq(500000.0, 128, llama3), from_bits(kLlama31InvFreqBits));
}

TEST(RopeInvFreqTest, Llama3KeepsHighFrequenciesAndDividesLowOnesByTheFactor) {
  const RopeScaling llama3{.type = RopeScalingType::kLlama3, .factor = 8.0};
  const std::vector<float> plain = rope_inv_freq(500000.0, 128);
  const std::vector<float> scaled = rope_inv_freq(500000.0, 128, llama3);
  ASSERT_EQ(plain.size(), 64u);
  EXPECT_EQ(scaled.front(), plain.front());       // wavelength 2π: untouched
  EXPECT_EQ(scaled.back(), plain.back() / 8.0f);  // longest wavelength: / factor
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_LE(scaled[i], plain[i]) << i;
    EXPECT_GE(scaled[i], plain[i] / 8.0f) << i;
  }
}

TEST(RopeTest, RotationMatchesTransformersApplyRotaryPosEmb) {
  // One head of 64 at positions 0, 7, 1000 and 131071 (large angles stress the
  // f32 argument: cos/sin of the f32 product pos * inv_freq, as torch).
  const int64_t m = 4, hd = 64;
  std::vector<float> q(static_cast<size_t>(m * hd));
  for (size_t i = 0; i < q.size(); ++i)
    q[i] = static_cast<float>(((i * 37) % 101)) / 16.0f - 50.0f / 16.0f;
  const std::vector<float> inv_freq = rope_inv_freq(10000.0, hd);
  ThreadPool pool(2);
  rope(pool, q.data(), 1, nullptr, 0, m, hd, kRopePositions, inv_freq);
  // cos/sin may differ from torch's by an ulp of the value: 1e-6 of |x| + 1e-6.
  EXPECT_TRUE(all_close(q, from_bits(kRopeOutBits), 1e-6, 2e-6));
}

TEST(RopeTest, QAndKHeadsMatchTheReferenceAtPerRowPositions) {
  std::mt19937 rng(3);
  for (int64_t hd : {64, 128, 96}) {
    for (int64_t m : {1, 3, 17}) {
      const int64_t nh = 5, nkv = 1;
      std::vector<float> q = testing::random_floats(rng, m * nh * hd, -2.0f, 2.0f);
      std::vector<float> k = testing::random_floats(rng, m * nkv * hd, -2.0f, 2.0f);
      std::vector<int32_t> pos(static_cast<size_t>(m));
      for (int64_t r = 0; r < m; ++r)
        pos[static_cast<size_t>(r)] = static_cast<int32_t>((r * 977) % 5000);
      const std::vector<float> inv_freq =
          rope_inv_freq(500000.0, hd, RopeScaling{.type = RopeScalingType::kLlama3, .factor = 8.0});
      std::vector<float> want_q = q, want_k = k;
      for (int64_t r = 0; r < m; ++r) {
        reference::rope_row(want_q.data() + r * nh * hd, nh, hd, pos[r], inv_freq);
        reference::rope_row(want_k.data() + r * nkv * hd, nkv, hd, pos[r], inv_freq);
      }
      ThreadPool pool(3);
      rope(pool, q.data(), nh, k.data(), nkv, m, hd, pos, inv_freq);
      // f32 cos/sin of an f32 angle versus f64: 1e-6 relative of |x|, 4e-6 absolute.
      EXPECT_TRUE(all_close(q, want_q, 1e-6, 4e-6)) << "hd " << hd << " m " << m;
      EXPECT_TRUE(all_close(k, want_k, 1e-6, 4e-6)) << "hd " << hd << " m " << m;
    }
  }
}

TEST(RopeTest, PartialRotaryLeavesTheTailDimensionsUntouched) {
  std::mt19937 rng(4);
  const int64_t hd = 80, rotary = 32, m = 2;
  std::vector<float> q = testing::random_floats(rng, m * hd);
  const std::vector<float> before = q;
  const std::vector<float> inv_freq = rope_inv_freq(10000.0, rotary);
  const std::vector<int32_t> pos = {5, 9};
  ThreadPool pool(1);
  rope(pool, q.data(), 1, nullptr, 0, m, hd, pos, inv_freq);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t i = rotary; i < hd; ++i) EXPECT_EQ(q[r * hd + i], before[r * hd + i]);
    EXPECT_NE(q[r * hd], before[r * hd]);
  }
}

TEST(RopeTest, PositionZeroIsTheIdentity) {
  std::vector<float> q = {1.0f, 2.0f, 3.0f, 4.0f, -1.0f, 0.5f, 0.25f, 8.0f};
  const std::vector<float> before = q;
  ThreadPool pool(1);
  const std::vector<int32_t> pos = {0};
  rope(pool, q.data(), 2, nullptr, 0, 1, 4, pos, rope_inv_freq(10000.0, 4));
  EXPECT_EQ(q, before);
}

}  // namespace
}  // namespace cellm::cpu
