// Tests of launch_gemv_fp8 (kernels/gemv_fp8.h) against its CPU twin: a double-precision
// product of the same bf16 inputs with the e4m3 weights decoded on the host from the
// format's definition, times the per-channel scale, plus the bias; every element. Every
// row count 1-8 on awkward and Llama-3-8B shapes, both inputs, with and without bias, both
// output types, per-channel and per-tensor scales, weights drawn over every finite code
// (zeros, subnormals, ±448 among them). The kSwiGLU reference input is launch_swiglu's
// output (the contract: fused equals launch_swiglu then kPlain, bit for bit, which is
// checked too). Also: the device decode of all 256 codes against the host table, a row's
// bits do not depend on m, two launches give the same bits, nothing is written past y,
// capture in a CUDA graph, and bad arguments are refused without a launch. Without a GPU,
// GemvFp8EmulationTest runs the kernel's walk (decode, fragments, splits, tails) on the host
// over the PTX instruction models of mma_emulation.h.
//
// Tolerance, per element: |got - want| <= rel * |want| + 1e-6 * |scale[j]| * sum_c
// |x'[i,c] w[j,c]|. The decoded weights are bf16 values, so the products are exact in f32
// and the kernel sums them in f32 (about 2^-24 of the sum of their magnitudes); the
// fma with the scale and bias rounds once. f32 outputs: rel 1e-5; bf16 outputs: rel 4e-3,
// above bf16's unit roundoff 2^-8 for the single rounding to bf16.
#include "cuda/kernels/gemv_fp8.h"

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

#include "cpu/kernels/convert.h"
#include "cuda/device_memory.h"
#include "cuda/kernels/swiglu.h"
#include "device_test_util.h"
#include "gpu_test.h"
#include "host_product.h"
#include "mma_emulation.h"

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

const char* input_name(GemvInput input) {
  return input == GemvInput::kPlain ? "plain" : "swiglu";
}

// The value of an e4m3fn code from the format's definition (sign, 4 exponent bits with
// bias 7, 3 mantissa bits; exponent 0 is subnormal). The NaN codes give ±480, the value
// gemv_fp8.h documents for them (they are not weights).
double e4m3_value(uint8_t code) {
  const int e = (code >> 3) & 0xf;
  const int m = code & 7;
  const double magnitude = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return (code & 0x80) != 0 ? -magnitude : magnitude;
}

// The bf16 bits of e4m3_value(code): exact (3 mantissa bits fit bf16's 7, and the
// exponents 2^-9..2^8 are normal bf16), so f32 -> bf16 rounds nothing.
uint16_t e4m3_bf16_bits(uint8_t code) {
  const auto f = static_cast<float>(e4m3_value(code));
  const uint16_t bits = cpu::f32_to_bf16(f);
  CELLM_CHECK(static_cast<double>(cpu::bf16_to_f32(bits)) == e4m3_value(code));
  return bits;
}

// n random finite e4m3 codes: every code but the two NaNs, uniformly.
std::vector<uint8_t> random_codes(std::mt19937& rng, int64_t n) {
  std::vector<uint8_t> codes(static_cast<size_t>(n));
  for (uint8_t& c : codes) {
    do {
      c = static_cast<uint8_t>(rng() & 0xffu);
    } while (e4m3_is_nan(c));
  }
  return codes;
}

std::vector<float> decode_codes(const std::vector<uint8_t>& codes) {
  std::vector<float> w(codes.size());
  for (size_t i = 0; i < codes.size(); ++i) w[i] = static_cast<float>(e4m3_value(codes[i]));
  return w;
}

// The CPU twin: scale[j] * sum_c x[i, c] * w[j, c] in f64, and its error scale.
HostProduct host_scaled_product(const std::vector<float>& x, const std::vector<float>& w,
                                const std::vector<float>& scale, int64_t m, int64_t k, int64_t n) {
  HostProduct p = host_product(x, w, m, k, n);
  for (int64_t e = 0; e < m * n; ++e) {
    const double s = scale[static_cast<size_t>(e % n)];
    p.value[static_cast<size_t>(e)] *= s;
    p.scale[static_cast<size_t>(e)] *= std::fabs(s);
  }
  return p;
}

enum class Scale { kPerChannel, kPerTensor };

// One fp8 weight matrix with its scale and bias, and kRows rows of each input, on the host.
struct Fp8Inputs {
  int64_t k, n;
  std::vector<uint8_t> codes;
  std::vector<float> w, scale, bias, x, gate_up;

  Fp8Inputs(std::mt19937& rng, int64_t k_, int64_t n_, Scale scale_kind = Scale::kPerChannel,
            std::vector<uint8_t> fixed_codes = {})
      : k(k_),
        n(n_),
        codes(fixed_codes.empty() ? random_codes(rng, n * k) : std::move(fixed_codes)),
        w(decode_codes(codes)),
        scale(random_scales(rng, n, scale_kind)),
        bias(random_values<Bf16>(rng, n)),
        x(random_values<Bf16>(rng, kRows * k)),
        // Gates over [-4, 4]: silu's curved part, not just its linear tail.
        gate_up(random_values<Bf16>(rng, kRows * 2 * k, 4.0f)) {
    CELLM_CHECK(static_cast<int64_t>(codes.size()) == n * k);
  }

  // Per channel: magnitudes in [2^-10, 2^-2) (the range of real fp8 checkpoints' scales),
  // either sign for a few; per tensor: one such value everywhere.
  static std::vector<float> random_scales(std::mt19937& rng, int64_t n, Scale kind) {
    std::uniform_real_distribution<float> exponent(-10.0f, -2.0f);
    std::vector<float> s(static_cast<size_t>(n));
    for (float& v : s) v = std::exp2(exponent(rng)) * ((rng() % 8) == 0 ? -1.0f : 1.0f);
    if (kind == Scale::kPerTensor) s.assign(s.size(), s[0]);
    return s;
  }

  std::string name(int64_t m, GemvInput input, bool with_bias) const {
    return std::string(input_name(input)) + " m=" + std::to_string(m) + " k=" + std::to_string(k) +
           " n=" + std::to_string(n) + (with_bias ? " +bias" : "");
  }
};

// Fp8Inputs on the device too, and the reference products of all kRows rows (a launch of
// m rows is checked against the first m) for the inputs asked for. For kSwiGLU the input x'
// is launch_swiglu's output for the gate_up rows.
struct Fp8Case : Fp8Inputs {
  std::vector<float> act;
  DeviceArray<uint8_t> dev_w;
  DeviceArray<float> dev_scale;
  DeviceArray<Bf16> dev_bias, dev_x, dev_gate_up, dev_act;
  HostProduct want_plain, want_swiglu;

  Fp8Case(std::mt19937& rng, int64_t k_, int64_t n_, const std::vector<GemvInput>& references,
          Scale scale_kind = Scale::kPerChannel, std::vector<uint8_t> fixed_codes = {})
      : Fp8Inputs(rng, k_, n_, scale_kind, std::move(fixed_codes)),
        dev_w(codes),
        dev_scale(scale),
        dev_bias(device_array<Bf16>(bias)),
        dev_x(device_array<Bf16>(x)),
        dev_gate_up(device_array<Bf16>(gate_up)),
        dev_act(static_cast<size_t>(kRows * k)) {
    const cudaError_t err =
        launch_swiglu<Bf16>(dev_gate_up.get(), kRows, k, dev_act.get(), nullptr);
    CELLM_CHECK_MSG(err == cudaSuccess, cudaGetErrorString(err));
    act = download_floats(dev_act);
    for (const GemvInput input : references) {
      if (input == GemvInput::kPlain) want_plain = host_scaled_product(x, w, scale, kRows, k, n);
      if (input == GemvInput::kSwiGLU) {
        want_swiglu = host_scaled_product(act, w, scale, kRows, k, n);
      }
    }
  }

  // y [m, n] (+ kGuard) of launch_gemv_fp8 on this case's input, poisoned before the launch.
  template <typename TOut>
  DeviceArray<TOut> run(int64_t m, GemvInput input, bool with_bias,
                        cudaStream_t stream = nullptr) const {
    DeviceArray<TOut> y(static_cast<size_t>(m * n + kGuard));
    poison(y);
    const Bf16* in = input == GemvInput::kPlain ? dev_x.get() : dev_gate_up.get();
    const cudaError_t err =
        launch_gemv_fp8<TOut>(in, m, k, input, dev_w.get(), dev_scale.get(), n,
                              with_bias ? dev_bias.get() : nullptr, y.get(), stream);
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
void expect_every_row_count(const Fp8Case& c, GemvInput input, bool with_bias) {
  const DeviceArray<TOut> all_rows = c.run<TOut>(kRows, input, with_bias);
  for (int64_t m = kRows; m >= 1; --m) {
    SCOPED_TRACE(std::string(type_name<TOut>()) + " out " + c.name(m, input, with_bias));
    const DeviceArray<TOut> y = c.run<TOut>(m, input, with_bias);
    c.expect_output(y, m, input, with_bias);
    EXPECT_TRUE(same_bits(y, all_rows, m * c.n)) << "rows differ from the m = 8 launch's";
    if (input == GemvInput::kSwiGLU) {
      DeviceArray<TOut> unfused(static_cast<size_t>(m * c.n));
      CELLM_ASSERT_CUDA(launch_gemv_fp8<TOut>(
          c.dev_act.get(), m, c.k, GemvInput::kPlain, c.dev_w.get(), c.dev_scale.get(), c.n,
          with_bias ? c.dev_bias.get() : nullptr, unfused.get(), nullptr));
      EXPECT_TRUE(same_bits(y, unfused, m * c.n)) << "fused differs from swiglu then plain";
    }
  }
}

void expect_case(const Fp8Case& c) {
  for (const GemvInput input : {GemvInput::kPlain, GemvInput::kSwiGLU}) {
    for (const bool with_bias : {false, true}) {
      expect_every_row_count<Bf16>(c, input, with_bias);
      expect_every_row_count<float>(c, input, with_bias);
    }
  }
}

const std::vector<GemvInput> kBothInputs = {GemvInput::kPlain, GemvInput::kSwiGLU};

TEST(GemvFp8Test, DecodeOfEveryCodeMatchesTheE4m3Definition) {
  CELLM_SKIP_WITHOUT_GPU();
  std::vector<uint8_t> codes(256);
  for (int c = 0; c < 256; ++c) codes[static_cast<size_t>(c)] = static_cast<uint8_t>(c);
  const DeviceArray<uint8_t> dev_codes(codes);
  DeviceArray<Bf16> out(256);
  poison(out);
  CELLM_ASSERT_CUDA(launch_decode_e4m3(dev_codes.get(), 256, out.get(), nullptr));
  CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
  const std::vector<Bf16> got = out.download();
  for (int c = 0; c < 256; ++c) {
    const uint16_t got_bits = __nv_bfloat16_raw(got[static_cast<size_t>(c)]).x;
    const uint16_t want_bits = e4m3_bf16_bits(static_cast<uint8_t>(c));
    EXPECT_EQ(got_bits, want_bits) << "code 0x" << std::hex << c << ": want " << std::dec
                                   << e4m3_value(static_cast<uint8_t>(c));
  }
  // The table's anchors: the largest finite value, the smallest subnormal, both zeros.
  EXPECT_EQ(e4m3_value(0x7e), 448.0);
  EXPECT_EQ(e4m3_value(0xfe), -448.0);
  EXPECT_EQ(e4m3_value(0x01), std::ldexp(1.0, -9));
  EXPECT_EQ(e4m3_value(0x08), std::ldexp(1.0, -6));
  EXPECT_EQ(e4m3_value(0x38), 1.0);
  EXPECT_EQ(e4m3_bf16_bits(0x00), 0x0000);
  EXPECT_EQ(e4m3_bf16_bits(0x80), 0x8000);
}

// k: one 16-column load; a partial warp step; a step and a quarter; several split
// iterations with a partial last one; the 8B's o and down widths; a long row. n: one row,
// a partial 16-row tile, several tiles, a partial last block.
TEST(GemvFp8Test, EveryRowCountMatchesADoubleReferenceOnAwkwardShapes) {
  CELLM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(41);
  for (const int64_t k : {16, 48, 80, 1008, 4096, 14336}) {
    for (const int64_t n : {1, 3, 37, 4097}) {
      const Fp8Case c(rng, k, n, kBothInputs);
      expect_case(c);
    }
  }
}

TEST(GemvFp8Test, LongRowsAndAPerTensorScaleMatchADoubleReference) {
  CELLM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(42);
  const Fp8Case long_rows(rng, 65536, 37, kBothInputs);
  expect_case(long_rows);
  const Fp8Case per_tensor(rng, 1024, 300, kBothInputs, Scale::kPerTensor);
  expect_case(per_tensor);
}

// Weights only at the ends of the range: ±448, the subnormals 2^-9..7·2^-9, and zeros of
// both signs, in a pattern that puts each kind in every lane's words.
TEST(GemvFp8Test, ExtremeWeightsMatchADoubleReference) {
  CELLM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(43);
  const std::vector<uint8_t> kinds = {0x7e, 0xfe, 0x01, 0x81, 0x07, 0x87, 0x04,
                                      0x00, 0x80, 0x7e, 0x03, 0x85, 0x06, 0xfe};
  constexpr int64_t kK = 2048, kN = 53;
  std::vector<uint8_t> codes(static_cast<size_t>(kK * kN));
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = kinds[(i * 7 + i / kK) % kinds.size()];
  const Fp8Case c(rng, kK, kN, kBothInputs, Scale::kPerChannel, codes);
  expect_case(c);
  // Only subnormals: the sum's every term comes from an e4m3 subnormal weight.
  std::vector<uint8_t> subnormals(static_cast<size_t>(kK * kN));
  for (size_t i = 0; i < subnormals.size(); ++i) {
    subnormals[i] = static_cast<uint8_t>(1 + (i % 7) + ((i / 3) % 2) * 0x80);
  }
  const Fp8Case s(rng, kK, kN, {GemvInput::kPlain}, Scale::kPerTensor, subnormals);
  expect_every_row_count<float>(s, GemvInput::kPlain, true);
}

// Llama-3-8B's qkv (4096 -> 6144), o (4096 -> 4096), gate_up (4096 -> 28672) and down
// (14336 -> 4096, the fused SwiGLU input) projections.
TEST(GemvFp8Test, LlamaEightBShapesMatchADoubleReference) {
  CELLM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(44);
  struct Shape {
    int64_t k, n;
    GemvInput input;
    std::vector<int64_t> row_counts;
  };
  for (const Shape& s :
       {Shape{4096, 6144, GemvInput::kPlain, {1, 8}}, Shape{4096, 4096, GemvInput::kPlain, {1, 4}},
        Shape{4096, 28672, GemvInput::kPlain, {4}},
        Shape{14336, 4096, GemvInput::kSwiGLU, {1, 8}}}) {
    const Fp8Case c(rng, s.k, s.n, {s.input});
    for (const int64_t m : s.row_counts) {
      c.expect_output(c.run<Bf16>(m, s.input, false), m, s.input, false);
      c.expect_output(c.run<float>(m, s.input, true), m, s.input, true);
    }
  }
}

TEST(GemvFp8Test, TwoLaunchesGiveTheSameBits) {
  CELLM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(45);
  const Fp8Case c(rng, 14336, 4096, {});
  for (const GemvInput input : kBothInputs) {
    const DeviceArray<float> first = c.run<float>(kRows, input, true);
    const DeviceArray<float> second = c.run<float>(kRows, input, true);
    EXPECT_TRUE(same_bits(first, second, kRows * c.n)) << input_name(input);
    // A row is the same whatever rows are around it.
    const DeviceArray<float> one = c.run<float>(1, input, true);
    EXPECT_TRUE(same_bits(one, first, c.n)) << input_name(input) << ": row 0 at m = 1";
  }
}

TEST(GemvFp8Test, LaunchesRecordIntoACudaGraphAndReplayToTheSameBits) {
  CELLM_SKIP_WITHOUT_GPU();
  auto stream = Stream::create();
  ASSERT_TRUE(stream.ok()) << stream.status().to_string();
  std::mt19937 rng(46);
  const Fp8Case c(rng, 1024, 300, {});
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
    plain = launch_gemv_fp8<Bf16>(c.dev_x.get(), 5, c.k, GemvInput::kPlain, c.dev_w.get(),
                                  c.dev_scale.get(), c.n, c.dev_bias.get(), y_plain.get(),
                                  stream->get());
    swiglu = launch_gemv_fp8<float>(c.dev_gate_up.get(), 8, c.k, GemvInput::kSwiGLU, c.dev_w.get(),
                                    c.dev_scale.get(), c.n, nullptr, y_swiglu.get(), stream->get());
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

TEST(GemvFp8Test, BadArgumentsAreRefusedWithoutALaunch) {
  CELLM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(47);
  constexpr int64_t kK = 64, kN = 16;
  const auto x = device_array<Bf16>(random_values<Bf16>(rng, kRows * 2 * kK + 16));
  const DeviceArray<uint8_t> w(random_codes(rng, kN * kK + 32));
  const DeviceArray<float> scale(std::vector<float>(kN, 1.0f));
  DeviceArray<float> y(static_cast<size_t>((kRows + 1) * kN));
  poison(y);
  CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
  const Bf16* xp = x.get();
  const uint8_t* wp = w.get();
  const float* sp = scale.get();
  const auto call = [&](const Bf16* xs, int64_t m, int64_t k, GemvInput input, const uint8_t* ws,
                        const float* ss, int64_t n, float* ys) {
    return launch_gemv_fp8<float>(xs, m, k, input, ws, ss, n, nullptr, ys, nullptr);
  };
  const GemvInput plain = GemvInput::kPlain;
  struct Bad {
    const char* what;
    cudaError_t err;
  };
  for (const Bad& bad : {
           Bad{"m = 0", call(xp, 0, kK, plain, wp, sp, kN, y.get())},
           Bad{"m = -1", call(xp, -1, kK, plain, wp, sp, kN, y.get())},
           Bad{"m = 9", call(xp, kRows + 1, kK, plain, wp, sp, kN, y.get())},
           Bad{"k = 0", call(xp, 1, 0, plain, wp, sp, kN, y.get())},
           Bad{"k = -16", call(xp, 1, -16, plain, wp, sp, kN, y.get())},
           Bad{"k = 8", call(xp, 1, 8, plain, wp, sp, kN, y.get())},
           Bad{"k = 40", call(xp, 1, 40, plain, wp, sp, kN, y.get())},
           Bad{"k = 2^24", call(xp, 1, int64_t{1} << 24, plain, wp, sp, kN, y.get())},
           Bad{"n = 0", call(xp, 1, kK, plain, wp, sp, 0, y.get())},
           Bad{"n = -1", call(xp, 1, kK, plain, wp, sp, -1, y.get())},
           Bad{"null x", call(nullptr, 1, kK, plain, wp, sp, kN, y.get())},
           Bad{"null w", call(xp, 1, kK, plain, nullptr, sp, kN, y.get())},
           Bad{"null scale", call(xp, 1, kK, plain, wp, nullptr, kN, y.get())},
           Bad{"null y", call(xp, 1, kK, plain, wp, sp, kN, nullptr)},
           Bad{"x off 16 bytes by 2", call(xp + 1, 1, kK, plain, wp, sp, kN, y.get())},
           Bad{"x off 16 bytes by 8", call(xp + 4, 1, kK, plain, wp, sp, kN, y.get())},
           Bad{"w off 16 bytes by 1", call(xp, 1, kK, plain, wp + 1, sp, kN, y.get())},
           Bad{"w off 16 bytes by 8", call(xp, 1, kK, plain, wp + 8, sp, kN, y.get())},
           Bad{"swiglu x off 16 bytes",
               call(xp + 4, 1, kK, GemvInput::kSwiGLU, wp, sp, kN, y.get())},
           Bad{"unknown input", call(xp, 1, kK, static_cast<GemvInput>(7), wp, sp, kN, y.get())},
       }) {
    EXPECT_EQ(bad.err, cudaErrorInvalidValue) << bad.what;
  }
  DeviceArray<Bf16> decoded(16);
  for (const Bad& bad : {
           Bad{"decode count 0", launch_decode_e4m3(wp, 0, decoded.get(), nullptr)},
           Bad{"decode count 6", launch_decode_e4m3(wp, 6, decoded.get(), nullptr)},
           Bad{"decode codes off 4 bytes", launch_decode_e4m3(wp + 2, 8, decoded.get(), nullptr)},
           Bad{"decode out off 8 bytes", launch_decode_e4m3(wp, 8, decoded.get() + 1, nullptr)},
           Bad{"decode null codes", launch_decode_e4m3(nullptr, 8, decoded.get(), nullptr)},
           Bad{"decode null out", launch_decode_e4m3(wp, 8, nullptr, nullptr)},
       }) {
    EXPECT_EQ(bad.err, cudaErrorInvalidValue) << bad.what;
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
  for (const float v : download_floats(y)) ASSERT_TRUE(std::isnan(v)) << "a refused call wrote y";
}

// The kernel's walk on the host (no GPU needed): gemv_fp8.cu's index arithmetic transcribed
// lane by lane over the PTX models of mma_emulation.h (the decode as prmt, shift, mask and
// the bf16 multiply by 2^120; mma.m16n8k16 with its fragment layout), under every split of
// k, at both lane widths, for both inputs (the kSwiGLU staging with its padded rows), against the
// CPU twin. It checks the fragments, the tails of k and n and the split's order where no GPU runs;
// the constants below must follow gemv_fp8.cu.
namespace emulation {

constexpr int kTileRows = 16, kIterCols = 256, kMaxSplitK = 8;
constexpr int kStageCols = kMaxSplitK * kIterCols, kStageStride = kStageCols + 8;

uint32_t prmt(uint32_t a, uint32_t selector) {  // prmt.b32 d, a, 0, selector
  uint32_t d = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t nibble = (selector >> (4 * i)) & 0xfu;
    const uint32_t index = nibble & 7u;
    uint32_t byte = index < 4 ? (a >> (8 * index)) & 0xffu : 0u;
    if ((nibble & 8u) != 0) byte = (byte & 0x80u) != 0 ? 0xffu : 0u;
    d |= byte << (8 * i);
  }
  return d;
}

uint32_t decode(uint32_t w, uint32_t selector) {
  const uint32_t bits = (prmt(w, selector) << 4) & 0x87f087f0u;
  const auto scaled = [](uint16_t h) {  // fma.rn.bf16 h * 2^120 + -0: exact
    return testing::to_bf16(testing::from_bf16(h) * std::ldexp(1.0f, 120) + -0.0f);
  };
  return uint32_t{scaled(static_cast<uint16_t>(bits & 0xffffu))} |
         uint32_t{scaled(static_cast<uint16_t>(bits >> 16))} << 16;
}
uint32_t decode_lo(uint32_t w) {
  return decode(w, 0x9180u);
}
uint32_t decode_hi(uint32_t w) {
  return decode(w, 0xb3a2u);
}

uint32_t word(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// y [m, n] (f32 outputs, no bias) of the kernel at this split and lane width (the bytes of a
// weight row a lane reads a step: the kernel's kLaneBytes, 32 for one row of x and 16 for
// more) on x' = xs [kRows, k] (bf16-exact floats; staged in shared memory when swiglu, else
// read from x).
std::vector<float> run(const Fp8Inputs& c, const std::vector<float>& xs, int m, int split_k,
                       bool swiglu, int lane_bytes) {
  const int k = static_cast<int>(c.k);
  const int64_t n = c.n;
  const int subs = lane_bytes / 16, step_cols = 4 * lane_bytes, unroll = kIterCols / step_cols;
  const int per_iter = split_k * unroll;
  const int iterations = (k + per_iter * step_cols - 1) / (per_iter * step_cols);
  std::vector<float> y(static_cast<size_t>(m * n), std::nanf(""));
  // Staged rows >= m are never written: NaN there reaches y if a lane reads them.
  std::vector<uint16_t> stage(static_cast<size_t>(kGemvMaxRows * kStageStride), 0x7fc0);
  for (int64_t tile = 0; tile * kTileRows < n; ++tile) {
    std::vector<testing::Acc4> partial(static_cast<size_t>(split_k));
    for (int kw = 0; kw < split_k; ++kw) {
      testing::Acc4& acc = partial[static_cast<size_t>(kw)];
      for (auto& a : acc) a = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int it = 0; it < iterations; ++it) {
        if (swiglu) {  // stage_swiglu of this iteration's columns
          const int first = it * per_iter * step_cols;
          for (int i = 0; i < m; ++i) {
            for (int col = 0; col < per_iter * step_cols; ++col) {
              const bool in = first + col < k;
              stage[static_cast<size_t>(i * kStageStride + col)] =
                  in ? testing::to_bf16(xs[static_cast<size_t>(i * k + first + col)]) : 0;
            }
          }
        }
        for (int u = 0; u < unroll; ++u) {
          const int col = (it * per_iter + u * split_k + kw) * step_cols;
          for (int sub = 0; sub < subs; ++sub) {  // 16 columns a lane: four MMAs
            testing::Frag4 a[4];
            testing::Lanes<uint32_t> b[8];
            for (int lane = 0; lane < 32; ++lane) {
              const int g = lane / 4, q = lane % 4;
              const int64_t row_lo = std::min(tile * kTileRows + g, n - 1);
              const int64_t row_hi = std::min(tile * kTileRows + g + 8, n - 1);
              const int first = col + lane_bytes * q + 16 * sub;  // the lane's first column
              const bool in_k = first < k;
              uint32_t lo[4] = {}, hi[4] = {}, xw[8] = {};
              for (int t = 0; t < 4 && in_k; ++t) {
                lo[t] = word(&c.codes[static_cast<size_t>(row_lo * k + first + 4 * t)]);
                hi[t] = word(&c.codes[static_cast<size_t>(row_hi * k + first + 4 * t)]);
              }
              if (g < m && in_k) {
                for (int t = 0; t < 8; ++t) {
                  if (swiglu) {
                    const int s = g * kStageStride + kw * step_cols + lane_bytes * q +
                                  u * split_k * step_cols + 16 * sub + 2 * t;
                    xw[t] = uint32_t{stage[static_cast<size_t>(s)]} |
                            uint32_t{stage[static_cast<size_t>(s + 1)]} << 16;
                  } else {
                    const size_t e = static_cast<size_t>(g * k + first + 2 * t);
                    xw[t] = testing::pack(xs[e], xs[e + 1]);
                  }
                }
              }
              for (int t = 0; t < 4; ++t) {
                a[t][lane] = {decode_lo(lo[t]), decode_lo(hi[t]), decode_hi(lo[t]),
                              decode_hi(hi[t])};
              }
              for (int t = 0; t < 8; ++t) b[t][lane] = xw[t];
            }
            for (int t = 0; t < 4; ++t) testing::mma(acc, a[t], b[2 * t], b[2 * t + 1]);
          }
        }
      }
    }
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, q = lane % 4;
      float sum[4];
      for (int r = 0; r < 4; ++r) {
        sum[r] = split_k > 1 ? 0.0f : partial[0][lane][r];
        for (int j = 0; split_k > 1 && j < split_k; ++j) {
          sum[r] += partial[static_cast<size_t>(j)][lane][r];
        }
      }
      const auto store = [&](int i, int64_t row, float v) {
        if (i >= m || row >= n) return;
        y[static_cast<size_t>(i * n + row)] = std::fma(v, c.scale[static_cast<size_t>(row)], 0.0f);
      };
      store(2 * q, tile * kTileRows + g, sum[0]);
      store(2 * q + 1, tile * kTileRows + g, sum[1]);
      store(2 * q, tile * kTileRows + g + 8, sum[2]);
      store(2 * q + 1, tile * kTileRows + g + 8, sum[3]);
    }
  }
  return y;
}

}  // namespace emulation

TEST(GemvFp8EmulationTest, TheDecodeOfEveryCodeIsExact) {
  for (uint32_t lo = 0; lo < 256; ++lo) {
    for (const uint32_t hi : {0x00u, 0x01u, 0x7eu, 0x80u, 0x87u, 0xfeu, lo ^ 0x55u}) {
      const uint32_t w = lo | hi << 8 | hi << 16 | lo << 24;
      const uint32_t pair_lo = emulation::decode_lo(w), pair_hi = emulation::decode_hi(w);
      const auto b = [](uint32_t code) { return e4m3_bf16_bits(static_cast<uint8_t>(code)); };
      EXPECT_EQ(pair_lo & 0xffffu, b(lo)) << "code " << lo;
      EXPECT_EQ(pair_lo >> 16, b(hi)) << "code " << hi;
      EXPECT_EQ(pair_hi & 0xffffu, b(hi)) << "code " << hi;
      EXPECT_EQ(pair_hi >> 16, b(lo)) << "code " << lo;
    }
  }
}

TEST(GemvFp8EmulationTest, TheKernelsWalkMatchesADoubleReferenceAtEverySplit) {
  std::mt19937 rng(48);
  for (const int64_t k : {16, 48, 80, 1008, 2112}) {
    for (const int64_t n : {1, 19, 37}) {
      const Fp8Inputs c(rng, k, n);
      // x' for kSwiGLU: any bf16 rows serve the walk; the host's silu of gate and up.
      std::vector<float> act(static_cast<size_t>(kRows * k));
      for (int64_t i = 0; i < kRows; ++i) {
        for (int64_t j = 0; j < k; ++j) {
          const float g = c.gate_up[static_cast<size_t>(i * 2 * k + j)];
          const float up = c.gate_up[static_cast<size_t>(i * 2 * k + k + j)];
          act[static_cast<size_t>(i * k + j)] =
              testing::round_to<Bf16>(g / (1.0f + std::exp(-g)) * up);
        }
      }
      const HostProduct want_plain = host_scaled_product(c.x, c.w, c.scale, kRows, k, n);
      const HostProduct want_swiglu = host_scaled_product(act, c.w, c.scale, kRows, k, n);
      for (int split = 1; split <= emulation::kMaxSplitK; split *= 2) {
        for (const bool swiglu : {false, true}) {
          for (const int m : {1, 3, 8}) {
            for (const int lane_bytes : {16, 32}) {
              const std::vector<float> y =
                  emulation::run(c, swiglu ? act : c.x, m, split, swiglu, lane_bytes);
              testing::expect_product_output(
                  y, swiglu ? want_swiglu : want_plain, {}, m, n, 1e-5,
                  c.name(m, swiglu ? GemvInput::kSwiGLU : GemvInput::kPlain, false) + " split " +
                      std::to_string(split) + ", " + std::to_string(lane_bytes) + " bytes a lane");
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace cellm::cuda
