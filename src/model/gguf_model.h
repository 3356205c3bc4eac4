// A GGUF file as a cellm model: its metadata as a ModelConfig and its tensor names
// as ModelWeights' checkpoint names, with the layout facts of llama.cpp's
// converter (convert_hf_to_gguf.py) undone.
//
// Metadata keys read (ARCH = general.architecture: llama, qwen2 or qwen3):
//   ARCH.embedding_length, .block_count, .feed_forward_length,
//   .attention.head_count, .attention.head_count_kv (default: head_count),
//   .attention.key_length / .value_length (default: embedding_length / heads),
//   .attention.layer_norm_rms_epsilon, .context_length, .vocab_size (default:
//   token_embd's rows), .rope.freq_base (default 10000), .rope.dimension_count
//   (must be the head dim), .rope.scaling.type (none only, except the llama3
//   frequency factors below); tokenizer.ggml.bos_token_id, eos_token_id and
//   eot_token_id become the config's bos and eos ids.
// Tied embeddings: a file without output.weight. Biases: present iff
// blk.0.attn_q.bias (q/k/v) and blk.0.attn_output.bias exist; Qwen2 always has
// q/k/v biases, Qwen3 always q/k norms.
// Llama 3.1 rope scaling is stored as the tensor rope_freqs.weight (one divisor
// per frequency); it is read back into the llama3 parameters (low_freq_factor 1,
// high_freq_factor 4 as every Llama 3.x uses, the factor and the original context
// recovered from the divisors) and refused when they do not reproduce it.
#pragma once

#include <string>
#include <string_view>

#include "cellm/model_config.h"
#include "cellm/status.h"
#include "gguf.h"

namespace cellm {

// The config of the model in `file`; `source` (its path) names it in errors.
// `rope_freqs`, when the file has rope_freqs.weight, is that tensor's data (f32).
Result<ModelConfig> gguf_model_config(const GgufParsed& file, const float* rope_freqs,
                                      std::string_view source);

// The GGUF name of ModelWeights' checkpoint name `hf_name`
// ("model.layers.3.self_attn.q_proj.weight" -> "blk.3.attn_q.weight"), or "" when
// the name is not one of the weight table's.
std::string gguf_tensor_name(std::string_view hf_name);

// Whether the converter permuted the rows of q and k (weights and biases) of this
// architecture for llama.cpp's interleaved RoPE: true for llama.
bool gguf_permutes_qk(Architecture arch);

// Undoes the converter's permutation of a q or k projection with `heads` heads:
// within each head of `rows / heads` rows, stored row 2j + t holds the original
// row t * (rows / heads / 2) + j. `row_bytes` bytes per row; works on any row
// layout (elements or whole blocks). REQUIRES: rows % (2 * heads) == 0.
void unpermute_qk_rows(const std::byte* stored, std::byte* out, int64_t rows, size_t row_bytes,
                       int64_t heads);

}  // namespace cellm
