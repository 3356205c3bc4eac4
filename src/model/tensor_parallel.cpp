#include "cellm/tensor_parallel.h"

#include <string>
#include <utility>

namespace cellm {
namespace {

struct Range {
  int64_t begin = 0;
  int64_t size = 0;
};

// Rank `rank`'s part of n elements split over `world` near-equal parts whose
// boundaries are multiples of the largest power of two up to 256 that gives an
// exact split, else of the largest that divides n, else of 1.
Range split(int64_t n, int rank, int world) {
  int64_t unit = 1;
  for (int64_t g = 256; g > 1; g /= 2) {
    if (n % (g * world) == 0) {
      unit = g;
      break;
    }
  }
  if (unit == 1) {
    for (int64_t g = 256; g > 1; g /= 2) {
      if (n % g == 0 && n / g >= world) {
        unit = g;
        break;
      }
    }
  }
  const int64_t units = n / unit;
  const int64_t begin = units * rank / world;
  const int64_t end = units * (rank + 1) / world;
  return {begin * unit, (end - begin) * unit};
}

}  // namespace

Result<ShardPlan> plan_shard(const ModelConfig& config, int rank, int world) {
  if (world < 1) {
    return InvalidArgument("tensor parallel: the number of GPUs must be at least 1, not " +
                           std::to_string(world));
  }
  if (rank < 0 || rank >= world) {
    return InvalidArgument("tensor parallel: rank " + std::to_string(rank) + " is not in [0, " +
                           std::to_string(world) + ")");
  }
  const int64_t heads = config.num_heads();
  const int64_t kv_heads = config.num_kv_heads();
  const std::string over = " over " + std::to_string(world) + " GPUs";
  if (heads % world != 0) {
    return InvalidArgument("tensor parallel: the model's " + std::to_string(heads) +
                           " attention heads do not split evenly" + over);
  }
  if (kv_heads % world != 0 && world % kv_heads != 0) {
    return InvalidArgument("tensor parallel: the model's " + std::to_string(kv_heads) +
                           " kv heads neither split evenly" + over +
                           " nor replicate evenly over them");
  }
  if (config.intermediate_size() < world || config.vocab_size() < world) {
    return InvalidArgument("tensor parallel: the model is too narrow to split" + over);
  }
  ShardPlan plan;
  plan.rank = rank;
  plan.world = world;
  plan.num_heads = heads / world;
  plan.head_begin = plan.num_heads * rank;
  if (kv_heads % world == 0) {
    plan.num_kv_heads = kv_heads / world;
    plan.kv_head_begin = plan.num_kv_heads * rank;
  } else {
    // world / kv_heads consecutive ranks share one kv head: the one their query
    // heads read (query head h reads kv head h / (heads / kv_heads)).
    plan.num_kv_heads = 1;
    plan.kv_head_begin = rank / (world / kv_heads);
  }
  const Range ffn = split(config.intermediate_size(), rank, world);
  plan.ffn_begin = ffn.begin;
  plan.ffn_size = ffn.size;
  const Range vocab = split(config.vocab_size(), rank, world);
  plan.vocab_begin = vocab.begin;
  plan.vocab_size = vocab.size;
  return plan;
}

Result<ModelConfig> shard_config(const ModelConfig& config, const ShardPlan& plan) {
  CELLM_ASSIGN_OR_RETURN(const ShardPlan expected, plan_shard(config, plan.rank, plan.world));
  if (!(expected == plan)) {
    return InvalidArgument("tensor parallel: the plan of rank " + std::to_string(plan.rank) +
                           " is not this model's");
  }
  ModelSpec spec = config.spec();
  spec.num_attention_heads = plan.num_heads;
  spec.num_key_value_heads = plan.num_kv_heads;
  spec.intermediate_size = plan.ffn_size;
  spec.tie_word_embeddings = false;
  spec.o_bias = config.o_bias() && plan.rank == 0;
  return ModelConfig::from_spec(std::move(spec), config.source() + " (tensor-parallel rank " +
                                                     std::to_string(plan.rank) + " of " +
                                                     std::to_string(plan.world) + ")");
}

}  // namespace cellm
