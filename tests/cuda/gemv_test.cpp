// Tests of launch_gemv (kernels/gemv.h) against a double-precision host product of the
// same bf16 inputs, every element: every row count 1-8 on awkward and real shapes, with
// and without bias, both output types, both inputs. The kSwiGLU reference input is
// launch_swiglu's output (the contract: fused equals launch_swiglu then kPlain, bit for
// bit, which is checked too). Also: every split of the kRows kernel, a row's bits do not
// depend on m, two launches give the same bits, nothing is written past y, capture in a
// CUDA graph, and bad arguments are refused without a launch.
//
// Tolerance, per element: |got - want| <= rel * |want| + 1e-6 * sum_c |x'[i,c] w[j,c]|.
//   The products of bf16 values are exact in f32 and the kernel sums them in f32, which
//   errs by about 2^-24 times the sum of their magnitudes: 1e-6 of that sum is a wide
//   margin. f32 outputs: rel 1e-5. bf16 outputs: rel 4e-3, above bf16's unit roundoff
//   2^-8 for the single rounding (the bias is added in f32 before it).
#include "cuda/kernels/gemv.h"

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
using testing::same_bits;
using testing::type_name;

using Bf16 = __nv_bfloat16;

constexpr int64_t kRows = kGemvMaxRows;
// Elements after y[m, n] that must keep their poison.
constexpr int64_t kGuard = 64;

const char* kernel_name(GemvKernel kernel) {
  return kernel == GemvKernel::kTensorCores ? " (tensor cores)" : " (rows)";
}

const char* input_name(GemvInput input) {
  return input == GemvInput::kPlain ? "plain" : "swiglu";
}

// One weight matrix with its bias, and kRows rows of each input, on host and device;
// the reference products of all kRows rows (a launch of m rows is checked against the
// first m), unless the test needs none. For kSwiGLU the input x' is launch_swiglu's
// output for the gate_up rows.
struct GemvCase {
  int64_t k, n;
  std::vector<float> w, bias, x, gate_up, act;
  DeviceArray<Bf16> dev_w, dev_bias, dev_x, dev_gate_up, dev_act;
  HostProduct want_plain, want_swiglu;

  GemvCase(std::mt19937& rng, int64_t k_, int64_t n_, bool with_reference = true)
      : k(k_),
        n(n_),
        w(random_values<Bf16>(rng, n * k)),
        bias(random_values<Bf16>(rng, n)),
        x(random_values<Bf16>(rng, kRows * k)),
        // Gates over [-4, 4]: silu's curved part, not just its linear tail.
        gate_up(random_values<Bf16>(rng, kRows * 2 * k, 4.0f)),
        dev_w(device_array<Bf16>(w)),
        dev_bias(device_array<Bf16>(bias)),
        dev_x(device_array<Bf16>(x)),
        dev_gate_up(device_array<Bf16>(gate_up)),
        dev_act(static_cast<size_t>(kRows * k)) {
    const cudaError_t err =
        launch_swiglu<Bf16>(dev_gate_up.get(), kRows, k, dev_act.get(), nullptr);
    CELLM_CHECK_MSG(err == cudaSuccess, cudaGetErrorString(err));
    act = download_floats(dev_act);
    if (with_reference) {
      want_plain = host_product(x, w, kRows, k, n);
      want_swiglu = host_product(act, w, kRows, k, n);
    }
  }

  std::string name(int64_t m, GemvInput input, bool with_bias) const {
    return std::string(input_name(input)) + " m=" + std::to_string(m) + " k=" + std::to_string(k) +
           " n=" + std::to_string(n) + (with_bias ? " +bias" : "");
  }

  // y [m, n] (+ kGuard) of launch_gemv on this case's input, poisoned before the launch.
  template <typename TOut>
  DeviceArray<TOut> run(int64_t m, GemvInput input, bool with_bias, cudaStream_t stream = nullptr,
                        GemvKernel kernel = GemvKernel::kTensorCores,
                        int rows_split = kGemvRowsAutoSplit) const {
    DeviceArray<TOut> y(static_cast<size_t>(m * n + kGuard));
    poison(y);
    const Bf16* in = input == GemvInput::kPlain ? dev_x.get() : dev_gate_up.get();
    const cudaError_t err =
        launch_gemv<TOut>(in, m, k, input, dev_w.get(), n, with_bias ? dev_bias.get() : nullptr,
                          y.get(), stream, kernel, rows_split);
    EXPECT_EQ(err, cudaSuccess) << name(m, input, with_bias) << ": " << cudaGetErrorString(err);
    return y;
  }

  // y against the reference under the tolerance stated atop this file, and its guard
  // elements still poisoned.
  template <typename TOut>
  void expect_output(const DeviceArray<TOut>& y, int64_t m, GemvInput input, bool with_bias) const {
    constexpr double kRel = std::is_same_v<TOut, Bf16> ? 4e-3 : 1e-5;
    const HostProduct& want = input == GemvInput::kPlain ? want_plain : want_swiglu;
    ASSERT_EQ(static_cast<int64_t>(want.value.size()), kRows * n) << "a case without reference";
    const std::string what = std::string(type_name<TOut>()) + " out " + name(m, input, with_bias);
    const std::vector<TOut> raw = y.download();
    ASSERT_EQ(static_cast<int64_t>(raw.size()), m * n + kGuard);
    testing::expect_product_output(raw, want, with_bias ? bias : std::vector<float>{}, m, n, kRel,
                                   what);
  }
};

// Every m in [1, kRows] of one case, for one output type, input and bias: each against the
// reference; each row's bits equal to the m = kRows launch's; for kSwiGLU, the bits of
// launch_swiglu followed by a kPlain product.
template <typename TOut>
void expect_every_row_count(const GemvCase& c, GemvInput input, bool with_bias, GemvKernel kernel,
                            int rows_split = kGemvRowsAutoSplit) {
  const DeviceArray<TOut> all_rows =
      c.run<TOut>(kRows, input, with_bias, nullptr, kernel, rows_split);
  for (int64_t m = kRows; m >= 1; --m) {
    SCOPED_TRACE(std::string(type_name<TOut>()) + " out " + c.name(m, input, with_bias) +
                 kernel_name(kernel) + " split " + std::to_string(rows_split));
    const DeviceArray<TOut> y = c.run<TOut>(m, input, with_bias, nullptr, kernel, rows_split);
    c.expect_output(y, m, input, with_bias);
    EXPECT_TRUE(same_bits(y, all_rows, m * c.n)) << "rows differ from the m = 8 launch's";
    if (input == GemvInput::kSwiGLU) {
      DeviceArray<TOut> unfused(static_cast<size_t>(m * c.n));
      CELLM_ASSERT_CUDA(launch_gemv<TOut>(c.dev_act.get(), m, c.k, GemvInput::kPlain, c.dev_w.get(),
                                          c.n, with_bias ? c.dev_bias.get() : nullptr,
                                          unfused.get(), nullptr, kernel, rows_split));
      EXPECT_TRUE(same_bits(y, unfused, m * c.n)) << "fused differs from swiglu then plain";
    }
  }
}

void expect_case(const GemvCase& c) {
  for (const GemvKernel kernel : {GemvKernel::kTensorCores, GemvKernel::kRows}) {
    for (const GemvInput input : {GemvInput::kPlain, GemvInput::kSwiGLU}) {
      for (const bool with_bias : {false, true}) {
        expect_every_row_count<Bf16>(c, input, with_bias, kernel);
        expect_every_row_count<float>(c, input, with_bias, kernel);
      }
    }
  }
}

// k: a single 8-column load; one and two partial warp steps; a partial last iteration
// with split k; whole iterations; the down projection's width. n: one row, a partial
// 16-row tile, several tiles, a partial last block.
TEST(GemvTest, EveryRowCountMatchesADoubleReferenceOnAwkwardShapes) {
  CELLM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(31);
  for (const int64_t k : {8, 64, 136, 1000, 4096, 14336}) {
    for (const int64_t n : {1, 3, 37, 4097}) {
      const GemvCase c(rng, k, n);
      expect_case(c);
    }
  }
}

// Every split of the kRows kernel (the tuner may pick any): a k shorter than one run of
// a warp at split 8, partial runs, several runs per warp, the 8B's down width; n with a
// partial group of rows and a partial block.
TEST(GemvTest, EveryRowsSplitMatchesADoubleReference) {
  CELLM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(36);
  for (const int64_t k : {8, 1000, 4096, 14336}) {
    for (const int64_t n : {3, 37, 4097}) {
      const GemvCase c(rng, k, n);
      for (int split = 1; split <= kGemvRowsMaxSplit; split *= 2) {
        for (const GemvInput input : {GemvInput::kPlain, GemvInput::kSwiGLU}) {
          expect_every_row_count<Bf16>(c, input, /*with_bias=*/false, GemvKernel::kRows, split);
          expect_every_row_count<float>(c, input, /*with_bias=*/true, GemvKernel::kRows, split);
        }
      }
    }
  }
}

// Llama-3-8B's qkv (4096 -> 6144), gate_up (4096 -> 28672) and down (14336 -> 4096)
// projections, and a shape whose k is split over 4 warps on a 132-SM GPU.
TEST(GemvTest, LlamaEightBShapesMatchADoubleReference) {
  CELLM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(32);
  struct Shape {
    int64_t k, n;
    GemvInput input;
    std::vector<int64_t> row_counts;
  };
  for (const Shape& s :
       {Shape{4096, 6144, GemvInput::kPlain, {1, 8}}, Shape{4096, 28672, GemvInput::kPlain, {4}},
        Shape{14336, 4096, GemvInput::kSwiGLU, {1, 8}},
        Shape{1024, 9000, GemvInput::kPlain, {3}}}) {
    const GemvCase c(rng, s.k, s.n);
    for (const GemvKernel kernel : {GemvKernel::kTensorCores, GemvKernel::kRows}) {
      SCOPED_TRACE(kernel_name(kernel));
      for (const int64_t m : s.row_counts) {
        c.expect_output(c.run<Bf16>(m, s.input, false, nullptr, kernel), m, s.input, false);
        c.expect_output(c.run<float>(m, s.input, true, nullptr, kernel), m, s.input, true);
      }
    }
  }
}

TEST(GemvTest, TwoLaunchesGiveTheSameBits) {
  CELLM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(33);
  const GemvCase c(rng, 14336, 4096, /*with_reference=*/false);
  for (const GemvKernel kernel : {GemvKernel::kTensorCores, GemvKernel::kRows}) {
    for (const GemvInput input : {GemvInput::kPlain, GemvInput::kSwiGLU}) {
      const DeviceArray<float> first = c.run<float>(kRows, input, true, nullptr, kernel);
      const DeviceArray<float> second = c.run<float>(kRows, input, true, nullptr, kernel);
      EXPECT_TRUE(same_bits(first, second, kRows * c.n))
          << input_name(input) << kernel_name(kernel);
    }
  }
}

TEST(GemvTest, LaunchesRecordIntoACudaGraphAndReplayToTheSameBits) {
  CELLM_SKIP_WITHOUT_GPU();
  auto stream = Stream::create();
  ASSERT_TRUE(stream.ok()) << stream.status().to_string();
  std::mt19937 rng(34);
  const GemvCase c(rng, 1000, 300, /*with_reference=*/false);
  const DeviceArray<Bf16> eager_plain = c.run<Bf16>(5, GemvInput::kPlain, true);
  const DeviceArray<float> eager_swiglu = c.run<float>(8, GemvInput::kSwiGLU, false);
  DeviceArray<Bf16> y_plain(static_cast<size_t>(5 * c.n));
  DeviceArray<float> y_swiglu(static_cast<size_t>(8 * c.n));
  poison(y_plain);
  poison(y_swiglu);

  // Orders the uploads and poisoning (legacy stream) before work on the non-blocking stream.
  CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
  cudaError_t plain = cudaSuccess, swiglu = cudaSuccess;
  const GraphExec exec = capture_graph(stream->get(), [&] {
    plain = launch_gemv<Bf16>(c.dev_x.get(), 5, c.k, GemvInput::kPlain, c.dev_w.get(), c.n,
                              c.dev_bias.get(), y_plain.get(), stream->get());
    swiglu = launch_gemv<float>(c.dev_gate_up.get(), 8, c.k, GemvInput::kSwiGLU, c.dev_w.get(), c.n,
                                nullptr, y_swiglu.get(), stream->get());
  });
  CELLM_ASSERT_CUDA(plain);
  CELLM_ASSERT_CUDA(swiglu);
  ASSERT_NE(exec.get(), nullptr);
  for (int replay = 0; replay < 2; ++replay) {
    CELLM_ASSERT_CUDA(cudaGraphLaunch(exec.get(), stream->get()));
    CELLM_ASSERT_CUDA(cudaStreamSynchronize(stream->get()));
    EXPECT_TRUE(same_bits(y_plain, eager_plain, 5 * c.n)) << "replay " << replay;
    EXPECT_TRUE(same_bits(y_swiglu, eager_swiglu, 8 * c.n)) << "replay " << replay;
    poison(y_plain);
    poison(y_swiglu);
    CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
  }
}

TEST(GemvTest, BadArgumentsAreRefusedWithoutALaunch) {
  CELLM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(35);
  constexpr int64_t kK = 64, kN = 16;
  const auto x = device_array<Bf16>(random_values<Bf16>(rng, kRows * 2 * kK + 8));
  const auto w = device_array<Bf16>(random_values<Bf16>(rng, kN * kK + 8));
  DeviceArray<float> y(static_cast<size_t>((kRows + 1) * kN));
  poison(y);
  CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
  const Bf16* xp = x.get();
  const Bf16* wp = w.get();
  const auto call = [&](const Bf16* xs, int64_t m, int64_t k, GemvInput input, const Bf16* ws,
                        int64_t n, float* ys) {
    return launch_gemv<float>(xs, m, k, input, ws, n, nullptr, ys, nullptr);
  };
  const auto split = [&](GemvKernel kernel, int rows_split) {
    return launch_gemv<float>(xp, 1, kK, GemvInput::kPlain, wp, kN, nullptr, y.get(), nullptr,
                              kernel, rows_split);
  };
  const GemvInput plain = GemvInput::kPlain;
  struct Bad {
    const char* what;
    cudaError_t err;
  };
  for (const Bad& bad : {
           Bad{"m = 0", call(xp, 0, kK, plain, wp, kN, y.get())},
           Bad{"m = -1", call(xp, -1, kK, plain, wp, kN, y.get())},
           Bad{"m = 9", call(xp, kRows + 1, kK, plain, wp, kN, y.get())},
           Bad{"k = 0", call(xp, 1, 0, plain, wp, kN, y.get())},
           Bad{"k = -8", call(xp, 1, -8, plain, wp, kN, y.get())},
           Bad{"k = 12", call(xp, 1, 12, plain, wp, kN, y.get())},
           Bad{"k = 2^24", call(xp, 1, int64_t{1} << 24, plain, wp, kN, y.get())},
           Bad{"n = 0", call(xp, 1, kK, plain, wp, 0, y.get())},
           Bad{"n = -1", call(xp, 1, kK, plain, wp, -1, y.get())},
           Bad{"null x", call(nullptr, 1, kK, plain, wp, kN, y.get())},
           Bad{"null w", call(xp, 1, kK, plain, nullptr, kN, y.get())},
           Bad{"null y", call(xp, 1, kK, plain, wp, kN, nullptr)},
           Bad{"x off 16 bytes", call(xp + 1, 1, kK, plain, wp, kN, y.get())},
           Bad{"w off 16 bytes", call(xp, 1, kK, plain, wp + 4, kN, y.get())},
           Bad{"swiglu x off 16 bytes", call(xp + 4, 1, kK, GemvInput::kSwiGLU, wp, kN, y.get())},
           Bad{"unknown input", call(xp, 1, kK, static_cast<GemvInput>(7), wp, kN, y.get())},
           Bad{"rows split 3", split(GemvKernel::kRows, 3)},
           Bad{"rows split 16", split(GemvKernel::kRows, 16)},
           Bad{"rows split -1", split(GemvKernel::kRows, -1)},
           Bad{"split for the tensor-core kernel", split(GemvKernel::kTensorCores, 2)},
       }) {
    EXPECT_EQ(bad.err, cudaErrorInvalidValue) << bad.what;
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
  for (const float v : download_floats(y)) ASSERT_TRUE(std::isnan(v)) << "a refused call wrote y";
}

}  // namespace
}  // namespace cellm::cuda
