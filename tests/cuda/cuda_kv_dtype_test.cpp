// The CUDA executor's --kv-dtype refusals. They come before any device is touched, so
// this test runs (and must pass) with or without a GPU: fp8 has no device kernels yet and
// is NotSupported naming --kv-dtype fp8 and the CPU executor; a dtype other than the one
// the precision stores (bf16 in bf16, f32 in f32) is NotSupported naming it.
#include <gtest/gtest.h>

#include <string>

#include "cellm/cuda_executor.h"
#include "fixture_model.h"

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

TEST(CudaKvDtypeTest, Fp8IsNotSupportedNamingTheFlagAndTheCpuExecutor) {
  for (const CudaPrecision p : {CudaPrecision::kBF16, CudaPrecision::kF32}) {
    const Status s = create_status(KvDtype::kFp8, p);
    EXPECT_EQ(s.code(), StatusCode::kNotSupported) << s.to_string();
    EXPECT_NE(s.message().find("--kv-dtype fp8 is not supported by the CUDA executor"),
              std::string::npos)
        << s.message();
    EXPECT_NE(s.message().find("--executor cpu"), std::string::npos) << s.message();
  }
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

}  // namespace
}  // namespace cellm
