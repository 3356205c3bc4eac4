// Block-quantized GGUF files on the CUDA executor: the engine dequantizes their
// block tensors to bf16 on the host (engine/weight_formats.h) so one file serves
// both executors. On tests/fixtures/gguf/llama-q-q8_0.gguf and llama-q-kmix.gguf
// (Q4_K, Q5_K, Q6_K) the CUDA executor's greedy tokens, teacher-forced along the
// reference continuation (float64 numpy over the dequantized weights,
// quant_reference.json), equal the reference's and the CPU executor's (which runs
// the blocks themselves) wherever the reference's top-1/top-2 margin is clear, and
// its last-position log-probabilities are within bf16 tolerance of the reference's.
//
// Tolerances: the device runs bf16 (weights, activations and K/V rounded to 8
// significant bits), the CPU executor rounds activations to 8 bits per block; on
// these tiny models (logits of spread ~8) either moves a logit by up to a few
// tenths, so tokens are compared where the margin is at least 1 logit and
// log-probabilities within 0.5.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cellm/cpu_executor.h"
#include "cellm/cuda_executor.h"
#include "cellm/engine.h"
#include "cellm/model_weights.h"
#include "engine/weight_formats.h"
#include "executor_driver.h"
#include "gpu_test.h"

namespace cellm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr double kMinMargin = 1.0;
constexpr double kLogprobTolerance = 0.5;

fs::path fixture(const std::string& name) {
  return fs::path(CELLM_SOURCE_DIR) / "tests" / "fixtures" / "gguf" / name;
}

const json& reference() {
  static const json r = [] {
    std::ifstream in(fixture("quant_reference.json"), std::ios::binary);
    std::stringstream buffer;
    buffer << in.rdbuf();
    return json::parse(buffer.str());
  }();
  return r;
}

ExecutorLimits limits() {
  ExecutorLimits l;
  l.max_sessions = 8;
  l.max_session_tokens = 128;
  l.step_width = 16;
  return l;
}

class CudaGgufTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaGgufTest, GreedyTokensMatchTheReferenceAndTheCpuExecutorWhereTheMarginIsClear) {
  CELLM_SKIP_WITHOUT_GPU();
  Result<ModelWeights> loaded = ModelWeights::load(fixture(GetParam() + ".gguf"));
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  auto blocks = std::make_shared<const ModelWeights>(std::move(*loaded));
  Result<std::shared_ptr<const ModelWeights>> bf16 = dequantize_blocks_to_bf16(blocks);
  ASSERT_TRUE(bf16.ok()) << bf16.status().to_string();

  CudaExecutorOptions o;
  o.precision = CudaPrecision::kBF16;
  Result<std::unique_ptr<CudaExecutor>> gpu = CudaExecutor::create(*bf16, limits(), o);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  Result<std::unique_ptr<CpuExecutor>> cpu = CpuExecutor::create(blocks, limits(), {});
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();

  std::vector<std::vector<Token>> prompts, forced;
  std::vector<std::vector<double>> margins;
  for (const json& p : reference().at("files").at(GetParam()).at("prompts")) {
    prompts.push_back(p.at("ids").get<std::vector<Token>>());
    forced.push_back(p.at("greedy").get<std::vector<Token>>());
    margins.push_back(p.at("margins").get<std::vector<double>>());
  }
  size_t steps = forced[0].size();
  for (const auto& f : forced) steps = std::min(steps, f.size());
  const auto on_gpu = testing::drive(**gpu, prompts, 5, steps, &forced);
  const auto on_cpu = testing::drive(**cpu, prompts, 5, steps, &forced);
  ASSERT_EQ(on_gpu.size(), prompts.size());
  ASSERT_EQ(on_cpu.size(), prompts.size());
  size_t compared = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(on_gpu[i].size(), steps);
    for (size_t s = 0; s < steps; ++s) {
      if (margins[i][s] < kMinMargin) continue;
      EXPECT_EQ(on_gpu[i][s], forced[i][s]) << GetParam() << " prompt " << i << " step " << s;
      EXPECT_EQ(on_gpu[i][s], on_cpu[i][s]) << GetParam() << " prompt " << i << " step " << s;
      ++compared;
    }
  }
  EXPECT_GE(compared, 4u);
}

TEST_P(CudaGgufTest, LastPositionLogprobsAreWithinBf16ToleranceOfTheReference) {
  CELLM_SKIP_WITHOUT_GPU();
  Result<ModelWeights> loaded = ModelWeights::load(fixture(GetParam() + ".gguf"));
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  Result<std::shared_ptr<const ModelWeights>> bf16 =
      dequantize_blocks_to_bf16(std::make_shared<const ModelWeights>(std::move(*loaded)));
  ASSERT_TRUE(bf16.ok()) << bf16.status().to_string();
  CudaExecutorOptions o;
  o.precision = CudaPrecision::kBF16;
  Result<std::unique_ptr<CudaExecutor>> gpu = CudaExecutor::create(*bf16, limits(), o);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();

  std::vector<std::vector<Token>> prompts;
  std::vector<std::vector<double>> want;  // reference log-softmax of the last logits
  for (const json& p : reference().at("files").at(GetParam()).at("prompts")) {
    prompts.push_back(p.at("ids").get<std::vector<Token>>());
    const auto logits = p.at("last_logits").get<std::vector<double>>();
    const double top = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (double l : logits) sum += std::exp(l - top);
    std::vector<double> lp;
    for (double l : logits) lp.push_back(l - top - std::log(sum));
    want.push_back(std::move(lp));
  }
  std::vector<SamplingParams> params(prompts.size());
  for (SamplingParams& sp : params) sp.num_logprobs = 5;
  const auto outputs = testing::drive_outputs(**gpu, prompts, 5, 1, params);
  ASSERT_EQ(outputs.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(outputs[i].size(), 1u);
    ASSERT_EQ(outputs[i][0].logprobs.size(), 1u);
    for (const auto& [token, logprob] : outputs[i][0].logprobs[0].top) {
      ASSERT_GE(token, 0);
      ASSERT_LT(static_cast<size_t>(token), want[i].size());
      EXPECT_NEAR(logprob, want[i][static_cast<size_t>(token)], kLogprobTolerance)
          << GetParam() << " prompt " << i << " token " << token;
    }
  }
}

TEST_P(CudaGgufTest, TheEngineRunsTheFileOnTheCudaExecutor) {
  CELLM_SKIP_WITHOUT_GPU();
  EngineOptions options;
  options.model.path = fixture(GetParam() + ".gguf").string();
  options.load_tokenizer = false;
  options.executor = ExecutorKind::kCuda;
  options.limits = limits();
  Result<Engine> engine = Engine::create(options);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EXPECT_EQ(engine->executor_kind(), ExecutorKind::kCuda);
  // Quantizing on load is the CPU executor's; the CUDA one refuses it by name.
  options.model.weights = WeightFormat::kQ8_0;
  Result<Engine> refused = Engine::create(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("--weights q8_0"), std::string::npos)
      << refused.status().message();
}

INSTANTIATE_TEST_SUITE_P(Files, CudaGgufTest, ::testing::Values("llama-q-q8_0", "llama-q-kmix"));

}  // namespace
}  // namespace cellm
