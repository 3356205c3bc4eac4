// The weight quantizers of quantize-on-load (cpu/quant/weight_quant.h): the bytes of
// the `gguf` package's quantizer for the 32-weight types on rows that look like
// trained weights (tests/fixtures/quant/make_weight_quant_fixtures.py), and for
// every type dequantize(quantize(x)) within a bound on random rows, heavy-tailed
// rows and the bundled model's own weights; the K-quants' search must beat the
// range rule it replaces.
#include "cpu/quant/weight_quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "cellm/model_weights.h"
#include "cpu/quant/block_formats.h"
#include "model/half.h"

namespace cellm::cpu::quant {
namespace {

const std::string kDir = std::string(CELLM_SOURCE_DIR) + "/tests/fixtures/quant/";

std::vector<uint8_t> read_bytes(const std::string& name) {
  std::ifstream in(kDir + name, std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing fixture " << kDir + name;
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<float> read_floats(const std::string& name) {
  const std::vector<uint8_t> bytes = read_bytes(name);
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

// sqrt(sum (x - y)^2 / sum x^2) of x against its round trip through `type`.
double relative_rms_error(QuantType type, const std::vector<float>& x, int64_t cols,
                          bool search = true) {
  const int64_t rows = static_cast<int64_t>(x.size()) / cols;
  const int64_t row = row_bytes(type, cols).value();
  std::vector<uint8_t> blocks(static_cast<size_t>(rows * row));
  std::vector<float> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    if (search) {
      quantize_weight_row(type, x.data() + r * cols, cols, blocks.data() + r * row);
    } else {
      quantize_row(type, x.data() + r * cols, cols, blocks.data() + r * row);
    }
    dequantize_row(type, blocks.data() + r * row, cols, y.data() + r * cols);
  }
  double err = 0, ref = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    err += (double{x[i]} - y[i]) * (double{x[i]} - y[i]);
    ref += double{x[i]} * x[i];
  }
  return std::sqrt(err / ref);
}

std::vector<float> gaussian_rows(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = dist(rng);
  return x;
}

// Heavy tails and outliers, as trained weights have: a Student-t-like mix (a normal
// scaled by a log-normal), every 97th weight 10x, and a small positive offset.
std::vector<float> heavy_tailed_rows(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = 0.02f * dist(rng) * std::exp(0.5f * dist(rng)) + 0.002f;
    if (i % 97 == 0) x[i] *= 10.0f;
  }
  return x;
}

struct Bound {
  QuantType type;
  double gaussian;  // relative rms error bound on normal rows
  double heavy;     // and on heavy-tailed rows (their rare large weights set the scale)
};

// About 1.3x what the quantizers give (grid step / sqrt(12) relative to the rms,
// larger for the tails); the 4-bit formats' error is 8x the 8-bit one's.
constexpr Bound kBounds[] = {
    {QuantType::kQ8_0, 0.0070, 0.012}, {QuantType::kQ4_0, 0.115, 0.16},
    {QuantType::kQ4_1, 0.095, 0.13},   {QuantType::kQ5_0, 0.058, 0.08},
    {QuantType::kQ5_1, 0.048, 0.065},  {QuantType::kQ4_K, 0.085, 0.12},
    {QuantType::kQ5_K, 0.042, 0.06},   {QuantType::kQ6_K, 0.021, 0.03},
};

TEST(WeightQuantTest, ThirtyTwoWeightTypesGiveTheGgufPackagesBytesOnWeightLikeRows) {
  std::ifstream in(kDir + "weights_manifest.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json m = nlohmann::json::parse(in);
  const int64_t rows = m["rows"].get<int64_t>(), cols = m["cols"].get<int64_t>();
  const std::vector<float> src = read_floats(m["src"].get<std::string>());
  ASSERT_EQ(static_cast<int64_t>(src.size()), rows * cols);
  int checked = 0;
  for (const auto& e : m["types"]) {
    const QuantType type = *type_from_name(e["type"].get<std::string>());
    const std::vector<uint8_t> want = read_bytes(e["blocks"].get<std::string>());
    const int64_t row = row_bytes(type, cols).value();
    ASSERT_EQ(static_cast<int64_t>(want.size()), rows * row) << e["type"];
    std::vector<uint8_t> got(want.size());
    for (int64_t r = 0; r < rows; ++r) {
      quantize_weight_row(type, src.data() + r * cols, cols, got.data() + r * row);
    }
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i], want[i]) << e["type"] << " row " << static_cast<int64_t>(i) / row
                                 << " byte " << static_cast<int64_t>(i) % row;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 5);  // q8_0 q4_0 q4_1 q5_0 q5_1
}

TEST(WeightQuantTest, EveryTypeRoundTripsWithinItsBound) {
  const int64_t cols = 2048;
  const std::vector<float> g = gaussian_rows(8 * cols, 11);
  const std::vector<float> h = heavy_tailed_rows(8 * cols, 12);
  for (const Bound& b : kBounds) {
    const double eg = relative_rms_error(b.type, g, cols);
    const double eh = relative_rms_error(b.type, h, cols);
    std::printf("%-5s relative rms error: normal %.4f (bound %.4f), heavy-tailed %.4f (%.4f)\n",
                type_info(b.type).name, eg, b.gaussian, eh, b.heavy);
    EXPECT_LT(eg, b.gaussian) << type_info(b.type).name;
    EXPECT_LT(eh, b.heavy) << type_info(b.type).name;
  }
}

TEST(WeightQuantTest, KQuantSearchBeatsTheRangeRule) {
  // The searched scales and mins lose less than scales taken from the range
  // (block_formats.h's quantize_row), on both kinds of rows.
  const int64_t cols = 4096;
  for (const std::vector<float>& x :
       {gaussian_rows(4 * cols, 21), heavy_tailed_rows(4 * cols, 22)}) {
    for (QuantType t : {QuantType::kQ4_K, QuantType::kQ5_K, QuantType::kQ6_K}) {
      const double searched = relative_rms_error(t, x, cols, true);
      const double range = relative_rms_error(t, x, cols, false);
      std::printf("%-5s searched %.4f, range rule %.4f\n", type_info(t).name, searched, range);
      EXPECT_LT(searched, 0.97 * range) << type_info(t).name;
    }
  }
}

TEST(WeightQuantTest, ZeroBlocksBesideNonZeroOnesStayExactlyZero) {
  const int64_t n = 512;
  std::vector<float> x = gaussian_rows(n, 5);
  for (int64_t i = 0; i < 256; ++i) x[static_cast<size_t>(i)] = 0.0f;
  for (int64_t i = 288; i < 320; ++i) x[static_cast<size_t>(i)] = 0.0f;  // inside a block
  for (const Bound& b : kBounds) {
    std::vector<uint8_t> blocks(static_cast<size_t>(row_bytes(b.type, n).value()));
    quantize_weight_row(b.type, x.data(), n, blocks.data());
    std::vector<float> y(n);
    dequantize_row(b.type, blocks.data(), n, y.data());
    for (int64_t i = 0; i < n; ++i) {
      const float v = y[static_cast<size_t>(i)];
      ASSERT_TRUE(std::isfinite(v)) << type_info(b.type).name << " weight " << i;
      if (i < 256 || (i >= 288 && i < 320)) {
        ASSERT_EQ(v, 0.0f) << type_info(b.type).name << " weight " << i;
      }
    }
  }
}

TEST(WeightQuantTest, MatrixFromBf16IsRowByRowAndTheSameOnAnyThreadCount) {
  const int64_t rows = 96, cols = 512;
  const std::vector<float> x = heavy_tailed_rows(rows * cols, 31);
  std::vector<uint16_t> bf16(x.size());
  std::vector<float> widened(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    bf16[i] = f32_to_bf16(x[i]);
    widened[i] = bf16_to_f32(bf16[i]);
  }
  for (QuantType t : {QuantType::kQ8_0, QuantType::kQ4_K, QuantType::kQ6_K}) {
    const int64_t row = row_bytes(t, cols).value();
    std::vector<uint8_t> want(static_cast<size_t>(rows * row));
    for (int64_t r = 0; r < rows; ++r) {
      quantize_weight_row(t, widened.data() + r * cols, cols, want.data() + r * row);
    }
    for (int threads : {1, 3}) {
      std::vector<uint8_t> got(want.size());
      ASSERT_TRUE(
          quantize_weight_matrix(QuantType::kBF16, bf16.data(), rows, cols, t, got.data(), threads)
              .ok());
      EXPECT_EQ(got, want) << type_info(t).name << " threads " << threads;
    }
  }
}

TEST(WeightQuantTest, RowsThatAreNotWholeBlocksAreAnError) {
  std::vector<float> x(384 * 2, 0.0f);
  std::vector<uint8_t> out(4096);
  const Status s =
      quantize_weight_matrix(QuantType::kF32, x.data(), 2, 384, QuantType::kQ4_K, out.data(), 1);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("q4_k"), std::string::npos) << s.message();
  EXPECT_FALSE(is_weight_quant_type(QuantType::kQ8_K));
  EXPECT_FALSE(is_weight_quant_type(QuantType::kBF16));
  EXPECT_TRUE(is_weight_quant_type(QuantType::kQ5_K));
}

TEST(WeightQuantTest, TheBundledModelsWeightsRoundTripWithinTheirBounds) {
  // A trained model's rows: down_proj of three layers of models/kjv-small (rows of 1024, whole
  // blocks of every type).
  const std::filesystem::path dir = std::filesystem::path(CELLM_SOURCE_DIR) / "models/kjv-small";
  Result<ModelWeights> w = ModelWeights::load(dir);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  std::vector<float> x;
  int64_t cols = 0;
  for (int64_t i = 0; i < 3; ++i) {
    const TensorView& t = w->layer(i).down_proj;
    ASSERT_EQ(t.dtype, DType::kBF16);
    cols = t.shape[1];
    const auto* p = static_cast<const uint16_t*>(t.data);
    for (int64_t i = 0; i < t.numel(); ++i) x.push_back(bf16_to_f32(p[i]));
  }
  ASSERT_EQ(cols % kBlockK, 0);
  for (const Bound& b : kBounds) {
    const double e = relative_rms_error(b.type, x, cols);
    std::printf("%-5s kjv-small down_proj relative rms error %.4f (bound %.4f)\n",
                type_info(b.type).name, e, b.heavy);
    EXPECT_LT(e, b.heavy) << type_info(b.type).name;
  }
}

}  // namespace
}  // namespace cellm::cpu::quant
