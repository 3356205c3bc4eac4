#include "cellm/model_config.h"

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "model_test_files.h"

namespace cellm {
namespace {

using testing::TempDir;
using testing::write_file;

void ExpectError(const Status& status, StatusCode code, std::initializer_list<std::string> parts) {
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), code) << status.to_string();
  for (const std::string& part : parts) {
    EXPECT_NE(status.message().find(part), std::string::npos)
        << "'" << part << "' not in: " << status.message();
  }
}

Result<ModelConfig> Parse(const std::string& json) {
  return ModelConfig::parse(json, "cfg.json");
}

// config.json of meta-llama/Llama-3.2-1B (transformers 4.45).
const char* kLlama32 = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})";

TEST(ModelConfigTest, ParsesLlama32WithLlama3RopeScalingAndTiedEmbeddings) {
  Result<ModelConfig> c = Parse(kLlama32);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture(), Architecture::kLlama);
  EXPECT_EQ(c->hidden_size(), 2048);
  EXPECT_EQ(c->num_layers(), 16);
  EXPECT_EQ(c->num_heads(), 32);
  EXPECT_EQ(c->num_kv_heads(), 8);
  EXPECT_EQ(c->head_dim(), 64);
  EXPECT_EQ(c->intermediate_size(), 8192);
  EXPECT_EQ(c->vocab_size(), 128256);
  EXPECT_EQ(c->max_position_embeddings(), 131072);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps(), 1e-5);
  EXPECT_DOUBLE_EQ(c->rope_theta(), 500000.0);
  EXPECT_EQ(c->rope_scaling().type, RopeScalingType::kLlama3);
  EXPECT_DOUBLE_EQ(c->rope_scaling().factor, 32.0);
  EXPECT_DOUBLE_EQ(c->rope_scaling().low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c->rope_scaling().high_freq_factor, 4.0);
  EXPECT_EQ(c->rope_scaling().original_max_position_embeddings, 8192);
  EXPECT_TRUE(c->tie_word_embeddings());
  EXPECT_FALSE(c->qkv_bias());
  EXPECT_FALSE(c->o_bias());
  EXPECT_FALSE(c->qk_norm());
  EXPECT_EQ(c->bos_token_id(), std::optional<Token>(128000));
  EXPECT_EQ(c->eos_token_ids(), (std::vector<Token>{128001}));
  EXPECT_EQ(c->torch_dtype(), "bfloat16");
  EXPECT_EQ(c->q_dim(), 2048);
  EXPECT_EQ(c->kv_dim(), 512);
  EXPECT_EQ(c->num_queries_per_kv(), 4);
  EXPECT_FALSE(c->has_sliding_window());
  EXPECT_EQ(c->windows(), std::vector<int64_t>(16, 0));
  EXPECT_EQ(c->num_parameters(), 1235814400);  // the published size of Llama-3.2-1B
  EXPECT_EQ(c->source(), "cfg.json");
}

TEST(ModelConfigTest, ReadsRopeThetaAndScalingFromRopeParameters) {
  Result<ModelConfig> c = Parse(R"({
    "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
    "vocab_size": 100, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "llama3", "rope_theta": 250000.0, "factor": 8.0,
                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 2048},
    "eos_token_id": [1, 7, 9], "bos_token_id": null, "dtype": "float16"})");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_DOUBLE_EQ(c->rope_theta(), 250000.0);
  EXPECT_EQ(c->rope_scaling().type, RopeScalingType::kLlama3);
  EXPECT_DOUBLE_EQ(c->rope_scaling().factor, 8.0);
  EXPECT_EQ(c->rope_scaling().original_max_position_embeddings, 2048);
  EXPECT_EQ(c->head_dim(), 16);  // hidden / heads when head_dim is absent
  EXPECT_FALSE(c->tie_word_embeddings());
  EXPECT_FALSE(c->bos_token_id().has_value());
  EXPECT_EQ(c->eos_token_ids(), (std::vector<Token>{1, 7, 9}));
  EXPECT_EQ(c->torch_dtype(), "float16");
}

TEST(ModelConfigTest, DefaultRopeParametersMeanPlainRope) {
  Result<ModelConfig> c = Parse(R"({
    "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 1,
    "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1234.0}})");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_DOUBLE_EQ(c->rope_theta(), 1234.0);
  EXPECT_EQ(c->rope_scaling().type, RopeScalingType::kNone);
  EXPECT_EQ(c->num_kv_heads(), 4);  // defaults to the query heads
  Result<ModelConfig> d = Parse(R"({
    "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 1,
    "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-6})");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_DOUBLE_EQ(d->rope_theta(), 10000.0);
  EXPECT_EQ(d->rope_scaling().type, RopeScalingType::kNone);
}

TEST(ModelConfigTest, LlamaAttentionBiasAddsQkvAndOutputBiases) {
  Result<ModelConfig> c = Parse(R"({
    "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 1,
    "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "attention_bias": true})");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_TRUE(c->qkv_bias());
  EXPECT_TRUE(c->o_bias());
}

// config.json of Qwen/Qwen3-0.6B.
const char* kQwen3 = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
  "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

TEST(ModelConfigTest, ParsesQwen3WithExplicitHeadDimAndQkNorm) {
  Result<ModelConfig> c = Parse(kQwen3);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture(), Architecture::kQwen3);
  EXPECT_EQ(c->head_dim(), 128);
  EXPECT_EQ(c->q_dim(), 2048);  // wider than hidden_size
  EXPECT_EQ(c->kv_dim(), 1024);
  EXPECT_TRUE(c->qk_norm());
  EXPECT_FALSE(c->qkv_bias());
  EXPECT_DOUBLE_EQ(c->rope_theta(), 1000000.0);
  EXPECT_EQ(c->rope_scaling().type, RopeScalingType::kNone);
  EXPECT_FALSE(c->has_sliding_window());
  EXPECT_TRUE(c->tie_word_embeddings());
  EXPECT_EQ(c->eos_token_ids(), (std::vector<Token>{151645}));
}

TEST(ModelConfigTest, Qwen2AlwaysHasQkvBiasButNoOutputBias) {
  Result<ModelConfig> c = Parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "hidden_size": 896, "num_hidden_layers": 24,
    "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864,
    "vocab_size": 151936, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "sliding_window": 32768, "use_sliding_window": false,
    "max_window_layers": 21, "tie_word_embeddings": true, "bos_token_id": 151643,
    "eos_token_id": 151643})");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture(), Architecture::kQwen2);
  EXPECT_TRUE(c->qkv_bias());
  EXPECT_FALSE(c->o_bias());
  EXPECT_FALSE(c->qk_norm());
  EXPECT_EQ(c->head_dim(), 64);
  EXPECT_FALSE(c->has_sliding_window());  // use_sliding_window is false
}

TEST(ModelConfigTest, QwenSlidingWindowAppliesFromMaxWindowLayersOn) {
  Result<ModelConfig> c = Parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
    "use_sliding_window": true, "sliding_window": 1024, "max_window_layers": 2})");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->windows(), (std::vector<int64_t>{0, 0, 1024, 1024}));
  EXPECT_EQ(c->window(1), 0);
  EXPECT_EQ(c->window(3), 1024);
  EXPECT_TRUE(c->has_sliding_window());

  ExpectError(Parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
    "use_sliding_window": true, "sliding_window": 1024})")
                  .status(),
              StatusCode::kInvalidProgram, {"cfg.json", "max_window_layers", "missing"});
}

TEST(ModelConfigTest, LayerTypesDecideWhichLayersSlide) {
  Result<ModelConfig> c = Parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 3,
    "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "use_sliding_window": true,
    "sliding_window": 16, "max_window_layers": 0,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]})");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->windows(), (std::vector<int64_t>{16, 0, 16}));

  ExpectError(Parse(R"({
    "architectures": ["MistralForCausalLM"], "hidden_size": 64, "num_hidden_layers": 3,
    "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "sliding_window": 16,
    "layer_types": ["sliding_attention", "full_attention"]})")
                  .status(),
              StatusCode::kInvalidProgram, {"cfg.json", "layer_types", "3"});
  ExpectError(Parse(R"({
    "architectures": ["MistralForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "sliding_window": 16,
    "layer_types": ["sliding_attention", "chunked_attention"]})")
                  .status(),
              StatusCode::kInvalidProgram, {"cfg.json", "layer_types[1]", "chunked_attention"});
}

TEST(ModelConfigTest, MistralSlidingWindowCoversEveryLayerAndNullMeansNone) {
  Result<ModelConfig> v01 = Parse(R"({
    "architectures": ["MistralForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
    "vocab_size": 32000, "max_position_embeddings": 32768, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": false,
    "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu"})");
  ASSERT_TRUE(v01.ok()) << v01.status().to_string();
  EXPECT_EQ(v01->architecture(), Architecture::kMistral);
  EXPECT_EQ(v01->windows(), std::vector<int64_t>(32, 4096));
  EXPECT_FALSE(v01->qkv_bias());

  Result<ModelConfig> v03 = Parse(R"({
    "architectures": ["MistralForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
    "vocab_size": 32768, "max_position_embeddings": 32768, "rms_norm_eps": 1e-5,
    "rope_theta": 1000000.0, "sliding_window": null, "head_dim": null})");
  ASSERT_TRUE(v03.ok()) << v03.status().to_string();
  EXPECT_FALSE(v03->has_sliding_window());
  EXPECT_EQ(v03->head_dim(), 128);

  ExpectError(Parse(R"({
    "architectures": ["MistralForCausalLM"], "hidden_size": 64, "num_hidden_layers": 1,
    "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "sliding_window": -5})")
                  .status(),
              StatusCode::kInvalidProgram, {"cfg.json", "sliding_window", "-5"});
}

TEST(ModelConfigTest, UnknownArchitecturesAreNotSupportedByName) {
  ExpectError(Parse(R"({"architectures": ["GPT2LMHeadModel"], "hidden_size": 64})").status(),
              StatusCode::kNotSupported, {"cfg.json", "GPT2LMHeadModel", "architectures[0]"});
  ExpectError(Parse(R"({"architectures": []})").status(), StatusCode::kInvalidProgram,
              {"cfg.json", "architectures"});
  ExpectError(Parse(R"({"hidden_size": 64})").status(), StatusCode::kInvalidProgram,
              {"cfg.json", "architectures", "missing"});
}

TEST(ModelConfigTest, ModelTypeStandsInForMissingArchitectures) {
  Result<ModelConfig> c = Parse(R"({
    "model_type": "mistral", "hidden_size": 64, "num_hidden_layers": 1,
    "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-6})");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture(), Architecture::kMistral);
}

const char* kTinyValid = R"({
    "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
    "vocab_size": 100, "max_position_embeddings": 512, "rms_norm_eps": 1e-6)";

// kTinyValid with one more field (or an override: a later duplicate key wins).
std::string TinyWith(const std::string& extra) {
  return std::string(kTinyValid) + (extra.empty() ? "" : ", " + extra) + "}";
}

TEST(ModelConfigTest, TheTinyBaselineParses) {
  ASSERT_TRUE(Parse(TinyWith("")).ok()) << Parse(TinyWith("")).status().to_string();
}

TEST(ModelConfigTest, MissingRequiredFieldsAreNamed) {
  for (const char* field :
       {"hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
        "vocab_size", "max_position_embeddings", "rms_norm_eps"}) {
    std::string json = TinyWith("");
    const std::string key = std::string("\"") + field + "\"";
    const size_t at = json.find(key);
    ASSERT_NE(at, std::string::npos);
    json.replace(at, key.size(), "\"renamed_" + std::string(field) + "\"");
    ExpectError(Parse(json).status(), StatusCode::kInvalidProgram,
                {"cfg.json", std::string(field) + ": missing required field"});
  }
}

TEST(ModelConfigTest, WronglyTypedFieldsAreNamedWithWhatWasFound) {
  std::string json = kTinyValid;
  json.replace(json.find("\"hidden_size\": 64"), 17, "\"hidden_size\": \"big\"");
  ExpectError(Parse(json + "}").status(), StatusCode::kInvalidProgram,
              {"cfg.json", "hidden_size", "expected an integer", "big"});
  ExpectError(Parse(TinyWith("\"tie_word_embeddings\": 1")).status(), StatusCode::kInvalidProgram,
              {"cfg.json", "tie_word_embeddings", "true or false"});
  ExpectError(Parse(TinyWith("\"rope_theta\": \"high\"")).status(), StatusCode::kInvalidProgram,
              {"cfg.json", "rope_theta", "number"});
  ExpectError(Parse(TinyWith("\"eos_token_id\": [2, \"x\"]")).status(), StatusCode::kInvalidProgram,
              {"cfg.json", "eos_token_id[1]"});
  ExpectError(Parse(TinyWith("\"rope_scaling\": 3")).status(), StatusCode::kInvalidProgram,
              {"cfg.json", "rope_scaling", "object"});
}

TEST(ModelConfigTest, NonPositiveSizesAndBadNumbersAreRejected) {
  std::string zero_layers = kTinyValid;
  zero_layers.replace(zero_layers.find("\"num_hidden_layers\": 2"), 22, "\"num_hidden_layers\": 0");
  ExpectError(Parse(zero_layers + "}").status(), StatusCode::kInvalidProgram,
              {"cfg.json", "num_hidden_layers", "positive", "0"});
  std::string negative_vocab = kTinyValid;
  negative_vocab.replace(negative_vocab.find("\"vocab_size\": 100"), 17, "\"vocab_size\": -1");
  ExpectError(Parse(negative_vocab + "}").status(), StatusCode::kInvalidProgram,
              {"cfg.json", "vocab_size", "positive"});
  ExpectError(Parse(TinyWith("\"head_dim\": 0")).status(), StatusCode::kInvalidProgram,
              {"cfg.json", "head_dim"});
  ExpectError(Parse(TinyWith("\"head_dim\": 7")).status(), StatusCode::kInvalidProgram,
              {"cfg.json", "head_dim", "even"});
  ExpectError(Parse(TinyWith("\"rope_theta\": -1")).status(), StatusCode::kInvalidProgram,
              {"cfg.json", "rope_theta", "positive"});
  ExpectError(Parse(TinyWith("\"eos_token_id\": 100")).status(), StatusCode::kInvalidProgram,
              {"cfg.json", "eos_token_id", "100", "vocabulary"});
}

// Found with the fuzz targets (tests/fuzz): every size within its own limit, but layers * hidden *
// intermediate overflowed int64 in num_parameters() (undefined behaviour).
TEST(ModelConfigTest, SizesWhoseParameterCountOverflowsAreRejected) {
  const char* huge = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 16777216,
      "num_hidden_layers": 65536, "num_attention_heads": 1, "intermediate_size": 16777216,
      "vocab_size": 16777216, "max_position_embeddings": 8, "rms_norm_eps": 1e-5})";
  ExpectError(Parse(huge).status(), StatusCode::kInvalidProgram,
              {"cfg.json", "parameters", "more than the limit", "hidden_size 16777216"});
  // The largest real models stay far below the bound.
  Result<ModelConfig> eight = ModelConfig::preset("8b");
  ASSERT_TRUE(eight.ok()) << eight.status().to_string();
  EXPECT_EQ(eight->num_parameters(), 8030261248);
}

// Found by the model_config fuzz target: a number past the range of a double
// threw nlohmann's out_of_range (not a parse_error) out of parse(): a crash.
TEST(ModelConfigTest, NumbersTooLargeForADoubleAreMalformedJsonNotACrash) {
  ExpectError(Parse(TinyWith("\"rope_theta\": 1e3082")).status(), StatusCode::kInvalidProgram,
              {"cfg.json", "malformed JSON", "number overflow", "1e3082"});
}

TEST(ModelConfigTest, HeadsThatDoNotDivideAreRejected) {
  std::string json = kTinyValid;
  json.replace(json.find("\"num_attention_heads\": 4"), 24, "\"num_attention_heads\": 5");
  ExpectError(Parse(json + "}").status(), StatusCode::kInvalidProgram,
              {"cfg.json", "num_attention_heads", "5", "hidden_size 64"});
  // An explicit head_dim lifts the hidden_size constraint.
  Result<ModelConfig> explicit_head =
      Parse(json + ", \"head_dim\": 16, \"num_key_value_heads\": 5}");
  ASSERT_TRUE(explicit_head.ok()) << explicit_head.status().to_string();
  EXPECT_EQ(explicit_head->q_dim(), 80);

  std::string kv = kTinyValid;
  kv.replace(kv.find("\"num_key_value_heads\": 2"), 24, "\"num_key_value_heads\": 3");
  ExpectError(Parse(kv + "}").status(), StatusCode::kInvalidProgram,
              {"cfg.json", "num_key_value_heads", "3", "num_attention_heads 4"});
}

TEST(ModelConfigTest, UnsupportedRopeTypesActivationsAndMlpBiasAreNotSupported) {
  ExpectError(Parse(TinyWith(R"("rope_scaling": {"rope_type": "yarn", "factor": 4.0})")).status(),
              StatusCode::kNotSupported, {"cfg.json", "rope_scaling.rope_type", "yarn"});
  ExpectError(Parse(TinyWith(R"("rope_scaling": {"type": "linear", "factor": 2.0})")).status(),
              StatusCode::kNotSupported, {"cfg.json", "rope_scaling.type", "linear"});
  ExpectError(Parse(TinyWith(R"("rope_parameters": {"rope_type": "dynamic"})")).status(),
              StatusCode::kNotSupported, {"cfg.json", "rope_parameters.rope_type", "dynamic"});
  ExpectError(Parse(TinyWith(R"("hidden_act": "gelu")")).status(), StatusCode::kNotSupported,
              {"cfg.json", "hidden_act", "gelu"});
  ExpectError(Parse(TinyWith(R"("mlp_bias": true)")).status(), StatusCode::kNotSupported,
              {"cfg.json", "mlp_bias"});
}

TEST(ModelConfigTest, Llama3ScalingNeedsAllItsParameters) {
  ExpectError(Parse(TinyWith(R"("rope_scaling": {"rope_type": "llama3", "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})"))
                  .status(),
              StatusCode::kInvalidProgram, {"cfg.json", "rope_scaling.factor", "missing"});
  ExpectError(
      Parse(TinyWith(R"("rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 4,
                          "high_freq_factor": 1, "original_max_position_embeddings": 8192})"))
          .status(),
      StatusCode::kInvalidProgram, {"cfg.json", "high_freq_factor"});
}

TEST(ModelConfigTest, MalformedJsonAndNonObjectsAreRejectedNamingTheSource) {
  ExpectError(Parse("{\"hidden_size\": 64,").status(), StatusCode::kInvalidProgram,
              {"cfg.json", "malformed JSON"});
  ExpectError(Parse("[1, 2]").status(), StatusCode::kInvalidProgram, {"cfg.json", "object"});
}

TEST(ModelConfigTest, LoadReadsTheFileAndNamesItInErrors) {
  TempDir dir;
  write_file(dir / "config.json", kQwen3);
  Result<ModelConfig> c = ModelConfig::load(dir / "config.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture(), Architecture::kQwen3);
  EXPECT_EQ(c->source(), (dir / "config.json").string());

  ExpectError(ModelConfig::load(dir / "absent.json").status(), StatusCode::kNotFound,
              {(dir / "absent.json").string()});
  write_file(dir / "broken.json", "{\"architectures\": [\"LlamaForCausalLM\"]");
  ExpectError(ModelConfig::load(dir / "broken.json").status(), StatusCode::kInvalidProgram,
              {(dir / "broken.json").string(), "malformed JSON"});
}

TEST(ModelConfigTest, PresetsHaveTheRealShapes) {
  Result<ModelConfig> small = ModelConfig::preset("110m");
  ASSERT_TRUE(small.ok()) << small.status().to_string();
  EXPECT_EQ(small->hidden_size(), 768);
  EXPECT_EQ(small->num_layers(), 12);
  EXPECT_EQ(small->num_heads(), 12);
  EXPECT_EQ(small->num_kv_heads(), 12);
  EXPECT_EQ(small->intermediate_size(), 2048);
  EXPECT_EQ(small->vocab_size(), 32000);
  EXPECT_FALSE(small->tie_word_embeddings());
  EXPECT_EQ(small->rope_scaling().type, RopeScalingType::kNone);

  Result<ModelConfig> one = ModelConfig::preset("1b");
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  Result<ModelConfig> parsed = Parse(kLlama32);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(one->num_parameters(), parsed->num_parameters());
  EXPECT_EQ(one->head_dim(), 64);
  EXPECT_TRUE(one->tie_word_embeddings());
  EXPECT_DOUBLE_EQ(one->rope_scaling().factor, 32.0);
  EXPECT_DOUBLE_EQ(one->rms_norm_eps(), 1e-5);

  Result<ModelConfig> eight = ModelConfig::preset("8b");
  ASSERT_TRUE(eight.ok()) << eight.status().to_string();
  EXPECT_EQ(eight->num_parameters(), 8030261248);  // the published size of Llama-3.1-8B
  EXPECT_EQ(eight->head_dim(), 128);
  EXPECT_EQ(eight->kv_dim(), 1024);
  EXPECT_FALSE(eight->tie_word_embeddings());
  EXPECT_DOUBLE_EQ(eight->rope_scaling().factor, 8.0);
  EXPECT_DOUBLE_EQ(eight->rope_theta(), 500000.0);
  EXPECT_EQ(eight->max_position_embeddings(), 131072);

  ExpectError(ModelConfig::preset("70b").status(), StatusCode::kInvalidArgument,
              {"70b", "110m", "1b", "8b"});
}

TEST(ModelConfigTest, FromSpecValidatesProgrammaticConfigs) {
  ModelSpec spec;
  spec.hidden_size = 32;
  spec.num_hidden_layers = 2;
  spec.num_attention_heads = 4;
  spec.num_key_value_heads = 2;
  spec.head_dim = 8;
  spec.intermediate_size = 64;
  spec.vocab_size = 50;
  spec.max_position_embeddings = 256;
  spec.layer_windows = {0, 16};
  Result<ModelConfig> c = ModelConfig::from_spec(spec, "tiny");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->window(1), 16);
  EXPECT_EQ(c->kv_dim(), 16);

  ModelSpec bad_windows = spec;
  bad_windows.layer_windows = {4};
  ExpectError(ModelConfig::from_spec(bad_windows, "tiny").status(), StatusCode::kInvalidProgram,
              {"tiny", "layer_windows", "1 entries"});
  ModelSpec no_head_dim = spec;
  no_head_dim.head_dim = 0;
  ExpectError(ModelConfig::from_spec(no_head_dim, "tiny").status(), StatusCode::kInvalidProgram,
              {"tiny", "head_dim", "positive"});
}

TEST(ModelConfigDeathTest, AskingForTheWindowOfALayerOutOfRangeIsABug) {
  Result<ModelConfig> c = ModelConfig::preset("110m");
  ASSERT_TRUE(c.ok());
  EXPECT_DEATH((void)c->window(12), "check failed");
}

}  // namespace
}  // namespace cellm
