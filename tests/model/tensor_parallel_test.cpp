// Tensor parallelism's plan and shards (cellm/tensor_parallel.h, ModelWeights::shard
// and random_shard): the plans cover every dimension once, the shards reassemble the
// whole model, their partial products add up to the whole layer's, and a random
// shard is the shard of the whole random model.
#include "cellm/tensor_parallel.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cellm/model_weights.h"
#include "model/fp8.h"
#include "model/half.h"

namespace cellm {
namespace {

ModelConfig SmallConfig(bool tied, int64_t kv_heads = 4, int64_t ffn = 96) {
  ModelSpec spec;
  spec.hidden_size = 64;
  spec.num_hidden_layers = 2;
  spec.num_attention_heads = 8;
  spec.num_key_value_heads = kv_heads;
  spec.head_dim = 8;
  spec.intermediate_size = ffn;
  spec.vocab_size = 100;
  spec.max_position_embeddings = 128;
  spec.tie_word_embeddings = tied;
  spec.qkv_bias = true;
  spec.o_bias = true;
  Result<ModelConfig> config = ModelConfig::from_spec(spec, "small");
  EXPECT_TRUE(config.ok()) << config.status().to_string();
  return *config;
}

ShardPlan Plan(const ModelConfig& config, int rank, int world) {
  Result<ShardPlan> plan = plan_shard(config, rank, world);
  EXPECT_TRUE(plan.ok()) << plan.status().to_string();
  return plan.ok() ? *plan : ShardPlan{};
}

// Element i of an F32 view.
float F32(const TensorView& t, int64_t i) {
  return static_cast<const float*>(t.data)[i];
}

// Row `row` of an F32 [rows, cols] view.
const float* F32Row(const TensorView& t, int64_t row) {
  return static_cast<const float*>(t.data) + row * (t.numel() / t.shape[0]);
}

// y = W x for an F32 [rows, cols] view.
std::vector<double> Product(const TensorView& w, const std::vector<double>& x) {
  const int64_t rows = w.shape[0], cols = w.shape[1];
  std::vector<double> y(static_cast<size_t>(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) y[r] += F32Row(w, r)[c] * x[static_cast<size_t>(c)];
  }
  return y;
}

std::vector<double> RandomVector(int64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = u(gen);
  return v;
}

// Every tensor of two models, by name: same shape, dtype and bytes.
void ExpectSameTensors(const ModelWeights& a, const ModelWeights& b) {
  const std::vector<const TensorView*> ta = a.tensors();
  const std::vector<const TensorView*> tb = b.tensors();
  ASSERT_EQ(ta.size(), tb.size());
  for (size_t i = 0; i < ta.size(); ++i) {
    SCOPED_TRACE(ta[i]->name);
    EXPECT_EQ(ta[i]->name, tb[i]->name);
    EXPECT_EQ(ta[i]->shape, tb[i]->shape);
    EXPECT_EQ(ta[i]->dtype, tb[i]->dtype);
    ASSERT_EQ(ta[i]->nbytes, tb[i]->nbytes);
    EXPECT_EQ(std::memcmp(ta[i]->data, tb[i]->data, ta[i]->nbytes), 0);
  }
  ASSERT_EQ(a.lm_head().nbytes, b.lm_head().nbytes);
  EXPECT_EQ(std::memcmp(a.lm_head().data, b.lm_head().data, a.lm_head().nbytes), 0);
}

TEST(ShardPlan, CoversEveryHeadColumnAndVocabularyRowOnce) {
  for (const char* preset : {"110m", "1b", "8b"}) {
    Result<ModelConfig> config = ModelConfig::preset(preset);
    ASSERT_TRUE(config.ok());
    const int64_t heads = config->num_heads();
    const int64_t kv = config->num_kv_heads();
    for (int world : {1, 2, 4, 8}) {
      if (heads % world != 0 || (kv % world != 0 && world % kv != 0)) continue;
      SCOPED_TRACE(std::string(preset) + " over " + std::to_string(world));
      int64_t head = 0, ffn = 0, vocab = 0, kv_covered = 0;
      for (int rank = 0; rank < world; ++rank) {
        const ShardPlan p = Plan(*config, rank, world);
        EXPECT_EQ(p.head_begin, head);
        EXPECT_EQ(p.ffn_begin, ffn);
        EXPECT_EQ(p.vocab_begin, vocab);
        head += p.num_heads;
        ffn += p.ffn_size;
        vocab += p.vocab_size;
        // Every query head of the rank reads a kv head the rank holds.
        for (int64_t h = p.head_begin; h < p.head_begin + p.num_heads; ++h) {
          const int64_t reads = h / config->num_queries_per_kv();
          EXPECT_GE(reads, p.kv_head_begin);
          EXPECT_LT(reads, p.kv_head_begin + p.num_kv_heads);
        }
        if (p.kv_head_begin == kv_covered) kv_covered += p.num_kv_heads;
        // Near-equal parts on aligned boundaries.
        EXPECT_LE(std::abs(p.ffn_size - config->intermediate_size() / world), 256);
        EXPECT_EQ(p.ffn_begin % 128, 0);
      }
      EXPECT_EQ(head, heads);
      EXPECT_EQ(ffn, config->intermediate_size());
      EXPECT_EQ(vocab, config->vocab_size());
      EXPECT_EQ(kv_covered, kv);
    }
  }
}

TEST(ShardPlan, KvHeadsReplicateWhenThereAreMoreGpusThanKvHeads) {
  const ModelConfig config = SmallConfig(false, /*kv_heads=*/2);
  for (int rank = 0; rank < 8; ++rank) {
    const ShardPlan p = Plan(config, rank, 8);
    EXPECT_EQ(p.num_heads, 1);
    EXPECT_EQ(p.num_kv_heads, 1);
    EXPECT_EQ(p.kv_head_begin, rank / 4);
  }
}

TEST(ShardPlan, DimensionsThatDoNotSplitAreNamed) {
  const ModelConfig config = SmallConfig(false);
  Result<ShardPlan> three = plan_shard(config, 0, 3);
  ASSERT_FALSE(three.ok());
  EXPECT_NE(three.status().message().find("8 attention heads do not split evenly over 3 GPUs"),
            std::string::npos)
      << three.status().message();
  ModelSpec spec = config.spec();
  spec.num_attention_heads = 12;
  spec.num_key_value_heads = 4;
  Result<ModelConfig> twelve = ModelConfig::from_spec(spec);
  ASSERT_TRUE(twelve.ok());
  Result<ShardPlan> six = plan_shard(*twelve, 0, 6);
  ASSERT_FALSE(six.ok());
  EXPECT_NE(six.status().message().find("4 kv heads"), std::string::npos) << six.status().message();
  EXPECT_FALSE(plan_shard(config, 2, 2).ok());
  EXPECT_FALSE(plan_shard(config, 0, 0).ok());
}

TEST(TensorShard, ARandomShardIsTheShardOfTheWholeRandomModel) {
  for (bool tied : {false, true}) {
    const ModelConfig config = SmallConfig(tied);
    const ModelWeights whole = ModelWeights::random(config, DType::kBF16, 7);
    for (int world : {1, 2, 4}) {
      for (int rank = 0; rank < world; ++rank) {
        SCOPED_TRACE("tied " + std::to_string(tied) + ", rank " + std::to_string(rank) + " of " +
                     std::to_string(world));
        const ShardPlan plan = Plan(config, rank, world);
        Result<ModelWeights> cut = whole.shard(plan);
        Result<ModelWeights> made = ModelWeights::random_shard(config, DType::kBF16, 7, plan);
        ASSERT_TRUE(cut.ok()) << cut.status().to_string();
        ASSERT_TRUE(made.ok()) << made.status().to_string();
        ExpectSameTensors(*cut, *made);
        ASSERT_TRUE(made->shard_plan().has_value());
        EXPECT_EQ(*made->shard_plan(), plan);
        EXPECT_EQ(made->config().num_heads(), plan.num_heads);
        EXPECT_EQ(made->config().intermediate_size(), plan.ffn_size);
        EXPECT_EQ(made->lm_head().shape, (std::vector<int64_t>{plan.vocab_size, 64}));
        EXPECT_EQ(made->layer(0).o_bias.has_value(), rank == 0);
      }
    }
  }
}

TEST(TensorShard, ShardsReassembleEveryWeight) {
  const ModelConfig config = SmallConfig(false);
  const ModelWeights whole = ModelWeights::random(config, DType::kF32, 3);
  const int world = 4;
  std::vector<ModelWeights> shards;
  for (int rank = 0; rank < world; ++rank) {
    Result<ModelWeights> s = whole.shard(Plan(config, rank, world));
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    shards.push_back(*s);
  }
  const int64_t hidden = config.hidden_size();
  for (int64_t l = 0; l < config.num_layers(); ++l) {
    const LayerWeights& w = whole.layer(l);
    int64_t q_row = 0, ffn_row = 0, o_col = 0, down_col = 0;
    for (const ModelWeights& s : shards) {
      const LayerWeights& p = s.layer(l);
      // Row slices: q (and its bias) and gate are the whole one's rows.
      EXPECT_EQ(std::memcmp(p.q_proj.data, F32Row(w.q_proj, q_row), p.q_proj.nbytes), 0);
      EXPECT_EQ(F32(*p.q_bias, 0), F32(*w.q_bias, q_row));
      EXPECT_EQ(std::memcmp(p.gate_proj.data, F32Row(w.gate_proj, ffn_row), p.gate_proj.nbytes), 0);
      q_row += p.q_proj.shape[0];
      ffn_row += p.gate_proj.shape[0];
      // Column slices: o and down hold the whole one's columns of every row.
      const int64_t o_cols = p.o_proj.shape[1];
      const int64_t down_cols = p.down_proj.shape[1];
      for (int64_t r = 0; r < hidden; ++r) {
        for (int64_t c = 0; c < o_cols; ++c) {
          ASSERT_EQ(F32(p.o_proj, r * o_cols + c), F32(w.o_proj, r * config.q_dim() + o_col + c));
        }
        for (int64_t c = 0; c < down_cols; ++c) {
          ASSERT_EQ(F32(p.down_proj, r * down_cols + c),
                    F32(w.down_proj, r * config.intermediate_size() + down_col + c));
        }
      }
      o_col += o_cols;
      down_col += down_cols;
    }
    EXPECT_EQ(q_row, config.q_dim());
    EXPECT_EQ(ffn_row, config.intermediate_size());
    EXPECT_EQ(o_col, config.q_dim());
    EXPECT_EQ(down_col, config.intermediate_size());
  }
}

// The sums the all-reduces make: o_proj over the heads' columns, down_proj over the
// SwiGLU columns, and the LM head's rows concatenated, equal the whole layer's.
TEST(TensorShard, PartialProductsAddUpToTheWholeLayer) {
  const ModelConfig config = SmallConfig(false);
  const ModelWeights whole = ModelWeights::random(config, DType::kF32, 11);
  const LayerWeights& w = whole.layer(1);
  const std::vector<double> x = RandomVector(config.hidden_size(), 1);
  const std::vector<double> heads = RandomVector(config.q_dim(), 2);  // attention's output
  const auto swiglu = [](const std::vector<double>& g, const std::vector<double>& u) {
    std::vector<double> h(g.size());
    for (size_t i = 0; i < g.size(); ++i) h[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
    return h;
  };
  const std::vector<double> o_whole = Product(w.o_proj, heads);
  const std::vector<double> mlp_whole =
      Product(w.down_proj, swiglu(Product(w.gate_proj, x), Product(w.up_proj, x)));
  const std::vector<double> logits_whole = Product(whole.lm_head(), x);
  for (int world : {2, 4}) {
    std::vector<double> o(o_whole.size(), 0.0), mlp(mlp_whole.size(), 0.0), logits;
    for (int rank = 0; rank < world; ++rank) {
      const ShardPlan plan = Plan(config, rank, world);
      Result<ModelWeights> s = whole.shard(plan);
      ASSERT_TRUE(s.ok());
      const LayerWeights& p = s->layer(1);
      const std::vector<double> mine(
          heads.begin() + plan.head_begin * config.head_dim(),
          heads.begin() + (plan.head_begin + plan.num_heads) * config.head_dim());
      const std::vector<double> o_part = Product(p.o_proj, mine);
      const std::vector<double> mlp_part =
          Product(p.down_proj, swiglu(Product(p.gate_proj, x), Product(p.up_proj, x)));
      for (size_t i = 0; i < o.size(); ++i) o[i] += o_part[i];
      for (size_t i = 0; i < mlp.size(); ++i) mlp[i] += mlp_part[i];
      const std::vector<double> l = Product(s->lm_head(), x);
      logits.insert(logits.end(), l.begin(), l.end());
    }
    for (size_t i = 0; i < o.size(); ++i) EXPECT_NEAR(o[i], o_whole[i], 1e-9);
    for (size_t i = 0; i < mlp.size(); ++i) EXPECT_NEAR(mlp[i], mlp_whole[i], 1e-9);
    ASSERT_EQ(logits.size(), logits_whole.size());
    for (size_t i = 0; i < logits.size(); ++i) EXPECT_NEAR(logits[i], logits_whole[i], 1e-9);
  }
}

TEST(TensorShard, Fp8RowScalesFollowTheirRows) {
  const ModelConfig config = SmallConfig(false);
  const ModelWeights whole = ModelWeights::random(config, DType::kF32, 5);
  Result<ModelWeights> fp8 = whole.converted(
      [](const TensorView& t, WeightRole role) -> Result<std::optional<ConvertedWeight>> {
        if (role != WeightRole::kLinear) return std::optional<ConvertedWeight>();
        CELLM_ASSIGN_OR_RETURN(ConvertedWeight c, quantize_to_fp8(t));
        return std::optional<ConvertedWeight>(std::move(c));
      });
  ASSERT_TRUE(fp8.ok()) << fp8.status().to_string();
  const LayerWeights& w = fp8->layer(0);
  for (int rank = 0; rank < 2; ++rank) {
    const ShardPlan plan = Plan(config, rank, 2);
    Result<ModelWeights> s = fp8->shard(plan);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    const LayerWeights& p = s->layer(0);
    ASSERT_EQ(p.up_proj.dtype, DType::kF8E4M3);
    for (int64_t r = 0; r < plan.ffn_size; ++r) {
      EXPECT_EQ(p.up_proj.scales[r], w.up_proj.scales[plan.ffn_begin + r]);
    }
    // A column slice keeps each row's scale: every row of down_proj is whole there.
    for (int64_t r = 0; r < config.hidden_size(); ++r) {
      EXPECT_EQ(p.down_proj.scales[r], w.down_proj.scales[r]);
      const auto* part = static_cast<const uint8_t*>(p.down_proj.data) + r * plan.ffn_size;
      const auto* full = static_cast<const uint8_t*>(w.down_proj.data) +
                         r * config.intermediate_size() + plan.ffn_begin;
      EXPECT_EQ(std::memcmp(part, full, static_cast<size_t>(plan.ffn_size)), 0);
    }
  }
}

// Column slices of a block format fall on whole blocks, or the shard names the weight.
TEST(TensorShard, BlockFormatColumnsSplitOnlyOnTheirBlocks) {
  for (int64_t ffn : {96, 128}) {
    const ModelConfig config = SmallConfig(false, 4, ffn);
    const ModelWeights whole = ModelWeights::random(config, DType::kF32, 9);
    // Q8_0: 34 bytes per 32 values; byte b of row r's blocks is (r * 131 + b) % 251.
    Result<ModelWeights> q8 = whole.converted(
        [](const TensorView& t, WeightRole role) -> Result<std::optional<ConvertedWeight>> {
          if (role != WeightRole::kLinear || t.name.find("down_proj") == std::string::npos) {
            return std::optional<ConvertedWeight>();
          }
          ConvertedWeight c;
          c.block_type = GgmlType::kQ8_0;
          const int64_t row_bytes = t.shape[1] / 32 * 34;
          c.bytes.resize(static_cast<size_t>(t.shape[0] * row_bytes));
          for (int64_t r = 0; r < t.shape[0]; ++r) {
            for (int64_t b = 0; b < row_bytes; ++b) {
              c.bytes[static_cast<size_t>(r * row_bytes + b)] =
                  static_cast<std::byte>((r * 131 + b) % 251);
            }
          }
          return std::optional<ConvertedWeight>(std::move(c));
        });
    ASSERT_TRUE(q8.ok()) << q8.status().to_string();
    const ShardPlan plan = Plan(config, 1, 2);
    Result<ModelWeights> s = q8->shard(plan);
    if (plan.ffn_begin % 32 != 0) {
      ASSERT_FALSE(s.ok());
      EXPECT_NE(s.status().message().find("model.layers.0.mlp.down_proj.weight"), std::string::npos)
          << s.status().message();
      EXPECT_NE(s.status().message().find("Q8_0 blocks of 32"), std::string::npos)
          << s.status().message();
      continue;
    }
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    const TensorView& part = s->layer(0).down_proj;
    const int64_t part_row = plan.ffn_size / 32 * 34;
    ASSERT_EQ(part.nbytes, static_cast<size_t>(config.hidden_size() * part_row));
    for (int64_t r = 0; r < config.hidden_size(); ++r) {
      for (int64_t b = 0; b < part_row; ++b) {
        const int64_t whole_b = plan.ffn_begin / 32 * 34 + b;
        ASSERT_EQ(static_cast<const std::byte*>(part.data)[r * part_row + b],
                  static_cast<std::byte>((r * 131 + whole_b) % 251));
      }
    }
  }
}

TEST(TensorShard, AShardIsNotSplitAgainAndAForeignPlanIsRefused) {
  const ModelConfig config = SmallConfig(false);
  const ModelWeights whole = ModelWeights::random(config, DType::kBF16, 1);
  Result<ModelWeights> s = whole.shard(Plan(config, 0, 2));
  ASSERT_TRUE(s.ok());
  Result<ModelWeights> again = s->shard(Plan(config, 0, 2));
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("cannot be split again"), std::string::npos);
  ShardPlan foreign = Plan(config, 0, 2);
  foreign.ffn_size += 1;
  EXPECT_FALSE(whole.shard(foreign).ok());
  EXPECT_FALSE(ModelWeights::random_shard(config, DType::kBF16, 1, foreign).ok());
}

}  // namespace
}  // namespace cellm
