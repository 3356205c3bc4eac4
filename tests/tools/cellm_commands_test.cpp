// `cellm tokenize`, `cellm bench` and every command's --help, run as a user runs
// them.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "run_cellm.h"

namespace cellm {
namespace {

using nlohmann::json;
using testing::CellmRun;
using testing::run_cellm;

void ExpectSuccess(const CellmRun& r) {
  ASSERT_TRUE(r.exited) << r.describe();
  ASSERT_EQ(r.exit_code, 0) << r.describe();
}

TEST(CellmTokenizeTest, PrintsIdsWithTheBosFirstAndTheirDecoding) {
  const CellmRun r = run_cellm(
      {"tokenize", "--model", testing::kjv_dir(), "--text", "In the beginning", "--add-special"});
  ExpectSuccess(r);
  EXPECT_EQ(r.err, "");
  const json j = json::parse(r.out);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_EQ(j.size(), 2u) << r.out;
  // kjv_reference.json's prompt ids for "In the beginning"; <|bos|> is id 0.
  EXPECT_EQ(j.at("ids").get<std::vector<int32_t>>(), (std::vector<int32_t>{0, 1115, 260, 2130}));
  EXPECT_EQ(j.at("decoded").get<std::string>(), "<|bos|>In the beginning");
}

TEST(CellmTokenizeTest, WithoutAddSpecialThereIsNoBos) {
  const CellmRun r =
      run_cellm({"tokenize", "--model", testing::kjv_dir(), "--text", "In the beginning"});
  ExpectSuccess(r);
  const json j = json::parse(r.out);
  EXPECT_EQ(j.at("ids").get<std::vector<int32_t>>(), (std::vector<int32_t>{1115, 260, 2130}));
  EXPECT_EQ(j.at("decoded").get<std::string>(), "In the beginning");
}

TEST(CellmTokenizeTest, UsesTheBundledModelByDefault) {
  const CellmRun r = run_cellm({"tokenize", "--text", "In the beginning", "--add-special"});
  ExpectSuccess(r);
  EXPECT_EQ(json::parse(r.out).at("ids").get<std::vector<int32_t>>(),
            (std::vector<int32_t>{0, 1115, 260, 2130}));
}

struct HelpCase {
  std::string command;
  std::vector<std::string> flags;  // each must appear as "--<flag>"
};

TEST(CellmHelpTest, EverySubcommandDescribesItsFlags) {
  const std::vector<HelpCase> cases = {
      {"generate",
       {"model", "prompt", "prompts-file", "prompt-tokens", "max-new-tokens", "temperature",
        "top-k", "top-p", "min-p", "seed", "ignore-eos", "max-sessions", "max-session-tokens",
        "step-width", "threads", "executor", "report-json", "help"}},
      {"tokenize", {"model", "text", "add-special", "help"}},
      {"bench",
       {"model",
        "preset",
        "npp",
        "ntg",
        "npl",
        "temperature",
        "top-k",
        "top-p",
        "min-p",
        "executor",
        "step-width",
        "threads",
        "seed",
        "peak-bandwidth",
        "no-pdl",
        "no-gemm-tuning",
        "early-triggers",
        "early-after-cublas",
        "l2-prefetch",
        "requests",
        "json",
        "help"}},
  };
  for (const HelpCase& c : cases) {
    for (const char* help : {"--help", "-h"}) {
      SCOPED_TRACE(c.command + " " + help);
      const CellmRun r = run_cellm({c.command, help});
      ExpectSuccess(r);
      EXPECT_EQ(r.err, "");
      EXPECT_EQ(r.out.rfind("usage: cellm " + c.command, 0), 0u) << r.out;
      for (const std::string& flag : c.flags) {
        EXPECT_NE(r.out.find("--" + flag), std::string::npos) << "--" << flag << " in\n" << r.out;
      }
    }
  }
}

TEST(CellmHelpTest, HelpWinsOverOtherFlags) {
  const CellmRun r = run_cellm({"generate", "--model", "/absent", "--bogus", "--help"});
  ExpectSuccess(r);
  EXPECT_EQ(r.out.rfind("usage: cellm generate", 0), 0u) << r.out;
}

TEST(CellmHelpTest, TheTopLevelHelpListsTheCommands) {
  const CellmRun r = run_cellm({"--help"});
  ExpectSuccess(r);
  for (const char* c : {"generate", "tokenize", "bench"}) {
    EXPECT_NE(r.out.find(std::string("  ") + c), std::string::npos) << c << " in\n" << r.out;
  }
}

TEST(CellmHelpTest, NoCommandPrintsTheUsageAndFails) {
  const CellmRun r = run_cellm({});
  ASSERT_TRUE(r.exited) << r.describe();
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("usage: cellm <command>"), std::string::npos) << r.out;
}

TEST(CellmBenchTest, JsonPrintsOneRowPerParallelismWithEveryColumn) {
  const CellmRun r = run_cellm({"bench", "--preset", "110m", "-npp", "8", "-ntg", "4", "-npl",
                                "1,2", "--json", "--threads", "2"});
  ExpectSuccess(r);
  std::vector<json> rows;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) rows.push_back(json::parse(line));
  ASSERT_EQ(rows.size(), 2u) << r.out;
  for (size_t i = 0; i < rows.size(); ++i) {
    const json& row = rows[i];
    SCOPED_TRACE(row.dump());
    const int64_t pl = static_cast<int64_t>(i) + 1;
    EXPECT_EQ(row.at("pp").get<int64_t>(), 8);
    EXPECT_EQ(row.at("tg").get<int64_t>(), 4);
    EXPECT_EQ(row.at("pl").get<int64_t>(), pl);
    EXPECT_EQ(row.at("n_kv").get<int64_t>(), pl * (8 + 4));
    const double t_pp = row.at("t_pp").get<double>(), t_tg = row.at("t_tg").get<double>();
    ASSERT_GT(t_pp, 0.0);
    ASSERT_GT(t_tg, 0.0);
    EXPECT_DOUBLE_EQ(row.at("speed_pp").get<double>(), static_cast<double>(pl * 8) / t_pp);
    EXPECT_DOUBLE_EQ(row.at("speed_tg").get<double>(), static_cast<double>(pl * 4) / t_tg);
    EXPECT_DOUBLE_EQ(row.at("t").get<double>(), t_pp + t_tg);
    EXPECT_DOUBLE_EQ(row.at("speed").get<double>(), static_cast<double>(pl * 12) / (t_pp + t_tg));
    EXPECT_FALSE(row.contains("tg_floor_fraction"));
    EXPECT_EQ(row.at("sampling").get<std::string>(), "greedy");
  }
}

// The sampling flags reach every generation: the rows name the policy their tokens were
// drawn with, in both kinds of row, and the table's header line names it too.
TEST(CellmBenchTest, SamplingFlagsAreThePolicyOfEveryRow) {
  const CellmRun rows =
      run_cellm({"bench", "--preset", "110m", "-npp", "8", "-ntg", "4", "-npl", "1,2", "--json",
                 "--threads", "2", "--temperature", "0.7", "--top-p", "0.9"});
  ExpectSuccess(rows);
  std::istringstream lines(rows.out);
  int n = 0;
  for (std::string line; std::getline(lines, line); ++n) {
    EXPECT_EQ(json::parse(line).at("sampling").get<std::string>(), "temperature 0.7, top-p 0.9")
        << line;
  }
  EXPECT_EQ(n, 2) << rows.out;

  const CellmRun load =
      run_cellm({"bench",         "--preset", "110m",       "-npp", "4",       "-ntg",      "4",
                 "-npl",          "2",        "--requests", "3",    "--json",  "--threads", "2",
                 "--temperature", "1",        "--top-k",    "5",    "--min-p", "0.05"});
  ExpectSuccess(load);
  const json row = json::parse(load.out);
  EXPECT_EQ(row.at("sampling").get<std::string>(), "temperature 1, top-k 5, min-p 0.05");
  EXPECT_EQ(row.at("requests").get<int64_t>(), 3);

  const CellmRun table = run_cellm({"bench", "--preset", "110m", "-npp", "4", "-ntg", "2",
                                    "--threads", "2", "--temperature", "0.5", "--top-k", "40"});
  ExpectSuccess(table);
  EXPECT_NE(table.out.find("; sampling temperature 0.5, top-k 40\n"), std::string::npos)
      << table.out;
}

// The serving load: 3 clients run 7 requests of 8 prompt tokens and 2-6 generated ones
// (TG = 4), each in its own session. Every request's tokens are counted; the lengths come
// from the seed, so a second run generates as many tokens.
TEST(CellmBenchTest, ServingLoadRunsEveryRequestAndCountsItsTokens) {
  std::vector<int64_t> generated;
  for (int run = 0; run < 2; ++run) {
    const CellmRun r = run_cellm({"bench", "--preset", "110m", "-npp", "8", "-ntg", "4", "-npl",
                                  "3", "--requests", "7", "--json", "--threads", "2"});
    ExpectSuccess(r);
    const json row = json::parse(r.out);
    SCOPED_TRACE(row.dump());
    EXPECT_EQ(row.at("pl").get<int64_t>(), 3);
    EXPECT_EQ(row.at("requests").get<int64_t>(), 7);
    EXPECT_EQ(row.at("prompt_tokens").get<int64_t>(), 7 * 8);
    const int64_t gen = row.at("generated_tokens").get<int64_t>();
    EXPECT_GE(gen, 7 * 2);
    EXPECT_LE(gen, 7 * 6);
    const double t = row.at("t").get<double>();
    ASSERT_GT(t, 0.0);
    EXPECT_DOUBLE_EQ(row.at("speed_gen").get<double>(), static_cast<double>(gen) / t);
    EXPECT_DOUBLE_EQ(row.at("speed").get<double>(), static_cast<double>(gen + 7 * 8) / t);
    EXPECT_GT(row.at("ttft_ms").get<double>(), 0.0);
    // 7 requests: the 99th percentile is the slowest, at least the mean. Every request
    // generates 2 or more tokens, so each has a time per output token.
    EXPECT_GE(row.at("ttft_p99_ms").get<double>(), row.at("ttft_ms").get<double>());
    EXPECT_GT(row.at("tpot_ms").get<double>(), 0.0);
    EXPECT_GE(row.at("tpot_p99_ms").get<double>(), row.at("tpot_ms").get<double>());
    generated.push_back(gen);
  }
  EXPECT_EQ(generated[0], generated[1]);
}

// Each row's scheduler is sized like its executor: 12 clients decode together, past the
// 8 sessions of the default limits, which would hold every step to 8 decodes. A step with
// all of them decodes 12 rows; the mean over the steps (~10 on the 2-core dev machine)
// counts the steps where a client is between requests and the tail.
TEST(CellmBenchTest, ServingLoadDecodesEveryClientInOneStep) {
  const CellmRun r = run_cellm({"bench", "--preset", "110m", "-npp", "4", "-ntg", "16", "-npl",
                                "12", "--requests", "72", "--json", "--threads", "2"});
  ExpectSuccess(r);
  const json row = json::parse(r.out);
  SCOPED_TRACE(row.dump());
  const double rows = row.at("decode_rows_per_step").get<double>();
  EXPECT_GT(rows, 8.5);
  EXPECT_LE(rows, 12.0);
  EXPECT_GT(row.at("steps").get<int64_t>(), 0);
  EXPECT_GT(row.at("steps_with_prefill").get<int64_t>(), 0);
  EXPECT_GT(row.at("busy_fraction").get<double>(), 0.0);
  EXPECT_LE(row.at("busy_fraction").get<double>(), 1.0);
}

TEST(CellmBenchTest, CudaSwitchesAreAcceptedByTheCpuExecutor) {
  // --no-pdl switches the CUDA executor's kernels to plain launches, --no-gemm-tuning
  // its decode GEMMs to cuBLASLt's heuristic, --early-triggers, --early-after-cublas and
  // --l2-prefetch how its graphs are built; the CPU executor has none of them, so it runs
  // as usual.
  std::vector<std::string> args = {"bench", "--preset", "110m",      "-npp", "8",          "-ntg",
                                   "4",     "--json",   "--threads", "2",    "--executor", "cpu"};
  for (const char* cuda_only : {"--no-pdl", "--no-gemm-tuning"}) args.emplace_back(cuda_only);
  for (const char* choice : {"--early-triggers", "--early-after-cublas", "--l2-prefetch"}) {
    args.emplace_back(choice);
    args.emplace_back("on");
  }
  const CellmRun r = run_cellm(args);
  ExpectSuccess(r);
  EXPECT_EQ(json::parse(r.out).at("pp").get<int64_t>(), 8) << r.out;
}

TEST(CellmBenchTest, StepTimesAddNoColumnsForAnExecutorThatDoesNotMeasureThem) {
  // --step-times is measured by the CUDA executor; on the CPU it is accepted and the
  // table keeps exactly the llama-batched-bench columns.
  const CellmRun r = run_cellm({"bench", "--preset", "110m", "-npp", "8", "-ntg", "4", "--executor",
                                "cpu", "--step-times", "--threads", "2"});
  ExpectSuccess(r);
  EXPECT_NE(r.out.find("|    PP |     TG |    B |"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("step ms"), std::string::npos) << r.out;
  std::istringstream lines(r.out);
  int rows = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("|     8 |", 0) == 0) {
      ++rows;
      EXPECT_EQ(std::count(line.begin(), line.end(), '|'), 11) << line;
    }
  }
  EXPECT_EQ(rows, 1) << r.out;
}

}  // namespace
}  // namespace cellm
