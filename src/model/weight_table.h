// The weight table shared by ModelWeights' loaders, random weights and tensor-
// parallel shards: every weight of a model of a config, its checkpoint name, its
// shape, the view it binds and how random weights fill it. Internal to cellm_model.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cellm/model_weights.h"

namespace cellm::weights_internal {

// How random() fills a tensor: uniform in [center - half_range, center + half_range].
struct RandomInit {
  float center = 0.0f;
  float half_range = 0.0f;
};

// One row of the weight table: a checkpoint name, its expected shape, and the
// view it binds. View is TensorView (binding) or const TensorView (listing).
template <typename View>
struct Slot {
  std::string name;
  std::vector<int64_t> shape;
  View* view;
  RandomInit init;
};

inline RandomInit linear_init(int64_t in_features) {
  return {0.0f, static_cast<float>(std::sqrt(3.0 / static_cast<double>(in_features)))};
}
constexpr RandomInit kNormInit{1.0f, 0.1f};
constexpr RandomInit kBiasInit{0.0f, 0.02f};
constexpr RandomInit kEmbeddingInit{0.0f, 1.0f};

// THE weight table: every weight of a model of `config`, in checkpoint order.
// With a mutable `tensors` it engages the optional slots the config requires.
template <typename TensorsT>
auto weight_table(const ModelConfig& config, TensorsT& tensors) {
  constexpr bool kBinding = !std::is_const_v<TensorsT>;
  using View = std::conditional_t<kBinding, TensorView, const TensorView>;
  const int64_t hidden = config.hidden_size();
  const int64_t q_dim = config.q_dim();
  const int64_t kv_dim = config.kv_dim();
  const int64_t ff = config.intermediate_size();
  const int64_t vocab = config.vocab_size();
  const int64_t head_dim = config.head_dim();

  std::vector<Slot<View>> table;
  auto add = [&](std::string name, std::vector<int64_t> shape, View& view, RandomInit init) {
    table.push_back(Slot<View>{std::move(name), std::move(shape), &view, init});
  };
  auto add_optional = [&](std::string name, std::vector<int64_t> shape, auto& optional_view,
                          RandomInit init) {
    if constexpr (kBinding) optional_view.emplace();
    add(std::move(name), std::move(shape), *optional_view, init);
  };

  if constexpr (kBinding) tensors.layers.resize(static_cast<size_t>(config.num_layers()));
  add("model.embed_tokens.weight", {vocab, hidden}, tensors.embed_tokens, kEmbeddingInit);
  for (int64_t i = 0; i < config.num_layers(); ++i) {
    auto& layer = tensors.layers[static_cast<size_t>(i)];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {hidden}, layer.input_norm, kNormInit);
    add(p + "self_attn.q_proj.weight", {q_dim, hidden}, layer.q_proj, linear_init(hidden));
    add(p + "self_attn.k_proj.weight", {kv_dim, hidden}, layer.k_proj, linear_init(hidden));
    add(p + "self_attn.v_proj.weight", {kv_dim, hidden}, layer.v_proj, linear_init(hidden));
    if (config.qkv_bias()) {
      add_optional(p + "self_attn.q_proj.bias", {q_dim}, layer.q_bias, kBiasInit);
      add_optional(p + "self_attn.k_proj.bias", {kv_dim}, layer.k_bias, kBiasInit);
      add_optional(p + "self_attn.v_proj.bias", {kv_dim}, layer.v_bias, kBiasInit);
    }
    add(p + "self_attn.o_proj.weight", {hidden, q_dim}, layer.o_proj, linear_init(q_dim));
    if (config.o_bias()) {
      add_optional(p + "self_attn.o_proj.bias", {hidden}, layer.o_bias, kBiasInit);
    }
    if (config.qk_norm()) {
      add_optional(p + "self_attn.q_norm.weight", {head_dim}, layer.q_norm, kNormInit);
      add_optional(p + "self_attn.k_norm.weight", {head_dim}, layer.k_norm, kNormInit);
    }
    add(p + "post_attention_layernorm.weight", {hidden}, layer.post_attention_norm, kNormInit);
    add(p + "mlp.gate_proj.weight", {ff, hidden}, layer.gate_proj, linear_init(hidden));
    add(p + "mlp.up_proj.weight", {ff, hidden}, layer.up_proj, linear_init(hidden));
    add(p + "mlp.down_proj.weight", {hidden, ff}, layer.down_proj, linear_init(ff));
  }
  add("model.norm.weight", {hidden}, tensors.final_norm, kNormInit);
  if (!config.tie_word_embeddings()) {
    add("lm_head.weight", {vocab, hidden}, tensors.lm_head, linear_init(hidden));
  }
  return table;
}

}  // namespace cellm::weights_internal
