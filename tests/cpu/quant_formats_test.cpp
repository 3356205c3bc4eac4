// The GGUF block formats (cpu/quant/block_formats.h) against the `gguf` Python
// package: its dequantizer's floats for random blocks of every type, and (where
// the package quantizes) its quantizer's bytes. Fixtures:
// tests/fixtures/quant/make_quant_fixtures.py. Dequantized floats must match bit
// for bit (0 ulp): both sides round each product of fp16 scales to f32 once.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "cpu/quant/block_formats.h"

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

nlohmann::json manifest() {
  std::ifstream in(kDir + "manifest.json");
  EXPECT_TRUE(in.good()) << "missing " << kDir << "manifest.json";
  return nlohmann::json::parse(in);
}

// Index of the first element whose bits differ, or -1.
int64_t first_bit_mismatch(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) {
      return static_cast<int64_t>(i);
    }
  }
  return -1;
}

TEST(QuantFormatsTest, TheTableMatchesTheFixturesIdsAndBlockSizes) {
  const nlohmann::json m = manifest();
  ASSERT_EQ(m["types"].size(), 11u);  // every weight type (Q8_K is activations only)
  for (const auto& e : m["types"]) {
    const auto type = type_from_name(e["type"].get<std::string>());
    ASSERT_TRUE(type.has_value()) << e["type"];
    EXPECT_EQ(static_cast<uint32_t>(*type), e["ggml_id"].get<uint32_t>()) << e["type"];
    EXPECT_EQ(type_from_ggml_id(e["ggml_id"].get<uint32_t>()), type);
    const int64_t n = e["n"].get<int64_t>();
    const Result<int64_t> bytes = row_bytes(*type, n);
    ASSERT_TRUE(bytes.ok()) << bytes.status().message();
    EXPECT_EQ(bytes.value(), static_cast<int64_t>(read_bytes(e["blocks"]).size())) << e["type"];
  }
}

TEST(QuantFormatsTest, DequantizeMatchesTheGgufPackageBitForBitOnEveryType) {
  const nlohmann::json m = manifest();
  for (const auto& e : m["types"]) {
    const QuantType type = *type_from_name(e["type"].get<std::string>());
    const int64_t n = e["n"].get<int64_t>();
    const std::vector<uint8_t> blocks = read_bytes(e["blocks"]);
    const std::vector<float> want = read_floats(e["f32"]);
    ASSERT_EQ(static_cast<int64_t>(want.size()), n) << e["type"];
    // Copied to an aligned buffer, as a memory-mapped tensor is (32-byte aligned).
    std::vector<uint64_t> aligned((blocks.size() + 7) / 8);
    std::memcpy(aligned.data(), blocks.data(), blocks.size());
    std::vector<float> got(static_cast<size_t>(n));
    dequantize_row(type, aligned.data(), n, got.data());
    const int64_t bad = first_bit_mismatch(got, want);
    EXPECT_EQ(bad, -1) << e["type"] << " element " << bad << ": got " << got[bad] << " want "
                       << want[bad];
  }
}

TEST(QuantFormatsTest, QuantizeGivesTheGgufPackagesBytesWhereItQuantizes) {
  int checked = 0;
  const nlohmann::json m = manifest();
  for (const auto& e : m["types"]) {
    if (!e.contains("src")) continue;
    const QuantType type = *type_from_name(e["type"].get<std::string>());
    const int64_t n = e["n"].get<int64_t>();
    const std::vector<float> src = read_floats(e["src"]);
    const std::vector<uint8_t> want = read_bytes(e["blocks"]);
    std::vector<uint8_t> got(static_cast<size_t>(row_bytes(type, n).value()));
    quantize_row(type, src.data(), n, got.data());
    ASSERT_EQ(got.size(), want.size()) << e["type"];
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i], want[i]) << e["type"] << " byte " << i;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 8);  // f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1
}

// The K-quants (which the package does not quantize) round-trip within their grid:
// relative RMS error under what their bits allow.
TEST(QuantFormatsTest, KQuantsRoundTripWithinTheirPrecision) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  const int64_t n = 8 * kBlockK;
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = dist(rng);
  for (int64_t i = 0; i < kBlockK; ++i) x[static_cast<size_t>(i)] = 0.0f;  // an all-zero block
  struct Case {
    QuantType type;
    double max_rel_rms;
  };
  for (const Case c : {Case{QuantType::kQ4_K, 0.12}, Case{QuantType::kQ5_K, 0.06},
                       Case{QuantType::kQ6_K, 0.03}, Case{QuantType::kQ8_K, 0.01}}) {
    std::vector<uint8_t> blocks(static_cast<size_t>(row_bytes(c.type, n).value()));
    quantize_row(c.type, x.data(), n, blocks.data());
    std::vector<float> y(static_cast<size_t>(n));
    dequantize_row(c.type, blocks.data(), n, y.data());
    double err = 0.0, ref = 0.0;
    for (size_t i = 0; i < x.size(); ++i) {
      err += (double{x[i]} - y[i]) * (double{x[i]} - y[i]);
      ref += double{x[i]} * x[i];
      if (i < static_cast<size_t>(kBlockK)) {
        ASSERT_EQ(y[i], 0.0f) << type_info(c.type).name;
      }
    }
    EXPECT_LT(std::sqrt(err / ref), c.max_rel_rms) << type_info(c.type).name;
  }
}

TEST(QuantFormatsTest, Q8KBlockSumsAreTheSumsOfTheirSixteenQuants) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<float> x(kBlockK);
  for (float& v : x) v = dist(rng);
  BlockQ8_K b;
  quantize_row(QuantType::kQ8_K, x.data(), kBlockK, &b);
  for (int g = 0; g < 16; ++g) {
    int sum = 0;
    for (int l = 0; l < 16; ++l) sum += b.qs[16 * g + l];
    EXPECT_EQ(b.bsums[g], sum);
  }
}

TEST(QuantFormatsTest, ARowThatIsNotWholeBlocksIsAnErrorNamingTheType) {
  const Result<int64_t> r = row_bytes(QuantType::kQ4_K, 300);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("q4_k"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("256"), std::string::npos) << r.status().message();
  EXPECT_FALSE(row_bytes(QuantType::kQ8_0, -32).ok());
  EXPECT_EQ(row_bytes(QuantType::kBF16, 7).value(), 14);
}

TEST(QuantFormatsTest, NamesAndIdsOutsideTheTableAreRejected) {
  EXPECT_FALSE(type_from_name("q3_k").has_value());
  EXPECT_FALSE(type_from_ggml_id(11).has_value());  // Q3_K
  EXPECT_EQ(type_from_name("Q4_K"), QuantType::kQ4_K);
  EXPECT_EQ(type_from_ggml_id(30), QuantType::kBF16);
}

}  // namespace
}  // namespace cellm::cpu::quant
