// `--tensor-parallel N` as the commands take it, without a GPU: generate, bench and serve
// refuse N < 1 and a value that is not a number naming the flag, and N > 1 with the CPU
// executor; `cellm bench` names the degree in its header; a degree the model's heads do
// not split into is refused by the CUDA executor before it looks for a device; the 70b
// preset is refused by name before anything is allocated (never built whole).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "run_cellm.h"

namespace cellm {
namespace {

using testing::CellmRun;
using testing::run_cellm;

void expect_has(const CellmRun& r, const std::string& part) {
  EXPECT_NE(r.err.find(part), std::string::npos) << r.describe() << "\nlacks: " << part;
}

// Each command with `extra` flags appended.
std::vector<CellmRun> run_each_command(const std::vector<std::string>& extra) {
  std::vector<std::vector<std::string>> commands = {
      {"generate", "--prompt", "In the beginning", "--max-new-tokens", "4"},
      {"bench", "--model", testing::kjv_dir(), "-npp", "16", "-ntg", "4"},
      {"serve"},
  };
  std::vector<CellmRun> runs;
  for (std::vector<std::string>& c : commands) {
    c.insert(c.end(), extra.begin(), extra.end());
    runs.push_back(run_cellm(c));
  }
  return runs;
}

TEST(CellmTensorParallelTest, ADegreeBelowOneIsRefusedByEveryCommand) {
  for (const std::string n : {"0", "-2"}) {
    for (const CellmRun& r : run_each_command({"--executor", "cpu", "--tensor-parallel", n})) {
      EXPECT_NE(r.exit_code, 0) << r.describe();
      expect_has(r, "--tensor-parallel must be at least 1, got " + n);
    }
  }
  for (const CellmRun& r : run_each_command({"--executor", "cpu", "--tensor-parallel", "two"})) {
    EXPECT_NE(r.exit_code, 0) << r.describe();
    expect_has(r, "--tensor-parallel expects a number of GPUs, got 'two'");
  }
}

TEST(CellmTensorParallelTest, TheCpuExecutorRefusesMoreThanOne) {
  for (const CellmRun& r : run_each_command({"--executor", "cpu", "--tensor-parallel", "2"})) {
    EXPECT_NE(r.exit_code, 0) << r.describe();
    expect_has(r, "--tensor-parallel 2 splits the model over GPUs; the CPU executor");
  }
}

TEST(CellmTensorParallelTest, OneOnTheCpuExecutorRunsAndBenchNamesTheDegree) {
  const CellmRun r =
      run_cellm({"bench", "--executor", "cpu", "--threads", "2", "--model", testing::kjv_dir(),
                 "--tensor-parallel", "1", "-npp", "16", "-ntg", "4", "-npl", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_NE(r.out.find("weights), tensor parallel 1, step width"), std::string::npos) << r.out;
}

TEST(CellmTensorParallelTest, TheCudaExecutorRefusesHeadsThatDoNotSplit) {
  // kjv-small has 6 heads and 2 kv heads: 4 GPUs split neither.
  const CellmRun r = run_cellm({"generate", "--executor", "cuda", "--tensor-parallel", "4",
                                "--prompt", "In the beginning", "--max-new-tokens", "4"});
  EXPECT_NE(r.exit_code, 0) << r.describe();
  if (r.err.find("has no CUDA executor") != std::string::npos) {
    GTEST_SKIP() << "this build has no CUDA executor";
  }
  expect_has(r, "--tensor-parallel 4: the model's 6 heads and 2 kv heads do not split over 4 GPUs");
}

TEST(CellmTensorParallelTest, The70bPresetIsNeverBuiltWhole) {
  for (const std::string executor : {"cpu", "cuda"}) {
    const CellmRun r =
        run_cellm({"bench", "--executor", executor, "--preset", "70b", "-npp", "16", "-ntg", "4"});
    EXPECT_NE(r.exit_code, 0) << r.describe();
    expect_has(r, "preset 70b has 70553706496 parameters");
  }
}

}  // namespace
}  // namespace cellm
