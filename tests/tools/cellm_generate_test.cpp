// `cellm generate` end to end: the JSON report's contents, greedy output equal
// to the reference continuations (models/kjv-small against
// tests/fixtures/kjv_reference.json; mistral-tiny against its reference.json),
// --prompt-tokens fed exactly as given, seeded sampling that does not
// depend on what else shares the batches, and --logprobs (against the
// reference's log-softmax on mistral-tiny).
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

  // Every reference prompt at once; --ignore-eos as the reference never stops. Exact
  // f32 products, the reference's numerics: a random-weight model's logits are full of
  // near-ties, which bf16 activations (the CLI's default) would break differently.
  std::vector<std::string> args = {
      "--model", dir.string(), "--max-new-tokens", "24", "--ignore-eos", "--activations", "f32"};
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

// Checks one generation's "logprobs" against its tokens: parallel, `n` entries
// of "top" each, most likely first, the greedy token first when `greedy`.
void expect_report_logprobs(const json& g, size_t n, bool greedy) {
  const Ids tokens = g.at("tokens").get<Ids>();
  const json& lps = g.at("logprobs");
  ASSERT_EQ(lps.size(), tokens.size());
  for (size_t k = 0; k < tokens.size(); ++k) {
    const json& lp = lps.at(k);
    EXPECT_EQ(lp.at("token").get<int32_t>(), tokens[k]) << "token " << k;
    const double logprob = lp.at("logprob").get<double>();
    EXPECT_LE(logprob, 0.0);
    const json& top = lp.at("top");
    ASSERT_EQ(top.size(), n) << "token " << k;
    for (size_t r = 0; r + 1 < top.size(); ++r) {
      EXPECT_GE(top.at(r).at(1).get<double>(), top.at(r + 1).at(1).get<double>());
    }
    EXPECT_LE(logprob, top.at(0).at(1).get<double>());
    if (greedy) {
      EXPECT_EQ(top.at(0).at(0).get<int32_t>(), tokens[k]) << "token " << k;
      EXPECT_EQ(top.at(0).at(1).get<double>(), logprob) << "token " << k;
    }
  }
}

TEST(CellmGenerateTest, LogprobsAreReportedParallelToTheTokensOnlyWhenAsked) {
  const std::string prompt = "In the beginning";
  const json greedy = generate_report({"--model", testing::kjv_dir(), "--prompt", prompt,
                                       "--max-new-tokens", "8", "--logprobs", "5"});
  ASSERT_TRUE(greedy.contains("generations")) << greedy.dump(2);
  expect_report_logprobs(greedy.at("generations").at(0), 5, /*greedy=*/true);
  EXPECT_EQ(greedy.at("config").at("logprobs").get<int64_t>(), 5);
  EXPECT_EQ(tokens_of(greedy, 0), head(kjv_greedy()[0].new_ids, 8)) << "logprobs change nothing";

  // Sampling: the raw-logit log-probabilities of whatever was drawn.
  const json sampled =
      generate_report({"--model", testing::kjv_dir(), "--prompt", prompt, "--max-new-tokens", "12",
                       "--temperature", "1.5", "--seed", "3", "--logprobs", "2"});
  ASSERT_TRUE(sampled.contains("generations")) << sampled.dump(2);
  expect_report_logprobs(sampled.at("generations").at(0), 2, /*greedy=*/false);

  const json plain =
      generate_report({"--model", testing::kjv_dir(), "--prompt", prompt, "--max-new-tokens", "4"});
  ASSERT_TRUE(plain.contains("generations")) << plain.dump(2);
  EXPECT_FALSE(plain.at("generations").at(0).contains("logprobs"));
}

TEST(CellmGenerateTest, LogprobsOfTheFirstTokenEqualTheReferencesLogSoftmax) {
  const fs::path fixture = testing::source_dir() + "/tests/fixtures/models/mistral-tiny";
  const json ref = testing::parse_json_file(fixture / "reference.json");
  const fs::path tokenizer =
      fs::path(CELLM_SHARED_DIR) / "tokenizers" / ref.at("tokenizer").get<std::string>();
  if (!fs::exists(tokenizer / "tokenizer.json")) GTEST_SKIP() << "no " << tokenizer;
  testing::TempDir tmp;
  const fs::path dir = tmp.path() / "mistral-tiny";
  testing::assemble_model_dir(dir, {fixture, tokenizer});

  std::vector<std::string> args = {
      "--model",    dir.string(), "--max-new-tokens", "2",  "--ignore-eos",
      "--logprobs", "20",         "--activations",    "f32"};  // the reference's numerics, as above
  for (const json& p : ref.at("prompts")) {
    args.push_back("--prompt-tokens");
    args.push_back(join_ids(p.at("ids").get<Ids>()));
  }
  const json report = generate_report(args);
  ASSERT_TRUE(report.contains("generations")) << report.dump(2);
  for (size_t i = 0; i < ref.at("prompts").size(); ++i) {
    const json& last = ref.at("prompts").at(i).at("last");
    const double lse = last.at("logsumexp").get<double>();
    const std::vector<double> top_logits = last.at("top_logits").get<std::vector<double>>();
    const Ids top_ids = last.at("top_ids").get<Ids>();
    const json& g = report.at("generations").at(i);
    expect_report_logprobs(g, 20, /*greedy=*/true);
    const json& first = g.at("logprobs").at(0);
    EXPECT_EQ(first.at("token").get<int32_t>(), top_ids[0]);
    EXPECT_NEAR(first.at("logprob").get<double>(), top_logits[0] - lse, 1e-4);
    for (size_t r = 0; r < 20; ++r) {
      EXPECT_NEAR(first.at("top").at(r).at(1).get<double>(), top_logits[r] - lse, 1e-4)
          << "prompt " << i << " rank " << r;
      const bool apart = (r == 0 || top_logits[r - 1] - top_logits[r] > 1e-3) &&
                         top_logits[r] - top_logits[r + 1] > 1e-3;
      if (apart) {
        EXPECT_EQ(first.at("top").at(r).at(0).get<int32_t>(), top_ids[r])
            << "prompt " << i << " rank " << r;
      }
    }
  }
}

}  // namespace
}  // namespace cellm
