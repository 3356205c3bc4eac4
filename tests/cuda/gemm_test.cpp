// Tests of Gemm (cuBLASLt y = x · wᵀ + bias) against a double-precision host product of
// the same inputs (bf16-rounded where T is bf16), every element; plan caching; capture
// of warmed shapes in a CUDA graph.
//
// Tolerance, per element: |got - want| <= rel * |want| + 1e-6 * sum_c |x[i,c] w[j,c]|
// (+ 4e-3 |bias[j]| for bf16 outputs).
//   f32 outputs: rel 1e-5. f32 accumulation of k products errs by about 2^-24 times the
//   sum of their magnitudes (bf16 products are exact in f32), so 1e-6 of that sum is a
//   wide margin, while a TF32 product (10-bit mantissa: ~2^-11 of the sum) fails it.
//   bf16 outputs: rel 1e-2, above the 2^-8 relative half-ulp of the single rounding, and
//   4e-3 |bias| for a bias added after that rounding (the separate bias kernel).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/device_memory.h"
#include "cuda/gemm.h"
#include "device_test_util.h"
#include "gpu_test.h"

namespace cellm::cuda {
namespace {

using testing::device_array;
using testing::DeviceArray;
using testing::download_floats;
using testing::poison;
using testing::random_values;
using testing::type_name;

using Bf16 = __nv_bfloat16;

// sum_c x[i, c] * w[j, c] in f64, and sum_c |x[i, c] * w[j, c]| (the error scale).
struct HostProduct {
  std::vector<double> value;  // [m, n]
  std::vector<double> scale;  // [m, n]
};

HostProduct host_product(const std::vector<float>& x, const std::vector<float>& w, int64_t m,
                         int64_t k, int64_t n) {
  HostProduct p{std::vector<double>(static_cast<size_t>(m * n)),
                std::vector<double>(static_cast<size_t>(m * n))};
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0, abs_sum = 0.0;
      for (int64_t c = 0; c < k; ++c) {
        const double term = double{x[i * k + c]} * double{w[j * k + c]};
        sum += term;
        abs_sum += std::fabs(term);
      }
      p.value[i * n + j] = sum;
      p.scale[i * n + j] = abs_sum;
    }
  }
  return p;
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
    constexpr bool kBf16Out = std::is_same_v<TOut, Bf16>;
    constexpr double kRel = kBf16Out ? 1e-2 : 1e-5;
    const std::vector<float> got = download_floats(y);
    ASSERT_EQ(static_cast<int64_t>(got.size()), m * n);
    size_t bad = 0;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        const size_t e = static_cast<size_t>(i * n + j);
        const double b = with_bias ? double{bias[static_cast<size_t>(j)]} : 0.0;
        const double expected = want.value[e] + b;
        const double tol = kRel * std::fabs(expected) + 1e-6 * want.scale[e] +
                           (kBf16Out ? 4e-3 * std::fabs(b) : 0);
        if (!(std::fabs(double{got[e]} - expected) <= tol) && ++bad <= 5) {
          ADD_FAILURE() << type_name<TOut>() << " out " << name(with_bias) << " [" << i << ", " << j
                        << "]: got " << got[e] << " want " << expected << " (tol " << tol << ")";
        }
      }
    }
    EXPECT_EQ(bad, 0u) << type_name<TOut>() << " out " << name(with_bias) << ": " << bad << " of "
                       << got.size() << " elements off";
  }
};

constexpr int64_t kRowCounts[] = {1, 7, 64, 300};
struct Dims {
  int64_t k, n;
};
constexpr Dims kDims[] = {{64, 64}, {67, 67}, {1024, 96}, {4096, 64}, {128, 4096}};

Gemm make_gemm() {
  Result<Gemm> gemm = Gemm::create();
  EXPECT_TRUE(gemm.ok()) << gemm.status().to_string();
  return std::move(gemm).value();
}

TEST(GemmTest, Bf16ProductsMatchADoubleReferenceForBothOutputTypes) {
  CELLM_SKIP_WITHOUT_GPU();
  Gemm gemm = make_gemm();
  std::mt19937 rng(21);
  for (const Dims dims : kDims) {
    for (const int64_t m : kRowCounts) {
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
  Gemm gemm = make_gemm();
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
  Gemm gemm = make_gemm();
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
  Gemm gemm = make_gemm();
  auto stream = Stream::create();
  ASSERT_TRUE(stream.ok()) << stream.status().to_string();
  std::mt19937 rng(25);
  const ProductCase<Bf16> qkv(rng, 7, 64, 96);     // bf16 -> bf16 + bias (epilogue)
  const ProductCase<Bf16> head(rng, 1, 128, 64);   // bf16 -> f32 + bias (bias kernel)
  const ProductCase<float> exact(rng, 3, 67, 67);  // f32 -> f32 + bias
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
  EXPECT_EQ(plans, 3u);

  poison(y_qkv);
  poison(y_head);
  poison(y_exact);
  CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
  CELLM_ASSERT_CUDA(cudaStreamBeginCapture(stream->get(), cudaStreamCaptureModeThreadLocal));
  const Status recorded = enqueue();
  cudaGraph_t graph = nullptr;
  CELLM_ASSERT_CUDA(cudaStreamEndCapture(stream->get(), &graph));
  ASSERT_TRUE(recorded.ok()) << recorded.to_string();
  cudaGraphExec_t exec_handle = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec_handle, graph, 0);
  cudaGraphDestroy(graph);
  CELLM_ASSERT_CUDA(instantiated);
  const GraphExec exec(exec_handle);
  EXPECT_EQ(gemm.cached_plans(), plans);
  for (int replay = 0; replay < 2; ++replay) {
    CELLM_ASSERT_CUDA(cudaGraphLaunch(exec.get(), stream->get()));
    CELLM_ASSERT_CUDA(cudaStreamSynchronize(stream->get()));
    qkv.expect_output(y_qkv, true);
    head.expect_output(y_head, true);
    exact.expect_output(y_exact, true);
  }
}

}  // namespace
}  // namespace cellm::cuda
