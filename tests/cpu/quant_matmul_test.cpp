// The quantized matmul (cpu/quant/quant_matmul.h): each vector path against its
// scalar twin on every block type, over awkward shapes (weight rows not a multiple
// of the tile, 1..17 activation rows); the scalar twin against an f64 dot of the
// dequantized weights and activations; and the whole against an f32 matmul within
// the bound the activations' 8-bit rounding allows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cpu/quant/quant_kernels.h"
#include "cpu/quant/quant_matmul.h"
#include "kernel_test_util.h"
#include "model/half.h"

namespace cellm::cpu::quant {
namespace {

using cpu::testing::all_close;

constexpr QuantType kBlockTypes[] = {QuantType::kQ8_0, QuantType::kQ4_0, QuantType::kQ4_1,
                                     QuantType::kQ5_0, QuantType::kQ5_1, QuantType::kQ4_K,
                                     QuantType::kQ5_K, QuantType::kQ6_K};

struct Shape {
  int64_t m, rows, cols;
};

bool is_k(QuantType t) {
  return type_info(t).block_weights == kBlockK;
}

// Rows [0, rows / 2) quantized from normal weights; the rest random bytes with
// every scale field set to a small fp16 value, so all quant and scale bits occur.
std::vector<uint8_t> random_weights(std::mt19937& rng, QuantType t, int64_t rows, int64_t cols) {
  const int64_t rb = row_bytes(t, cols).value();
  std::vector<uint8_t> w(static_cast<size_t>(rows * rb));
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> row(static_cast<size_t>(cols));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(-0.01f, 0.01f);
  const QuantTypeInfo& info = type_info(t);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* dst = w.data() + r * rb;
    if (r < rows / 2) {
      for (float& v : row) v = normal(rng);
      quantize_row(t, row.data(), cols, dst);
      continue;
    }
    for (int64_t i = 0; i < rb; ++i) dst[i] = static_cast<uint8_t>(byte(rng));
    for (int64_t b = 0; b < cols / info.block_weights; ++b) {
      uint8_t* blk = dst + b * info.block_bytes;
      const int n_scales = (t == QuantType::kQ4_1 || t == QuantType::kQ5_1 ||
                            t == QuantType::kQ4_K || t == QuantType::kQ5_K)
                               ? 2
                               : 1;
      for (int s = 0; s < n_scales; ++s) {
        const uint16_t h = f32_to_f16(scale(rng));
        std::memcpy(blk + (t == QuantType::kQ6_K ? 208 : 2 * s), &h, 2);
      }
    }
  }
  return w;
}

// The activations as the kernels see them: quantized, then widened back to f32.
std::vector<float> quantized_activations(const std::vector<float>& x, int64_t m, int64_t k,
                                         ActFormat format) {
  std::vector<float> out(x.size());
  std::vector<uint8_t> q(static_cast<size_t>(act_row_bytes(format, k)));
  for (int64_t i = 0; i < m; ++i) {
    quantize_activations(x.data() + i * k, k, format, q.data());
    if (format == ActFormat::kBlockK) {
      dequantize_row(QuantType::kQ8_K, q.data(), k, out.data() + i * k);
      continue;
    }
    for (int64_t b = 0; b < k / kBlock32; ++b) {
      ActBlock32 blk;
      std::memcpy(&blk, q.data() + b * static_cast<int64_t>(sizeof(blk)), sizeof(blk));
      for (int l = 0; l < 32; ++l) out[static_cast<size_t>(i * k + b * 32 + l)] = blk.d * blk.qs[l];
    }
  }
  return out;
}

struct Case {
  QuantType type;
  Shape shape;
  std::vector<uint8_t> w;
  std::vector<float> x;
  std::vector<float> w_f32;  // dequantized [rows, cols]
};

Case make_case(std::mt19937& rng, QuantType t, Shape s) {
  Case c{t, s, random_weights(rng, t, s.rows, s.cols), {}, {}};
  c.x = cpu::testing::random_floats(rng, s.m * s.cols, -2.0f, 2.0f);
  c.w_f32.resize(static_cast<size_t>(s.rows * s.cols));
  const int64_t rb = row_bytes(t, s.cols).value();
  for (int64_t r = 0; r < s.rows; ++r) {
    dequantize_row(t, c.w.data() + r * rb, s.cols, c.w_f32.data() + r * s.cols);
  }
  return c;
}

std::vector<float> run(ThreadPool& pool, const Case& c, QuantIsa isa) {
  std::vector<float> y(static_cast<size_t>(c.shape.m * c.shape.rows), -1.0f);
  quant_matmul(pool, c.x.data(), c.shape.m, {c.w.data(), c.type, c.shape.rows, c.shape.cols}, {},
               y.data(), isa);
  return y;
}

// sum_k |a[i, k] * w[j, k]| for every output: the scale of its rounding error.
std::vector<double> magnitudes(const std::vector<float>& a, const Case& c) {
  const Shape s = c.shape;
  std::vector<double> out(static_cast<size_t>(s.m * s.rows));
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = 0; j < s.rows; ++j) {
      double sum = 0.0;
      for (int64_t k = 0; k < s.cols; ++k)
        sum += std::fabs(double{a[i * s.cols + k]} * c.w_f32[j * s.cols + k]);
      out[static_cast<size_t>(i * s.rows + j)] = sum;
    }
  return out;
}

std::vector<Shape> shapes_for(QuantType t) {
  // The last shape of each list is big enough to be split over the pool's threads.
  if (is_k(t)) {
    // On 512 bits 1-3 rows take the direct K tiles, 4 or more the packed ones in tiles
    // of 4, 2, 1 rows (11 leaves 3 rows, 5 and 17 one), 16 weight rows a tile.
    return {{1, 7, 256},  {2, 9, 512},  {5, 13, 768},  {8, 4, 256},
            {11, 9, 512}, {16, 6, 256}, {17, 5, 1536}, {1, 203, 512}};
  }
  // On 512 bits one row takes the direct tiles, 2 or more the packed ones (tiles of 8,
  // 4, 2, 1 rows), 16 weight rows a tile (21, 33, 37, 203 leave a part tile).
  return {{1, 5, 32},  {1, 9, 576},  {3, 13, 96},  {4, 8, 64},     {8, 4, 64},
          {11, 9, 96}, {16, 7, 576}, {33, 6, 32},  {17, 10, 1536}, {35, 37, 576},
          {6, 21, 96}, {2, 33, 160}, {7, 40, 544}, {1, 203, 576}};
}

TEST(QuantMatmulTest, EveryVectorPathMatchesItsScalarTwinOnEveryType) {
  ThreadPool pool(2);
  std::mt19937 rng(11);
  int paths = 0;
  for (const QuantIsa isa : {QuantIsa::kAvx2, QuantIsa::kAvx512Vnni}) {
    if (!isa_supported(isa)) {
      std::printf("[ skipped  ] %s: not on this CPU\n", to_string(isa));
      continue;
    }
    ++paths;
    for (const QuantType t : kBlockTypes) {
      for (const Shape s : shapes_for(t)) {
        const Case c = make_case(rng, t, s);
        const std::vector<float> want = run(pool, c, QuantIsa::kScalar);
        const std::vector<float> got = run(pool, c, isa);
        const std::vector<float> xq = quantized_activations(c.x, s.m, s.cols, act_format(t));
        // Same integer sums; only the f32 accumulation order differs.
        EXPECT_TRUE(all_close(got, want, 1e-5, 1e-6, magnitudes(xq, c)))
            << to_string(isa) << " " << type_info(t).name << " m=" << s.m << " rows=" << s.rows
            << " cols=" << s.cols;
      }
    }
  }
  std::printf("vector paths checked: %d\n", paths);
}

// The vector quantizer writes every byte the scalar one does, on every format:
// random rows, an all-zero block, a block with exact .5 ties, huge and tiny values.
TEST(QuantMatmulTest, VectorActivationQuantizerMatchesItsScalarTwinByteForByte) {
  if (!isa_supported(QuantIsa::kAvx512Vnni)) {
    std::printf("[ skipped  ] avx512-vnni: not on this CPU\n");
    return;
  }
  std::mt19937 rng(5);
  int rows = 0;
  for (const int64_t k : {int64_t{32}, int64_t{64}, int64_t{96}, int64_t{256}, int64_t{576},
                          int64_t{768}, int64_t{1536}}) {
    for (int variant = 0; variant < 4; ++variant) {
      std::vector<float> x = cpu::testing::random_floats(rng, k, -3.0f, 3.0f);
      if (variant == 1) std::fill(x.begin(), x.begin() + 32, 0.0f);
      if (variant == 2) {
        // max 127: every value's product is itself, so the k + 0.5 ties round to even.
        for (int64_t l = 0; l < k; ++l)
          x[l] = l % 32 == 0 ? 127.0f : static_cast<float>(l % 7) - 2.5f;
      }
      if (variant == 3) {
        for (int64_t l = 0; l < k; ++l) x[l] *= l % 2 == 0 ? 1e30f : 1e-30f;
      }
      for (const ActFormat f : {ActFormat::kBlock32, ActFormat::kBlock32Sums, ActFormat::kBlockK}) {
        if (f == ActFormat::kBlockK && k % kBlockK != 0) continue;
        const auto bytes = static_cast<size_t>(act_row_bytes(f, k));
        std::vector<uint8_t> want(bytes, 0xAB), got(bytes, 0xCD);
        quantize_activations(x.data(), k, f, want.data());
        quantize_activations_avx512(x.data(), k, f, got.data());
        for (size_t b = 0; b < bytes; ++b) {
          ASSERT_EQ(got[b], want[b]) << "k=" << k << " variant=" << variant
                                     << " format=" << static_cast<int>(f) << " byte " << b;
        }
        ++rows;
      }
    }
  }
  std::printf("rows compared: %d\n", rows);
}

TEST(QuantMatmulTest, TheScalarTwinIsTheDotOfTheDequantizedOperands) {
  ThreadPool pool(1);
  std::mt19937 rng(5);
  for (const QuantType t : kBlockTypes) {
    for (const Shape s : shapes_for(t)) {
      const Case c = make_case(rng, t, s);
      const std::vector<float> got = run(pool, c, QuantIsa::kScalar);
      const std::vector<float> xq = quantized_activations(c.x, s.m, s.cols, act_format(t));
      std::vector<float> want(got.size());
      for (int64_t i = 0; i < s.m; ++i)
        for (int64_t j = 0; j < s.rows; ++j) {
          double sum = 0.0;
          for (int64_t k = 0; k < s.cols; ++k)
            sum += double{xq[i * s.cols + k]} * c.w_f32[j * s.cols + k];
          want[static_cast<size_t>(i * s.rows + j)] = static_cast<float>(sum);
        }
      EXPECT_TRUE(all_close(got, want, 1e-5, 1e-6, magnitudes(xq, c)))
          << type_info(t).name << " m=" << s.m << " rows=" << s.rows << " cols=" << s.cols;
    }
  }
}

// Against an f32 matmul of the dequantized weights with the unrounded x: each
// activation is off by at most half its block's step (max |x| / 254).
TEST(QuantMatmulTest, ResultsAreWithinTheActivationRoundingOfAnF32Matmul) {
  ThreadPool pool(2);
  std::mt19937 rng(9);
  for (const QuantType t : kBlockTypes) {
    const Shape s = is_k(t) ? Shape{6, 11, 512} : Shape{6, 11, 576};
    const Case c = make_case(rng, t, s);
    const std::vector<float> got = run(pool, c, best_isa());
    const int64_t block = act_format(t) == ActFormat::kBlockK ? kBlockK : kBlock32;
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t j = 0; j < s.rows; ++j) {
        double want = 0.0, bound = 1e-5;
        for (int64_t b = 0; b < s.cols / block; ++b) {
          double amax = 0.0, wabs = 0.0;
          for (int64_t k = b * block; k < (b + 1) * block; ++k) {
            want += double{c.x[i * s.cols + k]} * c.w_f32[j * s.cols + k];
            amax = std::max(amax, std::fabs(double{c.x[i * s.cols + k]}));
            wabs += std::fabs(double{c.w_f32[j * s.cols + k]});
          }
          bound += amax / 254.0 * 1.001 * wabs;
        }
        EXPECT_NEAR(got[static_cast<size_t>(i * s.rows + j)], want, bound)
            << type_info(t).name << " [" << i << ", " << j << "]";
      }
  }
}

// A row's result does not depend on the rows computed with it (DESIGN.md: a seeded
// generation gives the same tokens whatever else shares its batches): on every
// vector path and block type, each row of a product of 2..40 rows (on 512 bits the
// 32-weight formats' packed tiles from 2 rows, the K-quants' direct tiles of 1-3 rows
// and packed ones from 4) has the bits of that row computed alone.
TEST(QuantMatmulTest, ARowsResultHasTheSameBitsInAnyBatch) {
  ThreadPool pool(2);
  std::mt19937 rng(14);
  for (const QuantIsa isa : {QuantIsa::kScalar, QuantIsa::kAvx2, QuantIsa::kAvx512Vnni}) {
    if (!isa_supported(isa)) continue;
    for (const QuantType t : kBlockTypes) {
      for (const int64_t m : {2, 3, 5, 8, 17, 40}) {
        // An odd number of 32-weight blocks where m is odd.
        const int64_t cols = is_k(t) ? 768 : m % 2 == 1 ? 544 : 576;
        const Case c = make_case(rng, t, Shape{m, 37, cols});
        const std::vector<float> batch = run(pool, c, isa);
        for (const int64_t i : {int64_t{0}, m - 1}) {
          Case one = c;
          one.shape.m = 1;
          one.x.assign(c.x.begin() + i * cols, c.x.begin() + (i + 1) * cols);
          const std::vector<float> alone = run(pool, one, isa);
          EXPECT_EQ(std::memcmp(alone.data(), batch.data() + i * 37, 37 * sizeof(float)), 0)
              << to_string(isa) << " " << type_info(t).name << " row " << i << " of " << m;
        }
      }
    }
  }
}

TEST(QuantMatmulTest, ThreadCountDoesNotChangeAnyBit) {
  ThreadPool one(1), two(2);
  std::mt19937 rng(13);
  // 64 x 1024 activations: quantized by the pool's threads too.
  for (const QuantType t : {QuantType::kQ4_0, QuantType::kQ6_K}) {
    const Case c = make_case(rng, t, Shape{64, 203, 1024});
    const std::vector<float> a = run(one, c, best_isa());
    const std::vector<float> b = run(two, c, best_isa());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << type_info(t).name;
  }
}

// Products of one x run together (quant_matmul_shared: x quantized once per activation
// format, the rows of all of them split over the threads in one pass) give each y the
// bits quant_matmul gives it alone: block types of both activation formats, a float type
// among them, biases, row counts that leave part tiles, on every path and 1, 3 and 19 rows.
TEST(QuantMatmulTest, SharedProductsHaveTheBitsOfEachProductAlone) {
  ThreadPool pool(2);
  std::mt19937 rng(23);
  const int64_t cols = 512;
  const std::pair<QuantType, int64_t> weights[] = {{QuantType::kQ5_0, 37},
                                                   {QuantType::kQ8_0, 16},
                                                   {QuantType::kQ4_K, 21},
                                                   {QuantType::kF32, 5},
                                                   {QuantType::kQ6_K, 40}};
  for (const QuantIsa isa : {QuantIsa::kScalar, QuantIsa::kAvx2, QuantIsa::kAvx512Vnni}) {
    if (!isa_supported(isa)) continue;
    for (const int64_t m : {1, 3, 19}) {
      const std::vector<float> x = cpu::testing::random_floats(rng, m * cols, -2.0f, 2.0f);
      std::vector<Case> cases;
      std::vector<std::vector<float>> biases, shared;
      std::vector<QuantProduct> products;
      for (const auto& [type, rows] : weights) {
        cases.push_back(make_case(rng, type == QuantType::kF32 ? QuantType::kQ8_0 : type,
                                  Shape{m, rows, cols}));
        biases.push_back(cpu::testing::random_floats(rng, rows));
        shared.emplace_back(static_cast<size_t>(m * rows), -1.0f);
      }
      for (size_t t = 0; t < cases.size(); ++t) {
        const Case& c = cases[t];
        const bool f32 = weights[t].first == QuantType::kF32;
        products.push_back(
            QuantProduct{{f32 ? static_cast<const void*>(c.w_f32.data()) : c.w.data(),
                          weights[t].first, c.shape.rows, cols},
                         {biases[t].data(), DType::kF32},
                         shared[t].data()});
      }
      quant_matmul_shared(pool, x.data(), m, products, isa);
      for (size_t t = 0; t < products.size(); ++t) {
        std::vector<float> alone(static_cast<size_t>(m * products[t].w.rows), -2.0f);
        quant_matmul(pool, x.data(), m, products[t].w, products[t].bias, alone.data(), isa);
        EXPECT_EQ(std::memcmp(alone.data(), shared[t].data(), alone.size() * sizeof(float)), 0)
            << to_string(isa) << " m=" << m << " product " << t << " ("
            << type_info(products[t].w.type).name << ")";
      }
    }
  }
}

TEST(QuantMatmulTest, BiasIsAddedAndFloatTypesGoToTheF32Matmul) {
  ThreadPool pool(1);
  std::mt19937 rng(17);
  const Case c = make_case(rng, QuantType::kQ8_0, Shape{2, 3, 64});
  const std::vector<float> bias = {1.0f, -2.0f, 0.5f};
  std::vector<float> y(6), y0 = run(pool, c, QuantIsa::kScalar);
  quant_matmul(pool, c.x.data(), 2, {c.w.data(), c.type, 3, 64}, {bias.data(), DType::kF32},
               y.data(), QuantIsa::kScalar);
  for (size_t i = 0; i < y.size(); ++i) EXPECT_FLOAT_EQ(y[i], y0[i] + bias[i % 3]);

  // F32 weights: exactly cpu::matmul's result, no activation rounding.
  std::vector<float> yf(6);
  quant_matmul(pool, c.x.data(), 2, {c.w_f32.data(), QuantType::kF32, 3, 64}, {}, yf.data());
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j) {
      double want = 0.0;
      for (int64_t k = 0; k < 64; ++k) want += double{c.x[i * 64 + k]} * c.w_f32[j * 64 + k];
      EXPECT_NEAR(yf[static_cast<size_t>(i * 3 + j)], want, 1e-5);
    }
}

// BF16 weights on every path (cpu::matmul, or bf16_dot_matmul where the CPU has
// AVX-512 BF16): within x's bf16 rounding (2^-8 per product) of the f64 product,
// with the bias added.
TEST(QuantMatmulTest, Bf16WeightsOnEveryPathAreWithinTheBf16RoundingOfX) {
  ThreadPool pool(2);
  std::mt19937 rng(19);
  const int64_t m = 7, rows = 70, cols = 200;
  const std::vector<float> x = cpu::testing::random_floats(rng, m * cols, -2.0f, 2.0f);
  const std::vector<float> wf = cpu::testing::random_floats(rng, rows * cols);
  const std::vector<float> bias = cpu::testing::random_floats(rng, rows);
  std::vector<uint16_t> w(wf.size());
  for (size_t i = 0; i < w.size(); ++i) w[i] = f32_to_bf16(wf[i]);
  std::vector<float> want(static_cast<size_t>(m * rows));
  std::vector<double> scale(want.size());
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < rows; ++j) {
      double sum = bias[static_cast<size_t>(j)], mag = 0.0;
      for (int64_t k = 0; k < cols; ++k) {
        const double p = double{x[i * cols + k]} * bf16_to_f32(w[j * cols + k]);
        sum += p;
        mag += std::fabs(p);
      }
      want[static_cast<size_t>(i * rows + j)] = static_cast<float>(sum);
      scale[static_cast<size_t>(i * rows + j)] = mag;
    }
  for (const QuantIsa isa : {QuantIsa::kScalar, QuantIsa::kAvx2, QuantIsa::kAvx512Vnni}) {
    if (!isa_supported(isa)) continue;
    std::vector<float> y(want.size());
    quant_matmul(pool, x.data(), m, {w.data(), QuantType::kBF16, rows, cols},
                 {bias.data(), DType::kF32}, y.data(), isa);
    EXPECT_TRUE(all_close(y, want, 1.0 / 256 + 1e-5, 1e-6, scale)) << to_string(isa);
  }
}

TEST(QuantMatmulTest, WeightShapesThatAreNotWholeBlocksAreRejectedWithTheirType) {
  const Status s = check_weights(QuantType::kQ4_K, 576);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("q4_k"), std::string::npos) << s.message();
  EXPECT_FALSE(check_weights(QuantType::kQ8_K, 256).ok());
  EXPECT_TRUE(check_weights(QuantType::kQ8_0, 576).ok());
}

}  // namespace
}  // namespace cellm::cpu::quant
