// `--activations` end to end: every command that builds an engine takes it, bf16 by
// default; `cellm bench` names the mode in its header; both modes generate from the
// bundled (bf16) model; an unknown value is refused by name before anything loads.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "run_cellm.h"

namespace cellm {
namespace {

using testing::CellmRun;
using testing::run_cellm;

constexpr const char* kBadValue = "--activations must be bf16 or f32, got 'f16'";

TEST(CellmActivationsTest, BenchNamesTheModeInItsHeaderBf16ByDefault) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{}, "executor cpu (bf16 activations for bf16 weights)"},
      {{"--activations", "bf16"}, "executor cpu (bf16 activations for bf16 weights)"},
      {{"--activations", "f32"}, "executor cpu (f32 activations)"},
  };
  for (const auto& [flags, header] : cases) {
    std::vector<std::string> argv = {
        "bench", "--executor", "cpu",  "--threads", "2",    "--model", testing::kjv_dir(),
        "-npp",  "16",         "-ntg", "4",         "-npl", "1"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    const CellmRun r = run_cellm(argv);
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    EXPECT_NE(r.out.find(header), std::string::npos) << r.out;
  }
}

TEST(CellmActivationsTest, GenerateRunsInBothModes) {
  for (const std::string mode : {"bf16", "f32"}) {
    const CellmRun r =
        run_cellm({"generate", "--executor", "cpu", "--threads", "2", "--activations", mode,
                   "--prompt", "In the beginning", "--max-new-tokens", "8"});
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    EXPECT_EQ(r.out.rfind("In the beginning", 0), 0u) << r.out;
    EXPECT_GT(r.out.size(), std::string("In the beginning").size()) << r.out;
  }
}

TEST(CellmActivationsTest, AnUnknownValueIsRefusedByEveryCommandNamingTheFlag) {
  const std::vector<std::vector<std::string>> commands = {
      {"generate", "--prompt", "In the beginning", "--max-new-tokens", "4"},
      {"bench", "--model", testing::kjv_dir(), "-npp", "16", "-ntg", "4"},
      {"serve"},
      {"perplexity", "--file", testing::source_dir() + "/README.md"},
  };
  for (std::vector<std::string> argv : commands) {
    for (const char* a : {"--executor", "cpu", "--activations", "f16"}) argv.emplace_back(a);
    const CellmRun r = run_cellm(argv);
    EXPECT_NE(r.exit_code, 0) << r.describe();
    EXPECT_NE(r.err.find(kBadValue), std::string::npos) << r.describe();
  }
}

}  // namespace
}  // namespace cellm
