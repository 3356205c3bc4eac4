// `cellm bench` under constrained decoding (--json-schema, --grammar, --regex with
// --tokenizer, --outputs), run as a user runs it: every generation follows the
// constraint, the rows count the tokens really generated, and bad flags get one
// clear error.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "run_cellm.h"
#include "support/temp_dir.h"

namespace cellm {
namespace {

using nlohmann::json;
using testing::CellmRun;
using testing::run_cellm;

void ExpectSuccess(const CellmRun& r) {
  ASSERT_TRUE(r.exited) << r.describe();
  ASSERT_EQ(r.exit_code, 0) << r.describe();
}

void ExpectError(const CellmRun& r, const std::string& part) {
  ASSERT_TRUE(r.exited) << r.describe();
  EXPECT_NE(r.exit_code, 0) << r.describe();
  ASSERT_EQ(r.err_lines().size(), 1u) << r.describe();
  const std::string line = r.err_lines()[0];
  EXPECT_EQ(line.rfind("cellm bench: error: ", 0), 0u) << line;
  EXPECT_NE(line.find(part), std::string::npos) << "'" << part << "' not in: " << line;
}

void WriteFile(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path) << text;
}

std::vector<json> ReadLines(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::vector<json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
  return lines;
}

// A schema whose whole output fits the rows' TG (at most 20 bytes of whitespace in
// each of its gaps), so greedy generations of the fixture model end on EOS.
constexpr const char* kSchema =
    R"({"type": "object",
        "properties": {"kind": {"enum": ["psalm", "proverb"]}, "holy": {"type": "boolean"}},
        "required": ["kind", "holy"], "additionalProperties": false})";

// Checks one output against kSchema: the object with exactly its two members.
void ExpectValid(const std::string& text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(j.is_object()) << text;
  EXPECT_EQ(j.size(), 2u) << text;
  ASSERT_TRUE(j.contains("kind") && j["kind"].is_string()) << text;
  EXPECT_TRUE(j["kind"] == "psalm" || j["kind"] == "proverb") << text;
  ASSERT_TRUE(j.contains("holy")) << text;
  EXPECT_TRUE(j["holy"].is_boolean()) << text;
}

TEST(CellmBenchGrammarTest, EveryGenerationOfEveryRowFollowsTheSchema) {
  testing::TempDir dir;
  WriteFile(dir / "schema.json", kSchema);
  const std::string outputs = (dir / "outputs.jsonl").string();
  const CellmRun r = run_cellm({"bench",
                                "--model",
                                testing::kjv_dir(),
                                "--executor",
                                "cpu",
                                "--threads",
                                "2",
                                "-npp",
                                "8",
                                "-ntg",
                                "200",
                                "-npl",
                                "1,3",
                                "--json-schema",
                                (dir / "schema.json").string(),
                                "--outputs",
                                outputs,
                                "--json",
                                "--temperature",
                                "0.8"});
  ExpectSuccess(r);
  std::istringstream rows(r.out);
  std::vector<json> row_lines;
  for (std::string line; std::getline(rows, line);) row_lines.push_back(json::parse(line));
  ASSERT_EQ(row_lines.size(), 2u) << r.out;
  const std::vector<json> generations = ReadLines(outputs);
  ASSERT_EQ(generations.size(), 4u);  // B = 1, then B = 3: the warm-up writes none
  int64_t done = 0, tokens = 0;
  for (const json& g : generations) {
    SCOPED_TRACE(g.dump());
    tokens += g.at("tokens").get<int64_t>();
    EXPECT_LE(g.at("tokens").get<int64_t>(), 200);
    // This schema's outputs fit in 200 tokens: every generation ends complete.
    ASSERT_TRUE(g.at("done").get<bool>());
    ++done;
    ExpectValid(g.at("text").get<std::string>());
  }
  // Each row's S_TG counts its generated tokens, not B TG.
  int64_t row_tokens = 0, row_done = 0;
  for (const json& row : row_lines) {
    EXPECT_EQ(row.at("constraint").get<std::string>(),
              "json-schema " + (dir / "schema.json").string());
    const auto generated = row.at("tg_tokens").get<int64_t>();
    EXPECT_LT(generated, 200 * row.at("pl").get<int64_t>()) << row;
    EXPECT_NEAR(row.at("speed_tg").get<double>(),
                static_cast<double>(generated) / row.at("t_tg").get<double>(), 1e-6)
        << row;
    row_tokens += generated;
    row_done += row.at("tg_done").get<int64_t>();
  }
  EXPECT_EQ(row_tokens, tokens);
  EXPECT_EQ(row_done, done);
}

TEST(CellmBenchGrammarTest, TheTableNamesTheConstraintAndPrintsTheGrammar) {
  const CellmRun r =
      run_cellm({"bench", "--model", testing::kjv_dir(), "--executor", "cpu", "--threads", "2",
                 "-npp", "4", "-ntg", "24", "-npl", "2", "--regex", "(ab|cd)+"});
  ExpectSuccess(r);
  EXPECT_NE(r.out.find("constraint regex (ab|cd)+ over the vocabulary of " + testing::kjv_dir()),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("root ::="), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("|    gen |  done |"), std::string::npos) << r.out;
}

// Whether `text` matches [a-z]{3,5} [0-9]{2} (whole) or is a prefix of such a
// match (written out: std::regex trips -Wmaybe-uninitialized under the sanitizers).
bool MatchesWordAndNumber(const std::string& text, bool whole) {
  size_t i = 0;
  while (i < text.size() && text[i] >= 'a' && text[i] <= 'z') ++i;
  if (i > 5 || (whole && i < 3)) return false;
  if (i == text.size()) return !whole;
  if (text[i] != ' ' || i < 3) return false;
  size_t digits = 0;
  for (++i; i < text.size(); ++i, ++digits) {
    if (text[i] < '0' || text[i] > '9') return false;
  }
  return whole ? digits == 2 : digits <= 2;
}

TEST(CellmBenchGrammarTest, RegexOutputsMatch) {
  testing::TempDir dir;
  const std::string outputs = (dir / "outputs.jsonl").string();
  const CellmRun r = run_cellm({"bench", "--model", testing::kjv_dir(), "--executor", "cpu",
                                "--threads", "2", "-npp", "4", "-ntg", "12", "-npl", "3", "--regex",
                                "[a-z]{3,5} [0-9]{2}", "--outputs", outputs});
  ExpectSuccess(r);
  const std::vector<json> generations = ReadLines(outputs);
  ASSERT_EQ(generations.size(), 3u);
  for (const json& g : generations) {
    const std::string text = g.at("text").get<std::string>();
    if (g.at("done").get<bool>()) {
      EXPECT_TRUE(MatchesWordAndNumber(text, /*whole=*/true)) << g.dump();
    } else {
      // Cut by -ntg: a prefix of a match, exactly TG tokens long.
      EXPECT_EQ(g.at("tokens").get<int64_t>(), 12) << g.dump();
      EXPECT_TRUE(MatchesWordAndNumber(text, /*whole=*/false)) << g.dump();
    }
  }
}

TEST(CellmBenchGrammarTest, BadFlagsAreNamed) {
  testing::TempDir dir;
  WriteFile(dir / "bad.json", R"({"type": "object", "patternProperties": {}})");
  WriteFile(dir / "schema.json", kSchema);
  const std::vector<std::string> base = {"bench", "-npp", "4", "-ntg", "2", "--threads", "2"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    return run_cellm(args);
  };
  ExpectError(with({"--model", testing::kjv_dir(), "--json-schema", (dir / "bad.json").string()}),
              "patternProperties");
  ExpectError(with({"--model", testing::kjv_dir(), "--json-schema", (dir / "nope.json").string()}),
              "--json-schema: cannot read");
  ExpectError(with({"--preset", "110m", "--json-schema", (dir / "schema.json").string()}),
              "a preset has no tokenizer: give --tokenizer DIR");
  ExpectError(with({"--model", testing::kjv_dir(), "--tokenizer", testing::kjv_dir()}),
              "--tokenizer belongs to a constraint");
  ExpectError(with({"--model", testing::kjv_dir(), "--regex", "a", "--grammar", "g.gbnf"}),
              "at most one of --json-schema, --grammar, --regex");
  ExpectError(with({"--model", testing::kjv_dir(), "--regex", "a", "--requests", "2"}),
              "not to the serving load");
  if (std::filesystem::exists(std::string(CELLM_SHARED_DIR) + "/tokenizers/llama3")) {
    // 128,256 ids do not fit the fixture model's 4,096.
    ExpectError(with({"--model", testing::kjv_dir(), "--regex", "a", "--tokenizer",
                      std::string(CELLM_SHARED_DIR) + "/tokenizers/llama3"}),
                "more than the model's vocabulary of 4096");
  }
}

}  // namespace
}  // namespace cellm
