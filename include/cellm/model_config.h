// ModelConfig: the validated, immutable description of a decoder-only transformer,
// parsed once from a Hugging Face config.json (or built from a ModelSpec for
// presets and tests). Derived values (q/kv widths, group size, per-layer window)
// are computed once at construction.
//
// Supported architectures (architectures[0] in config.json):
//   LlamaForCausalLM   optional attention_bias (q/k/v/o), Llama 3.1 "llama3" rope scaling
//   MistralForCausalLM sliding_window on every layer (null = full attention)
//   Qwen2ForCausalLM   q/k/v bias always; use_sliding_window + max_window_layers
//   Qwen3ForCausalLM   q/k RMSNorm over head_dim, explicit head_dim, attention_bias
// `layer_types` ("full_attention" / "sliding_attention"), when present, decides
// which layers use the window for Mistral, Qwen2 and Qwen3.
//
// Every error names the source (the config.json path) and the field.
// Thread-safety: immutable after construction; share freely.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cellm/status.h"
#include "cellm/types.h"

namespace cellm {

enum class Architecture { kLlama, kMistral, kQwen2, kQwen3 };

// The Hugging Face class name: "LlamaForCausalLM", ...
const char* to_string(Architecture arch);

enum class RopeScalingType {
  kNone,    // plain RoPE: inv_freq[i] = rope_theta^(-2i / head_dim)
  kLlama3,  // Llama 3.1: long wavelengths divided by factor, smooth blend in between
};

// Parameters of the "llama3" rope type (transformers' _compute_llama3_parameters).
// Ignored when type is kNone.
struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// The primary fields of a model, as plain values: what config.json says, or what
// a preset or a test wants. ModelConfig::from_spec validates it.
struct ModelSpec {
  Architecture architecture = Architecture::kLlama;
  int64_t hidden_size = 0;  // d_model
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;  // query heads
  int64_t num_key_value_heads = 0;  // kv heads; divides num_attention_heads
  int64_t head_dim = 0;             // per-head width; even (RoPE rotates pairs)
  int64_t intermediate_size = 0;    // SwiGLU width
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;  // lm_head is the token embedding
  bool qkv_bias = false;             // q_proj, k_proj, v_proj carry a bias
  bool o_bias = false;               // o_proj carries a bias
  bool qk_norm = false;              // RMSNorm over head_dim on q and k (Qwen3)
  // Sliding-window width in tokens per layer (0 = full history). Empty means every
  // layer attends its full history; otherwise it has num_hidden_layers entries.
  std::vector<int64_t> layer_windows;
  std::optional<Token> bos_token_id;
  std::vector<Token> eos_token_ids;
  std::string torch_dtype;  // as written ("bfloat16", "float16", "float32"), "" if absent
};

class ModelConfig {
 public:
  // Reads and validates `path` (a config.json).
  static Result<ModelConfig> load(const std::filesystem::path& path);
  // Parses config.json text; `source` names it in errors (usually its path).
  static Result<ModelConfig> parse(std::string_view json_text, std::string_view source);
  // Validates a spec built in code; `source` names it in errors.
  static Result<ModelConfig> from_spec(ModelSpec spec, std::string_view source = "model spec");
  // Random-weight presets with real shapes: "110m", "1b" (Llama-3.2-1B), "8b"
  // (Llama-3.1-8B). Unknown names give InvalidArgument listing the known ones.
  static Result<ModelConfig> preset(std::string_view name);

  const ModelSpec& spec() const { return spec_; }
  const std::string& source() const { return source_; }

  Architecture architecture() const { return spec_.architecture; }
  int64_t hidden_size() const { return spec_.hidden_size; }
  int64_t num_layers() const { return spec_.num_hidden_layers; }
  int64_t num_heads() const { return spec_.num_attention_heads; }
  int64_t num_kv_heads() const { return spec_.num_key_value_heads; }
  int64_t head_dim() const { return spec_.head_dim; }
  int64_t intermediate_size() const { return spec_.intermediate_size; }
  int64_t vocab_size() const { return spec_.vocab_size; }
  int64_t max_position_embeddings() const { return spec_.max_position_embeddings; }
  double rms_norm_eps() const { return spec_.rms_norm_eps; }
  double rope_theta() const { return spec_.rope_theta; }
  const RopeScaling& rope_scaling() const { return spec_.rope_scaling; }
  bool tie_word_embeddings() const { return spec_.tie_word_embeddings; }
  bool qkv_bias() const { return spec_.qkv_bias; }
  bool o_bias() const { return spec_.o_bias; }
  bool qk_norm() const { return spec_.qk_norm; }
  const std::optional<Token>& bos_token_id() const { return spec_.bos_token_id; }
  const std::vector<Token>& eos_token_ids() const { return spec_.eos_token_ids; }
  const std::string& torch_dtype() const { return spec_.torch_dtype; }

  // Derived, computed once.
  int64_t q_dim() const { return q_dim_; }    // num_heads * head_dim
  int64_t kv_dim() const { return kv_dim_; }  // num_kv_heads * head_dim
  int64_t num_queries_per_kv() const {
    return spec_.num_attention_heads / spec_.num_key_value_heads;
  }
  // Sliding-window width of `layer` in tokens; 0 = full history.
  // REQUIRES: 0 <= layer < num_layers().
  int64_t window(int64_t layer) const;
  // Per-layer windows, num_layers() entries (0 = full history).
  const std::vector<int64_t>& windows() const { return windows_; }
  bool has_sliding_window() const;
  // Parameters in the weights (embedding counted once when tied).
  int64_t num_parameters() const;

 private:
  ModelConfig() = default;

  ModelSpec spec_;
  std::string source_;
  int64_t q_dim_ = 0;
  int64_t kv_dim_ = 0;
  std::vector<int64_t> windows_;
};

}  // namespace cellm
