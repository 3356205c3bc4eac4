// Tensor parallelism's split of one model over `world` GPUs (Megatron-style), as
// a plan per rank. Every rank holds the embedding and the norms whole; of each
// decoder layer it holds
//   - query heads [head_begin, +num_heads) and kv heads [kv_head_begin, +num_kv_heads):
//     the rows of q_proj, k_proj, v_proj (and their biases) for those heads
//     (column-parallel), and the columns of o_proj that read them (row-parallel);
//   - SwiGLU columns [ffn_begin, +ffn_size): the rows of gate_proj and up_proj and
//     the columns of down_proj;
// and rows [vocab_begin, +vocab_size) of the LM head. A layer's o_proj and down_proj
// outputs are partial sums, added over the ranks by one all-reduce each; o_proj's
// bias is added by rank 0 only. Each rank's logits are its vocabulary slice.
//
// Heads split evenly: num_heads must be a multiple of world. Kv heads split when
// num_kv_heads is a multiple of world, and are replicated when world is a multiple
// of num_kv_heads (each rank holds the one kv head its query heads read). The SwiGLU
// and vocabulary widths split into near-equal parts whose boundaries fall on the
// largest power of two up to 256 that allows an exact split (block formats and
// vector loads want aligned boundaries), else on any element.
#pragma once

#include <cstdint>

#include "cellm/model_config.h"
#include "cellm/status.h"

namespace cellm {

struct ShardPlan {
  int rank = 0;
  int world = 1;
  int64_t head_begin = 0;  // query heads of this rank
  int64_t num_heads = 0;
  int64_t kv_head_begin = 0;  // kv heads held by this rank
  int64_t num_kv_heads = 0;
  int64_t ffn_begin = 0;  // SwiGLU columns (intermediate features)
  int64_t ffn_size = 0;
  int64_t vocab_begin = 0;  // LM head rows: the logits this rank computes
  int64_t vocab_size = 0;

  bool operator==(const ShardPlan&) const = default;
};

// Rank `rank`'s part of `config` over `world` GPUs. InvalidArgument naming the
// dimension that does not split (heads, kv heads) or a bad rank/world.
Result<ShardPlan> plan_shard(const ModelConfig& config, int rank, int world);

// The config a rank computes with: its heads, kv heads and SwiGLU width; the
// hidden size and the full vocabulary (the embedding is whole) otherwise; untied
// (its LM head is a slice) and with o_proj's bias on rank 0 only. InvalidArgument when
// `plan` is not plan_shard(config, plan.rank, plan.world), or plan_shard's error.
Result<ModelConfig> shard_config(const ModelConfig& config, const ShardPlan& plan);

}  // namespace cellm
