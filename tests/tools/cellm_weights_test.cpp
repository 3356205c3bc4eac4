// `--weights` end to end: `cellm generate` and `cellm bench` quantize the bundled
// model as it loads and say what they did on stderr; greedy text of q8_0 is the
// bf16 model's; unknown formats and q formats on the CUDA executor are refused by
// name before anything loads.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "run_cellm.h"

namespace cellm {
namespace {

using testing::CellmRun;
using testing::run_cellm;

CellmRun generate(const std::string& weights) {
  return run_cellm({"generate", "--executor", "cpu", "--threads", "2", "--weights", weights,
                    "--prompt", "In the beginning", "--max-new-tokens", "16"});
}

TEST(CellmWeightsTest, GenerateQuantizesOnLoadAndSaysSo) {
  const CellmRun q8 = generate("q8_0");
  ASSERT_EQ(q8.exit_code, 0) << q8.describe();
  EXPECT_NE(q8.err.find("weights q8_0: linear weights 56 as q8_0"), std::string::npos) << q8.err;
  const CellmRun bf16 = generate("bf16");
  ASSERT_EQ(bf16.exit_code, 0) << bf16.describe();
  // kjv-small's greedy continuation of this prompt has clear margins: q8_0 keeps it.
  EXPECT_EQ(q8.out, bf16.out);
  const CellmRun q4k = generate("Q4_K");
  ASSERT_EQ(q4k.exit_code, 0) << q4k.describe();
  EXPECT_NE(q4k.err.find("8 as q4_k, 48 as q5_0 (rows not whole q4_k blocks)"), std::string::npos)
      << q4k.err;
}

TEST(CellmWeightsTest, BenchRunsAQuantizedModel) {
  const CellmRun r = run_cellm({"bench", "--executor", "cpu", "--model", testing::kjv_dir(),
                                "--weights", "q4_0", "-npp", "16", "-ntg", "4", "-npl", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_NE(r.err.find("weights q4_0: linear weights 56 as q4_0"), std::string::npos) << r.err;
}

TEST(CellmWeightsTest, UnknownFormatsAndQFormatsOnCudaAreRefusedByName) {
  const CellmRun bad = generate("q3_k");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--weights must be one of auto, bf16, f32, q8_0"), std::string::npos)
      << bad.err;
  const CellmRun cuda = run_cellm({"generate", "--executor", "cuda", "--weights", "q8_0",
                                   "--prompt", "In the beginning", "--max-new-tokens", "4"});
  EXPECT_NE(cuda.exit_code, 0);
  EXPECT_NE(cuda.err.find("the CUDA executor runs --weights bf16 or auto"), std::string::npos)
      << cuda.err;
}

}  // namespace
}  // namespace cellm
