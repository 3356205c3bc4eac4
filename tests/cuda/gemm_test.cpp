// Tests of Gemm (y = x · wᵀ + bias through cuBLASLt, or the GEMV for bf16 products of at
// most kGemvMaxRows rows) against a double-precision host product of the same inputs
// (bf16-rounded where T is bf16), every element, on both paths; which calls take the GEMV;
// plan caching of the cuBLASLt path; run_swiglu_down for every batch size; capture of
// warmed shapes in a CUDA graph; the tuned path (GemmPath::kTuned): its choices against
// the reference, a second Gemm adopting the first's choices (same bits), no timing inside
// capture.
//
// Tolerance, per element: |got - want| <= rel * |want| + 1e-6 * sum_c |x[i,c] w[j,c]|
// (+ 4e-3 |bias[j]| for bf16 outputs).
//   f32 outputs: rel 1e-5. f32 accumulation of k products errs by about 2^-24 times the
//   sum of their magnitudes (bf16 products are exact in f32), so 1e-6 of that sum is a
//   wide margin, while a TF32 product (10-bit mantissa: ~2^-11 of the sum) fails it.
//   bf16 outputs: rel 1e-2, above the 2^-8 relative half-ulp of the single rounding, and
//   4e-3 |bias| for a bias added after that rounding (the separate bias kernel).
//   The GEMV's products (kernels/gemv.h) meet the same bounds: f32 accumulation, the
//   bias added before the single rounding.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda/device_memory.h"
#include "cuda/gemm.h"
#include "cuda/kernels/gemv.h"
#include "cuda/kernels/swiglu.h"
#include "device_test_util.h"
#include "gpu_test.h"
#include "host_product.h"

namespace cellm::cuda {
namespace {

using testing::capture_graph;
using testing::device_array;
using testing::DeviceArray;
using testing::download_floats;
using testing::host_product;
using testing::HostProduct;
using testing::poison;
using testing::random_values;
using testing::type_name;

using Bf16 = __nv_bfloat16;

// got [m, n] against the reference `want` (+ bias [n], when not empty) under the tolerance
// stated atop this file.
template <typename TOut>
void expect_product(const std::vector<float>& got, const HostProduct& want,
                    const std::vector<float>& bias, int64_t m, int64_t n, const std::string& what) {
  constexpr bool kBf16Out = std::is_same_v<TOut, Bf16>;
  constexpr double kRel = kBf16Out ? 1e-2 : 1e-5;
  ASSERT_EQ(static_cast<int64_t>(got.size()), m * n) << what;
  size_t bad = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const size_t e = static_cast<size_t>(i * n + j);
      const double b = bias.empty() ? 0.0 : double{bias[static_cast<size_t>(j)]};
      const double expected = want.value[e] + b;
      const double tol =
          kRel * std::fabs(expected) + 1e-6 * want.scale[e] + (kBf16Out ? 4e-3 * std::fabs(b) : 0);
      if (!(std::fabs(double{got[e]} - expected) <= tol) && ++bad <= 5) {
        ADD_FAILURE() << what << " [" << i << ", " << j << "]: got " << got[e] << " want "
                      << expected << " (tol " << tol << ")";
      }
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements off";
}

// One product's inputs (random, non-zero, rounded to T) on host and device, and its
// double-precision reference.
template <typename T>
struct ProductCase {
  int64_t m, k, n;
  std::vector<float> x, w, bias;
  HostProduct want;
  DeviceArray<T> dev_x, dev_w, dev_bias;

  ProductCase(std::mt19937& rng, int64_t m_, int64_t k_, int64_t n_)
      : m(m_),
        k(k_),
        n(n_),
        x(random_values<T>(rng, m * k)),
        w(random_values<T>(rng, n * k)),
        bias(random_values<T>(rng, n)),
        want(host_product(x, w, m, k, n)),
        dev_x(device_array<T>(x)),
        dev_w(device_array<T>(w)),
        dev_bias(device_array<T>(bias)) {}

  std::string name(bool with_bias) const {
    return "m=" + std::to_string(m) + " k=" + std::to_string(k) + " n=" + std::to_string(n) +
           (with_bias ? " +bias" : "");
  }

  template <typename TOut>
  Status run(Gemm& gemm, bool with_bias, const DeviceArray<TOut>& y, cudaStream_t stream) const {
    return gemm.run<T, TOut>(dev_x.get(), m, k, dev_w.get(), n,
                             with_bias ? dev_bias.get() : nullptr, y.get(), stream);
  }

  // y against the reference under the tolerance stated atop this file.
  template <typename TOut>
  void expect_output(const DeviceArray<TOut>& y, bool with_bias) const {
    expect_product<TOut>(download_floats(y), want, with_bias ? bias : std::vector<float>{}, m, n,
                         std::string(type_name<TOut>()) + " out " + name(with_bias));
  }
};

constexpr int64_t kRowCounts[] = {1, 7, 64, 300};
struct Dims {
  int64_t k, n;
};
constexpr Dims kDims[] = {{64, 64}, {67, 67}, {1024, 96}, {4096, 64}, {128, 4096}};

Gemm make_gemm(GemmPath path = GemmPath::kAuto) {
  Result<Gemm> gemm = Gemm::create(size_t{32} << 20, path);
  EXPECT_TRUE(gemm.ok()) << gemm.status().to_string();
  return std::move(gemm).value();
}

TEST(GemmTest, Bf16ProductsMatchADoubleReferenceForBothOutputTypesOnBothPaths) {
  CELLM_SKIP_WITHOUT_GPU();
  Gemm gemms[] = {make_gemm(GemmPath::kAuto), make_gemm(GemmPath::kCublasLtOnly)};
  std::mt19937 rng(21);
  for (const Dims dims : kDims) {
    for (const int64_t m : kRowCounts) {
      const ProductCase<Bf16> c(rng, m, dims.k, dims.n);
      for (const auto& [gemm, with_bias] : {std::pair{&gemms[0], false},
                                            {&gemms[0], true},
                                            {&gemms[1], false},
                                            {&gemms[1], true}}) {
        SCOPED_TRACE(gemm == &gemms[0] ? "kAuto" : "kCublasLtOnly");
        DeviceArray<Bf16> y16(static_cast<size_t>(m * dims.n));
        poison(y16);
        const Status s16 = c.run(*gemm, with_bias, y16, nullptr);
        ASSERT_TRUE(s16.ok()) << s16.to_string();
        c.expect_output(y16, with_bias);

        DeviceArray<float> y32(static_cast<size_t>(m * dims.n));
        poison(y32);
        const Status s32 = c.run(*gemm, with_bias, y32, nullptr);
        ASSERT_TRUE(s32.ok()) << s32.to_string();
        c.expect_output(y32, with_bias);
      }
    }
  }
}

TEST(GemmTest, F32ModeMatchesADoubleReferenceToTrueF32Precision) {
  CELLM_SKIP_WITHOUT_GPU();
  Gemm gemm = make_gemm();
  std::mt19937 rng(22);
  for (const Dims dims : kDims) {
    for (const int64_t m : kRowCounts) {
      const ProductCase<float> c(rng, m, dims.k, dims.n);
      for (const bool with_bias : {false, true}) {
        DeviceArray<float> y(static_cast<size_t>(m * dims.n));
        poison(y);
        const Status s = c.run(gemm, with_bias, y, nullptr);
        ASSERT_TRUE(s.ok()) << s.to_string();
        c.expect_output(y, with_bias);
      }
    }
  }
}

TEST(GemmTest, ASecondRunOfTheSameShapeReusesItsCachedPlan) {
  CELLM_SKIP_WITHOUT_GPU();
  // cuBLASLt for every call (under kAuto these shapes take the GEMV, which has no plans).
  Gemm gemm = make_gemm(GemmPath::kCublasLtOnly);
  std::mt19937 rng(23);
  const ProductCase<Bf16> a(rng, 7, 64, 96);
  const ProductCase<Bf16> b(rng, 8, 64, 96);
  DeviceArray<Bf16> y_a(7 * 96), y_b(8 * 96);
  DeviceArray<float> y32_a(static_cast<size_t>(7 * 96));
  EXPECT_EQ(gemm.cached_plans(), 0u);
  ASSERT_TRUE(a.run(gemm, false, y_a, nullptr).ok());
  EXPECT_EQ(gemm.cached_plans(), 1u);
  poison(y_a);
  ASSERT_TRUE(a.run(gemm, false, y_a, nullptr).ok());
  EXPECT_EQ(gemm.cached_plans(), 1u);
  a.expect_output(y_a, false);
  // Same shape, other (equally aligned) buffers: the same plan.
  const ProductCase<Bf16> a2(rng, 7, 64, 96);
  ASSERT_TRUE(a2.run(gemm, false, y_a, nullptr).ok());
  EXPECT_EQ(gemm.cached_plans(), 1u);
  a2.expect_output(y_a, false);
  // Another m, a bias, another output type: a plan each.
  ASSERT_TRUE(b.run(gemm, false, y_b, nullptr).ok());
  EXPECT_EQ(gemm.cached_plans(), 2u);
  b.expect_output(y_b, false);
  ASSERT_TRUE(a.run(gemm, true, y_a, nullptr).ok());
  EXPECT_EQ(gemm.cached_plans(), 3u);
  a.expect_output(y_a, true);
  ASSERT_TRUE(a.run(gemm, false, y32_a, nullptr).ok());
  EXPECT_EQ(gemm.cached_plans(), 4u);
  a.expect_output(y32_a, false);
  // An empty product enqueues nothing and builds nothing; a malformed one is refused.
  const Status empty =
      gemm.run<Bf16, Bf16>(a.dev_x.get(), 0, 64, a.dev_w.get(), 96, nullptr, y_a.get(), nullptr);
  EXPECT_TRUE(empty.ok()) << empty.to_string();
  const Status malformed =
      gemm.run<Bf16, Bf16>(a.dev_x.get(), 7, 64, a.dev_w.get(), 0, nullptr, y_a.get(), nullptr);
  EXPECT_EQ(malformed.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(gemm.cached_plans(), 4u);
}

TEST(GemmTest, OperandsOffTheirUsualAlignmentGetTheirOwnPlanAndStayCorrect) {
  CELLM_SKIP_WITHOUT_GPU();
  Gemm gemm = make_gemm(GemmPath::kCublasLtOnly);
  std::mt19937 rng(24);
  constexpr int64_t kM = 7, kK = 64, kN = 64;
  // x and y start one element (2 bytes) past a 256-byte boundary.
  const std::vector<float> x = random_values<Bf16>(rng, kM * kK + 1);
  const std::vector<float> w = random_values<Bf16>(rng, kN * kK);
  const std::vector<float> bias = random_values<Bf16>(rng, kN);
  const auto dev_x = device_array<Bf16>(x);
  const auto dev_w = device_array<Bf16>(w);
  const auto dev_bias = device_array<Bf16>(bias);
  DeviceArray<Bf16> y(static_cast<size_t>(kM * kN + 1));
  poison(y);
  const Status s = gemm.run<Bf16, Bf16>(dev_x.get() + 1, kM, kK, dev_w.get(), kN, dev_bias.get(),
                                        y.get() + 1, nullptr);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(gemm.cached_plans(), 1u);
  const std::vector<float> got = download_floats(y);
  const HostProduct want = host_product(std::vector<float>(x.begin() + 1, x.end()), w, kM, kK, kN);
  size_t bad = 0;
  for (int64_t e = 0; e < kM * kN; ++e) {
    const double b = bias[static_cast<size_t>(e % kN)];
    const double expected = want.value[e] + b;
    const double tol = 1e-2 * std::fabs(expected) + 1e-6 * want.scale[e] + 4e-3 * std::fabs(b);
    if (!(std::fabs(double{got[e + 1]} - expected) <= tol) && ++bad <= 5) {
      ADD_FAILURE() << "[" << e << "] got " << got[e + 1] << " want " << expected;
    }
  }
  EXPECT_EQ(bad, 0u);
  // The same shape at aligned pointers is another key.
  const Status aligned =
      gemm.run<Bf16, Bf16>(dev_x.get(), kM, kK, dev_w.get(), kN, dev_bias.get(), y.get(), nullptr);
  ASSERT_TRUE(aligned.ok()) << aligned.to_string();
  EXPECT_EQ(gemm.cached_plans(), 2u);
}

TEST(GemmTest, WarmedShapesRecordIntoACudaGraphAndReplayCorrectly) {
  CELLM_SKIP_WITHOUT_GPU();
  auto stream = Stream::create();
  ASSERT_TRUE(stream.ok()) << stream.status().to_string();
  std::mt19937 rng(25);
  // On kCublasLtOnly: the BIAS epilogue, the bias kernel, f32. On kAuto the two bf16
  // products take the GEMV.
  const ProductCase<Bf16> qkv(rng, 7, 64, 96);     // bf16 -> bf16 + bias
  const ProductCase<Bf16> head(rng, 1, 128, 64);   // bf16 -> f32 + bias
  const ProductCase<float> exact(rng, 3, 67, 67);  // f32 -> f32 + bias
  for (const auto& [path, want_plans] :
       {std::pair{GemmPath::kCublasLtOnly, size_t{3}}, {GemmPath::kAuto, size_t{1}}}) {
    SCOPED_TRACE(path == GemmPath::kAuto ? "kAuto" : "kCublasLtOnly");
    Gemm gemm = make_gemm(path);
    DeviceArray<Bf16> y_qkv(static_cast<size_t>(7 * 96));
    DeviceArray<float> y_head(64), y_exact(3 * 67);
    const auto enqueue = [&] {
      Status s = qkv.run(gemm, true, y_qkv, stream->get());
      if (s.ok()) s = head.run(gemm, true, y_head, stream->get());
      if (s.ok()) s = exact.run(gemm, true, y_exact, stream->get());
      return s;
    };

    // Orders the inputs' uploads (legacy stream) before work on the non-blocking stream.
    CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
    const Status warm = enqueue();  // builds the plans, outside capture
    ASSERT_TRUE(warm.ok()) << warm.to_string();
    CELLM_ASSERT_CUDA(cudaStreamSynchronize(stream->get()));
    const size_t plans = gemm.cached_plans();
    EXPECT_EQ(plans, want_plans);

    poison(y_qkv);
    poison(y_head);
    poison(y_exact);
    CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
    Status recorded;
    const GraphExec exec = capture_graph(stream->get(), [&] { recorded = enqueue(); });
    ASSERT_TRUE(recorded.ok()) << recorded.to_string();
    ASSERT_NE(exec.get(), nullptr);
    EXPECT_EQ(gemm.cached_plans(), plans);
    for (int replay = 0; replay < 2; ++replay) {
      CELLM_ASSERT_CUDA(cudaGraphLaunch(exec.get(), stream->get()));
      CELLM_ASSERT_CUDA(cudaStreamSynchronize(stream->get()));
      qkv.expect_output(y_qkv, true);
      head.expect_output(y_head, true);
      exact.expect_output(y_exact, true);
    }
  }
}

TEST(GemmTest, SmallAlignedBf16ProductsTakeTheGemvAndBuildNoPlan) {
  CELLM_SKIP_WITHOUT_GPU();
  Gemm gemm = make_gemm();
  std::mt19937 rng(26);
  constexpr int64_t kK = 136, kN = 40;
  for (int64_t m = 1; m <= kGemvMaxRows; ++m) {
    const ProductCase<Bf16> c(rng, m, kK, kN);
    DeviceArray<Bf16> y16(static_cast<size_t>(m * kN));
    DeviceArray<float> y32(static_cast<size_t>(m * kN));
    poison(y16);
    poison(y32);
    ASSERT_TRUE(c.run(gemm, true, y16, nullptr).ok());
    ASSERT_TRUE(c.run(gemm, false, y32, nullptr).ok());
    c.expect_output(y16, true);
    c.expect_output(y32, false);
  }
  EXPECT_EQ(gemm.cached_plans(), 0u);

  // What the GEMV does not serve goes to cuBLASLt (a plan each): one row too many, k not a
  // multiple of 8, an operand off 16-byte alignment, f32.
  const ProductCase<Bf16> tall(rng, kGemvMaxRows + 1, kK, kN);
  const ProductCase<Bf16> odd_k(rng, 3, 67, kN);
  const ProductCase<float> f32(rng, 3, kK, kN);
  DeviceArray<Bf16> y16(static_cast<size_t>((kGemvMaxRows + 1) * kN));
  DeviceArray<float> y32(static_cast<size_t>(3 * kN));
  ASSERT_TRUE(tall.run(gemm, false, y16, nullptr).ok());
  tall.expect_output(y16, false);
  EXPECT_EQ(gemm.cached_plans(), 1u);
  ASSERT_TRUE(odd_k.run(gemm, false, y16, nullptr).ok());
  EXPECT_EQ(gemm.cached_plans(), 2u);
  ASSERT_TRUE(f32.run(gemm, false, y32, nullptr).ok());
  f32.expect_output(y32, false);
  EXPECT_EQ(gemm.cached_plans(), 3u);

  // x one element (2 bytes) past its allocation's start.
  const std::vector<float> x = random_values<Bf16>(rng, 3 * kK + 1);
  const auto dev_x = device_array<Bf16>(x);
  DeviceArray<Bf16> y(static_cast<size_t>(3 * kN));
  poison(y);
  const Status s =
      gemm.run<Bf16, Bf16>(dev_x.get() + 1, 3, kK, tall.dev_w.get(), kN, nullptr, y.get(), nullptr);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(gemm.cached_plans(), 4u);
  const HostProduct want =
      host_product(std::vector<float>(x.begin() + 1, x.end()), tall.w, 3, kK, kN);
  const std::vector<float> got = download_floats(y);
  size_t bad = 0;
  for (size_t e = 0; e < got.size(); ++e) {
    const double tol = 1e-2 * std::fabs(want.value[e]) + 1e-6 * want.scale[e];
    if (!(std::fabs(double{got[e]} - want.value[e]) <= tol) && ++bad <= 5) {
      ADD_FAILURE() << "[" << e << "] got " << got[e] << " want " << want.value[e];
    }
  }
  EXPECT_EQ(bad, 0u);
}

// True when every element of `a` is NaN (as poison() left it: nothing wrote it).
template <typename T>
bool all_poisoned(const DeviceArray<T>& a) {
  const std::vector<float> v = download_floats(a);
  return std::all_of(v.begin(), v.end(), [](float f) { return std::isnan(f); });
}

TEST(GemmTest, WarmRunsEachCublasLtAlgorithmOnceAndWritesWhatRunWould) {
  CELLM_SKIP_WITHOUT_GPU();
  Gemm gemm = make_gemm(GemmPath::kCublasLtOnly);
  std::mt19937 rng(29);
  constexpr int64_t kMaxM = 80, kK = 128, kN = 96;
  const ProductCase<Bf16> a(rng, kMaxM, kK, kN);
  DeviceArray<Bf16> y(static_cast<size_t>(kMaxM * kN));
  const auto warm = [&](int64_t m) {
    Result<bool> ran =
        gemm.warm<Bf16, Bf16>(a.dev_x.get(), m, kK, a.dev_w.get(), kN, nullptr, y.get(), nullptr);
    EXPECT_TRUE(ran.ok()) << ran.status().to_string();
    return ran.ok() && *ran;
  };
  // The first call runs its algorithm: y is the product, as run writes it.
  poison(y);
  ASSERT_TRUE(warm(kMaxM));
  EXPECT_EQ(gemm.cached_plans(), 1u);
  EXPECT_EQ(gemm.warmed_algorithms(), 1u);
  a.expect_output(y, false);
  // The same call again enqueues nothing; run then uses the plan warm built.
  poison(y);
  EXPECT_FALSE(warm(kMaxM));
  EXPECT_TRUE(all_poisoned(y));
  ASSERT_TRUE(a.run(gemm, false, y, nullptr).ok());
  EXPECT_EQ(gemm.cached_plans(), 1u);
  a.expect_output(y, false);
  // Every other width builds its plan and runs only algorithms not warmed before.
  size_t ran = 1;
  for (int64_t m = 1; m < kMaxM; ++m) ran += warm(m) ? 1 : 0;
  EXPECT_EQ(gemm.cached_plans(), static_cast<size_t>(kMaxM));
  EXPECT_EQ(gemm.warmed_algorithms(), ran);
  EXPECT_LE(ran, static_cast<size_t>(kMaxM));
  // An empty call does nothing; a malformed one is refused as run refuses it.
  Result<bool> empty =
      gemm.warm<Bf16, Bf16>(a.dev_x.get(), 0, kK, a.dev_w.get(), kN, nullptr, y.get(), nullptr);
  ASSERT_TRUE(empty.ok());
  EXPECT_FALSE(*empty);
  Result<bool> malformed =
      gemm.warm<Bf16, Bf16>(a.dev_x.get(), 4, kK, a.dev_w.get(), 0, nullptr, y.get(), nullptr);
  EXPECT_EQ(malformed.status().code(), StatusCode::kInvalidArgument);
  // Under kAuto the GEMV serves small bf16 calls: nothing to load, no plan.
  Gemm gemv = make_gemm();
  poison(y);
  Result<bool> small =
      gemv.warm<Bf16, Bf16>(a.dev_x.get(), 4, kK, a.dev_w.get(), kN, nullptr, y.get(), nullptr);
  ASSERT_TRUE(small.ok());
  EXPECT_FALSE(*small);
  EXPECT_EQ(gemv.cached_plans(), 0u);
  EXPECT_TRUE(all_poisoned(y));
}

// One run_swiglu_down call against launch_swiglu followed by run on the same Gemm: the same
// bits, and act untouched exactly when the call is `fused` (one GEMV launch).
template <typename T>
void expect_swiglu_down_equals_swiglu_then_run(Gemm& gemm, std::mt19937& rng, int64_t m,
                                               bool fused) {
  constexpr int64_t kFf = 136, kN = 40;
  SCOPED_TRACE(std::string(type_name<T>()) + " m=" + std::to_string(m));
  const auto gate_up = device_array<T>(random_values<T>(rng, m * 2 * kFf, 4.0f));
  const auto w = device_array<T>(random_values<T>(rng, kN * kFf));
  DeviceArray<T> act(static_cast<size_t>(m * kFf)), y(static_cast<size_t>(m * kN));
  poison(act);
  poison(y);
  const Status s =
      gemm.run_swiglu_down<T>(gate_up.get(), m, kFf, w.get(), kN, act.get(), y.get(), nullptr);
  ASSERT_TRUE(s.ok()) << s.to_string();
  const std::vector<T> got = y.download();
  const std::vector<float> act_after = download_floats(act);
  for (size_t e = 0; e < act_after.size(); ++e) {
    ASSERT_EQ(std::isnan(act_after[e]), fused) << "act[" << e << "]";
  }

  DeviceArray<T> act2(static_cast<size_t>(m * kFf)), y2(static_cast<size_t>(m * kN));
  CELLM_ASSERT_CUDA(launch_swiglu<T>(gate_up.get(), m, kFf, act2.get(), nullptr));
  const Status two = gemm.run<T, T>(act2.get(), m, kFf, w.get(), kN, nullptr, y2.get(), nullptr);
  ASSERT_TRUE(two.ok()) << two.to_string();
  const std::vector<T> want = y2.download();
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(T)), 0)
      << "run_swiglu_down differs from launch_swiglu + run";
}

TEST(GemmTest, RunSwigluDownEqualsSwigluThenRunForEveryBatchSize) {
  CELLM_SKIP_WITHOUT_GPU();
  Gemm gemm = make_gemm();
  std::mt19937 rng(27);
  for (const int64_t m : {1, 5, 8, 9, 64}) {
    expect_swiglu_down_equals_swiglu_then_run<Bf16>(gemm, rng, m, m <= kGemvMaxRows);
    expect_swiglu_down_equals_swiglu_then_run<float>(gemm, rng, m, false);
  }
  Gemm cublaslt = make_gemm(GemmPath::kCublasLtOnly);
  expect_swiglu_down_equals_swiglu_then_run<Bf16>(cublaslt, rng, 3, false);
  // An empty batch enqueues nothing; a malformed one is refused.
  EXPECT_TRUE(
      (gemm.run_swiglu_down<Bf16>(nullptr, 0, 64, nullptr, 64, nullptr, nullptr, nullptr).ok()));
  EXPECT_EQ(
      (gemm.run_swiglu_down<Bf16>(nullptr, 1, 0, nullptr, 64, nullptr, nullptr, nullptr).code()),
      StatusCode::kInvalidArgument);
}

// warm_swiglu_down's first call at a shape writes run_swiglu_down's bits (a cuBLASLt
// product at these widths, on either path); a second enqueues nothing.
TEST(GemmTest, WarmSwigluDownWritesWhatRunSwigluDownWould) {
  CELLM_SKIP_WITHOUT_GPU();
  constexpr int64_t kM = 24, kFf = 136, kN = 40;
  std::mt19937 rng(31);
  const auto gate_up = device_array<Bf16>(random_values<Bf16>(rng, kM * 2 * kFf, 4.0f));
  const auto w = device_array<Bf16>(random_values<Bf16>(rng, kN * kFf));
  DeviceArray<Bf16> act(static_cast<size_t>(kM * kFf)), y(static_cast<size_t>(kM * kN));
  for (const GemmPath path : {GemmPath::kCublasLtOnly, GemmPath::kTuned}) {
    SCOPED_TRACE(path == GemmPath::kTuned ? "kTuned" : "kCublasLtOnly");
    Gemm gemm = make_gemm(path);
    poison(y);
    Result<bool> first = gemm.warm_swiglu_down<Bf16>(gate_up.get(), kM, kFf, w.get(), kN, act.get(),
                                                     y.get(), nullptr);
    ASSERT_TRUE(first.ok()) << first.status().to_string();
    EXPECT_TRUE(*first);
    const std::vector<Bf16> warmed = y.download();
    poison(y);
    Result<bool> second = gemm.warm_swiglu_down<Bf16>(gate_up.get(), kM, kFf, w.get(), kN,
                                                      act.get(), y.get(), nullptr);
    ASSERT_TRUE(second.ok());
    EXPECT_FALSE(*second);
    EXPECT_TRUE(all_poisoned(y));
    ASSERT_TRUE(
        gemm.run_swiglu_down<Bf16>(gate_up.get(), kM, kFf, w.get(), kN, act.get(), y.get(), nullptr)
            .ok());
    const std::vector<Bf16> ran = y.download();
    EXPECT_EQ(std::memcmp(warmed.data(), ran.data(), ran.size() * sizeof(Bf16)), 0);
  }
}

// The tuned path. The process-wide choice table outlives each test, so tests that need a
// key timed (not adopted) use shapes no other test uses.

Gemm make_tuned_gemm(bool tuning = true) {
  Gemm gemm = make_gemm(GemmPath::kTuned);
  gemm.set_tuning(tuning);
  return gemm;
}

TEST(GemmTunedTest, TunedProductsMatchADoubleReferenceAtEveryBatchSize) {
  CELLM_SKIP_WITHOUT_GPU();
  Gemm gemm = make_tuned_gemm();
  std::mt19937 rng(31);
  for (const Dims dims : kDims) {
    for (const int64_t m : {1, 8, 16, 64}) {
      const ProductCase<Bf16> c(rng, m, dims.k, dims.n);
      for (const bool with_bias : {false, true}) {
        DeviceArray<Bf16> y16(static_cast<size_t>(m * dims.n));
        poison(y16);
        const Status s16 = c.run(gemm, with_bias, y16, nullptr);
        ASSERT_TRUE(s16.ok()) << s16.to_string();
        c.expect_output(y16, with_bias);

        DeviceArray<float> y32(static_cast<size_t>(m * dims.n));
        poison(y32);
        const Status s32 = c.run(gemm, with_bias, y32, nullptr);
        ASSERT_TRUE(s32.ok()) << s32.to_string();
        c.expect_output(y32, with_bias);
      }
    }
    for (const int64_t m : {1, 16}) {
      const ProductCase<float> c(rng, m, dims.k, dims.n);
      DeviceArray<float> y(static_cast<size_t>(m * dims.n));
      poison(y);
      const Status s = c.run(gemm, true, y, nullptr);
      ASSERT_TRUE(s.ok()) << s.to_string();
      c.expect_output(y, true);
    }
  }
  // Tuning was on and no stream captured: every key was timed here or adopted.
  for (const Gemm::PlanInfo& plan : gemm.describe_plans()) {
    EXPECT_NE(plan.source, Gemm::PlanSource::kHeuristic) << plan.choice.name;
    EXPECT_GT(plan.choice.us, 0.0f) << plan.choice.name;
  }
}

// run_swiglu_down under kTuned against launch_swiglu's activation and a double product.
template <typename T>
void expect_tuned_swiglu_down(Gemm& gemm, std::mt19937& rng, int64_t m, int64_t ff, int64_t n) {
  const std::string what = std::string(type_name<T>()) + " swiglu+down m=" + std::to_string(m) +
                           " ff=" + std::to_string(ff) + " n=" + std::to_string(n);
  const auto gate_up = device_array<T>(random_values<T>(rng, m * 2 * ff, 4.0f));
  const std::vector<float> w = random_values<T>(rng, n * ff);
  const auto dev_w = device_array<T>(w);
  DeviceArray<T> act(static_cast<size_t>(m * ff)), y(static_cast<size_t>(m * n));
  poison(act);
  poison(y);
  const Status s =
      gemm.run_swiglu_down<T>(gate_up.get(), m, ff, dev_w.get(), n, act.get(), y.get(), nullptr);
  ASSERT_TRUE(s.ok()) << what << ": " << s.to_string();
  DeviceArray<T> want_act(static_cast<size_t>(m * ff));
  CELLM_ASSERT_CUDA(launch_swiglu<T>(gate_up.get(), m, ff, want_act.get(), nullptr));
  const HostProduct want = host_product(download_floats(want_act), w, m, ff, n);
  expect_product<T>(download_floats(y), want, {}, m, n, what);
}

TEST(GemmTunedTest, TunedSwigluDownMatchesTheActivationThenADoubleReference) {
  CELLM_SKIP_WITHOUT_GPU();
  Gemm gemm = make_tuned_gemm();
  std::mt19937 rng(32);
  for (const int64_t m : {1, 5, 8, 9, 64}) {
    expect_tuned_swiglu_down<Bf16>(gemm, rng, m, 264, 72);
    expect_tuned_swiglu_down<float>(gemm, rng, m, 264, 72);
  }
  for (const Gemm::PlanInfo& plan : gemm.describe_plans()) {
    EXPECT_EQ(plan.key.op, GemmOp::kSwiGLUDown);
    EXPECT_NE(plan.source, Gemm::PlanSource::kHeuristic) << plan.choice.name;
    if (plan.choice.kernel != GemmKernel::kCublasLt) {
      EXPECT_LE(plan.key.m, kGemvMaxRows);
      EXPECT_EQ(plan.key.a_type, static_cast<int>(CUDA_R_16BF));
    }
  }
}

TEST(GemmTunedTest, ASecondGemmAdoptsTheFirstsChoicesAndGivesTheSameBits) {
  CELLM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(33);
  // The first times; the second, tuning too, adopts; the third, tuning off (as for a
  // prefill shape), takes the table's choice as well.
  Gemm gemms[] = {make_tuned_gemm(), make_tuned_gemm(), make_tuned_gemm(false)};
  constexpr int64_t kK = 520, kN = 136, kFf = 520;
  for (const int64_t m : {1, 8, 16}) {
    const ProductCase<Bf16> c(rng, m, kK, kN);
    const auto gate_up = device_array<Bf16>(random_values<Bf16>(rng, m * 2 * kFf, 4.0f));
    const auto w_down = device_array<Bf16>(random_values<Bf16>(rng, kN * kFf));
    std::vector<Bf16> first_y, first_down;
    for (Gemm& gemm : gemms) {
      SCOPED_TRACE("Gemm " + std::to_string(&gemm - gemms) + " m=" + std::to_string(m));
      DeviceArray<Bf16> y(static_cast<size_t>(m * kN)), down(static_cast<size_t>(m * kN));
      DeviceArray<Bf16> act(static_cast<size_t>(m * kFf));
      poison(y);
      poison(down);
      const Status product = c.run(gemm, true, y, nullptr);
      ASSERT_TRUE(product.ok()) << product.to_string();
      c.expect_output(y, true);
      const Status swiglu_down = gemm.run_swiglu_down<Bf16>(gate_up.get(), m, kFf, w_down.get(), kN,
                                                            act.get(), down.get(), nullptr);
      ASSERT_TRUE(swiglu_down.ok()) << swiglu_down.to_string();
      if (&gemm == gemms) {
        first_y = y.download();
        first_down = down.download();
      } else {
        testing::expect_bitwise_equal(y.download(), first_y, "the product");
        testing::expect_bitwise_equal(down.download(), first_down, "swiglu+down");
      }
    }
  }
  const std::vector<Gemm::PlanInfo> first = gemms[0].describe_plans();
  EXPECT_EQ(first.size(), 6u);
  for (const Gemm& other : {std::cref(gemms[1]), std::cref(gemms[2])}) {
    const std::vector<Gemm::PlanInfo> plans = other.describe_plans();
    ASSERT_EQ(plans.size(), first.size());
    for (size_t i = 0; i < plans.size(); ++i) {
      EXPECT_TRUE(plans[i].key == first[i].key);
      EXPECT_EQ(first[i].source, Gemm::PlanSource::kTimed) << first[i].choice.name;
      EXPECT_EQ(plans[i].source, Gemm::PlanSource::kAdopted) << plans[i].choice.name;
      EXPECT_EQ(plans[i].choice.name, first[i].choice.name);
    }
  }
}

TEST(GemmTunedTest, ANewShapeDuringCaptureTakesTheHeuristicAndIsTimedOutsideIt) {
  CELLM_SKIP_WITHOUT_GPU();
  auto stream = Stream::create();
  ASSERT_TRUE(stream.ok()) << stream.status().to_string();
  Gemm gemm = make_tuned_gemm();
  std::mt19937 rng(34);
  const ProductCase<Bf16> c(rng, 1, 328, 72);  // the GEMV serves it too
  DeviceArray<Bf16> y(72);
  // Records the product into a graph, replays it twice and checks y.
  const auto capture_and_replay = [&] {
    poison(y);
    CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
    Status recorded;
    const GraphExec exec =
        capture_graph(stream->get(), [&] { recorded = c.run(gemm, true, y, stream->get()); });
    ASSERT_TRUE(recorded.ok()) << recorded.to_string();
    ASSERT_NE(exec.get(), nullptr);
    for (int replay = 0; replay < 2; ++replay) {
      CELLM_ASSERT_CUDA(cudaGraphLaunch(exec.get(), stream->get()));
      CELLM_ASSERT_CUDA(cudaStreamSynchronize(stream->get()));
      c.expect_output(y, true);
    }
  };

  capture_and_replay();
  ASSERT_EQ(gemm.describe_plans().size(), 1u);
  EXPECT_EQ(gemm.describe_plans()[0].source, Gemm::PlanSource::kHeuristic);
  EXPECT_EQ(gemm.describe_plans()[0].choice.kernel, GemmKernel::kCublasLt);

  // Outside capture, with tuning on, the key is timed.
  poison(y);
  CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
  const Status eager = c.run(gemm, true, y, stream->get());
  ASSERT_TRUE(eager.ok()) << eager.to_string();
  CELLM_ASSERT_CUDA(cudaStreamSynchronize(stream->get()));
  c.expect_output(y, true);
  ASSERT_EQ(gemm.describe_plans().size(), 1u);
  EXPECT_EQ(gemm.describe_plans()[0].source, Gemm::PlanSource::kTimed);

  // And the tuned choice records and replays too.
  capture_and_replay();
  EXPECT_EQ(gemm.describe_plans()[0].source, Gemm::PlanSource::kTimed);
}

}  // namespace
}  // namespace cellm::cuda
