#include "gguf_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <optional>
#include <vector>

namespace cellm {
namespace {

Result<Architecture> gguf_architecture(const std::string& name, std::string_view source) {
  if (name == "llama") return Architecture::kLlama;
  if (name == "qwen2") return Architecture::kQwen2;
  if (name == "qwen3") return Architecture::kQwen3;
  return NotSupported(std::string(source) + ": general.architecture '" + name +
                      "' is not supported (supported: llama, qwen2, qwen3)");
}

// The llama3 divisor of a frequency of wavelength `wavelen`.
double llama3_divisor(double wavelen, const RopeScaling& s) {
  const double low_wavelen =
      static_cast<double>(s.original_max_position_embeddings) / s.low_freq_factor;
  const double high_wavelen =
      static_cast<double>(s.original_max_position_embeddings) / s.high_freq_factor;
  if (wavelen < high_wavelen) return 1.0;
  if (wavelen > low_wavelen) return s.factor;
  const double smooth =
      (static_cast<double>(s.original_max_position_embeddings) / wavelen - s.low_freq_factor) /
      (s.high_freq_factor - s.low_freq_factor);
  return 1.0 / ((1.0 - smooth) / s.factor + smooth);
}

// Reads the llama3 parameters back from the divisors of rope_freqs.weight.
Result<RopeScaling> llama3_from_divisors(const float* divisors, int64_t half, double theta,
                                         std::optional<int64_t> original_context,
                                         std::string_view source) {
  RopeScaling s;
  double factor = 1.0;
  for (int64_t i = 0; i < half; ++i) factor = std::max(factor, double{divisors[i]});
  if (factor == 1.0) return s;  // all ones: no scaling
  s.type = RopeScalingType::kLlama3;
  s.factor = factor;
  s.low_freq_factor = 1.0;
  s.high_freq_factor = 4.0;
  std::vector<double> wavelens(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const double inv_freq =
        std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(2 * half));
    wavelens[static_cast<size_t>(i)] = 2.0 * std::numbers::pi / inv_freq;
  }
  // A band between the two ends gives the original context; else the metadata's.
  std::optional<double> context;
  for (int64_t i = 0; i < half && !context; ++i) {
    const double r = divisors[i];
    if (r > 1.0 + 1e-6 && r < factor * (1.0 - 1e-6)) {
      const double smooth = (1.0 / r - 1.0 / factor) / (1.0 - 1.0 / factor);
      context = wavelens[static_cast<size_t>(i)] *
                (s.low_freq_factor + smooth * (s.high_freq_factor - s.low_freq_factor));
    }
  }
  s.original_max_position_embeddings =
      context ? static_cast<int64_t>(std::llround(*context)) : original_context.value_or(8192);
  for (int64_t i = 0; i < half; ++i) {
    const double expected = llama3_divisor(wavelens[static_cast<size_t>(i)], s);
    if (std::abs(expected - divisors[i]) > 1e-3 * expected) {
      return NotSupported(std::string(source) +
                          ": rope_freqs.weight does not follow the llama3 rope scaling "
                          "(low_freq_factor 1, high_freq_factor 4): divisor " +
                          std::to_string(i) + " is " + std::to_string(divisors[i]) + ", expected " +
                          std::to_string(expected));
    }
  }
  return s;
}

DType dtype_name_hint(const GgufTensorInfo* t, std::string& name) {
  name.clear();
  if (t == nullptr) return DType::kF32;
  switch (t->type.type) {
    case GgmlType::kBF16:
      name = "bfloat16";
      return DType::kBF16;
    case GgmlType::kF16:
      name = "float16";
      return DType::kF16;
    case GgmlType::kF32:
      name = "float32";
      return DType::kF32;
    default:
      return DType::kF32;
  }
}

}  // namespace

Result<ModelConfig> gguf_model_config(const GgufParsed& file, const float* rope_freqs,
                                      std::string_view source) {
  const GgufMetadata& m = file.metadata;
  const auto missing = [&](const std::string& key) {
    return InvalidProgram(std::string(source) + ": missing metadata '" + key + "'");
  };
  CELLM_ASSIGN_OR_RETURN(std::optional<std::string> arch_name,
                         m.get_string("general.architecture"));
  if (!arch_name) return missing("general.architecture");
  ModelSpec spec;
  CELLM_ASSIGN_OR_RETURN(spec.architecture, gguf_architecture(*arch_name, source));
  const std::string a = *arch_name + ".";
  const auto required = [&](const std::string& key) -> Result<int64_t> {
    CELLM_ASSIGN_OR_RETURN(std::optional<int64_t> v, m.get_int(a + key));
    if (!v) return missing(a + key);
    return *v;
  };
  CELLM_ASSIGN_OR_RETURN(spec.hidden_size, required("embedding_length"));
  CELLM_ASSIGN_OR_RETURN(spec.num_hidden_layers, required("block_count"));
  CELLM_ASSIGN_OR_RETURN(spec.intermediate_size, required("feed_forward_length"));
  CELLM_ASSIGN_OR_RETURN(spec.num_attention_heads, required("attention.head_count"));
  CELLM_ASSIGN_OR_RETURN(spec.max_position_embeddings, required("context_length"));
  CELLM_ASSIGN_OR_RETURN(std::optional<int64_t> kv_heads, m.get_int(a + "attention.head_count_kv"));
  spec.num_key_value_heads = kv_heads.value_or(spec.num_attention_heads);
  CELLM_ASSIGN_OR_RETURN(std::optional<int64_t> key_length, m.get_int(a + "attention.key_length"));
  CELLM_ASSIGN_OR_RETURN(std::optional<int64_t> value_length,
                         m.get_int(a + "attention.value_length"));
  if (key_length) {
    spec.head_dim = *key_length;
  } else if (spec.num_attention_heads > 0) {
    spec.head_dim = spec.hidden_size / spec.num_attention_heads;
  }
  if (value_length && *value_length != spec.head_dim) {
    return NotSupported(std::string(source) + ": " + a + "attention.value_length " +
                        std::to_string(*value_length) + " differs from the key length " +
                        std::to_string(spec.head_dim));
  }
  CELLM_ASSIGN_OR_RETURN(std::optional<int64_t> rope_dims, m.get_int(a + "rope.dimension_count"));
  if (rope_dims && *rope_dims != spec.head_dim) {
    return NotSupported(std::string(source) + ": " + a + "rope.dimension_count " +
                        std::to_string(*rope_dims) + " is not the head dim " +
                        std::to_string(spec.head_dim) + " (partial rotary is not supported)");
  }
  CELLM_ASSIGN_OR_RETURN(std::optional<double> eps,
                         m.get_real(a + "attention.layer_norm_rms_epsilon"));
  if (!eps) return missing(a + "attention.layer_norm_rms_epsilon");
  spec.rms_norm_eps = *eps;
  CELLM_ASSIGN_OR_RETURN(std::optional<double> theta, m.get_real(a + "rope.freq_base"));
  spec.rope_theta = theta.value_or(10000.0);
  CELLM_ASSIGN_OR_RETURN(std::optional<std::string> scaling, m.get_string(a + "rope.scaling.type"));
  if (scaling && *scaling != "none") {
    return NotSupported(std::string(source) + ": " + a + "rope.scaling.type '" + *scaling +
                        "' is not supported (supported: none, and llama3 frequency factors)");
  }
  if (rope_freqs != nullptr) {
    if (spec.head_dim <= 0 || spec.head_dim % 2 != 0 || spec.rope_theta <= 0.0) {
      return InvalidProgram(std::string(source) + ": rope_freqs.weight needs an even head dim");
    }
    CELLM_ASSIGN_OR_RETURN(std::optional<int64_t> original,
                           m.get_int(a + "rope.scaling.original_context_length"));
    CELLM_ASSIGN_OR_RETURN(
        spec.rope_scaling,
        llama3_from_divisors(rope_freqs, spec.head_dim / 2, spec.rope_theta, original, source));
  }

  const GgufTensorInfo* embedding = file.find("token_embd.weight");
  if (embedding == nullptr) {
    return InvalidProgram(std::string(source) + ": missing tensor 'token_embd.weight'");
  }
  CELLM_ASSIGN_OR_RETURN(std::optional<int64_t> vocab, m.get_int(a + "vocab_size"));
  spec.vocab_size = vocab.value_or(embedding->shape().front());
  dtype_name_hint(embedding, spec.torch_dtype);
  spec.tie_word_embeddings = file.find("output.weight") == nullptr;
  spec.qkv_bias = spec.architecture == Architecture::kQwen2 || file.find("blk.0.attn_q.bias");
  spec.o_bias = file.find("blk.0.attn_output.bias") != nullptr;
  spec.qk_norm = spec.architecture == Architecture::kQwen3;

  const auto token = [&](const char* key) -> Result<std::optional<Token>> {
    CELLM_ASSIGN_OR_RETURN(std::optional<int64_t> id, m.get_int(key));
    if (!id) return std::optional<Token>();
    if (*id < 0 || *id > std::numeric_limits<Token>::max()) {
      return InvalidProgram(std::string(source) + ": " + key + " " + std::to_string(*id) +
                            " is out of range");
    }
    return std::optional<Token>(static_cast<Token>(*id));
  };
  CELLM_ASSIGN_OR_RETURN(spec.bos_token_id, token("tokenizer.ggml.bos_token_id"));
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"}) {
    CELLM_ASSIGN_OR_RETURN(std::optional<Token> id, token(key));
    if (id && std::find(spec.eos_token_ids.begin(), spec.eos_token_ids.end(), *id) ==
                  spec.eos_token_ids.end()) {
      spec.eos_token_ids.push_back(*id);
    }
  }
  return ModelConfig::from_spec(std::move(spec), source);
}

std::string gguf_tensor_name(std::string_view hf) {
  static constexpr std::pair<std::string_view, std::string_view> kTop[] = {
      {"model.embed_tokens.weight", "token_embd.weight"},
      {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"},
  };
  for (const auto& [from, to] : kTop) {
    if (hf == from) return std::string(to);
  }
  static constexpr std::string_view kLayers = "model.layers.";
  if (hf.substr(0, kLayers.size()) != kLayers) return "";
  const std::string_view rest = hf.substr(kLayers.size());
  const size_t dot = rest.find('.');
  if (dot == std::string_view::npos) return "";
  const std::string_view index = rest.substr(0, dot);
  const std::string_view leaf = rest.substr(dot + 1);
  static constexpr std::pair<std::string_view, std::string_view> kLayer[] = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.o_proj.bias", "attn_output.bias"},
      {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
  };
  for (const auto& [from, to] : kLayer) {
    if (leaf == from) return "blk." + std::string(index) + "." + std::string(to);
  }
  return "";
}

bool gguf_permutes_qk(Architecture arch) {
  return arch == Architecture::kLlama || arch == Architecture::kMistral;
}

void unpermute_qk_rows(const std::byte* stored, std::byte* out, int64_t rows, size_t row_bytes,
                       int64_t heads) {
  // REQUIRES: whole heads of an even number of rows.
  CELLM_CHECK(heads > 0 && rows % (2 * heads) == 0);
  const int64_t head_rows = rows / heads;
  const int64_t half = head_rows / 2;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t t = 0; t < 2; ++t) {
      for (int64_t j = 0; j < half; ++j) {
        const int64_t original = h * head_rows + t * half + j;
        const int64_t at = h * head_rows + 2 * j + t;
        std::memcpy(out + static_cast<size_t>(original) * row_bytes,
                    stored + static_cast<size_t>(at) * row_bytes, row_bytes);
      }
    }
  }
}

}  // namespace cellm
