// `cellm generate` end to end: the JSON report's contents, greedy output equal
// to the reference continuations (models/kjv-small against
// tests/fixtures/kjv_reference.json; mistral-tiny against its reference.json),
// --prompt-tokens fed exactly as given, and seeded sampling that does not
// depend on what else shares the batches.
#include <gtest/gtest.h>

#include <filesystem>
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

struct KjvGreedy {
  std::string prompt;
  Ids prompt_ids;  // with the leading <|bos|>
  Ids new_ids;     // 32 greedy tokens (never stopped at <|eos|>)
};

std::vector<KjvGreedy> kjv_greedy() {
  const json j =
      testing::parse_json_file(testing::source_dir() + "/tests/fixtures/kjv_reference.json");
  std::vector<KjvGreedy> out;
  for (const json& g : j.at("greedy")) {
    out.push_back({g.at("prompt").get<std::string>(), g.at("prompt_ids").get<Ids>(),
                   g.at("new_ids").get<Ids>()});
  }
  return out;
}

Ids head(const Ids& ids, size_t n) {
  return Ids(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(std::min(n, ids.size())));
}

std::string join_ids(const Ids& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

// Runs `cellm generate args... --report-json <tmp>` and returns the report;
// fails the test unless the command exited 0.
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
  if (!fs::exists(report)) {
    ADD_FAILURE() << "no report written\n" << r.describe();
    return json::object();
  }
  return testing::parse_json_file(report);
}

Ids tokens_of(const json& report, size_t i) {
  return report.at("generations").at(i).at("tokens").get<Ids>();
}

TEST(CellmGenerateTest, GreedyReportMatchesTheKjvReferenceAndAccountsForEverything) {
  const std::vector<KjvGreedy> ref = kjv_greedy();
  ASSERT_EQ(ref.size(), 2u);
  const json report = generate_report({"--model", testing::kjv_dir(), "--prompt", ref[0].prompt,
                                       "--prompt", ref[1].prompt, "--max-new-tokens", "16"});
  ASSERT_TRUE(report.contains("generations")) << report.dump(2);

  const json& gens = report.at("generations");
  ASSERT_EQ(gens.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const json& g = gens.at(i);
    SCOPED_TRACE(ref[i].prompt);
    EXPECT_EQ(g.at("prompt").get<std::string>(), ref[i].prompt);
    // --prompt encodes with the tokenizer's post-processor: <|bos|> first,
    // exactly as the reference encoded its prompts.
    EXPECT_EQ(g.at("prompt_tokens").get<Ids>(), ref[i].prompt_ids);
    EXPECT_EQ(g.at("tokens").get<Ids>(), head(ref[i].new_ids, 16));
    EXPECT_EQ(g.at("finish_reason").get<std::string>(), "token_limit");
    EXPECT_EQ(g.at("error").get<std::string>(), "");
    EXPECT_FALSE(g.at("text").get<std::string>().empty());
    EXPECT_EQ(g.at("metrics").at("n_generated_tokens").get<int64_t>(), 16);
  }
  // The reference's text of the first 16 tokens is what the run printed.
  EXPECT_EQ(gens.at(0).at("text").get<std::string>().rfind(" of the reign of David", 0), 0u)
      << gens.at(0).at("text");

  const json& timing = report.at("timing");
  EXPECT_EQ(timing.at("generated_tokens").get<int64_t>(), 32);
  EXPECT_GT(timing.at("generate_seconds").get<double>(), 0.0);
  EXPECT_GE(timing.at("load_seconds").get<double>(), 0.0);

  const json& engine = report.at("engine");
  EXPECT_GT(engine.at("steps").get<int64_t>(), 0);
  EXPECT_EQ(engine.at("steps_failed").get<int64_t>(), 0);
  EXPECT_EQ(engine.at("generations_started").get<int64_t>(), 2);
  EXPECT_EQ(engine.at("generations_completed").get<int64_t>(), 2);
  EXPECT_EQ(engine.at("finished_token_limit").get<int64_t>(), 2);
  EXPECT_EQ(engine.at("total_generated_tokens").get<int64_t>(), 32);

  const json& kv = report.at("kv");
  EXPECT_EQ(kv.at("cells_in_use").get<int64_t>(), 0);
  EXPECT_GT(kv.at("bytes_per_cell").get<int64_t>(), 0);

  const json& config = report.at("config");
  EXPECT_EQ(config.at("model").get<std::string>(), testing::kjv_dir());
  EXPECT_EQ(config.at("executor").get<std::string>(), "cpu");
  EXPECT_EQ(config.at("max_new_tokens").get<int64_t>(), 16);
  EXPECT_EQ(config.at("temperature").get<double>(), 0.0);
  EXPECT_EQ(config.at("max_sessions").get<int64_t>(), 2);
  EXPECT_FALSE(config.at("ignore_eos").get<bool>());
}

TEST(CellmGenerateTest, PromptTokensAreFedAsGivenWithoutAddingABos) {
  const std::vector<KjvGreedy> ref = kjv_greedy();
  // The reference ids already start with <|bos|>; a second one would change
  // the continuation.
  const json report = generate_report({"--model", testing::kjv_dir(), "--prompt-tokens",
                                       join_ids(ref[0].prompt_ids), "--max-new-tokens", "16"});
  ASSERT_TRUE(report.contains("generations")) << report.dump(2);
  EXPECT_EQ(report.at("generations").at(0).at("prompt_tokens").get<Ids>(), ref[0].prompt_ids);
  EXPECT_EQ(report.at("generations").at(0).at("prompt").get<std::string>(), "");
  EXPECT_EQ(tokens_of(report, 0), head(ref[0].new_ids, 16));
}

TEST(CellmGenerateTest, PromptTokensReproduceMistralTinysGreedyContinuations) {
  const fs::path fixture = testing::source_dir() + "/tests/fixtures/models/mistral-tiny";
  const json ref = testing::parse_json_file(fixture / "reference.json");
  const fs::path tokenizer =
      fs::path(CELLM_SHARED_DIR) / "tokenizers" / ref.at("tokenizer").get<std::string>();
  if (!fs::exists(tokenizer / "tokenizer.json")) GTEST_SKIP() << "no " << tokenizer;
  testing::TempDir tmp;
  const fs::path dir = tmp.path() / "mistral-tiny";
  testing::assemble_model_dir(dir, {fixture, tokenizer});

  // Every reference prompt at once; --ignore-eos as the reference never stops.
  std::vector<std::string> args = {"--model", dir.string(), "--max-new-tokens", "24",
                                   "--ignore-eos"};
  for (const json& p : ref.at("prompts")) {
    args.push_back("--prompt-tokens");
    args.push_back(join_ids(p.at("ids").get<Ids>()));
  }
  const json report = generate_report(args);
  ASSERT_TRUE(report.contains("generations")) << report.dump(2);
  ASSERT_EQ(report.at("generations").size(), ref.at("prompts").size());
  for (size_t i = 0; i < ref.at("prompts").size(); ++i) {
    const json& p = ref.at("prompts").at(i);
    EXPECT_EQ(report.at("generations").at(i).at("prompt_tokens").get<Ids>(),
              p.at("ids").get<Ids>());
    EXPECT_EQ(tokens_of(report, i), p.at("greedy").at("new_ids").get<Ids>()) << p.at("text");
  }
  EXPECT_TRUE(report.at("config").at("ignore_eos").get<bool>());
  EXPECT_EQ(report.at("engine").at("steps_failed").get<int64_t>(), 0);
}

TEST(CellmGenerateTest, SeededSamplingIsReproducibleAloneAndAmongOtherPrompts) {
  const std::vector<std::string> sampling = {
      "--model", testing::kjv_dir(), "--temperature", "0.8", "--top-p", "0.9", "--max-new-tokens",
      "24"};
  auto run = [&](const std::string& seed, std::vector<std::string> prompts) {
    std::vector<std::string> args = sampling;
    args.push_back("--seed");
    args.push_back(seed);
    for (const std::string& p : prompts) {
      args.push_back("--prompt");
      args.push_back(p);
    }
    return generate_report(args);
  };
  const std::string prompt = "In the beginning";
  const json alone = run("7", {prompt});
  const json again = run("7", {prompt});
  const json crowded =
      run("7", {"And the LORD said unto Moses", prompt, "Blessed are the poor in spirit",
                "Now these are the generations"});
  const json other_seed = run("8", {prompt});
  ASSERT_TRUE(alone.contains("generations") && again.contains("generations") &&
              crowded.contains("generations") && other_seed.contains("generations"));

  const Ids tokens = tokens_of(alone, 0);
  ASSERT_EQ(tokens.size(), 24u);
  EXPECT_EQ(tokens_of(again, 0), tokens);
  EXPECT_EQ(tokens_of(crowded, 1), tokens);
  // The four ran concurrently, sharing steps.
  EXPECT_EQ(crowded.at("engine").at("peak_concurrent_generations").get<int64_t>(), 4);
  EXPECT_LT(crowded.at("engine").at("steps").get<int64_t>(),
            crowded.at("engine").at("total_generated_tokens").get<int64_t>());
  // The seed is what fixes the draw: another seed gives another continuation,
  // and sampling at 0.8 is not the greedy one.
  EXPECT_NE(tokens_of(other_seed, 0), tokens);
  EXPECT_NE(tokens, head(kjv_greedy()[0].new_ids, 24));
}

}  // namespace
}  // namespace cellm
