#include "cellm/model_config.h"

#include <cmath>
#include <limits>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "json_fields.h"
#include "mapped_file.h"

namespace cellm {
namespace {

using nlohmann::json;

// Bounds that keep every product of sizes inside int64 and reject garbage early.
constexpr int64_t kMaxDimension = int64_t{1} << 24;
constexpr int64_t kMaxLayers = int64_t{1} << 16;
// Each size alone is bounded above, but their products are not: layers * hidden *
// intermediate can pass 2^63. A model has at most this many parameters (2^50,
// about 10^15, far beyond any real one), which keeps num_parameters() in int64.
constexpr double kMaxParameters = static_cast<double>(int64_t{1} << 50);

// The parameter count of num_parameters(), in any arithmetic type (double to
// check the bound without overflowing, int64_t once it holds).
template <typename T>
T parameter_count(const ModelSpec& spec) {
  const T h = static_cast<T>(spec.hidden_size);
  const T q_dim = static_cast<T>(spec.num_attention_heads) * static_cast<T>(spec.head_dim);
  const T kv_dim = static_cast<T>(spec.num_key_value_heads) * static_cast<T>(spec.head_dim);
  T per_layer = 2 * h                                              // input and post-attention norms
                + h * q_dim + 2 * h * kv_dim + q_dim * h           // q, k, v, o
                + 3 * h * static_cast<T>(spec.intermediate_size);  // gate, up, down
  if (spec.qkv_bias) per_layer += q_dim + 2 * kv_dim;
  if (spec.o_bias) per_layer += h;
  if (spec.qk_norm) per_layer += 2 * static_cast<T>(spec.head_dim);
  const T embeddings = static_cast<T>(spec.vocab_size) * h * (spec.tie_word_embeddings ? 1 : 2);
  return embeddings + static_cast<T>(spec.num_hidden_layers) * per_layer + h;
}

Status spec_error(std::string_view source, std::string_view field, const std::string& problem) {
  return InvalidProgram(std::string(source) + ": " + std::string(field) + ": " + problem);
}

Status check_positive(std::string_view source, std::string_view field, int64_t value,
                      int64_t limit) {
  if (value <= 0) {
    return spec_error(source, field, "must be positive, got " + std::to_string(value));
  }
  if (value > limit) {
    return spec_error(source, field,
                      std::to_string(value) + " exceeds the limit " + std::to_string(limit));
  }
  return Status::Ok();
}

Status check_positive_real(std::string_view source, std::string_view field, double value) {
  if (!std::isfinite(value) || value <= 0.0) {
    std::ostringstream os;
    os << "must be a positive finite number, got " << value;
    return spec_error(source, field, os.str());
  }
  return Status::Ok();
}

Result<Architecture> architecture_from_name(const std::string& name, std::string_view source,
                                            std::string_view field) {
  if (name == "LlamaForCausalLM" || name == "llama") return Architecture::kLlama;
  if (name == "MistralForCausalLM" || name == "mistral") return Architecture::kMistral;
  if (name == "Qwen2ForCausalLM" || name == "qwen2") return Architecture::kQwen2;
  if (name == "Qwen3ForCausalLM" || name == "qwen3") return Architecture::kQwen3;
  return NotSupported(std::string(source) + ": " + std::string(field) + ": architecture '" + name +
                      "' is not supported (supported: LlamaForCausalLM, MistralForCausalLM, "
                      "Qwen2ForCausalLM, Qwen3ForCausalLM)");
}

Result<Architecture> parse_architecture(const JsonFields& top) {
  if (const json* list = top.find("architectures")) {
    if (!list->is_array() || list->empty() || !(*list)[0].is_string()) {
      return top.error("architectures", "expected a non-empty array of class names");
    }
    return architecture_from_name((*list)[0].get<std::string>(), top.source(), "architectures[0]");
  }
  CELLM_ASSIGN_OR_RETURN(std::optional<std::string> model_type, top.optional_string("model_type"));
  if (!model_type) return top.missing("architectures");
  return architecture_from_name(*model_type, top.source(), "model_type");
}

// rope_theta and rope scaling: top level (older transformers) or rope_parameters
// (newer); the scaling object is rope_scaling, else rope_parameters.
Status parse_rope(const JsonFields& top, ModelSpec& spec) {
  std::optional<JsonFields> parameters;
  CELLM_ASSIGN_OR_RETURN(parameters, top.optional_object("rope_parameters"));
  std::optional<double> theta;
  if (parameters) {
    CELLM_ASSIGN_OR_RETURN(theta, parameters->optional_number("rope_theta"));
  }
  if (!theta) {
    CELLM_ASSIGN_OR_RETURN(theta, top.optional_number("rope_theta"));
  }
  if (theta) spec.rope_theta = *theta;

  std::optional<JsonFields> scaling;
  CELLM_ASSIGN_OR_RETURN(scaling, top.optional_object("rope_scaling"));
  if (!scaling) scaling = parameters;
  if (!scaling) return Status::Ok();

  std::optional<std::string> type;
  const char* type_field = "rope_type";
  CELLM_ASSIGN_OR_RETURN(type, scaling->optional_string("rope_type"));
  if (!type) {
    type_field = "type";
    CELLM_ASSIGN_OR_RETURN(type, scaling->optional_string("type"));
  }
  if (!type || *type == "default") return Status::Ok();
  if (*type != "llama3") {
    return NotSupported(top.source() + ": " + scaling->path(type_field) + ": rope type '" + *type +
                        "' is not supported (supported: default, llama3)");
  }
  RopeScaling& rope = spec.rope_scaling;
  rope.type = RopeScalingType::kLlama3;
  CELLM_ASSIGN_OR_RETURN(rope.factor, scaling->required_number("factor"));
  CELLM_ASSIGN_OR_RETURN(rope.low_freq_factor, scaling->required_number("low_freq_factor"));
  CELLM_ASSIGN_OR_RETURN(rope.high_freq_factor, scaling->required_number("high_freq_factor"));
  CELLM_ASSIGN_OR_RETURN(rope.original_max_position_embeddings,
                         scaling->required_int("original_max_position_embeddings"));
  return Status::Ok();
}

Status parse_bias_and_norm(const JsonFields& top, ModelSpec& spec) {
  CELLM_ASSIGN_OR_RETURN(std::optional<bool> mlp_bias, top.optional_bool("mlp_bias"));
  if (mlp_bias.value_or(false)) {
    return NotSupported(top.source() + ": mlp_bias: biases on the MLP are not supported");
  }
  switch (spec.architecture) {
    case Architecture::kLlama:
    case Architecture::kQwen3: {
      CELLM_ASSIGN_OR_RETURN(std::optional<bool> bias, top.optional_bool("attention_bias"));
      spec.qkv_bias = bias.value_or(false);
      spec.o_bias = bias.value_or(false);
      spec.qk_norm = spec.architecture == Architecture::kQwen3;
      break;
    }
    case Architecture::kMistral:
      break;
    case Architecture::kQwen2:
      spec.qkv_bias = true;
      break;
  }
  return Status::Ok();
}

// Per-layer windows. Mistral: sliding_window on every layer. Qwen2/Qwen3: only
// with use_sliding_window, on layers >= max_window_layers. layer_types, when
// present, decides which layers slide. Llama has no sliding window.
Status parse_windows(const JsonFields& top, ModelSpec& spec) {
  if (spec.architecture == Architecture::kLlama) return Status::Ok();
  const int64_t num_layers = spec.num_hidden_layers;
  CELLM_ASSIGN_OR_RETURN(const std::optional<int64_t> window, top.optional_int("sliding_window"));
  int64_t width = window.value_or(0);  // 0: no sliding window
  if (window && width <= 0) {
    return top.error("sliding_window", "must be positive or null, got " + std::to_string(width));
  }
  const bool qwen =
      spec.architecture == Architecture::kQwen2 || spec.architecture == Architecture::kQwen3;
  int64_t max_window_layers = 0;  // Qwen: layers below this attend their full history
  if (qwen) {
    CELLM_ASSIGN_OR_RETURN(std::optional<bool> use, top.optional_bool("use_sliding_window"));
    if (!use.value_or(false)) width = 0;
    if (width > 0) {
      CELLM_ASSIGN_OR_RETURN(max_window_layers, top.required_int("max_window_layers"));
      if (max_window_layers < 0) {
        return top.error("max_window_layers",
                         "must not be negative, got " + std::to_string(max_window_layers));
      }
    }
  }

  std::vector<bool> sliding(static_cast<size_t>(num_layers));
  for (int64_t i = 0; i < num_layers; ++i) sliding[i] = i >= max_window_layers;
  if (const json* types = top.find("layer_types")) {
    if (!types->is_array() || static_cast<int64_t>(types->size()) != num_layers) {
      return top.error("layer_types", "expected an array of num_hidden_layers (" +
                                          std::to_string(num_layers) + ") strings");
    }
    for (int64_t i = 0; i < num_layers; ++i) {
      const json& t = (*types)[static_cast<size_t>(i)];
      if (t == "sliding_attention") {
        sliding[i] = true;
      } else if (t == "full_attention") {
        sliding[i] = false;
      } else {
        return top.error("layer_types[" + std::to_string(i) + "]",
                         "expected \"full_attention\" or \"sliding_attention\", got " + t.dump());
      }
    }
  }
  if (width == 0) return Status::Ok();
  spec.layer_windows.assign(static_cast<size_t>(num_layers), 0);
  for (int64_t i = 0; i < num_layers; ++i) {
    if (sliding[i]) spec.layer_windows[i] = width;
  }
  return Status::Ok();
}

Result<Token> token_id(const json& value, const JsonFields& top, const std::string& field) {
  if (!value.is_number_integer()) return top.error(field, "expected an integer token id");
  const int64_t id = value.get<int64_t>();
  if (id < 0 || id > std::numeric_limits<Token>::max()) {
    return top.error(field, "token id " + std::to_string(id) + " is out of range");
  }
  return static_cast<Token>(id);
}

Status parse_special_tokens(const JsonFields& top, ModelSpec& spec) {
  if (const json* bos = top.find("bos_token_id")) {
    if (bos->is_array()) {
      if (!bos->empty()) {
        CELLM_ASSIGN_OR_RETURN(spec.bos_token_id, token_id((*bos)[0], top, "bos_token_id[0]"));
      }
    } else {
      CELLM_ASSIGN_OR_RETURN(spec.bos_token_id, token_id(*bos, top, "bos_token_id"));
    }
  }
  if (const json* eos = top.find("eos_token_id")) {
    if (eos->is_array()) {
      for (size_t i = 0; i < eos->size(); ++i) {
        CELLM_ASSIGN_OR_RETURN(Token id,
                               token_id((*eos)[i], top, "eos_token_id[" + std::to_string(i) + "]"));
        spec.eos_token_ids.push_back(id);
      }
    } else {
      CELLM_ASSIGN_OR_RETURN(Token id, token_id(*eos, top, "eos_token_id"));
      spec.eos_token_ids.push_back(id);
    }
  }
  return Status::Ok();
}

Result<ModelSpec> parse_spec(const JsonFields& top) {
  ModelSpec spec;
  CELLM_ASSIGN_OR_RETURN(spec.architecture, parse_architecture(top));
  CELLM_ASSIGN_OR_RETURN(std::optional<std::string> act, top.optional_string("hidden_act"));
  if (act && *act != "silu") {
    return NotSupported(top.source() + ": hidden_act: activation '" + *act +
                        "' is not supported (supported: silu)");
  }
  CELLM_ASSIGN_OR_RETURN(spec.hidden_size, top.required_int("hidden_size"));
  CELLM_ASSIGN_OR_RETURN(spec.num_hidden_layers, top.required_int("num_hidden_layers"));
  CELLM_ASSIGN_OR_RETURN(spec.num_attention_heads, top.required_int("num_attention_heads"));
  CELLM_ASSIGN_OR_RETURN(spec.intermediate_size, top.required_int("intermediate_size"));
  CELLM_ASSIGN_OR_RETURN(spec.vocab_size, top.required_int("vocab_size"));
  CELLM_ASSIGN_OR_RETURN(spec.max_position_embeddings, top.required_int("max_position_embeddings"));
  CELLM_ASSIGN_OR_RETURN(spec.rms_norm_eps, top.required_number("rms_norm_eps"));
  // Sizes are checked here already: the derived head_dim and the windows use them.
  const std::string& source = top.source();
  CELLM_RETURN_IF_ERROR(check_positive(source, "hidden_size", spec.hidden_size, kMaxDimension));
  CELLM_RETURN_IF_ERROR(
      check_positive(source, "num_hidden_layers", spec.num_hidden_layers, kMaxLayers));
  CELLM_RETURN_IF_ERROR(
      check_positive(source, "num_attention_heads", spec.num_attention_heads, kMaxDimension));

  CELLM_ASSIGN_OR_RETURN(std::optional<int64_t> kv_heads, top.optional_int("num_key_value_heads"));
  spec.num_key_value_heads = kv_heads.value_or(spec.num_attention_heads);
  CELLM_ASSIGN_OR_RETURN(std::optional<int64_t> head_dim, top.optional_int("head_dim"));
  if (head_dim) {
    spec.head_dim = *head_dim;
  } else {
    if (spec.hidden_size % spec.num_attention_heads != 0) {
      return spec_error(source, "num_attention_heads",
                        std::to_string(spec.num_attention_heads) + " does not divide hidden_size " +
                            std::to_string(spec.hidden_size) + " (and head_dim is not given)");
    }
    spec.head_dim = spec.hidden_size / spec.num_attention_heads;
  }
  CELLM_ASSIGN_OR_RETURN(std::optional<bool> tie, top.optional_bool("tie_word_embeddings"));
  spec.tie_word_embeddings = tie.value_or(false);

  CELLM_RETURN_IF_ERROR(parse_rope(top, spec));
  CELLM_RETURN_IF_ERROR(parse_bias_and_norm(top, spec));
  CELLM_RETURN_IF_ERROR(parse_windows(top, spec));
  CELLM_RETURN_IF_ERROR(parse_special_tokens(top, spec));

  CELLM_ASSIGN_OR_RETURN(std::optional<std::string> dtype, top.optional_string("torch_dtype"));
  if (!dtype) {
    CELLM_ASSIGN_OR_RETURN(dtype, top.optional_string("dtype"));
  }
  spec.torch_dtype = dtype.value_or("");
  return spec;
}

}  // namespace

const char* to_string(Architecture arch) {
  switch (arch) {
    case Architecture::kLlama:
      return "LlamaForCausalLM";
    case Architecture::kMistral:
      return "MistralForCausalLM";
    case Architecture::kQwen2:
      return "Qwen2ForCausalLM";
    case Architecture::kQwen3:
      return "Qwen3ForCausalLM";
  }
  return "unknown";
}

Result<ModelConfig> ModelConfig::load(const std::filesystem::path& path) {
  CELLM_ASSIGN_OR_RETURN(std::string text, read_text_file(path, "model config"));
  return parse(text, path.string());
}

Result<ModelConfig> ModelConfig::parse(std::string_view json_text, std::string_view source) {
  CELLM_ASSIGN_OR_RETURN(json document, parse_json_text(json_text, source));
  if (!document.is_object()) {
    return InvalidProgram(std::string(source) + ": expected a JSON object at the top level");
  }
  JsonFields top(document, std::string(source));
  CELLM_ASSIGN_OR_RETURN(ModelSpec spec, parse_spec(top));
  return from_spec(std::move(spec), source);
}

Result<ModelConfig> ModelConfig::from_spec(ModelSpec spec, std::string_view source) {
  CELLM_RETURN_IF_ERROR(check_positive(source, "hidden_size", spec.hidden_size, kMaxDimension));
  CELLM_RETURN_IF_ERROR(
      check_positive(source, "num_hidden_layers", spec.num_hidden_layers, kMaxLayers));
  CELLM_RETURN_IF_ERROR(
      check_positive(source, "num_attention_heads", spec.num_attention_heads, kMaxDimension));
  CELLM_RETURN_IF_ERROR(
      check_positive(source, "num_key_value_heads", spec.num_key_value_heads, kMaxDimension));
  CELLM_RETURN_IF_ERROR(check_positive(source, "head_dim", spec.head_dim, kMaxDimension));
  CELLM_RETURN_IF_ERROR(
      check_positive(source, "intermediate_size", spec.intermediate_size, kMaxDimension));
  CELLM_RETURN_IF_ERROR(check_positive(source, "vocab_size", spec.vocab_size, kMaxDimension));
  CELLM_RETURN_IF_ERROR(check_positive(source, "max_position_embeddings",
                                       spec.max_position_embeddings,
                                       std::numeric_limits<Position>::max()));
  if (spec.num_attention_heads % spec.num_key_value_heads != 0) {
    return spec_error(source, "num_key_value_heads",
                      std::to_string(spec.num_key_value_heads) +
                          " does not divide num_attention_heads " +
                          std::to_string(spec.num_attention_heads));
  }
  if (spec.head_dim % 2 != 0) {
    return spec_error(source, "head_dim",
                      "must be even for rotary embeddings, got " + std::to_string(spec.head_dim));
  }
  if (spec.num_attention_heads * spec.head_dim > kMaxDimension) {
    return spec_error(
        source, "head_dim",
        "num_attention_heads * head_dim exceeds the limit " + std::to_string(kMaxDimension));
  }
  CELLM_RETURN_IF_ERROR(check_positive_real(source, "rms_norm_eps", spec.rms_norm_eps));
  CELLM_RETURN_IF_ERROR(check_positive_real(source, "rope_theta", spec.rope_theta));
  if (spec.rope_scaling.type == RopeScalingType::kLlama3) {
    const RopeScaling& r = spec.rope_scaling;
    CELLM_RETURN_IF_ERROR(check_positive_real(source, "rope_scaling.factor", r.factor));
    CELLM_RETURN_IF_ERROR(
        check_positive_real(source, "rope_scaling.low_freq_factor", r.low_freq_factor));
    CELLM_RETURN_IF_ERROR(
        check_positive_real(source, "rope_scaling.high_freq_factor", r.high_freq_factor));
    if (!(r.high_freq_factor > r.low_freq_factor)) {
      std::ostringstream os;
      os << "must exceed low_freq_factor " << r.low_freq_factor << ", got " << r.high_freq_factor;
      return spec_error(source, "rope_scaling.high_freq_factor", os.str());
    }
    CELLM_RETURN_IF_ERROR(check_positive(source, "rope_scaling.original_max_position_embeddings",
                                         r.original_max_position_embeddings,
                                         std::numeric_limits<Position>::max()));
  }
  if (!spec.layer_windows.empty()) {
    if (static_cast<int64_t>(spec.layer_windows.size()) != spec.num_hidden_layers) {
      return spec_error(source, "layer_windows",
                        "has " + std::to_string(spec.layer_windows.size()) +
                            " entries for num_hidden_layers " +
                            std::to_string(spec.num_hidden_layers));
    }
    for (size_t i = 0; i < spec.layer_windows.size(); ++i) {
      if (spec.layer_windows[i] < 0) {
        return spec_error(source, "layer_windows[" + std::to_string(i) + "]",
                          "must not be negative, got " + std::to_string(spec.layer_windows[i]));
      }
    }
  }
  if (const double n = parameter_count<double>(spec); n > kMaxParameters) {
    std::ostringstream os;
    os << "the sizes give " << n << " parameters, more than the limit " << kMaxParameters
       << " (hidden_size " << spec.hidden_size << ", intermediate_size " << spec.intermediate_size
       << ", vocab_size " << spec.vocab_size << ")";
    return spec_error(source, "num_hidden_layers", os.str());
  }
  auto check_token = [&](std::string_view field, Token id) -> Status {
    if (id < 0 || id >= spec.vocab_size) {
      return spec_error(source, field,
                        "token id " + std::to_string(id) + " is outside the vocabulary of " +
                            std::to_string(spec.vocab_size));
    }
    return Status::Ok();
  };
  if (spec.bos_token_id) CELLM_RETURN_IF_ERROR(check_token("bos_token_id", *spec.bos_token_id));
  for (Token id : spec.eos_token_ids) CELLM_RETURN_IF_ERROR(check_token("eos_token_id", id));

  ModelConfig config;
  config.source_ = std::string(source);
  config.q_dim_ = spec.num_attention_heads * spec.head_dim;
  config.kv_dim_ = spec.num_key_value_heads * spec.head_dim;
  config.windows_ = spec.layer_windows.empty()
                        ? std::vector<int64_t>(static_cast<size_t>(spec.num_hidden_layers), 0)
                        : spec.layer_windows;
  config.spec_ = std::move(spec);
  return config;
}

Result<ModelConfig> ModelConfig::preset(std::string_view name) {
  ModelSpec spec;
  spec.architecture = Architecture::kLlama;
  spec.rms_norm_eps = 1e-5;
  spec.max_position_embeddings = 131072;
  spec.torch_dtype = "bfloat16";
  if (name == "110m") {
    spec.hidden_size = 768;
    spec.num_hidden_layers = 12;
    spec.num_attention_heads = 12;
    spec.num_key_value_heads = 12;
    spec.intermediate_size = 2048;
    spec.vocab_size = 32000;
    spec.rope_theta = 10000.0;
    spec.bos_token_id = 1;
    spec.eos_token_ids = {2};
  } else if (name == "1b" || name == "8b") {
    const bool small = name == "1b";
    spec.hidden_size = small ? 2048 : 4096;
    spec.num_hidden_layers = small ? 16 : 32;
    spec.num_attention_heads = 32;
    spec.num_key_value_heads = 8;
    spec.intermediate_size = small ? 8192 : 14336;
    spec.vocab_size = 128256;
    spec.tie_word_embeddings = small;
    spec.rope_theta = 500000.0;
    spec.rope_scaling = RopeScaling{RopeScalingType::kLlama3, small ? 32.0 : 8.0, 1.0, 4.0, 8192};
    spec.bos_token_id = 128000;
    spec.eos_token_ids = {128001};
  } else {
    return InvalidArgument("unknown model preset '" + std::string(name) +
                           "' (known: 110m, 1b, 8b)");
  }
  spec.head_dim = spec.hidden_size / spec.num_attention_heads;
  return from_spec(std::move(spec), "preset " + std::string(name));
}

int64_t ModelConfig::window(int64_t layer) const {
  // REQUIRES: 0 <= layer < num_layers().
  CELLM_CHECK(layer >= 0 && layer < num_layers());
  return windows_[static_cast<size_t>(layer)];
}

bool ModelConfig::has_sliding_window() const {
  for (int64_t w : windows_) {
    if (w > 0) return true;
  }
  return false;
}

int64_t ModelConfig::num_parameters() const {
  return parameter_count<int64_t>(spec_);  // from_spec bounded it
}

}  // namespace cellm
