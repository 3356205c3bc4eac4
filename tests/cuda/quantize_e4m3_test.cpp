// Tests of kernels/quantize_e4m3.h against CPU twins, every byte and every scale bit:
// launch_quantize_rows_e4m3 (kPlain on rows of wide dynamic range, zero rows, rows of
// exact ties at scale 1, and kSwiGLU, whose reference input is launch_swiglu's output:
// fused equals launch_swiglu then kPlain, bit for bit) and launch_scale_outer_e4m3 (host
// std::fma in f32, both output types, with and without bias, a padded leading dimension).
// launch_add_rmsnorm_e4m3 (rmsnorm.h) equals launch_add_rmsnorm then the kPlain
// quantization, bit for bit. Also: nothing is written past the outputs, capture in a CUDA graph
// replays to the same bits, bad arguments are refused without a launch. Without a GPU the twin's
// encoder is checked against the format's definition (every code round-trips, midpoints tie to
// even, saturation).
#include "cuda/kernels/quantize_e4m3.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda/kernels/rmsnorm.h"
#include "cuda/kernels/swiglu.h"
#include "device_test_util.h"
#include "gpu_test.h"

namespace cellm::cuda {
namespace {

using testing::capture_graph;
using testing::DeviceArray;
using testing::round_to;
using testing::to_f32;
using testing::to_typed;
using Bf16 = __nv_bfloat16;

// The value of an e4m3fn code (sign, 4 exponent bits with bias 7, 3 mantissa bits;
// exponent 0 is subnormal). Codes 0x7f/0xff are NaN.
double e4m3_value(uint8_t code) {
  const int e = (code >> 3) & 0xf;
  const int m = code & 7;
  const double magnitude = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return (code & 0x80) != 0 ? -magnitude : magnitude;
}

// The twin's f32 -> e4m3 conversion: the nearest finite e4m3 value, ties to the even
// code (even mantissa), magnitudes above 448 saturated to 448; NaN -> 0x7f.
uint8_t encode_e4m3(float q) {
  if (std::isnan(q)) return 0x7f;
  const uint8_t sign = std::signbit(q) ? 0x80 : 0x00;
  const double a = std::fabs(static_cast<double>(q));
  if (a >= 448.0) return sign | 0x7e;
  static const std::array<double, 0x7f> values = [] {
    std::array<double, 0x7f> v{};
    for (int c = 0; c < 0x7f; ++c) v[c] = e4m3_value(static_cast<uint8_t>(c));
    return v;
  }();
  uint8_t best = 0;
  for (uint8_t c = 1; c <= 0x7e; ++c) {
    const double d_best = std::fabs(a - values[best]);
    const double d = std::fabs(a - values[c]);
    if (d < d_best || (d == d_best && (c & 1) == 0)) best = c;
  }
  return sign | best;
}

// The twin of launch_quantize_rows_e4m3 over x' (f32 values of bf16 numbers).
void quantize_rows_host(const std::vector<float>& x, int64_t m, int64_t k,
                        std::vector<uint8_t>& codes, std::vector<float>& scale) {
  codes.assign(static_cast<size_t>(m * k), 0);
  scale.assign(static_cast<size_t>(m), 0.0f);
  for (int64_t i = 0; i < m; ++i) {
    float amax = 0.0f;
    for (int64_t c = 0; c < k; ++c) amax = std::fmax(amax, std::fabs(x[i * k + c]));
    const float s = amax == 0.0f ? 1.0f : amax / kE4m3Max;
    scale[i] = s;
    for (int64_t c = 0; c < k; ++c) codes[i * k + c] = encode_e4m3(x[i * k + c] / s);
  }
}

TEST(QuantizeE4m3TwinTest, EncoderFollowsTheFormat) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    const auto code = static_cast<uint8_t>(c);
    const float v = static_cast<float>(e4m3_value(code));
    // -0 encodes to 0x80, +0 to 0x00: every finite code round-trips.
    EXPECT_EQ(encode_e4m3(v), code) << c;
  }
  // Midpoints between neighbours go to the even code.
  for (int c = 0; c < 0x7e; ++c) {
    const double mid =
        (e4m3_value(static_cast<uint8_t>(c)) + e4m3_value(static_cast<uint8_t>(c + 1))) / 2;
    const uint8_t even = (c % 2 == 0) ? static_cast<uint8_t>(c) : static_cast<uint8_t>(c + 1);
    EXPECT_EQ(encode_e4m3(static_cast<float>(mid)), even) << c;
    EXPECT_EQ(encode_e4m3(static_cast<float>(-mid)), even | 0x80) << c;
  }
  EXPECT_EQ(encode_e4m3(449.0f), 0x7e);
  EXPECT_EQ(encode_e4m3(1e30f), 0x7e);
  EXPECT_EQ(encode_e4m3(-500.0f), 0xfe);
  EXPECT_EQ(encode_e4m3(std::ldexp(1.0f, -10)), 0x00);  // below half the least subnormal: tie to 0
  EXPECT_EQ(encode_e4m3(std::ldexp(1.5f, -10)), 0x01);  // above it
  EXPECT_EQ(encode_e4m3(std::ldexp(1.0f, -9)), 0x01);   // the least subnormal
}

// The twin's encoder against the CUDA headers' own host conversion (the same
// cvt.rn.satfinite semantics the kernel uses): random f32 values over the whole e4m3
// range and beyond, and every midpoint, either sign.
TEST(QuantizeE4m3TwinTest, EncoderMatchesTheCudaHostConversion) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> exponent(-14.0f, 10.0f);
  std::vector<float> values;
  for (int i = 0; i < 200000; ++i) {
    values.push_back(std::exp2(exponent(rng)) * ((rng() & 1) ? -1.0f : 1.0f));
  }
  for (int c = 0; c < 0x7e; ++c) {
    values.push_back(static_cast<float>(
        (e4m3_value(static_cast<uint8_t>(c)) + e4m3_value(static_cast<uint8_t>(c + 1))) / 2));
  }
  values.push_back(0.0f);
  values.push_back(-0.0f);
  values.push_back(448.0f);
  values.push_back(463.99f);
  values.push_back(1e38f);
  size_t bad = 0;
  for (const float v : values) {
    for (const float q : {v, -v}) {
      const auto want = static_cast<uint8_t>(__nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3));
      if (encode_e4m3(q) != want && ++bad <= 5) {
        ADD_FAILURE() << q << ": twin 0x" << std::hex << int{encode_e4m3(q)} << " cuda 0x"
                      << int{want} << std::dec;
      }
    }
  }
  EXPECT_EQ(bad, 0u);
}

// Rows of bf16 values: magnitudes 2^[-24, 8) (many far below the row's maximum, so the
// e4m3 subnormals and flushes to zero appear), a zero row, a row of one non-zero value.
std::vector<float> wide_rows(std::mt19937& rng, int64_t m, int64_t k) {
  std::uniform_real_distribution<float> exponent(-24.0f, 8.0f);
  std::vector<float> x(static_cast<size_t>(m * k));
  for (float& v : x) v = round_to<Bf16>(std::exp2(exponent(rng)) * ((rng() & 1) ? -1.0f : 1.0f));
  if (m > 1) std::fill(x.begin() + k, x.begin() + 2 * k, 0.0f);
  if (m > 2) {
    std::fill(x.begin() + 2 * k, x.begin() + 3 * k, 0.0f);
    x[static_cast<size_t>(2 * k + k / 3)] = -3.25f;
  }
  return x;
}

struct QuantOut {
  std::vector<uint8_t> codes;
  std::vector<float> scale;
};

// launch_quantize_rows_e4m3 on `input` (device), outputs with guards poisoned first.
QuantOut run_quantize(const DeviceArray<Bf16>& input, int64_t m, int64_t k, GemvInput kind) {
  constexpr int64_t kGuard = 64;
  DeviceArray<uint8_t> x8(static_cast<size_t>(m * k + kGuard));
  DeviceArray<float> scale(static_cast<size_t>(m + kGuard));
  x8.fill_bytes(0xAB);
  scale.fill_bytes(0xFF);
  EXPECT_EQ(launch_quantize_rows_e4m3(input.get(), m, k, kind, x8.get(), scale.get(), nullptr),
            cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  QuantOut out{x8.download(), scale.download()};
  for (int64_t g = 0; g < kGuard; ++g) {
    EXPECT_EQ(out.codes[static_cast<size_t>(m * k + g)], 0xAB) << "x8 written past its end";
    uint32_t bits;
    std::memcpy(&bits, &out.scale[static_cast<size_t>(m + g)], 4);
    EXPECT_EQ(bits, 0xFFFFFFFFu) << "scale written past its end";
  }
  out.codes.resize(static_cast<size_t>(m * k));
  out.scale.resize(static_cast<size_t>(m));
  return out;
}

void expect_same(const QuantOut& got, const std::vector<uint8_t>& codes,
                 const std::vector<float>& scale, const std::string& what) {
  ASSERT_EQ(got.codes.size(), codes.size());
  size_t bad = 0;
  for (size_t e = 0; e < codes.size(); ++e) {
    if (got.codes[e] != codes[e] && ++bad <= 5) {
      ADD_FAILURE() << what << " code [" << e << "]: got 0x" << std::hex << int{got.codes[e]}
                    << " want 0x" << int{codes[e]} << std::dec;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": codes differ";
  for (size_t i = 0; i < scale.size(); ++i) {
    EXPECT_EQ(std::memcmp(&got.scale[i], &scale[i], 4), 0)
        << what << " scale [" << i << "]: got " << got.scale[i] << " want " << scale[i];
  }
}

TEST(QuantizeE4m3Test, PlainRowsMatchTheTwin) {
  CELLM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(7);
  // A block a row, and clusters of 8 blocks a row (a few rows of 8,192 values or more:
  // 14336, 16400 whose slices do not divide the row); rows read twice (140000 and 20480:
  // more than a block holds).
  const std::pair<int64_t, int64_t> shapes[] = {{1, 16},     {1, 4096},  {1, 16400},  {1, 14336},
                                                {3, 48},     {3, 4096},  {9, 16},     {9, 48},
                                                {9, 14336},  {64, 4096}, {64, 4112},  {64, 14336},
                                                {300, 4096}, {300, 48},  {2, 140000}, {300, 20480}};
  for (const auto& [m, k] : shapes) {
    const std::vector<float> x = wide_rows(rng, m, k);
    DeviceArray<Bf16> dx(to_typed<Bf16>(x));
    std::vector<uint8_t> codes;
    std::vector<float> scale;
    quantize_rows_host(x, m, k, codes, scale);
    expect_same(run_quantize(dx, m, k, GemvInput::kPlain), codes, scale,
                "plain m=" + std::to_string(m) + " k=" + std::to_string(k));
  }
}

TEST(QuantizeE4m3Test, TiesAtUnitScaleGoToEven) {
  CELLM_SKIP_WITHOUT_GPU();
  // One row holding 448 (so the scale is exactly 1), every midpoint between neighbouring
  // codes of either sign, and every code's value.
  std::vector<float> x{448.0f};
  for (int c = 0; c < 0x7e; ++c) {
    const double mid =
        (e4m3_value(static_cast<uint8_t>(c)) + e4m3_value(static_cast<uint8_t>(c + 1))) / 2;
    x.push_back(static_cast<float>(mid));
    x.push_back(static_cast<float>(-mid));
  }
  for (int c = 0; c < 0x7f; ++c)
    x.push_back(static_cast<float>(e4m3_value(static_cast<uint8_t>(c))));
  while (x.size() % 16 != 0) x.push_back(0.0f);
  for (float v : x) ASSERT_EQ(round_to<Bf16>(v), v) << "not a bf16 value: " << v;
  const auto k = static_cast<int64_t>(x.size());
  DeviceArray<Bf16> dx(to_typed<Bf16>(x));
  std::vector<uint8_t> codes;
  std::vector<float> scale;
  quantize_rows_host(x, 1, k, codes, scale);
  ASSERT_EQ(scale[0], 1.0f);
  expect_same(run_quantize(dx, 1, k, GemvInput::kPlain), codes, scale, "ties");
}

TEST(QuantizeE4m3Test, SwigluInputEqualsSwigluThenPlain) {
  CELLM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(11);
  const std::pair<int64_t, int64_t> shapes[] = {{1, 16},     {1, 1024},   {1, 14336},
                                                {9, 16},     {9, 1024},   {9, 14336},
                                                {64, 14336}, {300, 1024}, {2, 140000}};
  for (const auto& [m, ff] : shapes) {
    // Gates over [-8, 8]: silu's curved part and its tails.
    const std::vector<float> gate_up = testing::random_values<Bf16>(rng, m * 2 * ff, 8.0f);
    DeviceArray<Bf16> dgu(to_typed<Bf16>(gate_up));
    DeviceArray<Bf16> act(static_cast<size_t>(m * ff));
    ASSERT_EQ(launch_swiglu<Bf16>(dgu.get(), m, ff, act.get(), nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> a = testing::download_floats(act);
    std::vector<uint8_t> codes;
    std::vector<float> scale;
    quantize_rows_host(a, m, ff, codes, scale);
    const std::string what = "m=" + std::to_string(m) + " ff=" + std::to_string(ff);
    expect_same(run_quantize(dgu, m, ff, GemvInput::kSwiGLU), codes, scale, "swiglu " + what);
    expect_same(run_quantize(act, m, ff, GemvInput::kPlain), codes, scale, "act " + what);
  }
}

TEST(QuantizeE4m3Test, GraphReplayGivesTheSameBits) {
  CELLM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(3);
  const int64_t m = 33, k = 4096;
  DeviceArray<Bf16> dx(to_typed<Bf16>(wide_rows(rng, m, k)));
  const QuantOut eager = run_quantize(dx, m, k, GemvInput::kPlain);
  Stream stream = Stream::create().value();
  DeviceArray<uint8_t> x8(static_cast<size_t>(m * k));
  DeviceArray<float> scale(static_cast<size_t>(m));
  x8.fill_bytes(0);
  scale.fill_bytes(0);
  // The fills go through the legacy stream, which `stream` does not wait for.
  CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
  GraphExec graph = capture_graph(stream.get(), [&] {
    EXPECT_EQ(launch_quantize_rows_e4m3(dx.get(), m, k, GemvInput::kPlain, x8.get(), scale.get(),
                                        stream.get()),
              cudaSuccess);
  });
  ASSERT_NE(graph.get(), nullptr);
  for (int replay = 0; replay < 2; ++replay) {
    CELLM_ASSERT_CUDA(cudaGraphLaunch(graph.get(), stream.get()));
    CELLM_ASSERT_CUDA(cudaStreamSynchronize(stream.get()));
    expect_same(QuantOut{x8.download(), scale.download()}, eager.codes, eager.scale, "replay");
  }
}

// launch_add_rmsnorm_e4m3 against its two parts run one after the other: the bf16 norm
// (launch_add_rmsnorm) and the row quantization of what it wrote; the residual, the row,
// every code and every scale bit equal, the codes also the host twin's. With and without
// a delta, a block's rows held in registers and rows wider than that (re-read), and a
// zero row (scale 1).
TEST(QuantizeE4m3Test, TheNormThatQuantizesEqualsTheNormThenTheQuantization) {
  CELLM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(13);
  const std::pair<int64_t, int64_t> shapes[] = {{1, 16},    {3, 4096},   {9, 576},
                                                {64, 4096}, {300, 2048}, {2, 20480}};
  for (const auto& [m, d] : shapes) {
    for (const bool with_delta : {false, true}) {
      const std::string what =
          "m=" + std::to_string(m) + " d=" + std::to_string(d) + (with_delta ? " with delta" : "");
      std::vector<float> residual = testing::random_values<float>(rng, m * d, 4.0f);
      std::fill(residual.begin(), residual.begin() + d, 0.0f);  // row 0: zero without delta
      const std::vector<float> delta = testing::random_values<Bf16>(rng, m * d, 2.0f);
      const std::vector<float> weight = testing::random_values<Bf16>(rng, d, 1.5f);
      DeviceArray<Bf16> dd(to_typed<Bf16>(delta)), dw(to_typed<Bf16>(weight));
      const Bf16* pd = with_delta ? dd.get() : nullptr;
      // The parts.
      DeviceArray<float> res_a(residual);
      DeviceArray<Bf16> out_a(static_cast<size_t>(m * d));
      ASSERT_EQ(
          launch_add_rmsnorm<Bf16>(res_a.get(), pd, dw.get(), m, d, 1e-5f, out_a.get(), nullptr),
          cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const QuantOut want = run_quantize(out_a, m, d, GemvInput::kPlain);
      // The fused kernel.
      DeviceArray<float> res_b(residual);
      DeviceArray<Bf16> out_b(static_cast<size_t>(m * d));
      DeviceArray<uint8_t> x8(static_cast<size_t>(m * d + 64));
      DeviceArray<float> scale(static_cast<size_t>(m + 16));
      x8.fill_bytes(0xAB);
      scale.fill_bytes(0xFF);
      ASSERT_EQ(launch_add_rmsnorm_e4m3(res_b.get(), pd, dw.get(), m, d, 1e-5f, out_b.get(),
                                        x8.get(), scale.get(), nullptr),
                cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      QuantOut got{x8.download(), scale.download()};
      for (int64_t g = 0; g < 64; ++g) {
        ASSERT_EQ(got.codes[static_cast<size_t>(m * d + g)], 0xAB) << what << ": x8 past its end";
      }
      got.codes.resize(static_cast<size_t>(m * d));
      got.scale.resize(static_cast<size_t>(m));
      expect_same(got, want.codes, want.scale, "fused " + what);
      const std::vector<float> ra = res_a.download(), rb = res_b.download();
      ASSERT_EQ(std::memcmp(ra.data(), rb.data(), ra.size() * 4), 0) << what << ": residual";
      const std::vector<float> oa = testing::download_floats(out_a);
      const std::vector<float> ob = testing::download_floats(out_b);
      ASSERT_EQ(std::memcmp(oa.data(), ob.data(), oa.size() * 4), 0) << what << ": row";
      std::vector<uint8_t> codes;
      std::vector<float> host_scale;
      quantize_rows_host(oa, m, d, codes, host_scale);
      expect_same(got, codes, host_scale, "twin " + what);
      if (!with_delta) {
        EXPECT_EQ(got.scale[0], 1.0f) << what << ": the zero row's scale";
      }
    }
  }
}

TEST(QuantizeE4m3Test, TheNormThatQuantizesRefusesWhatItCannotServe) {
  CELLM_SKIP_WITHOUT_GPU();
  DeviceArray<float> res(2 * 64 + 4);
  DeviceArray<Bf16> w(64 + 8), out(2 * 64 + 8);
  DeviceArray<uint8_t> x8(2 * 64 + 32);
  DeviceArray<float> scale(8);
  const auto refused = [&](float* pr, int64_t m, int64_t d, Bf16* po, uint8_t* p8, float* ps) {
    EXPECT_EQ(launch_add_rmsnorm_e4m3(pr, nullptr, w.get(), m, d, 1e-5f, po, p8, ps, nullptr),
              cudaErrorInvalidValue)
        << "m " << m << " d " << d;
  };
  refused(res.get(), 2, 24, out.get(), x8.get(), scale.get());      // d not a multiple of 16
  refused(res.get(), 2, 0, out.get(), x8.get(), scale.get());       // no columns
  refused(res.get(), -1, 64, out.get(), x8.get(), scale.get());     // negative rows
  refused(res.get(), 2, 64, out.get(), nullptr, scale.get());       // no codes
  refused(res.get(), 2, 64, out.get(), x8.get(), nullptr);          // no scales
  refused(res.get(), 2, 64, out.get(), x8.get() + 8, scale.get());  // codes misaligned
  refused(res.get() + 1, 2, 64, out.get(), x8.get(), scale.get());  // residual misaligned
  EXPECT_EQ(launch_add_rmsnorm_e4m3(res.get(), nullptr, w.get(), 0, 64, 1e-5f, out.get(), x8.get(),
                                    scale.get(), nullptr),
            cudaSuccess);
}

TEST(QuantizeE4m3Test, BadArgumentsAreRefusedWithoutALaunch) {
  CELLM_SKIP_WITHOUT_GPU();
  DeviceArray<Bf16> x(2 * 64 * 2 + 8);
  DeviceArray<uint8_t> x8(2 * 64 + 16);
  DeviceArray<float> scale(8);
  x8.fill_bytes(0xAB);
  const auto refused = [&](const Bf16* px, int64_t m, int64_t k, GemvInput in, uint8_t* p8,
                           float* ps) {
    EXPECT_EQ(launch_quantize_rows_e4m3(px, m, k, in, p8, ps, nullptr), cudaErrorInvalidValue)
        << "m=" << m << " k=" << k;
  };
  refused(x.get(), -1, 64, GemvInput::kPlain, x8.get(), scale.get());
  refused(x.get(), 2, 0, GemvInput::kPlain, x8.get(), scale.get());
  refused(x.get(), 2, 40, GemvInput::kPlain, x8.get(), scale.get());      // k % 16
  refused(x.get() + 1, 2, 64, GemvInput::kPlain, x8.get(), scale.get());  // x misaligned
  refused(x.get(), 2, 64, GemvInput::kPlain, x8.get() + 8, scale.get());  // x8 misaligned
  refused(x.get(), 2, 64, GemvInput::kPlain, x8.get(), nullptr);
  refused(nullptr, 2, 64, GemvInput::kPlain, x8.get(), scale.get());
  refused(x.get(), 2, 64, static_cast<GemvInput>(7), x8.get(), scale.get());
  CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
  for (uint8_t b : x8.download()) ASSERT_EQ(b, 0xAB) << "a refused call wrote x8";
  // m = 0 with valid pointers launches nothing and succeeds.
  EXPECT_EQ(
      launch_quantize_rows_e4m3(x.get(), 0, 64, GemvInput::kPlain, x8.get(), scale.get(), nullptr),
      cudaSuccess);
}

// The twin of launch_scale_outer_e4m3.
template <typename TOut>
std::vector<TOut> scale_outer_host(const std::vector<float>& acc, int64_t ld, int64_t m, int64_t n,
                                   const std::vector<float>& xs, const std::vector<float>& ws,
                                   const std::vector<float>& bias) {
  std::vector<float> y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const float s = xs[i] * ws[j];
      const float b = bias.empty() ? 0.0f : bias[j];
      y[i * n + j] = std::fma(acc[i * ld + j], s, b);
    }
  }
  return to_typed<TOut>(y);
}

template <typename TOut>
void check_scale_outer(int64_t m, int64_t n, int64_t ld, bool with_bias) {
  std::mt19937 rng(static_cast<unsigned>(m * 131 + n));
  const std::vector<float> acc = testing::random_values<float>(rng, m * ld, 1e4f);
  std::uniform_real_distribution<float> exponent(-12.0f, 0.0f);
  std::vector<float> xs(static_cast<size_t>(m)), ws(static_cast<size_t>(n));
  for (float& v : xs) v = std::exp2(exponent(rng));
  for (float& v : ws) v = std::exp2(exponent(rng)) * ((rng() % 5 == 0) ? -1.0f : 1.0f);
  const std::vector<float> bias =
      with_bias ? testing::random_values<Bf16>(rng, n) : std::vector<float>{};
  DeviceArray<float> dacc(acc), dxs(xs), dws(ws);
  DeviceArray<Bf16> dbias(with_bias ? to_typed<Bf16>(bias) : std::vector<Bf16>(1));
  constexpr int64_t kGuard = 32;
  DeviceArray<TOut> y(static_cast<size_t>(m * n + kGuard));
  testing::poison(y);
  ASSERT_EQ(launch_scale_outer_e4m3<TOut>(dacc.get(), ld, m, n, dxs.get(), dws.get(),
                                          with_bias ? dbias.get() : nullptr, y.get(), nullptr),
            cudaSuccess);
  CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
  std::vector<TOut> got = y.download();
  const std::vector<TOut> tail(got.begin() + m * n, got.end());
  got.resize(static_cast<size_t>(m * n));
  testing::expect_bitwise_equal(got, scale_outer_host<TOut>(acc, ld, m, n, xs, ws, bias),
                                std::string("scale_outer ") + testing::type_name<TOut>() +
                                    " m=" + std::to_string(m) + " n=" + std::to_string(n));
  for (const TOut& t : tail) ASSERT_TRUE(std::isnan(to_f32<TOut>(t))) << "written past y";
}

TEST(QuantizeE4m3Test, ScaleOuterMatchesTheTwin) {
  CELLM_SKIP_WITHOUT_GPU();
  for (const bool bias : {false, true}) {
    check_scale_outer<float>(9, 77, 80, bias);
    check_scale_outer<Bf16>(9, 77, 80, bias);
    check_scale_outer<float>(64, 1000, 1000, bias);
    check_scale_outer<Bf16>(130, 264, 264, bias);
  }
}

TEST(QuantizeE4m3Test, ScaleOuterRefusesBadArguments) {
  CELLM_SKIP_WITHOUT_GPU();
  DeviceArray<float> acc(64), xs(4), ws(16), y(64);
  EXPECT_EQ(launch_scale_outer_e4m3<float>(acc.get(), 8, 4, 16, xs.get(), ws.get(), nullptr,
                                           y.get(), nullptr),
            cudaErrorInvalidValue);  // ld < n
  EXPECT_EQ(launch_scale_outer_e4m3<float>(acc.get(), 16, 4, 16, nullptr, ws.get(), nullptr,
                                           y.get(), nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(launch_scale_outer_e4m3<float>(acc.get(), 16, -1, 16, xs.get(), ws.get(), nullptr,
                                           y.get(), nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(launch_scale_outer_e4m3<float>(acc.get(), 16, 4, 0, xs.get(), ws.get(), nullptr,
                                           y.get(), nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace cellm::cuda
