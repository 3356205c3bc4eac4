// The CUDA executor's --kv-dtype: a dtype other than the one the precision stores (bf16
// in bf16, f32 in f32) is NotSupported naming it, before any device is touched (so that
// test runs, and must pass, with or without a GPU); fp8 holds each cell's K and V as e4m3
// codes with one f32 scale per (layer, kv head) (kernels/kv_e4m3.h) in both precisions:
//  - a cell's bytes: 2 x layers x kv heads x (head_dim + 4);
//  - on the bundled trained model (kjv-small), greedy decoding teacher-forced on the CPU
//    executor's continuation with the same fp8 KV cache (which quantizes K/V the same way):
//    decode graphs and eager steps give the same tokens, and the tokens equal the CPU's
//    wherever its top-2 margin is clear.
#include <gtest/gtest.h>

#include <string>

#include "cellm/cpu_executor.h"
#include "cellm/cuda_executor.h"
#include "executor_driver.h"
#include "fixture_model.h"
#include "gpu_test.h"
#include "kjv_prompts.h"

namespace cellm {
namespace {

std::shared_ptr<const ModelWeights> mistral_tiny() {
  Result<ModelWeights> w = ModelWeights::load(testing::load_fixture("mistral-tiny").dir);
  CELLM_CHECK_MSG(w.ok(), w.status().to_string());
  return std::make_shared<const ModelWeights>(std::move(*w));
}

Status create_status(KvDtype dtype, CudaPrecision precision) {
  ExecutorLimits l;
  l.max_sessions = 2;
  l.max_session_tokens = 64;
  l.kv_dtype = dtype;
  CudaExecutorOptions o;
  o.precision = precision;
  return CudaExecutor::create(mistral_tiny(), l, o).status();
}

TEST(CudaKvDtypeTest, ADtypeThePrecisionDoesNotStoreIsNotSupported) {
  Status s = create_status(KvDtype::kF32, CudaPrecision::kBF16);
  EXPECT_EQ(s.code(), StatusCode::kNotSupported) << s.to_string();
  EXPECT_NE(s.message().find("--kv-dtype f32: the CUDA executor in this precision stores K/V as "
                             "bf16"),
            std::string::npos)
      << s.message();
  s = create_status(KvDtype::kBF16, CudaPrecision::kF32);
  EXPECT_EQ(s.code(), StatusCode::kNotSupported) << s.to_string();
  EXPECT_NE(s.message().find("stores K/V as f32"), std::string::npos) << s.message();
}

std::unique_ptr<CudaExecutor> make_cuda(std::shared_ptr<const ModelWeights> w, KvDtype kv,
                                        CudaPrecision precision, bool graphs) {
  ExecutorLimits l;
  l.max_sessions = 8;
  l.max_session_tokens = 160;
  l.step_width = 32;
  l.kv_dtype = kv;
  CudaExecutorOptions o;
  o.precision = precision;
  o.cuda_graph_for_decode = graphs;
  Result<std::unique_ptr<CudaExecutor>> e = CudaExecutor::create(std::move(w), l, o);
  CELLM_CHECK_MSG(e.ok(), e.status().to_string());
  return std::move(*e);
}

TEST(CudaKvDtypeTest, Fp8CellsHoldCodesAndAScalePerHead) {
  CELLM_SKIP_WITHOUT_GPU();
  const auto w = testing::load_kjv_small();
  const ModelConfig& c = w->config();
  for (const CudaPrecision p : {CudaPrecision::kBF16, CudaPrecision::kF32}) {
    auto e = make_cuda(w, KvDtype::kFp8, p, true);
    EXPECT_EQ(e->kv_sizing().bytes_per_cell,
              2 * c.num_layers() * c.num_kv_heads() * (c.head_dim() + 4));
    EXPECT_EQ(e->kv_metrics().bytes_per_cell, e->kv_sizing().bytes_per_cell);
  }
}

TEST(CudaKvDtypeTest, Fp8FollowsTheCpuExecutorsFp8CacheWhereItsMarginIsClear) {
  CELLM_SKIP_WITHOUT_GPU();
  constexpr float kClearMargin = 0.5f;  // top-1 minus top-2 logprob, nats
  constexpr size_t kSteps = 48;
  const auto w = testing::load_kjv_small();
  // Prompts long enough that prefill chunks of 16 rows read earlier chunks' cells.
  const std::vector<std::vector<Token>> prompts = testing::kjv_prompts(6, 60, 31);
  ExecutorLimits cl;
  cl.max_sessions = 8;
  cl.max_session_tokens = 160;
  cl.step_width = 32;
  cl.kv_dtype = KvDtype::kFp8;
  std::unique_ptr<CpuExecutor> cpu = std::move(CpuExecutor::create(w, cl, {}).value());
  std::vector<SamplingParams> params(prompts.size());
  for (SamplingParams& p : params) p.num_logprobs = 2;
  const auto reference = testing::drive_outputs(*cpu, prompts, 16, kSteps, params);
  const std::vector<std::vector<Token>> forced = testing::first_tokens(reference);
  for (const CudaPrecision p : {CudaPrecision::kF32, CudaPrecision::kBF16}) {
    const std::string name = p == CudaPrecision::kF32 ? "f32" : "bf16";
    std::vector<std::vector<Token>> by_mode[2];
    for (const bool graphs : {false, true}) {
      auto e = make_cuda(w, KvDtype::kFp8, p, graphs);
      by_mode[graphs ? 1 : 0] = testing::drive(*e, prompts, 16, kSteps, &forced);
      EXPECT_EQ(e->kv_metrics().cells_in_use, 0) << name;
      if (graphs) {
        EXPECT_GT(e->method_calls().decode_graph_replays, 0) << name;
      }
    }
    EXPECT_EQ(by_mode[0], by_mode[1]) << name << ": graphs and eager decode differ";
    const int checked = testing::expect_tokens_where_the_margin_is_clear(
        reference, by_mode[1], kClearMargin, name + ", fp8 KV, against the CPU executor");
    EXPECT_GT(checked, static_cast<int>(prompts.size() * kSteps / 2)) << name;
  }
}

}  // namespace
}  // namespace cellm
