// `--kv-dtype` end to end: every command that builds an engine takes it; fp8 runs on the
// CPU executor and `cellm bench` names it in its header beside the weights' types; an
// unknown value is refused by name (with the accepted values) before anything loads, and a
// dtype the CPU executor does not store is NotSupported naming the flag.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "run_cellm.h"

namespace cellm {
namespace {

using testing::CellmRun;
using testing::run_cellm;

constexpr const char* kBadValue = "--kv-dtype must be auto, f32, bf16 or fp8, got 'fp16'";

void expect_has(const CellmRun& r, const std::string& part) {
  EXPECT_NE(r.err.find(part), std::string::npos) << r.describe() << "\nlacks: " << part;
}

TEST(CellmKvDtypeTest, GenerateRunsAnFp8Cache) {
  const CellmRun r = run_cellm({"generate", "--executor", "cpu", "--threads", "2", "--kv-dtype",
                                "fp8", "--prompt", "In the beginning", "--max-new-tokens", "8"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.out.rfind("In the beginning", 0), 0u) << r.out;
}

TEST(CellmKvDtypeTest, BenchNamesTheWeightAndKvTypesInItsHeader) {
  for (const std::string dtype : {"fp8", "auto"}) {
    const CellmRun r =
        run_cellm({"bench", "--executor", "cpu", "--threads", "2", "--model", testing::kjv_dir(),
                   "--kv-dtype", dtype, "-npp", "16", "-ntg", "4", "-npl", "1"});
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    const std::string kv = dtype == "fp8" ? "fp8" : "f32";
    EXPECT_NE(r.out.find("of weights (BF16 0.03 GB), KV " + kv + "; executor cpu"),
              std::string::npos)
        << r.out;
  }
}

TEST(CellmKvDtypeTest, AnUnknownValueIsRefusedByEveryCommandNamingTheFlag) {
  const CellmRun gen = run_cellm({"generate", "--executor", "cpu", "--kv-dtype", "fp16", "--prompt",
                                  "In the beginning", "--max-new-tokens", "4"});
  EXPECT_NE(gen.exit_code, 0);
  expect_has(gen, kBadValue);
  const CellmRun bench = run_cellm({"bench", "--executor", "cpu", "--model", testing::kjv_dir(),
                                    "--kv-dtype", "fp16", "-npp", "16", "-ntg", "4"});
  EXPECT_NE(bench.exit_code, 0);
  expect_has(bench, kBadValue);
  const CellmRun serve = run_cellm({"serve", "--executor", "cpu", "--kv-dtype", "fp16"});
  EXPECT_NE(serve.exit_code, 0);
  expect_has(serve, kBadValue);
  const CellmRun ppl = run_cellm({"perplexity", "--executor", "cpu", "--kv-dtype", "fp16", "--file",
                                  testing::source_dir() + "/README.md"});
  EXPECT_NE(ppl.exit_code, 0);
  expect_has(ppl, kBadValue);
}

TEST(CellmKvDtypeTest, Bf16OnTheCpuExecutorIsNotSupportedNamingTheFlag) {
  const CellmRun r = run_cellm({"generate", "--executor", "cpu", "--kv-dtype", "bf16", "--prompt",
                                "In the beginning", "--max-new-tokens", "4"});
  EXPECT_NE(r.exit_code, 0);
  expect_has(r, "--kv-dtype bf16: the CPU executor stores K/V as f32 (auto, f32) or e4m3 (fp8)");
}

}  // namespace
}  // namespace cellm
