// ModelWeights: every weight of a loaded model as non-owning TensorViews, checked
// against its ModelConfig, plus the storage those views point into (the mapped
// safetensors files, or one owned slab for random weights).
//
// Checkpoint names map to the struct through one table (model_weights.cpp):
//   model.embed_tokens.weight                          embed_tokens  [vocab, hidden]
//   model.layers.{i}.input_layernorm.weight            input_norm    [hidden]
//   model.layers.{i}.self_attn.{q,k,v,o}_proj.weight   q/k/v/o_proj
//   model.layers.{i}.self_attn.{q,k,v,o}_proj.bias     *_bias (when the config says so)
//   model.layers.{i}.self_attn.{q,k}_norm.weight       q_norm, k_norm (Qwen3)
//   model.layers.{i}.post_attention_layernorm.weight   post_attention_norm
//   model.layers.{i}.mlp.{gate,up,down}_proj.weight    gate/up/down_proj
//   model.norm.weight                                  final_norm    [hidden]
//   lm_head.weight                                     lm_head       [vocab, hidden]
// Linear weights are [out_features, in_features], row-major (y = x W^T + b).
// Each view records its own dtype (BF16, F16 or F32; mixing is allowed). Tensors
// of the checkpoint outside the table (e.g. rotary inv_freq) are ignored.
// FP8 checkpoints (config.json's quantization_config, model/fp8_checkpoint.h): linear
// weights stored as F8_E4M3 bind with their weight_scale widened to one f32 per row
// (TensorView::scales); input_scale tensors are not read (activations stay float).
//
// A GGUF file (llama.cpp's format) loads through the same table: its tensor
// names (token_embd, blk.N.attn_q, ..., output) map onto the names above, its
// metadata gives the config, and the rows of q and k that llama.cpp's converter
// permuted for `llama` files are put back in Hugging Face's order (so RoPE's
// rotate-half convention gives the same results). F32, F16 and BF16 tensors are
// views into the mapping (q and k of llama files are rewritten copies); a tensor
// in a block format (Q4_1, Q8_0, ...) stays in its blocks (TensorView::block_type).
//
// converted() re-encodes chosen weights (quantize on load, or block formats
// dequantized for an executor that reads elements only): the result shares the
// source's storage and owns the new encodings.
//
// Copies share the storage, so views of any copy stay valid while one copy lives.
// Thread-safety: immutable after construction; share freely.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cellm/dtype.h"
#include "cellm/model_config.h"
#include "cellm/status.h"
#include "cellm/tensor_parallel.h"

namespace cellm {

class SafetensorsCheckpoint;

// One decoder layer. q_dim = num_heads * head_dim, kv_dim = num_kv_heads * head_dim.
struct LayerWeights {
  TensorView input_norm;             // [hidden]                 RMSNorm before attention
  TensorView q_proj;                 // [q_dim, hidden]
  TensorView k_proj;                 // [kv_dim, hidden]
  TensorView v_proj;                 // [kv_dim, hidden]
  TensorView o_proj;                 // [hidden, q_dim]
  std::optional<TensorView> q_bias;  // [q_dim]     iff config.qkv_bias()
  std::optional<TensorView> k_bias;  // [kv_dim]    iff config.qkv_bias()
  std::optional<TensorView> v_bias;  // [kv_dim]    iff config.qkv_bias()
  std::optional<TensorView> o_bias;  // [hidden]    iff config.o_bias()
  std::optional<TensorView> q_norm;  // [head_dim]  iff config.qk_norm(): RMSNorm per head
  std::optional<TensorView> k_norm;  // [head_dim]  iff config.qk_norm()
  TensorView post_attention_norm;    // [hidden]                 RMSNorm before the MLP
  TensorView gate_proj;              // [intermediate, hidden]
  TensorView up_proj;                // [intermediate, hidden]
  TensorView down_proj;              // [hidden, intermediate]
};

// What a weight is, for a WeightConverter.
enum class WeightRole {
  kEmbedding,  // embed_tokens
  kLinear,     // a decoder layer's q, k, v, o, gate, up or down projection
  kNorm,       // an RMSNorm weight
  kBias,       // a projection's bias
  kLmHead,     // lm_head (only when untied: a tied head is the embedding)
};

// A weight re-encoded by a WeightConverter: its bytes and their format, either
// `dtype` elements (block_type unset) or rows of `block_type` blocks. The shape
// stays the source's.
struct ConvertedWeight {
  std::vector<std::byte> bytes;
  DType dtype = DType::kF32;
  std::optional<GgmlType> block_type;
  std::vector<float> scales;  // dtype kF8E4M3: one per row (TensorView::scales)
};

// Re-encodes one weight, or returns nullopt to keep it as it is. Errors stop
// the conversion and are returned by converted().
using WeightConverter = std::function<Result<std::optional<ConvertedWeight>>(
    const TensorView& weight, WeightRole role)>;

// FP8 re-encodings for converters (the float8_e4m3fn codec of src/model/fp8.h).
// `weight` [rows, cols] (F32, F16 or BF16, or F8_E4M3) quantized to e4m3 with one
// scale per row: scale = the row's largest magnitude / 448, codes rounded to nearest
// even. InvalidArgument naming the tensor and row when it holds a non-finite value.
Result<ConvertedWeight> quantize_to_fp8(const TensorView& weight);
// The F8_E4M3 weight `weight` dequantized (code value * row scale) to `dtype` (F32:
// exact; BF16: rounded to nearest even). REQUIRES: weight.dtype == kF8E4M3, dtype F32
// or BF16.
ConvertedWeight dequantize_fp8(const TensorView& weight, DType dtype);

class ModelWeights {
 public:
  // Reads `dir`/config.json and the safetensors of `dir` (single or sharded) and
  // binds every weight; or, when `dir` is a GGUF file (cellm::is_gguf_path), its
  // metadata and tensors. Errors name the file or tensor and the problem.
  static Result<ModelWeights> load(const std::filesystem::path& dir);
  // Random weights with the config's real shapes, all of `dtype`, in one owned slab
  // of about num_parameters() * dtype size bytes (16 GB for the 8b preset in
  // BF16: it allocates all of it). Deterministic in `seed` whatever the thread
  // count; filled in parallel. Linear weights are uniform with variance
  // 1/in_features, the embedding uniform in [-1, 1], norms near 1, biases small.
  static ModelWeights random(const ModelConfig& config, DType dtype, uint64_t seed);
  // random(config, dtype, seed).shard(plan), element for element, made without the
  // whole model (an element's value depends only on its place in the whole model):
  // how a GPU of a tensor-parallel group gets a preset too big for one.
  static Result<ModelWeights> random_shard(const ModelConfig& config, DType dtype, uint64_t seed,
                                           const ShardPlan& plan);

  // Rank plan.rank's part of this model for tensor parallelism (cellm/tensor_parallel.h).
  // Its config() is shard_config(config(), plan); the whole weights (embedding, norms)
  // and the row slices (q, k, v, gate and up projections, their biases, and the LM
  // head's rows [vocab_begin, +vocab_size), so lm_head() is [plan.vocab_size, hidden])
  // are views of this model's storage, read from a mapped file only where used; the
  // column slices of o_proj and down_proj are copies. InvalidArgument when this model
  // is a shard already, the plan is not one of plan_shard(config(), ...), or a column
  // slice of a weight in a block format does not fall on its blocks.
  Result<ModelWeights> shard(const ShardPlan& plan) const;
  // The plan this model is a shard of; nullopt for a whole model.
  const std::optional<ShardPlan>& shard_plan() const { return shard_plan_; }

  const ModelConfig& config() const { return config_; }
  const TensorView& embed_tokens() const { return tensors_.embed_tokens; }  // [vocab, hidden]
  const std::vector<LayerWeights>& layers() const { return tensors_.layers; }
  // REQUIRES: 0 <= i < config().num_layers().
  const LayerWeights& layer(int64_t i) const;
  const TensorView& final_norm() const { return tensors_.final_norm; }  // [hidden]
  // [vocab, hidden]; the embedding's view when config().tie_word_embeddings().
  const TensorView& lm_head() const { return tensors_.lm_head; }

  // A copy whose weights are what `convert` makes of them, called once per
  // distinct weight in table order (a tied lm_head follows the embedding). The
  // copy shares this one's storage and owns the converted bytes. When this model's
  // weights are views into mapped safetensors files, each converted weight's pages
  // are handed back to the kernel once it is converted (the file stays mapped:
  // they are read again only if this model's view of them is used), so no second
  // full-precision copy stays resident. InvalidArgument when a converter's bytes
  // do not fit the weight's shape in the format it names, or `convert`'s error.
  Result<ModelWeights> converted(const WeightConverter& convert) const;

  // Every distinct weight in table order (lm_head omitted when tied).
  std::vector<const TensorView*> tensors() const;
  // Sum of nbytes over tensors().
  size_t total_bytes() const;

  struct Tensors {
    TensorView embed_tokens;
    std::vector<LayerWeights> layers;
    TensorView final_norm;
    TensorView lm_head;
  };

 private:
  // Binds the weights of an opened checkpoint to `config`; `source` names the
  // checkpoint (its folder) in errors.
  // `quantized`: config.json has a quantization_config (F8_E4M3 weights allowed).
  static Result<ModelWeights> from_checkpoint(ModelConfig config, SafetensorsCheckpoint checkpoint,
                                              const std::string& source, bool quantized);

  // Maps the GGUF file at `path` and binds its weights.
  static Result<ModelWeights> load_gguf(const std::filesystem::path& path);

  // Random weights of `config` (whole's, or shard_config(whole, *plan)): the values of
  // the whole model's weights in the regions `plan`'s rank holds.
  static ModelWeights random_regions(const ModelConfig& whole, const ModelConfig& config,
                                     DType dtype, uint64_t seed,
                                     const std::optional<ShardPlan>& plan);

  ModelWeights(ModelConfig config, std::shared_ptr<const void> storage)
      : config_(std::move(config)), storage_(std::move(storage)) {}

  ModelConfig config_;
  std::shared_ptr<const void> storage_;  // what the views point into
  bool mapped_ = false;                  // every view points into a file mapping
  std::optional<ShardPlan> shard_plan_;
  Tensors tensors_;
};

}  // namespace cellm
