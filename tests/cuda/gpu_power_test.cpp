// GpuPowerSampler (include/cellm/gpu_power.h): its argument checks everywhere, and on a GPU
// readings of the clock and power that a busy device can give.
#include "cellm/gpu_power.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "gpu_test.h"

namespace cellm {
namespace {

TEST(GpuPowerSamplerTest, APeriodBelowOneMillisecondIsRefused) {
  Result<std::unique_ptr<GpuPowerSampler>> s = GpuPowerSampler::create(0, 0);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("at least 1 ms, not 0"), std::string::npos)
      << s.status().to_string();
}

TEST(GpuPowerSamplerTest, ADeviceThatDoesNotExistIsNamed) {
  Result<std::unique_ptr<GpuPowerSampler>> s = GpuPowerSampler::create(4096, 20);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kNotSupported);
  EXPECT_NE(s.status().message().find("no CUDA device 4096"), std::string::npos)
      << s.status().to_string();
}

// Copies 1 GiB back and forth for `ms` milliseconds, so the clock and power are a busy
// device's.
void keep_busy(int ms) {
  constexpr size_t kBytes = size_t{512} << 20;
  void* a = nullptr;
  void* b = nullptr;
  ASSERT_EQ(cudaMalloc(&a, kBytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&b, kBytes), cudaSuccess);
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end) {
    ASSERT_EQ(cudaMemcpy(b, a, kBytes, cudaMemcpyDeviceToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(a, b, kBytes, cudaMemcpyDeviceToDevice), cudaSuccess);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(a);
  cudaFree(b);
}

TEST(GpuPowerSamplerTest, ReadsTheClockAndPowerOfABusyDevice) {
  CELLM_SKIP_WITHOUT_GPU();
  Result<std::unique_ptr<GpuPowerSampler>> s = GpuPowerSampler::create(0, 10);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  GpuPowerSampler& sampler = **s;

  sampler.start();
  keep_busy(300);
  const GpuPowerSummary busy = sampler.stop();
  // ~30 readings of 10 ms; a loaded machine's thread may wake late, never this late.
  EXPECT_GE(busy.samples, 10);
  EXPECT_GT(busy.sm_mhz_min, 0);
  EXPECT_LE(busy.sm_mhz_min, busy.sm_mhz_median);
  EXPECT_LT(busy.sm_mhz_median, 5000);
  EXPECT_GT(busy.watts_median, 0);
  EXPECT_LE(busy.watts_median, busy.watts_max);
  EXPECT_GT(busy.power_limit_watts, 0);
  EXPECT_LT(busy.watts_max, 2 * busy.power_limit_watts);
  EXPECT_GE(busy.power_capped, 0.0);
  EXPECT_LE(busy.power_capped, 1.0);

  // A second phase starts from no readings: one taken at once, then one every period.
  sampler.start();
  std::this_thread::sleep_for(std::chrono::milliseconds(45));
  const GpuPowerSummary idle = sampler.stop();
  EXPECT_GE(idle.samples, 2);
  EXPECT_LE(idle.samples, 6);
  EXPECT_EQ(idle.power_limit_watts, busy.power_limit_watts);

  // stop() without start(): nothing read.
  EXPECT_EQ(sampler.stop().samples, 0);
}

}  // namespace
}  // namespace cellm
