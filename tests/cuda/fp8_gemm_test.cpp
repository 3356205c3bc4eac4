// Tests of Fp8Gemm (fp8_gemm.h) against a double-precision CPU twin over the decoded
// e4m3 values: y[i, j] = x_scale[i] * w_scale[j] * sum_c x[i, c] w[j, c] (+ bias[j]),
// every element, on every path (Fp8Scaling::kAuto, which takes the outer-vector
// epilogue where cuBLASLt offers it, the forced kEpilogueKernel fallback, and cellm's
// skinny kernel where it serves, forced by kSkinny or chosen by tuning), bf16 and f32
// outputs, with and without bias: m in {9, 16, 64, 128, 256, 1000} on an awkward shape,
// m in {9, 16, 17, 33, 64} on shapes the skinny kernel serves (partial row tiles, k split
// over a cluster),
// Llama-3-8B's linear shapes (qkv 6144x4096, o 4096x4096, gate_up 28672x4096, down
// 4096x14336), awkward n (1000, 264, 24, 8; n % 8 != 0 is refused), and the product of
// launch_quantize_rows_e4m3's own output (plain and SwiGLU-fused activations, per-channel weights).
// Also: plans are cached per shape, replays of a captured CUDA graph give the eager bits, a first
// call inside capture is refused, bad arguments are refused before anything is enqueued (the
// argument checks also run without a GPU), nothing is written past y.
//
// Tolerance, per element: |got - want| <= rel |want| + 1e-3 |x_scale[i] w_scale[j]|
// sum_c |x[i, c] w[j, c]|. The products of two e4m3 values are exact; Hopper's FP8 tensor
// cores keep partial sums with about 14 significant bits between cuBLASLt's promotions to
// f32 (fast accumulation off), so a sum may be off by several 2^-14 of its terms'
// magnitudes: the m = 33, k = 48 products were off by up to 4.6 x 2^-14 on an H100 and
// 9.5 x 2^-14 on an H200 (cuBLASLt 13.0, both scaling paths alike); 1e-3 is 16 x 2^-14.
// The scales vary over 2^8 per row and per column, so a scale applied to the wrong index
// is far outside it. f32 outputs: rel 1e-5; bf16: rel 4e-3 (above bf16's unit roundoff
// 2^-8 for the final rounding).
#include "cuda/fp8_gemm.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda/kernels/quantize_e4m3.h"
#include "cuda/kernels/skinny_gemm.h"
#include "device_test_util.h"
#include "gpu_test.h"
#include "host_product.h"

namespace cellm::cuda {
namespace {

using testing::capture_graph;
using testing::DeviceArray;
using testing::HostProduct;
using testing::to_typed;
using Bf16 = __nv_bfloat16;

constexpr int64_t kGuard = 64;
// host_product.h's check allows 1e-6 of the error scale; the FP8 bound is 1e-3 of it.
constexpr double kScaleFactor = 1e-3 / 1e-6;

double e4m3_value(uint8_t code) {
  const int e = (code >> 3) & 0xf;
  const int m = code & 7;
  const double magnitude = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return (code & 0x80) != 0 ? -magnitude : magnitude;
}

// Random finite codes (no NaN), every one equally likely.
std::vector<uint8_t> random_codes(std::mt19937& rng, int64_t count) {
  std::vector<uint8_t> codes(static_cast<size_t>(count));
  for (uint8_t& c : codes) {
    do {
      c = static_cast<uint8_t>(rng() & 0xffu);
    } while ((c & 0x7f) == 0x7f);
  }
  return codes;
}

std::vector<float> decode(const std::vector<uint8_t>& codes) {
  std::vector<float> v(codes.size());
  for (size_t i = 0; i < codes.size(); ++i) v[i] = static_cast<float>(e4m3_value(codes[i]));
  return v;
}

// Scales with magnitudes in [2^-10, 2^-2); a fifth negative when `signed_too`.
std::vector<float> random_scales(std::mt19937& rng, int64_t count, bool signed_too) {
  std::uniform_real_distribution<float> exponent(-10.0f, -2.0f);
  std::vector<float> s(static_cast<size_t>(count));
  for (float& v : s) v = std::exp2(exponent(rng)) * (signed_too && rng() % 5 == 0 ? -1.0f : 1.0f);
  return s;
}

// One problem on the host and the device, with its reference (without bias).
struct Problem {
  int64_t m, n, k;
  std::vector<uint8_t> x8, w8;
  std::vector<float> x_scale, w_scale, bias;
  HostProduct want;  // scaled, error scale widened by kScaleFactor
  DeviceArray<uint8_t> dx8, dw8;
  DeviceArray<float> dxs, dws;
  DeviceArray<Bf16> dbias;

  Problem(std::mt19937& rng, int64_t m_, int64_t n_, int64_t k_)
      : Problem(m_, n_, k_, random_codes(rng, m_ * k_), random_codes(rng, n_ * k_),
                random_scales(rng, m_, false), random_scales(rng, n_, true),
                // Biases of the products' order of magnitude, so a missing one shows in
                // bf16 too.
                testing::random_values<Bf16>(rng, n_, 16.0f)) {}

  Problem(int64_t m_, int64_t n_, int64_t k_, std::vector<uint8_t> x8_, std::vector<uint8_t> w8_,
          std::vector<float> x_scale_, std::vector<float> w_scale_, std::vector<float> bias_)
      : m(m_),
        n(n_),
        k(k_),
        x8(std::move(x8_)),
        w8(std::move(w8_)),
        x_scale(std::move(x_scale_)),
        w_scale(std::move(w_scale_)),
        bias(std::move(bias_)),
        want(testing::host_product(decode(x8), decode(w8), m, k, n)),
        dx8(x8),
        dw8(w8),
        dxs(x_scale),
        dws(w_scale),
        dbias(to_typed<Bf16>(bias)) {
    for (int64_t e = 0; e < m * n; ++e) {
      const double s =
          double{x_scale[static_cast<size_t>(e / n)]} * double{w_scale[static_cast<size_t>(e % n)]};
      want.value[static_cast<size_t>(e)] *= s;
      want.scale[static_cast<size_t>(e)] *= std::fabs(s) * kScaleFactor;
    }
  }

  std::string name() const {
    return "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k);
  }
};

// Fp8Gemm::run on the problem into a poisoned y with a guard; every element checked.
template <typename TOut>
void check_run(Fp8Gemm& gemm, const Problem& p, bool with_bias, const std::string& what) {
  DeviceArray<TOut> y(static_cast<size_t>(p.m * p.n + kGuard));
  testing::poison(y);
  const Status st = gemm.run<TOut>(p.dx8.get(), p.dxs.get(), p.m, p.k, p.dw8.get(), p.dws.get(),
                                   p.n, with_bias ? p.dbias.get() : nullptr, y.get(), nullptr);
  const std::string full =
      what + " " + testing::type_name<TOut>() + " " + p.name() + (with_bias ? " +bias" : "");
  ASSERT_TRUE(st.ok()) << full << ": " << st.to_string();
  CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
  testing::expect_product_output(y.download(), p.want, with_bias ? p.bias : std::vector<float>{},
                                 p.m, p.n, std::is_same_v<TOut, float> ? 1e-5 : 4e-3, full);
}

// Every output type and bias choice through a kAuto, a forced-fallback and a
// forced-skinny Fp8Gemm.
void check_problem(const Problem& p) {
  Fp8Gemm auto_gemm = Fp8Gemm::create().value();
  Fp8Gemm fallback = Fp8Gemm::create(size_t{32} << 20, Fp8Scaling::kEpilogueKernel).value();
  Fp8Gemm skinny = Fp8Gemm::create(size_t{32} << 20, Fp8Scaling::kSkinny).value();
  for (const bool bias : {false, true}) {
    check_run<Bf16>(auto_gemm, p, bias, "auto");
    check_run<float>(auto_gemm, p, bias, "auto");
    check_run<Bf16>(fallback, p, bias, "fallback");
    check_run<float>(fallback, p, bias, "fallback");
    check_run<Bf16>(skinny, p, bias, "skinny");
    check_run<float>(skinny, p, bias, "skinny");
  }
  for (const Fp8Gemm::PlanInfo& info : fallback.describe_plans()) {
    EXPECT_EQ(info.kind, Fp8PlanKind::kEpilogueKernel) << p.name();
  }
  const bool serves = skinny_gemm_e4m3_supports(p.m, p.n, p.k, p.dx8.get(), p.dw8.get());
  for (const Fp8Gemm::PlanInfo& info : skinny.describe_plans()) {
    EXPECT_EQ(info.kind == Fp8PlanKind::kSkinny, serves) << p.name();
  }
  int outer = 0, in_epilogue = 0;
  for (const Fp8Gemm::PlanInfo& info : auto_gemm.describe_plans()) {
    outer += info.kind == Fp8PlanKind::kOuterVector;
    in_epilogue += info.bias_in_epilogue;
  }
  // What the installed cuBLASLt offered, for the log (either way is correct).
  std::cout << "[ fp8 plans ] " << p.name() << ": " << outer << " of " << auto_gemm.cached_plans()
            << " outer-vector, " << in_epilogue << " with the bias in cuBLASLt's epilogue\n";
  EXPECT_EQ(auto_gemm.cached_plans(), 4u);
  EXPECT_EQ(fallback.cached_plans(), 4u);
}

TEST(Fp8GemmTest, RowCountsOnAnAwkwardShape) {
  CELLM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(1);
  for (const int64_t m : {9, 16, 64, 128, 256, 1000}) {
    check_problem(Problem(rng, m, 264, 1040));
  }
}

// Shapes the skinny kernel serves (k a multiple of 256): each x-tile count (9-16, 17-32,
// 33-64 rows), partial row tiles (n = 264: 64- and 128-row blocks), one row tile over many
// stages (split over a cluster) and a bias-free narrow n.
TEST(Fp8GemmTest, SkinnyKernelShapes) {
  CELLM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(9);
  for (const int64_t m : {9, 16, 17, 33, 64}) {
    check_problem(Problem(rng, m, 264, 1280));
  }
  check_problem(Problem(rng, 24, 64, 14336));
  check_problem(Problem(rng, 64, 136, 4096));
  // The whole-SM ring (which tuning may choose) on its own, and the same bits from a
  // second launch.
  for (const int64_t m : {9, 40}) {
    const Problem p(rng, m, 520, 3072);
    DeviceArray<float> y(static_cast<size_t>(p.m * p.n + kGuard)), again(y.size());
    testing::poison(y);
    testing::poison(again);
    for (float* out : {y.get(), again.get()}) {
      ASSERT_EQ(launch_skinny_gemm_e4m3<float>(p.dx8.get(), p.dxs.get(), p.m, p.k, p.dw8.get(),
                                               p.dws.get(), p.n, p.dbias.get(), out,
                                               SkinnyRing::kWholeSm, nullptr),
                cudaSuccess);
    }
    CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
    testing::expect_product_output(y.download(), p.want, p.bias, p.m, p.n, 1e-5,
                                   "whole-SM ring " + p.name());
    EXPECT_TRUE(testing::same_bits(y, again, p.m * p.n + kGuard)) << p.name();
  }
}

// Tuning times the skinny kernel against cuBLASLt; whichever it keeps is remembered for
// the key, and an Fp8Gemm that meets the key later without tuning adopts it.
TEST(Fp8GemmTest, TunedChoiceIsAdoptedByEveryFp8Gemm) {
  CELLM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(10);
  const Problem p(rng, 32, 4096, 4096);
  Fp8Gemm tuned = Fp8Gemm::create().value();
  tuned.set_tuning(true);
  check_run<Bf16>(tuned, p, true, "tuned");
  tuned.set_tuning(false);
  Fp8Gemm later = Fp8Gemm::create().value();
  check_run<Bf16>(later, p, true, "adopted");
  ASSERT_EQ(tuned.describe_plans().size(), 1u);
  ASSERT_EQ(later.describe_plans().size(), 1u);
  const Fp8Gemm::PlanInfo chosen = tuned.describe_plans()[0];
  const Fp8Gemm::PlanInfo adopted = later.describe_plans()[0];
  EXPECT_EQ(chosen.kind == Fp8PlanKind::kSkinny, adopted.kind == Fp8PlanKind::kSkinny);
  if (chosen.kind == Fp8PlanKind::kSkinny) {
    EXPECT_EQ(chosen.skinny_ring, adopted.skinny_ring);
  }
  std::cout << "[ fp8 tuning ] " << p.name() << ": "
            << (chosen.kind == Fp8PlanKind::kSkinny ? "skinny" : "cuBLASLt") << "\n";
  // Not tuning and no choice remembered: the cuBLASLt plan.
  const Problem q(rng, 32, 4096, 4352);
  Fp8Gemm untuned = Fp8Gemm::create().value();
  check_run<Bf16>(untuned, q, false, "untuned");
  EXPECT_NE(untuned.describe_plans()[0].kind, Fp8PlanKind::kSkinny);
}

TEST(Fp8GemmTest, AwkwardN) {
  CELLM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(2);
  for (const int64_t n : {1000, 8, 24}) {
    check_problem(Problem(rng, 33, n, 48));
  }
  check_problem(Problem(rng, 1, 40, 16));
}

TEST(Fp8GemmTest, Llama8BShapes) {
  CELLM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(3);
  struct Shape {
    int64_t n, k;
  };
  for (const Shape s :
       {Shape{6144, 4096}, Shape{4096, 4096}, Shape{28672, 4096}, Shape{4096, 14336}}) {
    check_problem(Problem(rng, 16, s.n, s.k));
  }
  check_problem(Problem(rng, 256, 4096, 4096));
}

// The intended pipeline: bf16 activations and weights quantized on the device by
// launch_quantize_rows_e4m3 (the weights per output channel, the activations per row;
// the down projection's from a fused SwiGLU), then the product of what it produced.
TEST(Fp8GemmTest, ProductOfTheQuantizerOutput) {
  CELLM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(8);
  const auto quantize = [&](const std::vector<float>& values, int64_t rows, int64_t k,
                            GemvInput input, std::vector<uint8_t>& codes,
                            std::vector<float>& scales) {
    DeviceArray<Bf16> dv(to_typed<Bf16>(values));
    DeviceArray<uint8_t> d8(static_cast<size_t>(rows * k));
    DeviceArray<float> ds(static_cast<size_t>(rows));
    ASSERT_EQ(launch_quantize_rows_e4m3(dv.get(), rows, k, input, d8.get(), ds.get(), nullptr),
              cudaSuccess);
    CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
    codes = d8.download();
    scales = ds.download();
  };
  for (const GemvInput input : {GemvInput::kPlain, GemvInput::kSwiGLU}) {
    const int64_t m = 100, n = 520, k = 1024;
    const int64_t in_cols = input == GemvInput::kSwiGLU ? 2 * k : k;
    std::vector<uint8_t> x8, w8;
    std::vector<float> xs, ws;
    quantize(testing::random_values<Bf16>(rng, m * in_cols, 4.0f), m, k, input, x8, xs);
    quantize(testing::random_values<Bf16>(rng, n * k, 0.05f), n, k, GemvInput::kPlain, w8, ws);
    check_problem(Problem(m, n, k, std::move(x8), std::move(w8), std::move(xs), std::move(ws),
                          testing::random_values<Bf16>(rng, n, 1.0f)));
  }
}

TEST(Fp8GemmTest, CachedPlansAndGraphReplay) {
  CELLM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(4);
  const Problem p(rng, 64, 1000, 512);  // the skinny kernel serves it (k = 2 x 256)
  for (const Fp8Scaling scaling :
       {Fp8Scaling::kAuto, Fp8Scaling::kEpilogueKernel, Fp8Scaling::kSkinny}) {
    Fp8Gemm gemm = Fp8Gemm::create(size_t{32} << 20, scaling).value();
    Stream stream = Stream::create().value();
    DeviceArray<Bf16> eager(static_cast<size_t>(p.m * p.n)), graphed(eager.size());
    const auto enqueue = [&](Bf16* y) {
      return gemm.run<Bf16>(p.dx8.get(), p.dxs.get(), p.m, p.k, p.dw8.get(), p.dws.get(), p.n,
                            p.dbias.get(), y, stream.get());
    };
    // A first call inside capture is refused, and leaves the capture intact.
    cudaGraph_t refused_graph = testing::capture_raw_graph(stream.get(), [&] {
      const Status st = enqueue(graphed.get());
      EXPECT_EQ(st.code(), StatusCode::kInvalidState) << st.to_string();
    });
    if (refused_graph != nullptr) cudaGraphDestroy(refused_graph);
    EXPECT_EQ(gemm.cached_plans(), 0u);

    ASSERT_TRUE(enqueue(eager.get()).ok());
    ASSERT_TRUE(enqueue(eager.get()).ok());
    EXPECT_EQ(gemm.cached_plans(), 1u);
    testing::poison(graphed);
    // The poison goes through the legacy stream, which `stream` does not wait for.
    CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
    GraphExec graph = capture_graph(stream.get(), [&] {
      const Status st = enqueue(graphed.get());
      EXPECT_TRUE(st.ok()) << st.to_string();
    });
    ASSERT_NE(graph.get(), nullptr);
    EXPECT_EQ(gemm.cached_plans(), 1u);
    for (int replay = 0; replay < 3; ++replay) {
      CELLM_ASSERT_CUDA(cudaGraphLaunch(graph.get(), stream.get()));
      CELLM_ASSERT_CUDA(cudaStreamSynchronize(stream.get()));
      EXPECT_TRUE(testing::same_bits(eager, graphed, p.m * p.n)) << "replay " << replay;
    }
    testing::expect_product_output(eager.download(), p.want, p.bias, p.m, p.n, 4e-3, "graph eager");
  }
}

// Fake device addresses: the checks never dereference them.
const uint8_t* fake_bytes(uintptr_t address) {
  return reinterpret_cast<const uint8_t*>(address);
}
const float* fake_floats(uintptr_t address) {
  return reinterpret_cast<const float*>(address);
}

TEST(Fp8GemmArgumentsTest, ChecksNameTheViolation) {
  const uint8_t* x8 = fake_bytes(0x100000);
  const float* xs = fake_floats(0x200000);
  const uint8_t* w8 = fake_bytes(0x300000);
  const float* ws = fake_floats(0x400000);
  const auto* bias = reinterpret_cast<const Bf16*>(0x500000);
  void* y = reinterpret_cast<void*>(0x10000000);
  const auto check = [&](const uint8_t* px8, const float* pxs, int64_t m, int64_t k,
                         const uint8_t* pw8, const float* pws, int64_t n, const Bf16* pb,
                         const void* py, size_t out_bytes) {
    return check_fp8_gemm_call(px8, pxs, m, k, pw8, pws, n, pb, py, out_bytes);
  };
  EXPECT_TRUE(check(x8, xs, 4, 64, w8, ws, 32, bias, y, 2).ok());
  EXPECT_TRUE(check(x8, xs, 4, 64, w8, ws, 32, nullptr, y, 4).ok());
  EXPECT_TRUE(check(nullptr, nullptr, 0, 64, nullptr, nullptr, 32, nullptr, nullptr, 2).ok());
  const auto refused = [&](const Status& st, const char* needle) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.to_string().find(needle), std::string::npos) << st.to_string();
  };
  refused(check(x8, xs, -1, 64, w8, ws, 32, bias, y, 2), "bad shape");
  refused(check(x8, xs, 4, 0, w8, ws, 32, bias, y, 2), "bad shape");
  refused(check(x8, xs, 4, 64, w8, ws, 0, bias, y, 2), "bad shape");
  refused(check(x8, xs, 4, int64_t{1} << 31, w8, ws, 32, bias, y, 2), "bad shape");
  refused(check(x8, xs, 4, 40, w8, ws, 32, bias, y, 2), "multiple of 16");
  refused(check(x8, xs, 4, 64, w8, ws, 77, bias, y, 2), "n must be a multiple of 8");
  refused(check(x8, xs, 4, 64, w8, ws, 32, bias, y, 8), "bf16 or f32");
  refused(check(nullptr, xs, 4, 64, w8, ws, 32, bias, y, 2), "null x8");
  refused(check(x8, nullptr, 4, 64, w8, ws, 32, bias, y, 2), "null x_scale");
  refused(check(x8, xs, 4, 64, nullptr, ws, 32, bias, y, 2), "null w8");
  refused(check(x8, xs, 4, 64, w8, nullptr, 32, bias, y, 2), "null w_scale");
  refused(check(x8, xs, 4, 64, w8, ws, 32, bias, nullptr, 2), "null y");
  refused(check(x8 + 8, xs, 4, 64, w8, ws, 32, bias, y, 2), "x8 is not 16-byte aligned");
  refused(check(x8, xs, 4, 64, w8 + 4, ws, 32, bias, y, 2), "w8 is not 16-byte aligned");
  refused(check(x8, fake_floats(0x200002), 4, 64, w8, ws, 32, bias, y, 2), "misaligned");
  refused(check(x8, xs, 4, 64, w8, ws, 32, bias, fake_bytes(0x10000002), 4), "misaligned");
  // y over w8, over a scale, over the bias.
  refused(check(x8, xs, 4, 64, w8, ws, 32, bias, w8 + 16, 2), "overlaps");
  refused(check(x8, xs, 4, 64, w8, ws, 32, bias, ws, 4), "overlaps");
  refused(check(x8, xs, 4, 64, w8, ws, 32, bias, fake_bytes(0x500000 - 64), 4), "overlaps");
  // Adjacent, not overlapping: y ends where x8 begins.
  EXPECT_TRUE(check(x8, xs, 4, 64, w8, ws, 32, nullptr, fake_bytes(0x100000 - 4 * 32 * 2), 2).ok());
}

TEST(Fp8GemmTest, BadArgumentsEnqueueNothing) {
  CELLM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(6);
  const Problem p(rng, 4, 32, 64);
  Fp8Gemm gemm = Fp8Gemm::create().value();
  DeviceArray<float> y(static_cast<size_t>(p.m * p.n));
  testing::poison(y);
  const auto run = [&](const uint8_t* x8, int64_t m, int64_t k, int64_t n, float* py) {
    return gemm.run<float>(x8, p.dxs.get(), m, k, p.dw8.get(), p.dws.get(), n, nullptr, py,
                           nullptr);
  };
  EXPECT_EQ(run(p.dx8.get(), 4, 40, 32, y.get()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(run(p.dx8.get() + 1, 4, 64, 32, y.get()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(run(p.dx8.get(), 4, 64, 32, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(run(p.dx8.get(), 4, 64, 32, const_cast<float*>(p.dws.get())).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(run(p.dx8.get(), 0, 64, 32, y.get()).ok());
  CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_EQ(gemm.cached_plans(), 0u);
  for (float v : y.download()) ASSERT_TRUE(std::isnan(v)) << "a refused call wrote y";
}

}  // namespace
}  // namespace cellm::cuda
