// Bad inputs to the real `cellm` command: each must end the process normally
// with a non-zero exit code (no signal, no abort) and print exactly one line on
// stderr, "<command>: error: <problem>", that names the problem and, where a
// file is at fault, the file. Broken model folders are copies of models/kjv-small
// damaged in a temporary directory.
#include <gtest/gtest.h>

#include <filesystem>
#include <initializer_list>
#include <string>

#include "run_cellm.h"

namespace cellm {
namespace {

namespace fs = std::filesystem;
using testing::CellmRun;
using testing::run_cellm;

// The kjv-small header entry the shape and dtype tests rewrite in place (same
// byte length, so every data offset stays valid).
constexpr const char* kDownProjEntry =
    R"("model.layers.0.mlp.down_proj.weight":{"dtype":"BF16","shape":[384,1024])";

void ExpectOneErrorLine(const CellmRun& r, const std::string& command,
                        std::initializer_list<std::string> parts) {
  ASSERT_TRUE(r.exited) << r.describe();
  EXPECT_NE(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.out, "") << r.describe();
  ASSERT_EQ(r.err_lines().size(), 1u) << r.describe();
  EXPECT_EQ(r.err.back(), '\n') << r.describe();
  const std::string line = r.err_lines()[0];
  EXPECT_EQ(line.rfind(command + ": error: ", 0), 0u) << line;
  for (const std::string& part : parts) {
    EXPECT_NE(line.find(part), std::string::npos) << "'" << part << "' not in: " << line;
  }
}

class CellmBadModelTest : public ::testing::Test {
 protected:
  // A copy of models/kjv-small (model.safetensors as a link) that a test damages.
  fs::path model_copy() {
    const fs::path dir = tmp_.path() / "model";
    testing::assemble_model_dir(dir, {testing::kjv_dir()});
    return dir;
  }
  // Replaces `dir`/model.safetensors by a real file with `bytes`.
  static void write_safetensors(const fs::path& dir, const std::string& bytes) {
    fs::remove(dir / "model.safetensors");
    testing::write_text(dir / "model.safetensors", bytes);
  }
  // kjv-small's safetensors with kDownProjEntry replaced by `entry`, padded
  // with spaces to the same length.
  static std::string kjv_safetensors_with(std::string entry) {
    std::string bytes = testing::read_text(testing::kjv_dir() + "/model.safetensors");
    const size_t at = bytes.find(kDownProjEntry);
    EXPECT_NE(at, std::string::npos) << "kjv-small's header changed; update kDownProjEntry";
    const size_t len = std::string(kDownProjEntry).size();
    EXPECT_LE(entry.size(), len);
    entry.resize(len, ' ');
    bytes.replace(at, len, entry);
    return bytes;
  }
  static CellmRun generate(const fs::path& dir) {
    return run_cellm({"generate", "--model", dir.string(), "--prompt", "In the beginning",
                      "--max-new-tokens", "4", "--threads", "2"});
  }

  testing::TempDir tmp_;
};

TEST_F(CellmBadModelTest, AnIntactCopyGenerates) {
  const CellmRun r = generate(model_copy());
  ASSERT_TRUE(r.exited) << r.describe();
  EXPECT_EQ(r.exit_code, 0) << r.describe();
}

TEST_F(CellmBadModelTest, AMissingModelFolderIsNamed) {
  const fs::path dir = tmp_.path() / "absent";
  ExpectOneErrorLine(generate(dir), "cellm generate",
                     {dir.string() + ": the model folder does not exist"});
}

TEST_F(CellmBadModelTest, AMissingConfigJsonIsNamed) {
  const fs::path dir = model_copy();
  fs::remove(dir / "config.json");
  ExpectOneErrorLine(generate(dir), "cellm generate",
                     {(dir / "config.json").string() + ":", "does not exist"});
}

TEST_F(CellmBadModelTest, AMalformedConfigJsonIsNamed) {
  const fs::path dir = model_copy();
  testing::write_text(dir / "config.json", "{\"architectures\": [\"LlamaForCausalLM\",");
  ExpectOneErrorLine(generate(dir), "cellm generate",
                     {(dir / "config.json").string() + ":", "malformed JSON"});
}

TEST_F(CellmBadModelTest, AnUnknownArchitectureIsNamed) {
  const fs::path dir = model_copy();
  std::string config = testing::read_text(dir / "config.json");
  const size_t at = config.find("LlamaForCausalLM");
  ASSERT_NE(at, std::string::npos);
  config.replace(at, std::string("LlamaForCausalLM").size(), "GPT2LMHeadModel");
  testing::write_text(dir / "config.json", config);
  ExpectOneErrorLine(generate(dir), "cellm generate",
                     {(dir / "config.json").string() + ":", "'GPT2LMHeadModel' is not supported"});
}

TEST_F(CellmBadModelTest, ATruncatedSafetensorsIsNamed) {
  const fs::path dir = model_copy();
  const std::string bytes = testing::read_text(testing::kjv_dir() + "/model.safetensors");
  write_safetensors(dir, bytes.substr(0, bytes.size() / 2));
  ExpectOneErrorLine(generate(dir), "cellm generate",
                     {(dir / "model.safetensors").string() + ":", "truncated"});
}

TEST_F(CellmBadModelTest, ATensorOfTheWrongShapeIsNamedWithItsFileAndBothShapes) {
  const fs::path dir = model_copy();
  write_safetensors(
      dir, kjv_safetensors_with(
               R"("model.layers.0.mlp.down_proj.weight":{"dtype":"BF16","shape":[1024,384])"));
  ExpectOneErrorLine(
      generate(dir), "cellm generate",
      {(dir / "model.safetensors").string() + ": tensor 'model.layers.0.mlp.down_proj.weight'",
       "has shape [1024, 384]", "expected [384, 1024]"});
}

TEST_F(CellmBadModelTest, AnUnsupportedDtypeIsNamed) {
  const fs::path dir = model_copy();
  write_safetensors(
      dir, kjv_safetensors_with(
               R"("model.layers.0.mlp.down_proj.weight":{"dtype":"I16","shape":[384,1024])"));
  ExpectOneErrorLine(generate(dir), "cellm generate",
                     {(dir / "model.safetensors").string() + ":",
                      "model.layers.0.mlp.down_proj.weight", "dtype I16 is not supported"});
}

TEST_F(CellmBadModelTest, AMissingTokenizerJsonIsNamed) {
  const fs::path dir = model_copy();
  fs::remove(dir / "tokenizer.json");
  ExpectOneErrorLine(generate(dir), "cellm generate",
                     {(dir / "tokenizer.json").string() + ": no such file"});
}

TEST_F(CellmBadModelTest, AMalformedTokenizerJsonIsNamed) {
  const fs::path dir = model_copy();
  testing::write_text(dir / "tokenizer.json", "{\"model\": {\"type\": \"BPE\",");
  ExpectOneErrorLine(generate(dir), "cellm generate",
                     {(dir / "tokenizer.json").string() + ":", "malformed JSON"});
}

TEST_F(CellmBadModelTest, TokenizeNamesAMissingModelFolder) {
  const fs::path dir = tmp_.path() / "absent";
  ExpectOneErrorLine(run_cellm({"tokenize", "--model", dir.string(), "--text", "x"}),
                     "cellm tokenize", {dir.string() + ": the model folder does not exist"});
}

TEST_F(CellmBadModelTest, BenchNamesAMissingModelFolder) {
  const fs::path dir = tmp_.path() / "absent";
  ExpectOneErrorLine(run_cellm({"bench", "--model", dir.string(), "--json"}), "cellm bench",
                     {dir.string() + ": the model folder does not exist"});
}

// ---- Bad requests to a good model.

CellmRun generate_kjv(std::initializer_list<std::string> extra) {
  std::vector<std::string> args = {"generate", "--model", testing::kjv_dir(), "--threads", "2"};
  args.insert(args.end(), extra.begin(), extra.end());
  return run_cellm(args);
}

TEST(CellmBadRequestTest, APromptLongerThanTheSessionBudgetIsRefused) {
  // "In the beginning God" is <|bos|> + 4 tokens: 5 + 4 new > 8 positions.
  ExpectOneErrorLine(generate_kjv({"--prompt", "In the beginning God", "--max-new-tokens", "4",
                                   "--max-session-tokens", "8"}),
                     "cellm generate",
                     {"prompt 0 has 5 tokens", "needs 9 positions", "--max-session-tokens"});
}

TEST(CellmBadRequestTest, APromptThatFitsTheSessionBudgetExactlyRuns) {
  const CellmRun r = generate_kjv(
      {"--prompt", "In the beginning God", "--max-new-tokens", "3", "--max-session-tokens", "8"});
  ASSERT_TRUE(r.exited) << r.describe();
  EXPECT_EQ(r.exit_code, 0) << r.describe();
}

TEST(CellmBadRequestTest, ATokenIdOutsideTheVocabularyIsRefused) {
  ExpectOneErrorLine(generate_kjv({"--prompt-tokens", "0,1115,4096"}), "cellm generate",
                     {"token id 4096 outside the vocabulary [0, 4096)"});
}

TEST(CellmBadRequestTest, ANonNumericTokenIdIsRefused) {
  ExpectOneErrorLine(generate_kjv({"--prompt-tokens", "0,abc"}), "cellm generate",
                     {"--prompt-tokens", "'abc'"});
}

TEST(CellmBadRequestTest, TopPAboveOneIsRefused) {
  ExpectOneErrorLine(generate_kjv({"--prompt", "x", "--top-p", "1.5"}), "cellm generate",
                     {"top_p must be in (0, 1]", "1.5"});
}

TEST(CellmBadRequestTest, ANegativeTemperatureIsRefused) {
  ExpectOneErrorLine(generate_kjv({"--prompt", "x", "--temperature", "-1"}), "cellm generate",
                     {"temperature must be finite and >= 0", "-1"});
}

TEST(CellmBadRequestTest, ANonNumericTemperatureIsRefused) {
  ExpectOneErrorLine(generate_kjv({"--prompt", "x", "--temperature", "warm"}), "cellm generate",
                     {"--temperature expects a number", "'warm'"});
}

TEST(CellmBadRequestTest, MoreThanTwentyLogprobsAreRefused) {
  ExpectOneErrorLine(generate_kjv({"--prompt", "x", "--logprobs", "21"}), "cellm generate",
                     {"--logprobs must be in [0, 20], got 21"});
}

TEST(CellmBadRequestTest, AnUnknownFlagIsNamed) {
  ExpectOneErrorLine(generate_kjv({"--prompt", "x", "--bogus"}), "cellm generate",
                     {"unknown option '--bogus'", "cellm generate --help"});
}

TEST(CellmBadRequestTest, AMissingFlagValueAtTheEndIsNamed) {
  ExpectOneErrorLine(generate_kjv({"--prompt", "x", "--max-new-tokens"}), "cellm generate",
                     {"--max-new-tokens needs a value <N>"});
}

TEST(CellmBadRequestTest, AFlagFollowedByAnotherFlagIsAMissingValue) {
  ExpectOneErrorLine(run_cellm({"generate", "--model", "--prompt", "x"}), "cellm generate",
                     {"--model needs a value <DIR>"});
}

TEST(CellmBadRequestTest, NoPromptIsRefused) {
  ExpectOneErrorLine(generate_kjv({}), "cellm generate", {"no prompt"});
}

TEST(CellmBadRequestTest, BenchWithNeitherModelNorPresetIsRefused) {
  ExpectOneErrorLine(run_cellm({"bench", "-npp", "8"}), "cellm bench",
                     {"give exactly one of --model DIR or --preset NAME"});
}

TEST(CellmBadRequestTest, BenchWithAnUnknownPresetIsRefused) {
  ExpectOneErrorLine(run_cellm({"bench", "--preset", "nope"}), "cellm bench",
                     {"unknown model preset 'nope'", "110m"});
}

TEST(CellmBadRequestTest, BenchWithAnUnknownTriggerPlacementIsRefused) {
  ExpectOneErrorLine(run_cellm({"bench", "--preset", "110m", "--early-triggers", "sometimes"}),
                     "cellm bench", {"--early-triggers must be timed, on or off, not 'sometimes'"});
}

TEST(CellmBadRequestTest, BenchWithAnUnknownEdgeChoiceIsRefused) {
  ExpectOneErrorLine(run_cellm({"bench", "--preset", "110m", "--early-after-cublas", "yes"}),
                     "cellm bench", {"--early-after-cublas must be timed, on or off, not 'yes'"});
}

TEST(CellmBadRequestTest, BenchWithNoRequestsIsRefused) {
  ExpectOneErrorLine(run_cellm({"bench", "--preset", "110m", "--requests", "0"}), "cellm bench",
                     {"--requests must be in [1, 16777216], got 0"});
}

TEST(CellmBadRequestTest, BenchWithAnUnknownPrefetchChoiceIsRefused) {
  ExpectOneErrorLine(run_cellm({"bench", "--preset", "110m", "--l2-prefetch", "always"}),
                     "cellm bench", {"--l2-prefetch must be timed, on or off, not 'always'"});
}

TEST(CellmBadRequestTest, BenchWithABadSamplingFlagIsRefused) {
  ExpectOneErrorLine(run_cellm({"bench", "--preset", "110m", "--top-p", "0"}), "cellm bench",
                     {"top_p must be in (0, 1]", "got 0"});
  ExpectOneErrorLine(run_cellm({"bench", "--preset", "110m", "--min-p", "2"}), "cellm bench",
                     {"min_p must be in [0, 1]", "got 2"});
  ExpectOneErrorLine(run_cellm({"bench", "--preset", "110m", "--top-k=-3"}), "cellm bench",
                     {"--top-k must be in [0, 2147483647], got -3"});
  ExpectOneErrorLine(run_cellm({"bench", "--preset", "110m", "--temperature", "hot"}),
                     "cellm bench", {"--temperature expects a number", "'hot'"});
}

TEST(CellmBadRequestTest, BenchClocksOnTheCpuExecutorIsRefused) {
  ExpectOneErrorLine(run_cellm({"bench", "--preset", "110m", "--executor", "cpu", "--clocks"}),
                     "cellm bench", {"--clocks reads a CUDA device's clock: give --executor cuda"});
}

TEST(CellmBadRequestTest, BenchClocksWithAServingLoadIsRefused) {
  ExpectOneErrorLine(
      run_cellm({"bench", "--preset", "110m", "--executor", "cpu", "--requests", "4", "--clocks"}),
      "cellm bench", {"--clocks reads the clock through a row's TG phase", "--requests"});
}

TEST(CellmBadRequestTest, TokenizeWithoutTextIsRefused) {
  ExpectOneErrorLine(run_cellm({"tokenize", "--model", testing::kjv_dir()}), "cellm tokenize",
                     {"--text is required"});
}

TEST(CellmBadRequestTest, AnUnknownSubcommandIsNamed) {
  ExpectOneErrorLine(run_cellm({"frobnicate", "--model", "x"}), "cellm",
                     {"unknown command 'frobnicate'", "cellm --help"});
}

}  // namespace
}  // namespace cellm
