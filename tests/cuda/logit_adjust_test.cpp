// The device logit adjustments (cuda/kernels/logit_adjust.h, packed and uploaded by
// cuda/logit_adjuster.h) against their CPU twin, cellm::apply_logit_adjustments, element
// for element: random rows holding +-inf, NaN, +-0 and denormals; random masks (full,
// short, longer than the vocabulary, empty), random edits (scales below and above 1,
// biases of +-inf, tokens outside the vocabulary, a token edited twice), vocabularies
// that are not a multiple of 64 and span several of the kernel's chunks, and several rows
// with and without adjustments, the unadjusted rows untouched. Every float must equal the
// host's bit for bit (NaN: any NaN, as the device's NaN payload is its own).
//
// The packing (pack_adjustments) and the launcher's argument checks run without a GPU.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cellm/logits_processor.h"
#include "cuda/device_memory.h"
#include "cuda/kernels/logit_adjust.h"
#include "cuda/logit_adjuster.h"
#include "gpu_test.h"

namespace cellm::cuda {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Same bits, or both NaN.
bool same_float(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

float random_logit(std::mt19937& rng) {
  std::uniform_int_distribution<int> kind(0, 99);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  switch (kind(rng)) {
    case 0:
      return kInf;
    case 1:
      return -kInf;
    case 2:
      return std::numeric_limits<float>::quiet_NaN();
    case 3:
      return 0.0f;
    case 4:
      return -0.0f;
    case 5:
      return std::numeric_limits<float>::denorm_min() * 3.0f;
    case 6:
      return -std::numeric_limits<float>::max();
    default:
      return normal(rng);
  }
}

LogitAdjustments random_adjustments(std::mt19937& rng, int64_t vocab, int variant) {
  LogitAdjustments a;
  const auto words = static_cast<size_t>((vocab + 63) / 64);
  std::uniform_int_distribution<uint64_t> bits;
  // Masks: 0 none, 1 full, 2 short (forbids the tail), 3 longer than the vocabulary,
  // 4 sparse (a few allowed tokens), 5 none with edits only.
  const int mask_kind = variant % 6;
  if (mask_kind == 1 || mask_kind == 2 || mask_kind == 3) {
    size_t n = words;
    if (mask_kind == 2) n = words > 1 ? words / 2 : 1;
    if (mask_kind == 3) n = words + 3;
    a.allowed.resize(n);
    for (uint64_t& w : a.allowed) w = bits(rng) | bits(rng);  // about 3/4 allowed
  } else if (mask_kind == 4) {
    a.allowed.assign(words, 0);
    std::uniform_int_distribution<int64_t> token(0, vocab - 1);
    for (int i = 0; i < 5; ++i) {
      const int64_t t = token(rng);
      a.allowed[static_cast<size_t>(t / 64)] |= uint64_t{1} << (t % 64);
    }
  }
  if (mask_kind == 0 && variant % 4 == 0) return a;  // an empty row: nothing to do
  std::uniform_int_distribution<int64_t> token(0, vocab - 1);
  std::uniform_real_distribution<float> scale(0.25f, 3.0f);
  std::uniform_real_distribution<float> bias(-5.0f, 5.0f);
  std::uniform_int_distribution<int> odd(0, 19);
  const int n_edits = static_cast<int>(std::min<int64_t>(vocab, 1 + (variant * 37) % 600));
  std::vector<bool> used(static_cast<size_t>(vocab), false);
  for (int i = 0; i < n_edits; ++i) {
    LogitEdit e;
    e.token = static_cast<Token>(token(rng));
    if (used[static_cast<size_t>(e.token)]) continue;  // distinct, as the contract says
    used[static_cast<size_t>(e.token)] = true;
    e.scale = odd(rng) == 0 ? 1.0f : scale(rng);
    e.bias = bias(rng);
    const int o = odd(rng);
    if (o == 1) e.bias = -kInf;
    if (o == 2) e.bias = kInf;
    if (o == 3) e.bias = 0.0f;
    a.edits.push_back(e);
  }
  // Tokens the host ignores.
  if (variant % 3 == 0) {
    a.edits.push_back(LogitEdit{static_cast<Token>(vocab), 2.0f, 1.0f});
    a.edits.push_back(LogitEdit{-1, 2.0f, 1.0f});
  }
  // A token edited twice (outside the contract, but the host's order is defined).
  if (variant % 5 == 0 && !a.edits.empty()) {
    LogitEdit again = a.edits.front();
    again.scale = 1.5f;
    again.bias = -0.75f;
    a.edits.push_back(again);
  }
  return a;
}

// Runs `rows` x vocab logits through the adjuster on the device and compares every
// element with the host's apply_logit_adjustments (rows without adjustments: untouched).
void check_against_host(int64_t vocab, int64_t n_rows, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> logits(static_cast<size_t>(n_rows * vocab));
  for (float& x : logits) x = random_logit(rng);
  std::vector<LogitAdjustments> adjustments(static_cast<size_t>(n_rows));
  std::vector<RowAdjustments> rows;
  for (int64_t r = 0; r < n_rows; ++r) {
    // Every third row has no adjustments at all; the rest a variant of masks and edits.
    if (r % 3 == 1) continue;
    adjustments[static_cast<size_t>(r)] =
        random_adjustments(rng, vocab, static_cast<int>(r + seed % 7));
    rows.push_back(RowAdjustments{static_cast<int32_t>(r), &adjustments[static_cast<size_t>(r)]});
  }
  std::vector<float> want = logits;
  for (int64_t r = 0; r < n_rows; ++r) {
    apply_logit_adjustments(std::span<float>(want.data() + r * vocab, static_cast<size_t>(vocab)),
                            adjustments[static_cast<size_t>(r)]);
  }
  Result<DeviceBuffer> d = DeviceBuffer::allocate(logits.size() * sizeof(float));
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  CELLM_ASSERT_CUDA(
      cudaMemcpy(d->get(), logits.data(), logits.size() * sizeof(float), cudaMemcpyHostToDevice));
  // A pageable cudaMemcpy may return before its DMA lands, and the adjuster's
  // non-blocking stream does not wait for it.
  CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
  Result<Stream> stream = Stream::create();
  ASSERT_TRUE(stream.ok());
  LogitAdjuster adjuster(vocab);
  // Twice: the second call reuses (or grows) the staging of the first.
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1) {
      CELLM_ASSERT_CUDA(cudaMemcpy(d->get(), logits.data(), logits.size() * sizeof(float),
                                   cudaMemcpyHostToDevice));
      // A pageable cudaMemcpy may return before its DMA lands, and the adjuster's
      // non-blocking stream does not wait for it.
      CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
    }
    const Status s = adjuster.apply(rows, d->as<float>(), n_rows, stream->get());
    ASSERT_TRUE(s.ok()) << s.to_string();
    CELLM_ASSERT_CUDA(cudaStreamSynchronize(stream->get()));
    std::vector<float> got(logits.size());
    CELLM_ASSERT_CUDA(
        cudaMemcpy(got.data(), d->get(), got.size() * sizeof(float), cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (same_float(got[i], want[i])) continue;
      if (++bad <= 8) {
        ADD_FAILURE() << "vocab " << vocab << " row " << i / static_cast<size_t>(vocab) << " token "
                      << i % static_cast<size_t>(vocab) << ": device " << got[i] << " host "
                      << want[i] << " (raw " << logits[i] << ")";
      }
    }
    EXPECT_EQ(bad, 0u) << "vocab " << vocab << ", " << n_rows << " rows, pass " << pass << ": "
                       << bad << " of " << got.size() << " logits differ from the host's";
  }
}

TEST(LogitAdjustTest, EveryElementEqualsTheHostTwin) {
  CELLM_SKIP_WITHOUT_GPU();
  // Not multiples of 64; 1 and 63 below a word; 70001 and 151669 span several chunks
  // (kAdjustChunkTokens); 8192 is exactly one chunk.
  const int64_t vocabs[] = {1, 63, 65, 1000, 8192, 8193, 70001, 151669};
  uint32_t seed = 1;
  for (int64_t vocab : vocabs) {
    for (int64_t n_rows : {1, 7, 24}) {
      SCOPED_TRACE("vocab " + std::to_string(vocab) + ", " + std::to_string(n_rows) + " rows");
      check_against_host(vocab, n_rows, seed++);
    }
  }
}

TEST(LogitAdjustTest, ManyEditsAndAllForbiddenAndAllAllowedMasks) {
  CELLM_SKIP_WITHOUT_GPU();
  const int64_t vocab = 32003;
  std::mt19937 rng(99);
  std::vector<float> logits(static_cast<size_t>(3 * vocab));
  for (float& x : logits) x = random_logit(rng);
  std::vector<LogitAdjustments> a(3);
  // Row 0: every token edited (a repetition penalty over a long history).
  for (int64_t t = 0; t < vocab; ++t) {
    a[0].edits.push_back(LogitEdit{static_cast<Token>(t), 1.3f, -0.5f});
  }
  // Row 1: a mask forbidding everything; row 2: a mask allowing everything, with edits.
  a[1].allowed.assign(static_cast<size_t>((vocab + 63) / 64), 0);
  a[2].allowed.assign(static_cast<size_t>((vocab + 63) / 64), ~uint64_t{0});
  a[2].edits = {LogitEdit{5, 2.0f, 1.0f}, LogitEdit{static_cast<Token>(vocab - 1), 0.5f, -kInf}};
  std::vector<float> want = logits;
  for (int64_t r = 0; r < 3; ++r) {
    apply_logit_adjustments(std::span<float>(want.data() + r * vocab, static_cast<size_t>(vocab)),
                            a[static_cast<size_t>(r)]);
  }
  const std::vector<RowAdjustments> rows = {{0, &a[0]}, {1, &a[1]}, {2, &a[2]}};
  Result<DeviceBuffer> d = DeviceBuffer::allocate(logits.size() * sizeof(float));
  ASSERT_TRUE(d.ok());
  CELLM_ASSERT_CUDA(
      cudaMemcpy(d->get(), logits.data(), logits.size() * sizeof(float), cudaMemcpyHostToDevice));
  // A pageable cudaMemcpy may return before its DMA lands, and the adjuster's
  // non-blocking stream does not wait for it.
  CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
  LogitAdjuster adjuster(vocab);
  ASSERT_TRUE(adjuster.apply(rows, d->as<float>(), 3, nullptr).ok());
  EXPECT_EQ(adjuster.last_adjusted_rows(), 3);
  CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
  std::vector<float> got(logits.size());
  CELLM_ASSERT_CUDA(
      cudaMemcpy(got.data(), d->get(), got.size() * sizeof(float), cudaMemcpyDeviceToHost));
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) bad += same_float(got[i], want[i]) ? 0 : 1;
  EXPECT_EQ(bad, 0u) << bad << " of " << got.size() << " logits differ from the host's";
  for (int64_t t = 0; t < vocab; ++t) {
    ASSERT_EQ(got[static_cast<size_t>(vocab + t)], -kInf) << "row 1 forbids every token";
  }
}

TEST(LogitAdjustTest, PackingLeavesOutEmptyRowsAndTokensOutsideTheVocabulary) {
  // Host only: no GPU needed.
  const int64_t vocab = 130;  // 3 mask words
  LogitAdjustments none;
  LogitAdjustments only_outside;
  only_outside.edits = {LogitEdit{130, 2.0f, 1.0f}, LogitEdit{-3, 2.0f, 1.0f}};
  LogitAdjustments masked;
  masked.allowed = {1, 2, 4, 8, 16};  // two words beyond the vocabulary
  masked.edits = {LogitEdit{7, 2.0f, 0.5f}, LogitEdit{200, 1.0f, 1.0f}, LogitEdit{129, 1.0f, 3.0f}};
  LogitAdjustments twice;
  twice.edits = {LogitEdit{3, 2.0f, 0.0f}, LogitEdit{4, 1.0f, 1.0f}, LogitEdit{3, 1.0f, -1.0f}};
  const std::vector<RowAdjustments> rows = {
      {0, &none}, {1, nullptr}, {2, &only_outside}, {3, &masked}, {4, &twice}};
  PackedAdjustments p;
  std::vector<uint32_t> seen;
  pack_adjustments(rows, vocab, p, seen);
  ASSERT_EQ(p.rows.size(), 2u);
  EXPECT_EQ(p.rows[0].logits_row, 3);
  EXPECT_EQ(p.rows[0].mask_words, 3);
  EXPECT_EQ(p.rows[0].first_word, 0);
  EXPECT_EQ(p.rows[0].n_edits, 2);
  EXPECT_EQ(p.rows[0].in_order, 0);
  EXPECT_EQ(p.rows[1].logits_row, 4);
  EXPECT_EQ(p.rows[1].mask_words, 0);
  EXPECT_EQ(p.rows[1].first_edit, 2);
  EXPECT_EQ(p.rows[1].n_edits, 3);
  EXPECT_EQ(p.rows[1].in_order, 1) << "token 3 is edited twice: the edits go in order";
  EXPECT_EQ(p.masks, (std::vector<uint64_t>{1, 2, 4}));
  ASSERT_EQ(p.edits.size(), 5u);
  EXPECT_EQ(p.edits[1].token, 129);
  EXPECT_EQ(p.edits[1].bias, 3.0f);
  for (uint32_t s : seen) ASSERT_EQ(s, 0u) << "the scratch is left clear";
  // The same scratch again: a row editing token 3 once is not flagged.
  LogitAdjustments once;
  once.edits = {LogitEdit{3, 2.0f, 0.0f}};
  const std::vector<RowAdjustments> again = {{0, &once}};
  pack_adjustments(again, vocab, p, seen);
  ASSERT_EQ(p.rows.size(), 1u);
  EXPECT_EQ(p.rows[0].in_order, 0);
}

TEST(LogitAdjustTest, BadArgumentsAreRefusedWithoutALaunch) {
  // Host only: every refusal happens before a launch.
  float x = 0;
  LogitAdjustRow row;
  EXPECT_EQ(launch_logit_adjust(&x, 1, 0, &row, 1, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(launch_logit_adjust(&x, -1, 4, &row, 1, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(launch_logit_adjust(&x, 1, 4, &row, -1, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(launch_logit_adjust(nullptr, 1, 4, &row, 1, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(launch_logit_adjust(&x, 1, 4, nullptr, 1, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(launch_logit_adjust(&x, 1, 4, nullptr, 0, nullptr, nullptr, nullptr), cudaSuccess);
  // The adjuster names a row outside the step.
  LogitAdjustments a;
  a.edits = {LogitEdit{0, 2.0f, 0.0f}};
  LogitAdjuster adjuster(4);
  const std::vector<RowAdjustments> rows = {{2, &a}};
  const Status s = adjuster.apply(rows, &x, 2, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("row 2"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace cellm::cuda
