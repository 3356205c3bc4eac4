#include "cellm/model_weights.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/fp8.h"
#include "model/half.h"
#include "model_test_files.h"

namespace cellm {
namespace {

using testing::counting_tensor;
using testing::safetensors_bytes;
using testing::TempDir;
using testing::TestTensor;
using testing::write_file;

void ExpectError(const Status& status, StatusCode code, std::initializer_list<std::string> parts) {
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), code) << status.to_string();
  for (const std::string& part : parts) {
    EXPECT_NE(status.message().find(part), std::string::npos)
        << "'" << part << "' not in: " << status.message();
  }
}

float At(const TensorView& view, int64_t i) {
  switch (view.dtype) {
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(view.data)[i]);
    case DType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(view.data)[i]);
    case DType::kF32:
      return static_cast<const float*>(view.data)[i];
    case DType::kF8E4M3:  // the code times its row scale
      return e4m3_to_f32(static_cast<const uint8_t*>(view.data)[i]) *
             view.scales[i / view.shape.back()];
  }
  return 0.0f;
}

// A tiny model folder: hidden 8, 2 layers, 2 query heads, 1 kv head, ff 16, vocab 12.
struct TinyModel {
  std::string architecture = "LlamaForCausalLM";
  int64_t head_dim = 4;  // q_dim = 8 = hidden unless head_dim is changed
  bool tie = false;
  bool write_head_dim = false;
  std::string extra_config;

  static constexpr int64_t kHidden = 8, kLayers = 2, kHeads = 2, kKvHeads = 1, kFf = 16,
                           kVocab = 12;

  std::string config_json() const {
    std::string json = "{\"architectures\": [\"" + architecture +
                       "\"], \"hidden_size\": 8, \"num_hidden_layers\": 2, "
                       "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, "
                       "\"intermediate_size\": 16, \"vocab_size\": 12, "
                       "\"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-6, "
                       "\"tie_word_embeddings\": " +
                       std::string(tie ? "true" : "false");
    if (write_head_dim) json += ", \"head_dim\": " + std::to_string(head_dim);
    if (!extra_config.empty()) json += ", " + extra_config;
    return json + "}";
  }

  // Every tensor the checkpoint of this model holds, written independently of the
  // loader's table. Element i of tensor n is 1000 * n + i (matrices in `dtype`,
  // norms and biases in F32).
  std::vector<TestTensor> tensors(const std::string& dtype) const {
    const bool qwen2 = architecture == "Qwen2ForCausalLM";
    const bool qwen3 = architecture == "Qwen3ForCausalLM";
    const int64_t q_dim = kHeads * head_dim, kv_dim = kKvHeads * head_dim;
    std::vector<TestTensor> out;
    auto add = [&](const std::string& name, std::vector<int64_t> shape, const std::string& t) {
      out.push_back(counting_tensor(name, t, std::move(shape), 1000.0f * out.size()));
    };
    add("model.embed_tokens.weight", {kVocab, kHidden}, dtype);
    for (int i = 0; i < kLayers; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      add(p + "input_layernorm.weight", {kHidden}, "F32");
      add(p + "self_attn.q_proj.weight", {q_dim, kHidden}, dtype);
      add(p + "self_attn.k_proj.weight", {kv_dim, kHidden}, dtype);
      add(p + "self_attn.v_proj.weight", {kv_dim, kHidden}, dtype);
      add(p + "self_attn.o_proj.weight", {kHidden, q_dim}, dtype);
      if (qwen2) {
        add(p + "self_attn.q_proj.bias", {q_dim}, "F32");
        add(p + "self_attn.k_proj.bias", {kv_dim}, "F32");
        add(p + "self_attn.v_proj.bias", {kv_dim}, "F32");
      }
      if (qwen3) {
        add(p + "self_attn.q_norm.weight", {head_dim}, "F32");
        add(p + "self_attn.k_norm.weight", {head_dim}, "F32");
      }
      add(p + "post_attention_layernorm.weight", {kHidden}, "F32");
      add(p + "mlp.gate_proj.weight", {kFf, kHidden}, dtype);
      add(p + "mlp.up_proj.weight", {kFf, kHidden}, dtype);
      add(p + "mlp.down_proj.weight", {kHidden, kFf}, dtype);
      add(p + "self_attn.rotary_emb.inv_freq", {head_dim / 2}, "F32");  // ignored
    }
    add("model.norm.weight", {kHidden}, "F32");
    if (!tie) add("lm_head.weight", {kVocab, kHidden}, dtype);
    return out;
  }

  // Writes config.json and model.safetensors (F32 tensors first, to stay aligned).
  void write(const TempDir& dir, const std::string& dtype,
             std::vector<TestTensor> (*edit)(std::vector<TestTensor>) = nullptr) const {
    write_file(dir / "config.json", config_json());
    std::vector<TestTensor> all = tensors(dtype);
    if (edit != nullptr) all = edit(std::move(all));
    std::stable_partition(all.begin(), all.end(),
                          [](const TestTensor& t) { return t.dtype == "F32"; });
    write_file(dir / "model.safetensors", safetensors_bytes(all));
  }
};

// The value the test writer gave element `i` of the tensor written `n`-th, as
// stored in its dtype (BF16/F16 round large values: F32 tensors pin offsets exactly).
float Written(const std::vector<TestTensor>& tensors, const std::string& name, int64_t i) {
  for (size_t n = 0; n < tensors.size(); ++n) {
    if (tensors[n].name != name) continue;
    const float value = 1000.0f * static_cast<float>(n) + static_cast<float>(i);
    if (tensors[n].dtype == "BF16") return bf16_to_f32(f32_to_bf16(value));
    if (tensors[n].dtype == "F16") return f16_to_f32(f32_to_f16(value));
    return value;
  }
  ADD_FAILURE() << "no tensor " << name;
  return 0.0f;
}

TEST(ModelWeightsTest, LoadsEveryLlamaWeightIntoItsSlotWithItsShape) {
  TempDir dir;
  TinyModel model;
  model.write(dir, "F32");
  const std::vector<TestTensor> written = model.tensors("F32");
  Result<ModelWeights> w = ModelWeights::load(dir.path());
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ(w->config().architecture(), Architecture::kLlama);
  ASSERT_EQ(w->layers().size(), 2u);

  EXPECT_EQ(w->embed_tokens().shape, (std::vector<int64_t>{12, 8}));
  EXPECT_EQ(At(w->embed_tokens(), 5), Written(written, "model.embed_tokens.weight", 5));
  const LayerWeights& l1 = w->layer(1);
  EXPECT_EQ(l1.q_proj.name, "model.layers.1.self_attn.q_proj.weight");
  EXPECT_EQ(l1.q_proj.shape, (std::vector<int64_t>{8, 8}));
  EXPECT_EQ(l1.k_proj.shape, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(l1.v_proj.shape, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(l1.o_proj.shape, (std::vector<int64_t>{8, 8}));
  EXPECT_EQ(l1.gate_proj.shape, (std::vector<int64_t>{16, 8}));
  EXPECT_EQ(l1.up_proj.shape, (std::vector<int64_t>{16, 8}));
  EXPECT_EQ(l1.down_proj.shape, (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(l1.input_norm.shape, (std::vector<int64_t>{8}));
  EXPECT_EQ(l1.post_attention_norm.shape, (std::vector<int64_t>{8}));
  EXPECT_EQ(At(l1.k_proj, 31), Written(written, "model.layers.1.self_attn.k_proj.weight", 31));
  EXPECT_EQ(At(l1.down_proj, 100), Written(written, "model.layers.1.mlp.down_proj.weight", 100));
  EXPECT_EQ(At(w->layer(0).post_attention_norm, 7),
            Written(written, "model.layers.0.post_attention_layernorm.weight", 7));
  EXPECT_FALSE(l1.q_bias.has_value());
  EXPECT_FALSE(l1.o_bias.has_value());
  EXPECT_FALSE(l1.q_norm.has_value());
  EXPECT_EQ(At(w->final_norm(), 3), Written(written, "model.norm.weight", 3));
  EXPECT_EQ(w->lm_head().name, "lm_head.weight");
  EXPECT_EQ(At(w->lm_head(), 95), Written(written, "lm_head.weight", 95));
  EXPECT_NE(w->lm_head().data, w->embed_tokens().data);

  // 1 embedding + 9 per layer + final norm + lm_head; inv_freq is not a weight.
  EXPECT_EQ(w->tensors().size(), 1u + 2 * 9 + 1 + 1);
  EXPECT_EQ(w->total_bytes(), static_cast<size_t>(w->config().num_parameters()) * 4);
}

TEST(ModelWeightsTest, TiedEmbeddingsServeAsTheLmHead) {
  TempDir dir;
  TinyModel model;
  model.tie = true;
  model.write(dir, "BF16");
  Result<ModelWeights> w = ModelWeights::load(dir.path());
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ(w->lm_head().data, w->embed_tokens().data);
  EXPECT_EQ(w->lm_head().shape, (std::vector<int64_t>{12, 8}));
  EXPECT_EQ(w->tensors().size(), 1u + 2 * 9 + 1);
}

TEST(ModelWeightsTest, AMissingLmHeadOfAnUntiedModelIsNamed) {
  TempDir dir;
  TinyModel model;
  model.write(dir, "F32", [](std::vector<TestTensor> all) {
    all.pop_back();  // lm_head.weight
    return all;
  });
  ExpectError(ModelWeights::load(dir.path()).status(), StatusCode::kInvalidProgram,
              {dir.path().string(), "lm_head.weight", "[12, 8]", "tie_word_embeddings"});
}

TEST(ModelWeightsTest, Qwen2BindsItsQkvBiases) {
  TempDir dir;
  TinyModel model;
  model.architecture = "Qwen2ForCausalLM";
  model.write(dir, "BF16");
  const std::vector<TestTensor> written = model.tensors("BF16");
  Result<ModelWeights> w = ModelWeights::load(dir.path());
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  const LayerWeights& l0 = w->layer(0);
  ASSERT_TRUE(l0.q_bias.has_value());
  ASSERT_TRUE(l0.k_bias.has_value());
  ASSERT_TRUE(l0.v_bias.has_value());
  EXPECT_FALSE(l0.o_bias.has_value());
  EXPECT_EQ(l0.q_bias->shape, (std::vector<int64_t>{8}));
  EXPECT_EQ(l0.k_bias->shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(At(*l0.v_bias, 2), Written(written, "model.layers.0.self_attn.v_proj.bias", 2));
  EXPECT_EQ(l0.q_proj.dtype, DType::kBF16);
  EXPECT_EQ(l0.q_bias->dtype, DType::kF32);
}

TEST(ModelWeightsTest, AMissingRequiredBiasIsNamed) {
  TempDir dir;
  TinyModel model;
  model.architecture = "Qwen2ForCausalLM";
  model.write(dir, "F32", [](std::vector<TestTensor> all) {
    std::erase_if(
        all, [](const TestTensor& t) { return t.name == "model.layers.1.self_attn.k_proj.bias"; });
    return all;
  });
  ExpectError(ModelWeights::load(dir.path()).status(), StatusCode::kInvalidProgram,
              {"missing tensor", "model.layers.1.self_attn.k_proj.bias", "[4]"});
}

TEST(ModelWeightsTest, Qwen3BindsQkNormsOverAnExplicitHeadDim) {
  TempDir dir;
  TinyModel model;
  model.architecture = "Qwen3ForCausalLM";
  model.head_dim = 6;  // q_dim 12 != hidden 8
  model.write_head_dim = true;
  model.write(dir, "F16");
  const std::vector<TestTensor> written = model.tensors("F16");
  Result<ModelWeights> w = ModelWeights::load(dir.path());
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  const LayerWeights& l1 = w->layer(1);
  EXPECT_EQ(l1.q_proj.shape, (std::vector<int64_t>{12, 8}));
  EXPECT_EQ(l1.k_proj.shape, (std::vector<int64_t>{6, 8}));
  EXPECT_EQ(l1.o_proj.shape, (std::vector<int64_t>{8, 12}));
  ASSERT_TRUE(l1.q_norm.has_value());
  ASSERT_TRUE(l1.k_norm.has_value());
  EXPECT_EQ(l1.q_norm->shape, (std::vector<int64_t>{6}));
  EXPECT_EQ(At(*l1.k_norm, 5), Written(written, "model.layers.1.self_attn.k_norm.weight", 5));
  EXPECT_EQ(l1.q_proj.dtype, DType::kF16);
  EXPECT_EQ(At(l1.q_proj, 11), Written(written, "model.layers.1.self_attn.q_proj.weight", 11));
}

TEST(ModelWeightsTest, AWrongShapeNamesTheTensorAndBothShapes) {
  TempDir dir;
  TinyModel model;
  model.write(dir, "F32", [](std::vector<TestTensor> all) {
    for (TestTensor& t : all) {
      if (t.name == "model.layers.0.mlp.up_proj.weight") t.shape = {8, 16};  // transposed
    }
    return all;
  });
  ExpectError(
      ModelWeights::load(dir.path()).status(), StatusCode::kInvalidProgram,
      {(dir / "model.safetensors").string() + ": tensor 'model.layers.0.mlp.up_proj.weight'",
       "has shape [8, 16]", "expected [16, 8]", "config.json"});
}

TEST(ModelWeightsTest, LoadsShardedCheckpointsWithMixedDtypes) {
  TempDir dir;
  TinyModel model;
  write_file(dir / "config.json", model.config_json());
  std::vector<TestTensor> all = model.tensors("BF16");
  std::vector<TestTensor> first(all.begin(), all.begin() + 10);
  std::vector<TestTensor> second(all.begin() + 10, all.end());
  std::string index = "{\"weight_map\": {";
  for (size_t n = 0; n < all.size(); ++n) {
    if (n > 0) index += ", ";
    index += "\"" + all[n].name + "\": \"" +
             (n < 10 ? "model-1.safetensors" : "model-2.safetensors") + "\"";
  }
  index += "}}";
  for (auto* shard : {&first, &second}) {
    std::stable_partition(shard->begin(), shard->end(),
                          [](const TestTensor& t) { return t.dtype == "F32"; });
  }
  write_file(dir / "model-1.safetensors", safetensors_bytes(first));
  write_file(dir / "model-2.safetensors", safetensors_bytes(second));
  write_file(dir / "model.safetensors.index.json", index);

  Result<ModelWeights> w = ModelWeights::load(dir.path());
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ(w->embed_tokens().dtype, DType::kBF16);
  EXPECT_EQ(w->layer(1).input_norm.dtype, DType::kF32);
  EXPECT_EQ(At(w->layer(1).gate_proj, 17), Written(all, "model.layers.1.mlp.gate_proj.weight", 17));
  EXPECT_EQ(At(w->lm_head(), 1), Written(all, "lm_head.weight", 1));
}

TEST(ModelWeightsTest, AnAbsentFolderIsNamedAsTheFolder) {
  TempDir dir;
  ExpectError(ModelWeights::load(dir / "absent").status(), StatusCode::kNotFound,
              {(dir / "absent").string() + ": the model folder does not exist"});
}

TEST(ModelWeightsTest, MissingFilesAreNamed) {
  TempDir dir;
  ExpectError(ModelWeights::load(dir.path()).status(), StatusCode::kNotFound, {"config.json"});
  write_file(dir / "config.json", TinyModel().config_json());
  ExpectError(ModelWeights::load(dir.path()).status(), StatusCode::kNotFound,
              {"model.safetensors"});
  write_file(dir / "config.json", "{\"architectures\": [\"BertModel\"]}");
  ExpectError(ModelWeights::load(dir.path()).status(), StatusCode::kNotSupported,
              {"config.json", "BertModel"});
}

TEST(ModelWeightsTest, ViewsOutliveTheOriginalWhenCopiedOrMoved) {
  TempDir dir;
  TinyModel model;
  model.write(dir, "F32");
  const std::vector<TestTensor> written = model.tensors("F32");
  std::optional<ModelWeights> copy;
  {
    Result<ModelWeights> w = ModelWeights::load(dir.path());
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    ModelWeights moved = std::move(w).value();
    copy.emplace(moved);
  }
  EXPECT_EQ(At(copy->layer(0).q_proj, 9),
            Written(written, "model.layers.0.self_attn.q_proj.weight", 9));
}

TEST(ModelWeightsTest, BadSafetensorsSurfaceThroughLoadNamingTheFile) {
  TempDir dir;
  TinyModel model;
  model.write(dir, "F32");
  const std::filesystem::path file = dir / "model.safetensors";
  const uintmax_t size = std::filesystem::file_size(file);
  std::filesystem::resize_file(file, size - 3);
  ExpectError(ModelWeights::load(dir.path()).status(), StatusCode::kInvalidProgram,
              {file.string(), "truncated"});

  model.write(dir, "F32", [](std::vector<TestTensor> all) {
    all.push_back(TestTensor{"model.extra.positions", "I64", {1}, std::string(8, '\0')});
    return all;
  });
  ExpectError(ModelWeights::load(dir.path()).status(), StatusCode::kNotSupported,
              {file.string(), "model.extra.positions", "I64"});
}

TEST(ModelWeightsTest, ATiedModelIgnoresAStoredLmHead) {
  TempDir dir;
  TinyModel model;
  model.tie = true;
  model.write(dir, "F32", [](std::vector<TestTensor> all) {
    all.push_back(counting_tensor("lm_head.weight", "F32", {12, 8}, -1.0f));
    return all;
  });
  Result<ModelWeights> w = ModelWeights::load(dir.path());
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ(w->lm_head().data, w->embed_tokens().data);
}

ModelConfig TinyConfig(Architecture arch, bool tie) {
  ModelSpec spec;
  spec.architecture = arch;
  spec.hidden_size = 64;
  spec.num_hidden_layers = 3;
  spec.num_attention_heads = 4;
  spec.num_key_value_heads = 2;
  spec.head_dim = 16;
  spec.intermediate_size = 96;
  spec.vocab_size = 100;
  spec.max_position_embeddings = 128;
  spec.tie_word_embeddings = tie;
  spec.qkv_bias = arch == Architecture::kQwen2;
  spec.qk_norm = arch == Architecture::kQwen3;
  Result<ModelConfig> c = ModelConfig::from_spec(spec, "tiny");
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return *c;
}

TEST(ModelWeightsRandomTest, BuildsEveryWeightWithRealShapesInTheRequestedDtype) {
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    const ModelConfig config = TinyConfig(Architecture::kQwen2, false);
    const ModelWeights w = ModelWeights::random(config, dtype, 7);
    EXPECT_EQ(w.total_bytes(),
              static_cast<size_t>(config.num_parameters()) * dtype_size_bytes(dtype));
    for (const TensorView* view : w.tensors()) {
      EXPECT_EQ(view->dtype, dtype) << view->name;
      EXPECT_EQ(view->nbytes, static_cast<size_t>(view->numel()) * dtype_size_bytes(dtype));
      EXPECT_EQ(reinterpret_cast<uintptr_t>(view->data) % 64, 0u) << view->name;
    }
    EXPECT_EQ(w.layer(2).q_proj.shape, (std::vector<int64_t>{64, 64}));
    EXPECT_EQ(w.layer(2).k_proj.shape, (std::vector<int64_t>{32, 64}));
    ASSERT_TRUE(w.layer(2).k_bias.has_value());
    EXPECT_EQ(w.layer(2).k_bias->shape, (std::vector<int64_t>{32}));
    EXPECT_EQ(w.lm_head().name, "lm_head.weight");
  }
}

TEST(ModelWeightsRandomTest, ValuesAreDeterministicInTheSeedAndWithinTheirRanges) {
  const ModelConfig config = TinyConfig(Architecture::kQwen3, true);
  const ModelWeights a = ModelWeights::random(config, DType::kF32, 42);
  const ModelWeights b = ModelWeights::random(config, DType::kF32, 42);
  const ModelWeights c = ModelWeights::random(config, DType::kF32, 43);
  const std::vector<const TensorView*> ta = a.tensors(), tb = b.tensors(), tc = c.tensors();
  ASSERT_EQ(ta.size(), tb.size());
  for (size_t i = 0; i < ta.size(); ++i) {
    EXPECT_EQ(std::memcmp(ta[i]->data, tb[i]->data, ta[i]->nbytes), 0) << ta[i]->name;
    EXPECT_NE(std::memcmp(ta[i]->data, tc[i]->data, ta[i]->nbytes), 0) << ta[i]->name;
  }
  EXPECT_EQ(a.lm_head().data, a.embed_tokens().data);
  ASSERT_TRUE(a.layer(0).q_norm.has_value());

  // Norms near 1, linear weights within sqrt(3 / in_features), and not constant.
  const TensorView& norm = a.layer(1).input_norm;
  for (int64_t i = 0; i < norm.numel(); ++i) {
    EXPECT_GE(At(norm, i), 0.9f);
    EXPECT_LE(At(norm, i), 1.1f);
  }
  const TensorView& down = a.layer(1).down_proj;  // in_features 96
  const float bound = std::sqrt(3.0f / 96.0f);
  double sum_squares = 0;
  for (int64_t i = 0; i < down.numel(); ++i) {
    ASSERT_LE(std::fabs(At(down, i)), bound);
    sum_squares += At(down, i) * At(down, i);
  }
  const double variance = sum_squares / static_cast<double>(down.numel());
  EXPECT_NEAR(variance, 1.0 / 96.0, 0.2 / 96.0);
  // Different tensors get different streams.
  EXPECT_NE(
      std::memcmp(a.layer(0).gate_proj.data, a.layer(0).up_proj.data, a.layer(0).gate_proj.nbytes),
      0);
}

TEST(ModelWeightsRandomTest, ThePresetOf110mBuildsItsFullSizeInBf16) {
  Result<ModelConfig> config = ModelConfig::preset("110m");
  ASSERT_TRUE(config.ok());
  const ModelWeights w = ModelWeights::random(*config, DType::kBF16, 1);
  EXPECT_EQ(w.total_bytes(), static_cast<size_t>(config->num_parameters()) * 2);
  EXPECT_EQ(w.layers().size(), 12u);
  EXPECT_EQ(w.lm_head().shape, (std::vector<int64_t>{32000, 768}));
  EXPECT_NE(w.lm_head().data, w.embed_tokens().data);
}

}  // namespace
}  // namespace cellm
