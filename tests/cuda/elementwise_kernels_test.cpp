// Tests of the CUDA kernel families (embedding and row gather, add_rmsnorm and the per-head
// norm, rope, swiglu, f32 -> T conversion, bias add) against their CPU twins, every
// element, on awkward shapes: m = 1, 3, 17; odd widths; pointers that defeat the packed
// path. Output buffers are poisoned with NaN first, so an unwritten element fails.
//
// Tolerances: gathers, conversions, the residual update and the bias add are exact.
// Normalised, rotated and activated values follow OutputTolerance (device_test_util.h):
// f32 1e-5 relative + 1e-6 absolute; bf16 8e-3 relative + 1e-6 absolute. Rope allows
// 2e-6 absolute: cosf/sinf and the host's cos/sin each err by 1-2 ulp.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cpu/kernels/activation.h"
#include "cpu/kernels/convert.h"
#include "cpu/kernels/embedding.h"
#include "cpu/kernels/rmsnorm.h"
#include "cpu/kernels/rope.h"
#include "cpu/kernels/thread_pool.h"
#include "cuda/device_memory.h"
#include "cuda/kernels/bias.h"
#include "cuda/kernels/convert.h"
#include "cuda/kernels/embedding.h"
#include "cuda/kernels/l2_prefetch.h"
#include "cuda/kernels/rmsnorm.h"
#include "cuda/kernels/rope.h"
#include "cuda/kernels/swiglu.h"
#include "device_test_util.h"
#include "gpu_test.h"
#include "model/rope.h"

namespace cellm::cuda {
namespace {

using testing::device_array;
using testing::DeviceArray;
using testing::download_floats;
using testing::expect_all_close;
using testing::HostTyped;
using testing::OutputTolerance;
using testing::poison;
using testing::random_values;
using testing::round_to;

constexpr int64_t kRowCounts[] = {1, 3, 17};
constexpr int64_t kWidths[] = {1, 67, 64, 128, 4096};
constexpr int64_t kHeadDims[] = {8, 64, 128};

std::string shape(int64_t m, int64_t d) {
  return "m=" + std::to_string(m) + " d=" + std::to_string(d);
}

// v with `shift` filler elements in front: passing base + shift to a launcher moves every
// pointer off its 16-byte alignment, which must select the element-by-element path.
std::vector<float> with_prefix(const std::vector<float>& v, int64_t shift) {
  std::vector<float> p(static_cast<size_t>(shift), 0.5f);
  p.insert(p.end(), v.begin(), v.end());
  return p;
}

std::vector<float> drop_prefix(std::vector<float> v, int64_t shift) {
  v.erase(v.begin(), v.begin() + shift);
  return v;
}

using ActivationTypes = ::testing::Types<float, __nv_bfloat16>;

// ---- embedding and row gather ----

// What a gather of `rows` from src ([*, d]) writes: each row's values, zeros for a
// negative row.
std::vector<float> gathered(const std::vector<float>& src, int64_t d,
                            const std::vector<int32_t>& rows) {
  std::vector<float> out(rows.size() * static_cast<size_t>(d), 0.0f);
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0) continue;
    std::copy_n(src.begin() + rows[i] * d, d, out.begin() + static_cast<int64_t>(i) * d);
  }
  return out;
}

template <typename T>
class EmbeddingKernelTest : public ::testing::Test {};
TYPED_TEST_SUITE(EmbeddingKernelTest, ActivationTypes, testing::TypeNames);

TYPED_TEST(EmbeddingKernelTest, RowsEqualTheCpuGatherForEveryShape) {
  CELLM_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  std::mt19937 rng(1);
  constexpr int64_t kVocab = 300;
  for (const int64_t d : kWidths) {
    const std::vector<float> table = random_values<T>(rng, kVocab * d);
    const HostTyped<T> host_table(table);
    const auto dev_table = device_array<T>(table);
    for (const int64_t n : kRowCounts) {
      SCOPED_TRACE(shape(n, d));
      std::uniform_int_distribution<int32_t> pick(0, kVocab - 1);
      std::vector<int32_t> tokens(static_cast<size_t>(n));
      for (int32_t& t : tokens) t = pick(rng);
      tokens.back() = kVocab - 1;
      const DeviceArray<int32_t> dev_tokens(tokens);
      DeviceArray<float> out(static_cast<size_t>(n * d));
      poison(out);
      CELLM_ASSERT_CUDA(
          launch_embedding<T>(dev_table.get(), kVocab, d, dev_tokens.get(), n, out.get(), nullptr));
      std::vector<float> want(static_cast<size_t>(n * d));
      cpu::embedding_gather(host_table.ptr(), kVocab, d, tokens, want.data());
      expect_all_close(download_floats(out), want, 0.0f, 0.0f, "embedding");
    }
  }
}

TYPED_TEST(EmbeddingKernelTest, TokensOutsideTheVocabularyWriteZeroRows) {
  CELLM_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  std::mt19937 rng(2);
  constexpr int64_t kVocab = 50;
  for (const int64_t d : {int64_t{67}, int64_t{64}}) {
    SCOPED_TRACE(shape(6, d));
    const std::vector<float> table = random_values<T>(rng, kVocab * d);
    const auto dev_table = device_array<T>(table);
    const std::vector<int32_t> tokens = {
        -1, 7, kVocab, std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min(), 0};
    const DeviceArray<int32_t> dev_tokens(tokens);
    const auto n = static_cast<int64_t>(tokens.size());
    DeviceArray<float> out(static_cast<size_t>(n * d));
    poison(out);
    CELLM_ASSERT_CUDA(
        launch_embedding<T>(dev_table.get(), kVocab, d, dev_tokens.get(), n, out.get(), nullptr));
    std::vector<int32_t> rows = tokens;
    for (int32_t& t : rows) t = t < 0 || t >= kVocab ? -1 : t;
    expect_all_close(download_floats(out), gathered(table, d, rows), 0.0f, 0.0f, "embedding");
  }
}

TYPED_TEST(EmbeddingKernelTest, FedTokensTakeTheFedRowsToken) {
  CELLM_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  std::mt19937 rng(3);
  constexpr int64_t kVocab = 40;
  constexpr int64_t kD = 64;
  const std::vector<float> table = random_values<T>(rng, kVocab * kD);
  const auto dev_table = device_array<T>(table);
  // Row i's token is tokens[i], or fed[i] where tokens[i] is kFedToken; a fed token
  // outside the vocabulary writes zeros as any other; other negative tokens stay invalid.
  const std::vector<int32_t> tokens = {kFedToken, 5, kFedToken, kFedToken, -2, kVocab};
  const std::vector<int32_t> fed = {3, 11, 39, kVocab + 3, 7, 7};
  const std::vector<int32_t> want_tokens = {3, 5, 39, -1, -1, -1};
  const DeviceArray<int32_t> dev_tokens(tokens);
  const DeviceArray<int32_t> dev_fed(fed);
  const auto n = static_cast<int64_t>(tokens.size());
  DeviceArray<float> out(static_cast<size_t>(n * kD));
  poison(out);
  CELLM_ASSERT_CUDA(launch_embedding<T>(dev_table.get(), kVocab, kD, dev_tokens.get(), n, out.get(),
                                        nullptr, dev_fed.get()));
  expect_all_close(download_floats(out), gathered(table, kD, want_tokens), 0.0f, 0.0f, "embedding");
  // Without `fed`, kFedToken is a token outside the vocabulary.
  poison(out);
  CELLM_ASSERT_CUDA(
      launch_embedding<T>(dev_table.get(), kVocab, kD, dev_tokens.get(), n, out.get(), nullptr));
  expect_all_close(download_floats(out), gathered(table, kD, {-1, 5, -1, -1, -1, -1}), 0.0f, 0.0f,
                   "embedding without fed");
}

TEST(GatherRowsKernelTest, SelectedRowsAreCopiedExactlyAndNegativeRowsAreZero) {
  CELLM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(3);
  constexpr int64_t kSourceRows = 23;
  for (const int64_t d : kWidths) {
    const std::vector<float> x = random_values<float>(rng, kSourceRows * d, 10.0f);
    const auto dev_x = device_array<float>(x);
    for (const int64_t n : kRowCounts) {
      SCOPED_TRACE(shape(n, d));
      std::uniform_int_distribution<int32_t> pick(0, kSourceRows - 1);
      std::vector<int32_t> rows(static_cast<size_t>(n));
      for (int32_t& r : rows) r = pick(rng);
      rows.back() = kSourceRows - 1;
      if (n > 2) rows[1] = -1;
      const DeviceArray<int32_t> dev_rows(rows);
      DeviceArray<float> out(static_cast<size_t>(n * d));
      poison(out);
      CELLM_ASSERT_CUDA(launch_gather_rows(dev_x.get(), d, dev_rows.get(), n, out.get(), nullptr));
      expect_all_close(download_floats(out), gathered(x, d, rows), 0.0f, 0.0f, "gather_rows");
    }
  }
}

// ---- add_rmsnorm and head_rmsnorm ----

template <typename T>
class RmsNormKernelTest : public ::testing::Test {};
TYPED_TEST_SUITE(RmsNormKernelTest, ActivationTypes, testing::TypeNames);

TYPED_TEST(RmsNormKernelTest, AddRmsNormMatchesTheCpuTwinWithAndWithoutDelta) {
  CELLM_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  using Tol = OutputTolerance<T>;
  cpu::ThreadPool pool(1);
  std::mt19937 rng(4);
  constexpr float kEps = 1e-6f;
  for (const int64_t d : kWidths) {
    for (const int64_t m : kRowCounts) {
      for (const bool with_delta : {false, true}) {
        // The residual read after the wait or before it (written by an earlier kernel):
        // the same sums either way.
        for (const auto& [shift, writer] :
             {std::pair{int64_t{0}, ResidualWriter::kPreviousKernel},
              std::pair{int64_t{1}, ResidualWriter::kPreviousKernel},
              std::pair{int64_t{0}, ResidualWriter::kEarlierKernel},
              std::pair{int64_t{1}, ResidualWriter::kEarlierKernel}}) {
          SCOPED_TRACE(shape(m, d) + (with_delta ? " delta" : " no delta") +
                       (shift ? " unaligned" : "") +
                       (writer == ResidualWriter::kEarlierKernel ? " read early" : ""));
          const std::vector<float> residual = random_values<float>(rng, m * d, 4.0f);
          const std::vector<float> delta = random_values<T>(rng, m * d, 2.0f);
          const std::vector<float> weight = random_values<T>(rng, d);
          auto dev_residual = device_array<float>(with_prefix(residual, shift));
          const auto dev_delta = device_array<T>(with_prefix(delta, shift));
          const auto dev_weight = device_array<T>(with_prefix(weight, shift));
          DeviceArray<T> dev_out(static_cast<size_t>(m * d + shift));
          poison(dev_out);
          CELLM_ASSERT_CUDA(launch_add_rmsnorm<T>(
              dev_residual.get() + shift, with_delta ? dev_delta.get() + shift : nullptr,
              dev_weight.get() + shift, m, d, kEps, dev_out.get() + shift, nullptr, writer));

          std::vector<float> want_residual = residual;
          std::vector<float> want_out(static_cast<size_t>(m * d));
          const HostTyped<T> host_weight(weight);
          if (with_delta) {
            cpu::add_rmsnorm(pool, want_residual.data(), delta.data(), m, d, host_weight.ptr(),
                             kEps, want_out.data());
          } else {
            cpu::rmsnorm(pool, want_residual.data(), m, d, host_weight.ptr(), kEps,
                         want_out.data());
          }
          expect_all_close(drop_prefix(download_floats(dev_residual), shift), want_residual, 0.0f,
                           0.0f, "residual");
          expect_all_close(drop_prefix(download_floats(dev_out), shift), want_out, Tol::kAbs,
                           Tol::kRel, "out");
        }
      }
    }
  }
}

TYPED_TEST(RmsNormKernelTest, AddRmsNormMayWriteOverItsDelta) {
  CELLM_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  using Tol = OutputTolerance<T>;
  cpu::ThreadPool pool(1);
  std::mt19937 rng(5);
  constexpr float kEps = 1e-5f;
  for (const int64_t d : {int64_t{67}, int64_t{64}}) {
    constexpr int64_t kM = 3;
    SCOPED_TRACE(shape(kM, d));
    const std::vector<float> residual = random_values<float>(rng, kM * d, 4.0f);
    const std::vector<float> delta = random_values<T>(rng, kM * d, 2.0f);
    const std::vector<float> weight = random_values<T>(rng, d);
    auto dev_residual = device_array<float>(residual);
    auto dev_delta_out = device_array<T>(delta);
    const auto dev_weight = device_array<T>(weight);
    CELLM_ASSERT_CUDA(launch_add_rmsnorm<T>(dev_residual.get(), dev_delta_out.get(),
                                            dev_weight.get(), kM, d, kEps, dev_delta_out.get(),
                                            nullptr));
    std::vector<float> want_residual = residual;
    std::vector<float> want_out(static_cast<size_t>(kM * d));
    cpu::add_rmsnorm(pool, want_residual.data(), delta.data(), kM, d, HostTyped<T>(weight).ptr(),
                     kEps, want_out.data());
    expect_all_close(download_floats(dev_residual), want_residual, 0.0f, 0.0f, "residual");
    expect_all_close(download_floats(dev_delta_out), want_out, Tol::kAbs, Tol::kRel, "out");
  }
}

TYPED_TEST(RmsNormKernelTest, HeadRmsNormNormalisesTheNamedHeadsInPlaceAndNothingElse) {
  CELLM_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  using Tol = OutputTolerance<T>;
  cpu::ThreadPool pool(1);
  std::mt19937 rng(6);
  constexpr float kEps = 1e-6f;
  constexpr int64_t kQHeads = 4;
  constexpr int64_t kKvHeads = 2;
  for (const int64_t hd : kHeadDims) {
    for (const int64_t m : kRowCounts) {
      SCOPED_TRACE("head_dim=" + std::to_string(hd) + " m=" + std::to_string(m));
      // A fused qkv row plus 3 trailing elements: [q heads | k heads | v heads | pad].
      const int64_t row_stride = (kQHeads + 2 * kKvHeads) * hd + 3;
      const std::vector<float> x = random_values<T>(rng, m * row_stride, 3.0f);
      const std::vector<float> q_weight = random_values<T>(rng, hd);
      const std::vector<float> k_weight = random_values<T>(rng, hd);
      auto dev_x = device_array<T>(x);
      const auto dev_q_weight = device_array<T>(q_weight);
      const auto dev_k_weight = device_array<T>(k_weight);
      CELLM_ASSERT_CUDA(launch_head_rmsnorm<T>(dev_x.get(), m, row_stride, 0, kQHeads, hd,
                                               dev_q_weight.get(), kEps, nullptr));
      CELLM_ASSERT_CUDA(launch_head_rmsnorm<T>(dev_x.get(), m, row_stride, kQHeads * hd, kKvHeads,
                                               hd, dev_k_weight.get(), kEps, nullptr));
      const std::vector<float> got = download_floats(dev_x);

      // Normalised elements against cpu::rmsnorm per head; every other element unchanged.
      std::vector<float> got_normed, want_normed, got_kept, want_kept;
      std::vector<float> head_out(static_cast<size_t>(hd));
      const HostTyped<T> host_q_weight(q_weight), host_k_weight(k_weight);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t h = 0; h < kQHeads + kKvHeads; ++h) {
          const int64_t start = i * row_stride + h * hd;
          cpu::rmsnorm(pool, x.data() + start, 1, hd,
                       h < kQHeads ? host_q_weight.ptr() : host_k_weight.ptr(), kEps,
                       head_out.data());
          got_normed.insert(got_normed.end(), got.begin() + start, got.begin() + start + hd);
          want_normed.insert(want_normed.end(), head_out.begin(), head_out.end());
        }
        const int64_t kept_begin = i * row_stride + (kQHeads + kKvHeads) * hd;
        const int64_t kept_end = (i + 1) * row_stride;
        got_kept.insert(got_kept.end(), got.begin() + kept_begin, got.begin() + kept_end);
        want_kept.insert(want_kept.end(), x.begin() + kept_begin, x.begin() + kept_end);
      }
      expect_all_close(got_normed, want_normed, Tol::kAbs, Tol::kRel, "normalised heads");
      expect_all_close(got_kept, want_kept, 0.0f, 0.0f, "untouched elements");
    }
  }
}

// ---- rope ----

template <typename T>
class RopeKernelTest : public ::testing::Test {};
TYPED_TEST_SUITE(RopeKernelTest, ActivationTypes, testing::TypeNames);

TYPED_TEST(RopeKernelTest, RotatesTheQAndKHeadsLikeTheCpuTwinAndNothingElse) {
  CELLM_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  constexpr float kAbs = 2e-6f;
  constexpr float kRel = OutputTolerance<T>::kRel;
  cpu::ThreadPool pool(1);
  std::mt19937 rng(7);
  constexpr int64_t kQHeads = 4;
  constexpr int64_t kKvHeads = 2;
  constexpr int64_t kQOffset = 5;  // q heads start off any alignment
  for (const int64_t hd : kHeadDims) {
    for (const bool llama3 : {false, true}) {
      const std::vector<float> inv_freq =
          llama3 ? rope_inv_freq(500000.0, hd,
                                 RopeScaling{.type = RopeScalingType::kLlama3, .factor = 8.0})
                 : rope_inv_freq(10000.0, hd);
      const DeviceArray<float> dev_inv_freq(inv_freq);
      for (const int64_t m : kRowCounts) {
        SCOPED_TRACE("head_dim=" + std::to_string(hd) + " m=" + std::to_string(m) +
                     (llama3 ? " llama3" : " theta=1e4"));
        // [pad 5 | q heads | k heads | v heads | pad 1]
        const int64_t k_offset = kQOffset + kQHeads * hd;
        const int64_t row_stride = k_offset + 2 * kKvHeads * hd + 1;
        std::uniform_int_distribution<int32_t> pick(0, 10000);
        std::vector<int32_t> positions(static_cast<size_t>(m));
        for (int32_t& p : positions) p = pick(rng);
        positions[0] = 10000;
        if (m > 1) positions[1] = 0;
        const std::vector<float> x = random_values<T>(rng, m * row_stride);
        auto dev_x = device_array<T>(x);
        const DeviceArray<int32_t> dev_positions(positions);
        CELLM_ASSERT_CUDA(launch_rope<T>(dev_x.get(), m, row_stride, kQOffset, kQHeads, k_offset,
                                         kKvHeads, hd, dev_positions.get(), dev_inv_freq.get(),
                                         nullptr));
        const std::vector<float> got = download_floats(dev_x);

        // The CPU twin on contiguous copies of the q and k heads.
        std::vector<float> q(static_cast<size_t>(m * kQHeads * hd));
        std::vector<float> k(static_cast<size_t>(m * kKvHeads * hd));
        for (int64_t i = 0; i < m; ++i) {
          std::copy_n(x.begin() + i * row_stride + kQOffset, kQHeads * hd,
                      q.begin() + i * kQHeads * hd);
          std::copy_n(x.begin() + i * row_stride + k_offset, kKvHeads * hd,
                      k.begin() + i * kKvHeads * hd);
        }
        cpu::rope(pool, q.data(), kQHeads, k.data(), kKvHeads, m, hd, positions, inv_freq);
        std::vector<float> got_rotated, got_kept, want_kept;
        for (int64_t i = 0; i < m; ++i) {
          const auto row = got.begin() + i * row_stride;
          got_rotated.insert(got_rotated.end(), row + kQOffset, row + kQOffset + kQHeads * hd);
          got_rotated.insert(got_rotated.end(), row + k_offset, row + k_offset + kKvHeads * hd);
          got_kept.insert(got_kept.end(), row, row + kQOffset);
          got_kept.insert(got_kept.end(), row + k_offset + kKvHeads * hd, row + row_stride);
          const auto src = x.begin() + i * row_stride;
          want_kept.insert(want_kept.end(), src, src + kQOffset);
          want_kept.insert(want_kept.end(), src + k_offset + kKvHeads * hd, src + row_stride);
        }
        std::vector<float> want_rotated;
        for (int64_t i = 0; i < m; ++i) {
          want_rotated.insert(want_rotated.end(), q.begin() + i * kQHeads * hd,
                              q.begin() + (i + 1) * kQHeads * hd);
          want_rotated.insert(want_rotated.end(), k.begin() + i * kKvHeads * hd,
                              k.begin() + (i + 1) * kKvHeads * hd);
        }
        expect_all_close(got_rotated, want_rotated, kAbs, kRel, "rotated heads");
        expect_all_close(got_kept, want_kept, 0.0f, 0.0f, "untouched elements");
      }
    }
  }
}

// ---- swiglu ----

template <typename T>
class SwigluKernelTest : public ::testing::Test {};
TYPED_TEST_SUITE(SwigluKernelTest, ActivationTypes, testing::TypeNames);

TYPED_TEST(SwigluKernelTest, MatchesTheCpuSiluMulForEveryShape) {
  CELLM_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  using Tol = OutputTolerance<T>;
  cpu::ThreadPool pool(1);
  std::mt19937 rng(8);
  for (const int64_t ff : kWidths) {
    for (const int64_t m : kRowCounts) {
      for (const int64_t shift : {int64_t{0}, int64_t{1}}) {
        SCOPED_TRACE("m=" + std::to_string(m) + " ff=" + std::to_string(ff) +
                     (shift ? " unaligned" : ""));
        const std::vector<float> gate_up = random_values<T>(rng, m * 2 * ff, 6.0f);
        const auto dev_gate_up = device_array<T>(with_prefix(gate_up, shift));
        DeviceArray<T> dev_out(static_cast<size_t>(m * ff + shift));
        poison(dev_out);
        CELLM_ASSERT_CUDA(
            launch_swiglu<T>(dev_gate_up.get() + shift, m, ff, dev_out.get() + shift, nullptr));
        std::vector<float> gate, up;
        for (int64_t i = 0; i < m; ++i) {
          const auto row = gate_up.begin() + i * 2 * ff;
          gate.insert(gate.end(), row, row + ff);
          up.insert(up.end(), row + ff, row + 2 * ff);
        }
        std::vector<float> want(static_cast<size_t>(m * ff));
        cpu::silu_mul(pool, gate.data(), up.data(), m * ff, want.data());
        expect_all_close(drop_prefix(download_floats(dev_out), shift), want, Tol::kAbs, Tol::kRel,
                         "swiglu");
      }
    }
  }
}

// ---- f32 -> T conversion ----

template <typename T>
class ConvertKernelTest : public ::testing::Test {};
TYPED_TEST_SUITE(ConvertKernelTest, ActivationTypes, testing::TypeNames);

TYPED_TEST(ConvertKernelTest, RoundsToNearestEvenExactlyLikeTheCpuConversion) {
  CELLM_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> exponent(-40.0f, 40.0f);
  std::bernoulli_distribution negative(0.5);
  // Ties (1 + 2^-8 rounds down to even 1; 1 + 3·2^-8 up), the largest f32 (rounds to inf
  // in bf16), infinities and a subnormal.
  const std::vector<float> specials = {1.0f + 0x1p-8f,
                                       1.0f + 0x3p-8f,
                                       -(1.0f + 0x1p-8f),
                                       std::numeric_limits<float>::max(),
                                       std::numeric_limits<float>::infinity(),
                                       -std::numeric_limits<float>::infinity(),
                                       1e-40f};
  for (const int64_t n : {int64_t{1}, int64_t{3}, int64_t{67}, int64_t{4096}, int64_t{100003}}) {
    for (const int64_t shift : {int64_t{0}, int64_t{1}}) {
      SCOPED_TRACE("n=" + std::to_string(n) + (shift ? " unaligned" : ""));
      std::vector<float> src(static_cast<size_t>(n));
      for (float& v : src) v = (negative(rng) ? -1.0f : 1.0f) * std::exp2(exponent(rng));
      for (size_t i = 0; i < specials.size() && i < src.size(); ++i) src[i] = specials[i];
      const auto dev_src = device_array<float>(with_prefix(src, shift));
      DeviceArray<T> dev_dst(static_cast<size_t>(n + shift));
      poison(dev_dst);
      CELLM_ASSERT_CUDA(launch_f32_to<T>(dev_src.get() + shift, n, dev_dst.get() + shift, nullptr));
      const std::vector<float> got = drop_prefix(download_floats(dev_dst), shift);
      size_t bad = 0;
      for (size_t i = 0; i < src.size(); ++i) {
        const float want = round_to<T>(src[i]);
        if (!(got[i] == want) && ++bad <= 5) {
          ADD_FAILURE() << "[" << i << "] " << src[i] << " -> " << got[i] << ", want " << want;
        }
      }
      EXPECT_EQ(bad, 0u);
    }
  }
}

// ---- bias add ----

template <typename TOut, typename TBias>
void check_add_bias(std::mt19937& rng) {
  for (const int64_t n : {int64_t{1}, int64_t{67}, int64_t{64}}) {
    for (const int64_t m : kRowCounts) {
      SCOPED_TRACE(std::string(testing::type_name<TOut>()) + " += " + testing::type_name<TBias>() +
                   " m=" + std::to_string(m) + " n=" + std::to_string(n));
      const std::vector<float> y = random_values<TOut>(rng, m * n, 3.0f);
      const std::vector<float> bias = random_values<TBias>(rng, n);
      auto dev_y = device_array<TOut>(y);
      const auto dev_bias = device_array<TBias>(bias);
      CELLM_ASSERT_CUDA((launch_add_bias<TOut, TBias>(dev_y.get(), m, n, dev_bias.get(), nullptr)));
      std::vector<float> want(y.size());
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) want[i * n + j] = round_to<TOut>(y[i * n + j] + bias[j]);
      }
      expect_all_close(download_floats(dev_y), want, 0.0f, 0.0f, "add_bias");
    }
  }
}

TEST(AddBiasKernelTest, AddsTheBiasRowToEveryRowExactlyForEachTypePair) {
  CELLM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(10);
  check_add_bias<float, float>(rng);
  check_add_bias<float, __nv_bfloat16>(rng);
  check_add_bias<__nv_bfloat16, __nv_bfloat16>(rng);
}

// ---- launch contract ----

TEST(KernelLaunchTest, EmptyShapesLaunchNothingAndMalformedShapesAreRefused) {
  CELLM_SKIP_WITHOUT_GPU();
  using B = __nv_bfloat16;
  EXPECT_EQ(launch_embedding<B>(nullptr, 10, 64, nullptr, 0, nullptr, nullptr), cudaSuccess);
  EXPECT_EQ(launch_gather_rows(nullptr, 64, nullptr, 0, nullptr, nullptr), cudaSuccess);
  EXPECT_EQ(launch_add_rmsnorm<B>(nullptr, nullptr, nullptr, 0, 64, 1e-6f, nullptr, nullptr),
            cudaSuccess);
  EXPECT_EQ(launch_head_rmsnorm<B>(nullptr, 0, 256, 0, 2, 64, nullptr, 1e-6f, nullptr),
            cudaSuccess);
  EXPECT_EQ(launch_rope<B>(nullptr, 0, 256, 0, 2, 128, 2, 64, nullptr, nullptr, nullptr),
            cudaSuccess);
  EXPECT_EQ(launch_swiglu<B>(nullptr, 0, 64, nullptr, nullptr), cudaSuccess);
  EXPECT_EQ(launch_f32_to<B>(nullptr, 0, nullptr, nullptr), cudaSuccess);

  EXPECT_EQ(launch_embedding<B>(nullptr, 10, 0, nullptr, 1, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(launch_add_rmsnorm<B>(nullptr, nullptr, nullptr, 1, 0, 1e-6f, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(launch_add_rmsnorm<B>(nullptr, nullptr, nullptr, 0, 64, 1e-6f, nullptr, nullptr,
                                  static_cast<ResidualWriter>(7)),
            cudaErrorInvalidValue);  // no such writer
  // Heads running past the row.
  EXPECT_EQ(launch_head_rmsnorm<B>(nullptr, 1, 100, 40, 1, 64, nullptr, 1e-6f, nullptr),
            cudaErrorInvalidValue);
  // An odd head_dim, and q heads overlapping k heads.
  EXPECT_EQ(launch_rope<B>(nullptr, 1, 256, 0, 1, 128, 1, 63, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(launch_rope<B>(nullptr, 1, 256, 0, 2, 64, 1, 64, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(launch_swiglu<B>(nullptr, 1, 0, nullptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(launch_f32_to<B>(nullptr, -1, nullptr, nullptr), cudaErrorInvalidValue);
}

// The L2 prefetch is a hint: on rows more than a wave of threads covers, with a lead of
// part of a row and of all of it, it completes without error and leaves the matrix as it
// was. Leads and rows off 16 bytes are refused.
TEST(L2PrefetchKernelTest, PrefetchesRowsWithoutChangingThemAndRefusesUnalignedLeads) {
  CELLM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(12);
  constexpr int64_t kRows = 2 * 4 * 128 + 5, kD = 64;  // more rows than 4 blocks' threads
  const std::vector<float> x = random_values<float>(rng, kRows * kD);
  DeviceArray<float> dev = device_array<float>(x);
  const size_t row_bytes = kD * sizeof(float);
  for (const size_t lead : {size_t{16}, size_t{64}, row_bytes}) {
    CELLM_ASSERT_CUDA(launch_l2_prefetch_rows(dev.get(), kRows, row_bytes, lead, 4, nullptr));
    CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
  }
  expect_all_close(download_floats(dev), x, 0.0f, 0.0f, "prefetched rows");
  EXPECT_EQ(launch_l2_prefetch_rows(dev.get(), 0, row_bytes, 16, 4, nullptr), cudaSuccess);
  EXPECT_EQ(launch_l2_prefetch_rows(dev.get(), kRows, row_bytes, 24, 4, nullptr),
            cudaErrorInvalidValue);  // a lead off 16 bytes
  EXPECT_EQ(launch_l2_prefetch_rows(dev.get(), kRows, 200, 16, 4, nullptr),
            cudaErrorInvalidValue);  // rows off 16 bytes
  EXPECT_EQ(launch_l2_prefetch_rows(dev.get(), kRows, row_bytes, row_bytes + 16, 4, nullptr),
            cudaErrorInvalidValue);  // a lead past the row
  EXPECT_EQ(launch_l2_prefetch_rows(dev.get(), kRows, row_bytes, 16, 0, nullptr),
            cudaErrorInvalidValue);  // no blocks
}

// Every launcher recorded into one CUDA graph and replayed gives exactly what the same
// launches give eagerly (the kernels are deterministic).
TEST(KernelGraphCaptureTest, LaunchersRecordIntoAGraphAndReplayLikeEagerLaunches) {
  CELLM_SKIP_WITHOUT_GPU();
  using B = __nv_bfloat16;
  std::mt19937 rng(11);
  constexpr int64_t kM = 3, kD = 64, kVocab = 40, kHeadDim = 32, kQ = 2, kKv = 1, kFf = 96;
  constexpr int64_t kQkv = (kQ + 2 * kKv) * kHeadDim;
  const std::vector<int32_t> tokens = {3, 39, 0};
  const std::vector<int32_t> positions = {0, 7, 9999};
  const std::vector<int32_t> rows = {2, 0};
  const std::vector<float> inv_freq = rope_inv_freq(10000.0, kHeadDim);
  const std::vector<float> table = random_values<B>(rng, kVocab * kD);
  const std::vector<float> delta = random_values<B>(rng, kM * kD);
  const std::vector<float> weight = random_values<B>(rng, kD);
  const std::vector<float> qkv = random_values<B>(rng, kM * kQkv);
  const std::vector<float> head_weight = random_values<B>(rng, kHeadDim);
  const std::vector<float> gate_up = random_values<B>(rng, kM * 2 * kFf, 4.0f);
  const std::vector<float> f32_values = random_values<float>(rng, 1000);

  const DeviceArray<int32_t> dev_tokens(tokens), dev_positions(positions), dev_rows(rows);
  const DeviceArray<float> dev_inv_freq(inv_freq);
  const auto dev_table = device_array<B>(table);
  const auto dev_delta = device_array<B>(delta);
  const auto dev_weight = device_array<B>(weight);
  const auto dev_head_weight = device_array<B>(head_weight);
  const auto dev_gate_up = device_array<B>(gate_up);
  const auto dev_f32 = device_array<float>(f32_values);
  DeviceArray<B> dev_qkv(kM * kQkv), dev_normed(kM * kD), dev_act(kM * kFf), dev_converted(1000);
  DeviceArray<float> dev_residual(kM * kD), dev_selected(2 * kD);

  const auto enqueue = [&](cudaStream_t s) {
    cudaError_t e = launch_embedding<B>(dev_table.get(), kVocab, kD, dev_tokens.get(), kM,
                                        dev_residual.get(), s);
    if (e == cudaSuccess) {
      e = launch_add_rmsnorm<B>(dev_residual.get(), dev_delta.get(), dev_weight.get(), kM, kD,
                                1e-6f, dev_normed.get(), s);
    }
    if (e == cudaSuccess) {
      e = launch_head_rmsnorm<B>(dev_qkv.get(), kM, kQkv, 0, kQ + kKv, kHeadDim,
                                 dev_head_weight.get(), 1e-6f, s);
    }
    if (e == cudaSuccess) {
      e = launch_rope<B>(dev_qkv.get(), kM, kQkv, 0, kQ, kQ * kHeadDim, kKv, kHeadDim,
                         dev_positions.get(), dev_inv_freq.get(), s);
    }
    if (e == cudaSuccess) e = launch_swiglu<B>(dev_gate_up.get(), kM, kFf, dev_act.get(), s);
    if (e == cudaSuccess) e = launch_f32_to<B>(dev_f32.get(), 1000, dev_converted.get(), s);
    if (e == cudaSuccess) {
      e = launch_gather_rows(dev_residual.get(), kD, dev_rows.get(), 2, dev_selected.get(), s);
    }
    return e;
  };
  // Fresh inputs and poisoned outputs; the device sync orders these legacy-stream copies
  // and memsets before work on the non-blocking stream.
  const auto reset = [&] {
    dev_qkv.upload(testing::to_typed<B>(qkv));
    for (auto* a : {&dev_normed, &dev_act, &dev_converted}) poison(*a);
    for (auto* a : {&dev_residual, &dev_selected}) poison(*a);
    return cudaDeviceSynchronize();
  };
  const auto results = [&] {
    std::vector<std::vector<float>> r;
    for (const auto* a : {&dev_qkv, &dev_normed, &dev_act, &dev_converted}) {
      r.push_back(download_floats(*a));
    }
    for (const auto* a : {&dev_residual, &dev_selected}) r.push_back(download_floats(*a));
    return r;
  };

  auto stream = Stream::create();
  ASSERT_TRUE(stream.ok()) << stream.status().to_string();
  CELLM_ASSERT_CUDA(reset());
  CELLM_ASSERT_CUDA(enqueue(stream->get()));
  CELLM_ASSERT_CUDA(cudaStreamSynchronize(stream->get()));
  const std::vector<std::vector<float>> eager = results();

  CELLM_ASSERT_CUDA(reset());
  CELLM_ASSERT_CUDA(cudaStreamBeginCapture(stream->get(), cudaStreamCaptureModeThreadLocal));
  const cudaError_t recorded = enqueue(stream->get());
  cudaGraph_t graph = nullptr;
  CELLM_ASSERT_CUDA(cudaStreamEndCapture(stream->get(), &graph));
  CELLM_ASSERT_CUDA(recorded);
  cudaGraphExec_t exec_handle = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec_handle, graph, 0);
  cudaGraphDestroy(graph);
  CELLM_ASSERT_CUDA(instantiated);
  const GraphExec exec(exec_handle);
  CELLM_ASSERT_CUDA(cudaGraphLaunch(exec.get(), stream->get()));
  CELLM_ASSERT_CUDA(cudaStreamSynchronize(stream->get()));
  const std::vector<std::vector<float>> replayed = results();

  ASSERT_EQ(replayed.size(), eager.size());
  for (size_t i = 0; i < eager.size(); ++i) {
    expect_all_close(replayed[i], eager[i], 0.0f, 0.0f, "output " + std::to_string(i));
  }
}

}  // namespace
}  // namespace cellm::cuda
