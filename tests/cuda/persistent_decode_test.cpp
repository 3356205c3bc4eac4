// The persistent one-row kernel (kernels/decode_layers.h) against the separate kernels:
// two forward engines with the same bf16 weights, one with persistent_decode, run the
// same prompt (prefill steps of many rows: the same kernels in both) and then the same
// one-row decode steps, eagerly and from captured decode graphs, each fed the other
// engine's greedy token; every step's full vocabulary of logits must agree within the
// rounding of bf16 sums taken in another order, and so must the K/V each step leaves
// for the next ones (a wrong cell or rotation would move the later steps' logits).
// Shapes: Llama-3.2-1B's layer (two of them), Llama-3.1-8B's (its down projection's
// 14,336 columns take two ring stages a row, head_dim 128), and a small model with q/k
// biases, an o bias, q/k head norms and a sliding window shorter than the context.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cellm/model_config.h"
#include "cellm/model_weights.h"
#include "cuda/cuda_forward.h"
#include "cuda/kernels/decode_layers.h"
#include "gpu_test.h"

namespace cellm {
namespace {

ModelConfig config_of(ModelSpec spec) {
  Result<ModelConfig> c = ModelConfig::from_spec(std::move(spec), "persistent_decode_test");
  CELLM_CHECK_MSG(c.ok(), c.status().to_string());
  return *c;
}

ModelConfig preset_layers(const char* name, int64_t layers, int64_t vocab) {
  Result<ModelConfig> c = ModelConfig::preset(name);
  CELLM_CHECK_MSG(c.ok(), c.status().to_string());
  ModelSpec spec = c->spec();
  spec.num_hidden_layers = layers;
  spec.vocab_size = vocab;
  spec.layer_windows.clear();
  spec.bos_token_id.reset();
  spec.eos_token_ids.clear();
  return config_of(spec);
}

ModelConfig small_with_everything() {
  ModelSpec spec;
  spec.architecture = Architecture::kLlama;
  spec.hidden_size = 256;
  spec.num_hidden_layers = 2;
  spec.num_attention_heads = 8;
  spec.num_key_value_heads = 2;
  spec.head_dim = 32;
  spec.intermediate_size = 512;
  spec.vocab_size = 1000;
  spec.max_position_embeddings = 4096;
  spec.qkv_bias = true;
  spec.o_bias = true;
  spec.qk_norm = true;
  spec.layer_windows = {16, 0};
  return config_of(spec);
}

struct Case {
  std::string name;
  ModelConfig config;
};

class PersistentDecodeTest : public ::testing::TestWithParam<int> {};

std::vector<Case> cases() {
  return {{"llama_1b_layers", preset_layers("1b", 2, 32000)},
          {"llama_8b_layer", preset_layers("8b", 1, 4096)},
          {"biases_norms_window", small_with_everything()}};
}

std::unique_ptr<cuda::ForwardEngine> engine_for(const ModelWeights& w, bool persistent) {
  cuda::ForwardDims dims;
  dims.max_rows = 64;
  dims.max_cells = 256;
  dims.max_seqs = 1;
  dims.max_session_tokens = 256;
  cuda::ForwardOptions options;
  options.precision = CudaPrecision::kBF16;
  options.tune_gemm = false;
  options.persistent_decode = persistent;
  Result<std::unique_ptr<cuda::ForwardEngine>> e = cuda::ForwardEngine::create(w, dims, options);
  CELLM_CHECK_MSG(e.ok(), e.status().to_string());
  return std::move(*e);
}

// Stages rows [from, from + n) of the session (sequence 0, cell = position), selecting
// the last one.
void stage(cuda::ForwardEngine& e, const std::vector<Token>& tokens, int32_t from, int32_t n) {
  cuda::StepHost& h = e.host();
  for (int32_t r = 0; r < n; ++r) {
    h.tokens[r] = tokens[static_cast<size_t>(from + r)];
    h.positions[r] = from + r;
    h.row_seq[r] = 0;
    h.cells[r] = from + r;
  }
  h.selected[0] = n - 1;
  h.sampling[0] = cuda::SamplingRow{};
  h.sampling[0].position = from + n;
}

TEST_P(PersistentDecodeTest, OneRowStepsAgreeWithTheSeparateKernels) {
  CELLM_SKIP_WITHOUT_GPU();
  const Case c = cases().at(static_cast<size_t>(GetParam()));
  const ModelConfig& cfg = c.config;
  ASSERT_TRUE(cuda::decode_layers_supported(cfg.hidden_size(), cfg.intermediate_size(),
                                            cfg.num_heads(), cfg.num_kv_heads(), cfg.head_dim()))
      << c.name;
  const ModelWeights w = ModelWeights::random(cfg, DType::kBF16, 7);
  auto fused = engine_for(w, true);
  auto apart = engine_for(w, false);
  EXPECT_TRUE(fused->persistent_one_row());
  EXPECT_FALSE(apart->persistent_one_row());

  // A 100-token prompt: its first 99 tokens in two prefill steps (64 + 35 rows), then
  // one-row steps from its last token on: the first eager (the bucket's warm-up), the
  // second captured, the rest replayed.
  std::mt19937 rng(11);
  std::uniform_int_distribution<Token> token(0, static_cast<Token>(cfg.vocab_size() - 1));
  std::vector<Token> tokens(100);
  for (Token& t : tokens) t = token(rng);
  for (auto* e : {fused.get(), apart.get()}) {
    stage(*e, tokens, 0, 64);
    ASSERT_TRUE(e->run_eager(64, 1).ok());
    stage(*e, tokens, 64, 35);
    ASSERT_TRUE(e->run_eager(35, 1).ok());
  }
  const std::vector<int32_t> logit_rows = {0};
  constexpr int kSteps = 8;
  for (int step = 0; step < kSteps; ++step) {
    const auto pos = static_cast<int32_t>(tokens.size()) - 1;
    std::vector<float> logits[2];
    for (int k = 0; k < 2; ++k) {
      cuda::ForwardEngine& e = k == 0 ? *fused : *apart;
      cuda::StepHost& h = e.host();
      h.tokens[0] = tokens.back();
      h.positions[0] = pos;
      h.row_seq[0] = 0;
      h.cells[0] = pos;
      h.selected[0] = 0;
      h.sampling[0] = cuda::SamplingRow{};
      h.sampling[0].position = pos + 1;
      const Status s = e.run_decode_graph(1, logit_rows);
      ASSERT_TRUE(s.ok()) << c.name << " step " << step << ": " << s.to_string();
      const std::span<const float> l = e.host_logits(0);
      logits[k].assign(l.begin(), l.end());
    }
    // Agreement: the logits' RMS difference within 3% of their RMS, the largest within
    // 10% of the largest logit, and the same argmax wherever the separate kernels' top
    // two are further apart than twice the largest difference.
    double diff_sq = 0, ref_sq = 0, max_diff = 0, max_ref = 0;
    for (size_t v = 0; v < logits[1].size(); ++v) {
      const double d = static_cast<double>(logits[0][v]) - logits[1][v];
      diff_sq += d * d;
      ref_sq += static_cast<double>(logits[1][v]) * logits[1][v];
      max_diff = std::max(max_diff, std::abs(d));
      max_ref = std::max(max_ref, std::abs(static_cast<double>(logits[1][v])));
    }
    const std::string where = c.name + " step " + std::to_string(step);
    EXPECT_LE(std::sqrt(diff_sq / ref_sq), 0.03) << where;
    EXPECT_LE(max_diff, 0.1 * max_ref) << where;
    std::vector<size_t> order(logits[1].size());
    for (size_t v = 0; v < order.size(); ++v) order[v] = v;
    std::partial_sort(order.begin(), order.begin() + 2, order.end(),
                      [&](size_t a, size_t b) { return logits[1][a] > logits[1][b]; });
    const auto fused_top = static_cast<size_t>(
        std::max_element(logits[0].begin(), logits[0].end()) - logits[0].begin());
    if (logits[1][order[0]] - logits[1][order[1]] > 2 * max_diff) {
      EXPECT_EQ(fused_top, order[0]) << where;
    }
    tokens.push_back(static_cast<Token>(order[0]));
  }
  const std::vector<std::string>& notes = fused->graph_notes();
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("persistent"), std::string::npos) << notes[0];
}

std::string case_name(const ::testing::TestParamInfo<int>& info) {
  static const char* const kNames[] = {"llama_1b_layers", "llama_8b_layer", "biases_norms_window"};
  return kNames[info.param];
}

INSTANTIATE_TEST_SUITE_P(Shapes, PersistentDecodeTest, ::testing::Values(0, 1, 2), case_name);

// A model the kernel cannot take keeps the separate kernels, whatever the option says.
TEST(PersistentDecodeShapes, HeadsWiderThanTheKernelKeepTheSeparateKernels) {
  CELLM_SKIP_WITHOUT_GPU();
  EXPECT_FALSE(cuda::decode_layers_supported(256, 512, 2, 1, 256));  // head_dim 256
  EXPECT_FALSE(cuda::decode_layers_supported(256, 512, 8, 2, 4));    // head_dim 4
  EXPECT_FALSE(cuda::decode_layers_supported(260, 512, 8, 2, 32));   // d not a multiple of 8
  EXPECT_FALSE(cuda::decode_layers_supported(256, 512, 6, 4, 32));   // 4 kv heads for 6
  EXPECT_TRUE(cuda::decode_layers_supported(2048, 8192, 32, 8, 64));
  // The norms hold a row in two 8-float packs a consumer thread at most: d <= 7,680.
  EXPECT_TRUE(cuda::decode_layers_supported(7680, 8192, 32, 8, 128));
  EXPECT_FALSE(cuda::decode_layers_supported(7688, 8192, 32, 8, 128));
  ModelSpec spec = small_with_everything().spec();
  spec.head_dim = 4;
  spec.hidden_size = 32;
  spec.intermediate_size = 64;
  const ModelWeights w = ModelWeights::random(config_of(spec), DType::kBF16, 3);
  EXPECT_FALSE(engine_for(w, true)->persistent_one_row());
}

}  // namespace
}  // namespace cellm
