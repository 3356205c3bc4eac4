// Tests of launch_skinny_gemm (kernels/skinny_gemm.h) against a double-precision host
// product of the same bf16 inputs, every element: row counts across the x tiles (9-128),
// narrow and wide n (partial row tiles), k from one stage to the 8B down projection's,
// with and without bias, both output types, shapes that split k over a cluster (few row
// tiles, many stages) and shapes that do not, with either ring. Also: two launches give the same
// bits, nothing is written past y, a CUDA graph replays it, and bad arguments are refused without a
// launch.
//
// Tolerance, per element, as gemv_test.cpp: |got - want| <= rel * |want| + 1e-6 *
// sum_c |x[i,c] w[j,c]| (products of bf16 are exact in f32; f32 sums err by ~2^-24 of
// the magnitudes), rel 1e-5 for f32 outputs and 4e-3 for bf16 ones.
#include "cuda/kernels/skinny_gemm.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/device_memory.h"
#include "device_test_util.h"
#include "gpu_test.h"
#include "host_product.h"

namespace cellm::cuda {
namespace {

using testing::capture_graph;
using testing::device_array;
using testing::DeviceArray;
using testing::host_product;
using testing::HostProduct;
using testing::poison;
using testing::random_values;
using testing::same_bits;
using testing::type_name;

using Bf16 = __nv_bfloat16;

constexpr int64_t kGuard = 64;  // elements past y that keep their poison

struct SkinnyCase {
  int64_t m, k, n;
  std::vector<float> w, bias, x;
  DeviceArray<Bf16> dev_w, dev_bias, dev_x;
  HostProduct want;

  SkinnyCase(std::mt19937& rng, int64_t m_, int64_t k_, int64_t n_)
      : m(m_),
        k(k_),
        n(n_),
        w(random_values<Bf16>(rng, n * k)),
        bias(random_values<Bf16>(rng, n)),
        x(random_values<Bf16>(rng, m * k)),
        dev_w(device_array<Bf16>(w)),
        dev_bias(device_array<Bf16>(bias)),
        dev_x(device_array<Bf16>(x)),
        want(host_product(x, w, m, k, n)) {}

  std::string name(bool with_bias) const {
    return "m=" + std::to_string(m) + " k=" + std::to_string(k) + " n=" + std::to_string(n) +
           (with_bias ? " +bias" : "");
  }

  template <typename TOut>
  DeviceArray<TOut> run(bool with_bias, SkinnyRing ring) const {
    DeviceArray<TOut> y(static_cast<size_t>(m * n + kGuard));
    poison(y);
    const cudaError_t err =
        launch_skinny_gemm<TOut>(dev_x.get(), m, k, dev_w.get(), n,
                                 with_bias ? dev_bias.get() : nullptr, y.get(), ring, nullptr);
    EXPECT_EQ(err, cudaSuccess) << name(with_bias) << ": " << cudaGetErrorString(err);
    return y;
  }

  template <typename TOut>
  void expect_output(const DeviceArray<TOut>& y, bool with_bias, const std::string& what) const {
    constexpr double kRel = std::is_same_v<TOut, Bf16> ? 4e-3 : 1e-5;
    testing::expect_product_output(y.download(), want, with_bias ? bias : std::vector<float>{}, m,
                                   n, kRel, what);
  }
};

// Both rings (their split counts differ: other sums, other blocks a cluster), each launch
// twice.
template <typename TOut>
void expect_case(const SkinnyCase& c) {
  for (const SkinnyRing ring : {SkinnyRing::kShared, SkinnyRing::kWholeSm}) {
    for (const bool with_bias : {false, true}) {
      const std::string what = std::string(type_name<TOut>()) + " out " + c.name(with_bias) +
                               (ring == SkinnyRing::kShared ? " shared ring" : " whole-SM ring");
      SCOPED_TRACE(what);
      const DeviceArray<TOut> y = c.run<TOut>(with_bias, ring);
      CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
      c.expect_output(y, with_bias, what);
      const DeviceArray<TOut> again = c.run<TOut>(with_bias, ring);
      CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
      EXPECT_TRUE(same_bits(y, again, c.m * c.n)) << "a second launch gave other bits";
    }
  }
}

TEST(SkinnyGemmTest, EveryShapeMatchesADoubleReference) {
  CELLM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(91);
  // m: the first and last rows of each x tile size (16, 32, 64, 128); n: one row, a partial
  // row tile, several tiles, a partial last tile of many; k: one stage, the pipeline's
  // depth and past it, the 8B widths. Splits follow the device: none at k = 128 and 640
  // (fewer than 8 stages), up to 8 where few row tiles meet many stages (k = 14336).
  for (const int64_t m : {9, 16, 17, 32, 33, 64, 65, 128}) {
    for (const auto& [k, n] : std::vector<std::pair<int64_t, int64_t>>{
             {128, 1}, {640, 37}, {2048, 200}, {4096, 4097}, {14336, 129}}) {
      const SkinnyCase c(rng, m, k, n);
      expect_case<Bf16>(c);
      expect_case<float>(c);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(SkinnyGemmTest, LlamaEightBShapesMatchADoubleReference) {
  CELLM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(92);
  // qkv, o and down at the 8B widths, 16, 64 and 128 rows (the split's shapes).
  for (const int64_t m : {16, 64, 128}) {
    for (const auto& [k, n] :
         std::vector<std::pair<int64_t, int64_t>>{{4096, 6144}, {4096, 4096}, {14336, 4096}}) {
      const SkinnyCase c(rng, m, k, n);
      expect_case<Bf16>(c);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(SkinnyGemmTest, SplitsFitOneWaveOfClusters) {
  // Host-only: the split count of a shape on a device that runs clusters[s - 1] clusters of
  // s blocks at once (a 132-SM table: 62 clusters of 4 measured for 64-row blocks, not
  // the 66 that 132 SMs x 2 blocks / 4 would give): the most splits, up to 8, whose
  // clusters all run at once, each split >= 512 columns of k (4 stages).
  const SkinnyClusters clusters = {264, 128, 84, 62, 48, 40, 32, 30};
  EXPECT_EQ(skinny_gemm_splits(16, 4096, 4096, clusters), 3);   // o: 64 tiles; 4 -> 62 < 64
  EXPECT_EQ(skinny_gemm_splits(16, 6144, 4096, clusters), 2);   // qkv: 96 tiles
  EXPECT_EQ(skinny_gemm_splits(64, 4096, 4096, clusters), 7);   // 128-row blocks: 32 tiles
  EXPECT_EQ(skinny_gemm_splits(16, 28672, 4096, clusters), 1);  // gate_up: 448 tiles, no split
  EXPECT_EQ(skinny_gemm_splits(16, 4096, 14336, clusters), 3);  // down
  EXPECT_EQ(skinny_gemm_splits(16, 129, 14336, clusters), 8);   // 3 tiles: the cluster's most
  EXPECT_EQ(skinny_gemm_splits(16, 4096, 640, clusters), 1);    // 5 stages: too few to split
  EXPECT_EQ(skinny_gemm_splits(16, 64, 1024, clusters), 2);     // 8 stages: 2 splits of 4
  const SkinnyClusters one_sm = {1, 0, 0, 0, 0, 0, 0, 0};       // clusters do not fit
  EXPECT_EQ(skinny_gemm_splits(16, 64, 4096, one_sm), 1);
}

TEST(SkinnyGemmTest, ACapturedGraphReplaysToTheSameBits) {
  CELLM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(93);
  const SkinnyCase c(rng, 40, 4096, 1000);
  const DeviceArray<float> eager = c.run<float>(true, SkinnyRing::kWholeSm);
  DeviceArray<float> replayed(static_cast<size_t>(c.m * c.n + kGuard));
  poison(replayed);
  Result<Stream> stream = Stream::create();
  ASSERT_TRUE(stream.ok()) << stream.status().to_string();
  GraphExec exec = capture_graph(stream->get(), [&] {
    EXPECT_EQ(
        launch_skinny_gemm<float>(c.dev_x.get(), c.m, c.k, c.dev_w.get(), c.n, c.dev_bias.get(),
                                  replayed.get(), SkinnyRing::kWholeSm, stream->get()),
        cudaSuccess);
  });
  ASSERT_NE(exec.get(), nullptr);
  for (int i = 0; i < 3; ++i) CELLM_ASSERT_CUDA(cudaGraphLaunch(exec.get(), stream->get()));
  CELLM_ASSERT_CUDA(cudaStreamSynchronize(stream->get()));
  EXPECT_TRUE(same_bits(eager, replayed, c.m * c.n));
}

TEST(SkinnyGemmTest, BadArgumentsAreRefusedWithoutALaunch) {
  CELLM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(94);
  const SkinnyCase c(rng, 16, 128, 8);
  DeviceArray<float> y(static_cast<size_t>(65 * 8));
  const auto call = [&](int64_t m, int64_t k, const Bf16* x, const Bf16* w, float* out) {
    return launch_skinny_gemm<float>(x, m, k, w, 8, nullptr, out, SkinnyRing::kShared, nullptr);
  };
  const Bf16* x = c.dev_x.get();
  const Bf16* w = c.dev_w.get();
  EXPECT_EQ(call(8, 128, x, w, y.get()), cudaErrorInvalidValue);       // m < 9
  EXPECT_EQ(call(129, 128, x, w, y.get()), cudaErrorInvalidValue);     // m > 128
  EXPECT_EQ(call(16, 96, x, w, y.get()), cudaErrorInvalidValue);       // k % 128
  EXPECT_EQ(call(16, 64, x, w, y.get()), cudaErrorInvalidValue);       // k % 128
  EXPECT_EQ(call(16, 128, x + 1, w, y.get()), cudaErrorInvalidValue);  // aligned x
  EXPECT_EQ(call(16, 128, x, w + 1, y.get()), cudaErrorInvalidValue);  // aligned w
  EXPECT_EQ(call(16, 128, x, w, nullptr), cudaErrorInvalidValue);      // no y
  EXPECT_FALSE(skinny_gemm_supports(16, 0, 128, x, w));                // n = 0
  CELLM_ASSERT_CUDA(cudaGetLastError());
}

}  // namespace
}  // namespace cellm::cuda
