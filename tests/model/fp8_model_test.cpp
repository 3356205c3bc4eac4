// FP8 checkpoints and --weights fp8 end to end on the CPU executor:
//  - the compressed-tensors fixture (tests/fixtures/models/fp8-tiny, made by
//    tools/make_fp8_fixture.py) binds its projections as F8_E4M3 with per-row scales,
//    and its logits match transformers' over the dequantized weights (reference.json),
//    one forward of all tokens (the decode-to-bf16 path) and token by token (the fused
//    path); its bf16 dequantization (the CUDA executor's load path, --weights bf16)
//    gives the same logits within bf16 rounding;
//  - quantization_config variants that load (dynamic or absent activations, the "fp8"
//    method) and those refused, each naming the field and value;
//  - --weights fp8 / fp8_head on float models: logits cosine per row against the
//    model as stored.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cellm/engine.h"
#include "cellm/model_weights.h"
#include "cpu/cpu_forward.h"
#include "cpu/kernels/thread_pool.h"
#include "cpu/kv_store.h"
#include "engine/weight_formats.h"
#include "model/fp8.h"
#include "model/half.h"
#include "model_test_files.h"
#include "support/temp_dir.h"

namespace cellm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kSource(CELLM_SOURCE_DIR);
const fs::path kFp8Tiny = kSource / "tests/fixtures/models/fp8-tiny";

json read_json(const fs::path& path) {
  std::ifstream in(path);
  return json::parse(in);
}

std::shared_ptr<const ModelWeights> load_weights(const fs::path& dir) {
  Result<ModelWeights> w = ModelWeights::load(dir);
  EXPECT_TRUE(w.ok()) << w.status().to_string();
  return w.ok() ? std::make_shared<const ModelWeights>(std::move(*w)) : nullptr;
}

std::shared_ptr<const LoadedModel> load(const fs::path& path, WeightFormat format) {
  ModelSource source;
  source.path = path.string();
  source.weights = format;
  Result<std::shared_ptr<const LoadedModel>> m = load_model(source, /*with_tokenizer=*/false);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? *m : nullptr;
}

// Logits of every position of `ids`, in forwards of `step` tokens.
std::vector<float> logits_of(const std::shared_ptr<const ModelWeights>& w,
                             const std::vector<Token>& ids, int64_t step) {
  const auto n = static_cast<int64_t>(ids.size());
  const ModelConfig& c = w->config();
  cpu::ThreadPool pool(2);
  cpu::KvStore kv(c.num_layers(), c.kv_dim(), n + 1, n + 1);
  cpu::CpuForward fwd(w, pool, step);
  std::vector<CellId> all_cells(ids.size());
  std::iota(all_cells.begin(), all_cells.end(), 0);
  std::vector<float> out;
  for (int64_t b = 0; b < n; b += step) {
    const int64_t len = std::min(step, n - b);
    std::vector<Position> positions(static_cast<size_t>(len));
    std::iota(positions.begin(), positions.end(), static_cast<Position>(b));
    std::vector<CellId> cells(positions.begin(), positions.end());
    std::vector<std::span<const CellId>> seq(static_cast<size_t>(len));
    for (int64_t i = 0; i < len; ++i) {
      seq[static_cast<size_t>(i)] = std::span<const CellId>(all_cells.data(), b + i + 1);
    }
    std::vector<int32_t> rows(static_cast<size_t>(len));
    std::iota(rows.begin(), rows.end(), 0);
    const std::span<const Token> tokens(ids.data() + b, static_cast<size_t>(len));
    cpu::ForwardSlice s{tokens, positions, cells, seq, rows};
    std::vector<float> logits(static_cast<size_t>(len * c.vocab_size()));
    fwd.run(s, kv, logits);
    out.insert(out.end(), logits.begin(), logits.end());
  }
  return out;
}

double min_row_cosine(const std::vector<float>& got, const std::vector<float>& want,
                      int64_t vocab) {
  double worst = 1.0;
  for (size_t r = 0; r < want.size() / static_cast<size_t>(vocab); ++r) {
    double dot = 0, gg = 0, ww = 0;
    for (int64_t j = 0; j < vocab; ++j) {
      const double g = got[r * vocab + j], w = want[r * vocab + j];
      dot += g * w;
      gg += g * g;
      ww += w * w;
    }
    worst = std::min(worst, dot / std::sqrt(gg * ww));
  }
  return worst;
}

TEST(Fp8Checkpoint, BindsProjectionsAsE4m3WithRowScales) {
  const auto w = load_weights(kFp8Tiny);
  ASSERT_NE(w, nullptr);
  const LayerWeights& l0 = w->layer(0);
  for (const TensorView* t : {&l0.q_proj, &l0.k_proj, &l0.v_proj, &l0.o_proj, &l0.gate_proj,
                              &l0.up_proj, &l0.down_proj}) {
    EXPECT_EQ(t->dtype, DType::kF8E4M3) << t->name;
    ASSERT_NE(t->scales, nullptr) << t->name;
    EXPECT_EQ(t->nbytes, static_cast<size_t>(t->numel()));
    // Per-channel scales amax / 448: some code of each row is ±448.
    for (int64_t r = 0; r < t->shape[0]; ++r) {
      EXPECT_GT(t->scales[r], 0.0f);
      int peak = 0;
      for (int64_t c = 0; c < t->shape[1]; ++c) {
        const uint8_t code = static_cast<const uint8_t*>(t->data)[r * t->shape[1] + c];
        peak = std::max(peak, code & 0x7F);
      }
      EXPECT_EQ(peak, 0x7E) << t->name << " row " << r;
    }
  }
  EXPECT_EQ(w->embed_tokens().dtype, DType::kBF16);
  EXPECT_EQ(w->layer(1).input_norm.dtype, DType::kBF16);
  EXPECT_EQ(w->lm_head().data, w->embed_tokens().data);  // tied, and ignored by the quantizer
}

// transformers' float32 forward over the dequantized weights against cellm's f32
// products over the e4m3 codes: they differ in summation order only (measured about
// 2e-5 of the largest logit); 1e-3 of it bounds that while a wrong scale, code or row
// moves logits by whole units.
TEST(Fp8Checkpoint, LogitsMatchTheTorchReference) {
  const auto w = load_weights(kFp8Tiny);
  ASSERT_NE(w, nullptr);
  const json ref = read_json(kFp8Tiny / "reference.json");
  const std::vector<Token> ids = ref["tokens"].get<std::vector<Token>>();
  const int64_t vocab = w->config().vocab_size();
  std::vector<float> want;
  for (const json& row : ref["logits"]) {
    for (const json& v : row) want.push_back(v.get<float>());
  }
  ASSERT_EQ(want.size(), ids.size() * static_cast<size_t>(vocab));
  float peak = 0.0f;
  for (float v : want) peak = std::max(peak, std::fabs(v));
  for (int64_t step : {static_cast<int64_t>(ids.size()), int64_t{1}}) {
    const std::vector<float> got = logits_of(w, ids, step);
    double worst = 0.0;
    for (size_t i = 0; i < want.size(); ++i)
      worst = std::max<double>(worst, std::fabs(got[i] - want[i]));
    std::printf("fp8-tiny, forwards of %ld tokens: max |logit - torch| %.3g (largest logit %.3g)\n",
                static_cast<long>(step), worst, peak);
    EXPECT_LE(worst, 1e-3 * peak) << "step " << step;
  }
}

// The CUDA executor's load path (dequantize_blocks_to_bf16) and --weights bf16 both
// round code * scale to bf16: logits within bf16 rounding of the e4m3 model's.
TEST(Fp8Checkpoint, DequantizedToBf16ForTheCudaExecutor) {
  const auto w = load_weights(kFp8Tiny);
  ASSERT_NE(w, nullptr);
  Result<std::shared_ptr<const ModelWeights>> bf16 = dequantize_blocks_to_bf16(w);
  ASSERT_TRUE(bf16.ok()) << bf16.status().to_string();
  for (const TensorView* t : (*bf16)->tensors()) {
    EXPECT_NE(t->dtype, DType::kF8E4M3) << t->name;
  }
  const TensorView& q8 = w->layer(1).down_proj;
  const TensorView& qb = (*bf16)->layer(1).down_proj;
  ASSERT_EQ(qb.dtype, DType::kBF16);
  for (int64_t i = 0; i < q8.numel(); ++i) {
    const float want =
        e4m3_to_f32(static_cast<const uint8_t*>(q8.data)[i]) * q8.scales[i / q8.shape[1]];
    ASSERT_EQ(static_cast<const uint16_t*>(qb.data)[i], f32_to_bf16(want)) << i;
  }
  const auto as_bf16 = load(kFp8Tiny, WeightFormat::kBF16);
  ASSERT_NE(as_bf16, nullptr);
  EXPECT_EQ(as_bf16->weights->layer(0).q_proj.dtype, DType::kBF16);
  const std::vector<Token> ids = {1, 5, 9, 77, 3, 100};
  const int64_t vocab = w->config().vocab_size();
  const std::vector<float> ref = logits_of(w, ids, 6);
  EXPECT_GE(min_row_cosine(logits_of(*bf16, ids, 6), ref, vocab), 0.9999);
  EXPECT_GE(min_row_cosine(logits_of(as_bf16->weights, ids, 6), ref, vocab), 0.9999);
  // fp8 and auto keep the codes.
  const auto kept = load(kFp8Tiny, WeightFormat::kFp8);
  ASSERT_NE(kept, nullptr);
  EXPECT_EQ(kept->weights->layer(0).q_proj.dtype, DType::kF8E4M3);
  // A block format would re-quantize FP8 weights: refused, naming the tensor.
  ModelSource source;
  source.path = kFp8Tiny.string();
  source.weights = WeightFormat::kQ8_0;
  Result<std::shared_ptr<const LoadedModel>> q = load_model(source, false);
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.status().message().find("already FP8"), std::string::npos) << q.status().message();
}

// The fixture's tensors under `config` (config.json's quantization_config replaced by
// `quantization`; null removes it) in a temp folder, with `rename` applied to the
// safetensors header's names (from -> to).
void write_variant(const testing::TempDir& dir, const json& quantization,
                   const std::string& rename_from = "", const std::string& rename_to = "") {
  json config = read_json(kFp8Tiny / "config.json");
  if (quantization.is_null()) {
    config.erase("quantization_config");
  } else {
    config["quantization_config"] = quantization;
  }
  testing::write_file(dir / "config.json", config.dump(2));
  std::ifstream in(kFp8Tiny / "model.safetensors", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i)
    header_len |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
  json header = json::parse(bytes.substr(8, header_len));
  if (!rename_from.empty()) {
    header[rename_to] = header[rename_from];
    header.erase(rename_from);
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text += ' ';
  testing::write_file(dir / "model.safetensors",
                      testing::le64(text.size()) + text + bytes.substr(8 + header_len));
}

json fixture_quantization() {
  return read_json(kFp8Tiny / "config.json")["quantization_config"];
}

TEST(Fp8Checkpoint, LoadsTheSchemeVariants) {
  json dynamic = fixture_quantization();
  dynamic["config_groups"]["group_0"]["input_activations"] =
      json{{"type", "float"}, {"num_bits", 8}, {"strategy", "token"}, {"dynamic", true}};
  json absent = fixture_quantization();
  absent["config_groups"]["group_0"].erase("input_activations");
  json naive = fixture_quantization();
  naive["format"] = "naive-quantized";
  json per_tensor = fixture_quantization();
  per_tensor["config_groups"]["group_0"]["weights"]["strategy"] = "tensor";
  const json fp8 = {{"quant_method", "fp8"}, {"activation_scheme", "static"}, {"fmt", "e4m3"}};
  for (const json& q : {dynamic, absent, naive, per_tensor, fp8}) {
    testing::TempDir dir;
    write_variant(dir, q);
    Result<ModelWeights> w = ModelWeights::load(dir.path());
    ASSERT_TRUE(w.ok()) << q.dump() << ": " << w.status().to_string();
    EXPECT_EQ(w->layer(0).q_proj.dtype, DType::kF8E4M3);
  }
}

TEST(Fp8Checkpoint, RefusesOtherSchemesNamingTheField) {
  struct Refusal {
    json quantization;
    std::string names;  // in the message
  };
  std::vector<Refusal> cases;
  auto with = [](const std::string& field, const json& value) {
    json q = fixture_quantization();
    json* at = &q;
    std::string path = field;
    for (size_t dot; (dot = path.find('.')) != std::string::npos; path = path.substr(dot + 1)) {
      at = &(*at)[path.substr(0, dot)];
    }
    (*at)[path] = value;
    return q;
  };
  cases.push_back({with("quant_method", "awq"), "quant_method is awq"});
  cases.push_back({with("format", "pack-quantized"), "format is pack-quantized"});
  cases.push_back({with("config_groups.group_0.weights.num_bits", 4),
                   "config_groups.group_0.weights.num_bits is 4"});
  cases.push_back({with("config_groups.group_0.weights.type", "int"),
                   "config_groups.group_0.weights.type is int"});
  cases.push_back({with("config_groups.group_0.weights.strategy", "group"),
                   "config_groups.group_0.weights.strategy is group"});
  cases.push_back({with("config_groups.group_0.weights.symmetric", false),
                   "config_groups.group_0.weights.symmetric is false"});
  cases.push_back({with("kv_cache_scheme", json{{"num_bits", 8}}), "kv_cache_scheme"});
  cases.push_back({json{{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}},
                   "weight_block_size is [128,128]"});
  cases.push_back({json{{"quant_method", "fp8"}, {"fmt", "e5m2"}}, "fmt is e5m2"});
  for (const Refusal& r : cases) {
    testing::TempDir dir;
    write_variant(dir, r.quantization);
    Result<ModelWeights> w = ModelWeights::load(dir.path());
    ASSERT_FALSE(w.ok()) << r.quantization.dump();
    EXPECT_EQ(w.status().code(), StatusCode::kNotSupported) << w.status().to_string();
    EXPECT_NE(w.status().message().find(r.names), std::string::npos)
        << "want '" << r.names << "' in: " << w.status().message();
  }
}

TEST(Fp8Checkpoint, RefusesMissingOrBlockScalesAndAbsentConfig) {
  const std::string weight = "model.layers.0.self_attn.q_proj.weight";
  {
    testing::TempDir dir;
    write_variant(dir, fixture_quantization(), weight + "_scale", weight + "_scale_inv");
    Result<ModelWeights> w = ModelWeights::load(dir.path());
    ASSERT_FALSE(w.ok());
    EXPECT_EQ(w.status().code(), StatusCode::kNotSupported);
    EXPECT_NE(w.status().message().find("weight_scale_inv"), std::string::npos)
        << w.status().message();
  }
  {
    testing::TempDir dir;
    write_variant(dir, fixture_quantization(), weight + "_scale", weight + "_scalx");
    Result<ModelWeights> w = ModelWeights::load(dir.path());
    ASSERT_FALSE(w.ok());
    EXPECT_NE(w.status().message().find("has no '" + weight + "_scale'"), std::string::npos)
        << w.status().message();
  }
  {
    testing::TempDir dir;
    write_variant(dir, json());
    Result<ModelWeights> w = ModelWeights::load(dir.path());
    ASSERT_FALSE(w.ok());
    EXPECT_NE(w.status().message().find("no quantization_config"), std::string::npos)
        << w.status().message();
  }
}

// --weights fp8 against the model as stored, logits cosine per row over random
// prompts, whole-prompt forwards and token by token.
double fp8_cosine(const fs::path& path, WeightFormat format) {
  const auto ref = load(path, WeightFormat::kAuto);
  const auto q = load(path, format);
  if (!ref || !q) return -1.0;
  const int64_t vocab = ref->weights->config().vocab_size();
  std::mt19937 rng(11);
  std::uniform_int_distribution<Token> id(2,
                                          static_cast<Token>(std::min<int64_t>(vocab, 4000) - 1));
  double worst = 1.0;
  for (size_t len : {5u, 17u, 40u}) {
    std::vector<Token> p(len);
    for (Token& t : p) t = id(rng);
    const std::vector<float> want = logits_of(ref->weights, p, static_cast<int64_t>(len));
    worst = std::min(
        worst, min_row_cosine(logits_of(q->weights, p, static_cast<int64_t>(len)), want, vocab));
    if (len == 5) worst = std::min(worst, min_row_cosine(logits_of(q->weights, p, 1), want, vocab));
  }
  std::printf("%s --weights %s: %s; worst per-row logit cosine %.6f\n", path.c_str(),
              to_string(format), q->weights_summary.c_str(), worst);
  return worst;
}

TEST(WeightsFp8, QuantizesLinearLayersOnLoad) {
  const fs::path kjv = kSource / "models/kjv-small";
  const auto q = load(kjv, WeightFormat::kFp8);
  ASSERT_NE(q, nullptr);
  const LayerWeights& l = q->weights->layer(0);
  EXPECT_EQ(l.q_proj.dtype, DType::kF8E4M3);
  EXPECT_EQ(l.down_proj.dtype, DType::kF8E4M3);
  EXPECT_NE(l.down_proj.scales, nullptr);
  EXPECT_NE(q->weights->embed_tokens().dtype, DType::kF8E4M3);
  EXPECT_NE(l.input_norm.dtype, DType::kF8E4M3);
  // A model of 8 layers or more keeps its last layer's projections as stored (their
  // e4m3 rounding costs the most perplexity); the layer before it is quantized.
  const int64_t last = q->weights->config().num_layers() - 1;
  ASSERT_GE(last, 7);
  const LayerWeights& kept = q->weights->layer(last);
  for (const TensorView* t : {&kept.q_proj, &kept.k_proj, &kept.v_proj, &kept.o_proj,
                              &kept.gate_proj, &kept.up_proj, &kept.down_proj}) {
    EXPECT_EQ(t->dtype, DType::kBF16) << t->name;
    EXPECT_EQ(t->scales, nullptr) << t->name;
  }
  EXPECT_EQ(q->weights->layer(last - 1).down_proj.dtype, DType::kF8E4M3);
  EXPECT_NE(q->weights_summary.find("the last layer's 7 as stored"), std::string::npos)
      << q->weights_summary;
  // The codes and scales are quantize_row_e4m3's of the stored rows, exactly.
  const auto ref = load(kjv, WeightFormat::kAuto);
  ASSERT_NE(ref, nullptr);
  const TensorView& src = ref->weights->layer(1).gate_proj;
  const TensorView& dst = q->weights->layer(1).gate_proj;
  ASSERT_EQ(src.dtype, DType::kBF16);
  const int64_t cols = src.shape[1];
  std::vector<float> row(static_cast<size_t>(cols));
  std::vector<uint8_t> codes(static_cast<size_t>(cols));
  for (int64_t r = 0; r < src.shape[0]; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      row[static_cast<size_t>(c)] =
          bf16_to_f32(static_cast<const uint16_t*>(src.data)[r * cols + c]);
    }
    ASSERT_EQ(quantize_row_e4m3(row.data(), cols, codes.data()), dst.scales[r]) << r;
    ASSERT_EQ(
        std::memcmp(codes.data(), static_cast<const uint8_t*>(dst.data) + r * cols, codes.size()),
        0)
        << "row " << r;
  }
  // Measured 0.99888 (e4m3 keeps 3 mantissa bits: about 2% rms rounding per weight,
  // against q8_0's 0.9998 on this model); a wrong scale or row order gives near 0.
  EXPECT_GE(fp8_cosine(kjv, WeightFormat::kFp8), 0.998);
}

// The random tiny fixtures (untrained, hidden 32) amplify any rounding over the
// positions: q8_0 already loses up to 2.5e-2 there (quantize_on_load_test); e4m3's
// 3 mantissa bits (16 times q8_0's step) lose about 0.12 (llama3-tiny: 0.879) to 0.19
// (mistral-tiny: 0.807). Bounds about twice the measured loss; a wrong scale, code or
// row order gives near 0.
TEST(WeightsFp8, RandomTinyFixtures) {
  EXPECT_GE(fp8_cosine(kSource / "tests/fixtures/models/llama3-tiny", WeightFormat::kFp8), 0.75);
  const fs::path mistral = kSource / "tests/fixtures/models/mistral-tiny";
  EXPECT_GE(fp8_cosine(mistral, WeightFormat::kFp8), 0.6);
  // fp8_head also quantizes the untied LM head.
  const auto plain = load(mistral, WeightFormat::kFp8);
  const auto head = load(mistral, WeightFormat::kFp8Head);
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(head, nullptr);
  EXPECT_NE(plain->weights->lm_head().dtype, DType::kF8E4M3);
  EXPECT_EQ(head->weights->lm_head().dtype, DType::kF8E4M3);
  // Under 8 layers every projection is quantized, the last layer's too.
  const LayerWeights& last = plain->weights->layer(plain->weights->config().num_layers() - 1);
  EXPECT_EQ(last.q_proj.dtype, DType::kF8E4M3);
  EXPECT_EQ(last.down_proj.dtype, DType::kF8E4M3);
  EXPECT_GE(fp8_cosine(mistral, WeightFormat::kFp8Head), 0.6);
}

}  // namespace
}  // namespace cellm
