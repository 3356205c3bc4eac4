// What the CUDA executor's public header reports about the machine: whether a device
// is usable, one device's description, and the matrix-product plans tuned so far.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "cellm/cuda_executor.h"
#include "cuda/cuda_check.h"
#include "cuda/gemm_tuning.h"

namespace cellm {

bool cuda_device_available() {
  return cuda::gpu_available();
}

std::string describe_cuda_device(int device) {
  int count = 0;
  if (!cuda::gpu_available() || cudaGetDeviceCount(&count) != cudaSuccess || device < 0 ||
      device >= count) {
    return "";
  }
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, device) != cudaSuccess) return "";
  char uuid[9];
  for (int i = 0; i < 4; ++i) {
    std::snprintf(uuid + 2 * i, 3, "%02x", static_cast<unsigned char>(p.uuid.bytes[i]));
  }
  char text[384];
  std::snprintf(text, sizeof(text), "%s, %d SMs, %.1f GiB, GPU-%s", p.name, p.multiProcessorCount,
                static_cast<double>(p.totalGlobalMem) / static_cast<double>(1ull << 30), uuid);
  return text;
}

std::vector<std::string> describe_tuned_gemms() {
  std::vector<cuda::TunedGemm> tuned = cuda::tuned_gemms();
  // By batch size, so a bucket's shapes read together.
  std::stable_sort(
      tuned.begin(), tuned.end(),
      [](const cuda::TunedGemm& a, const cuda::TunedGemm& b) { return a.key.m < b.key.m; });
  std::vector<std::string> lines;
  for (const cuda::TunedGemm& t : tuned) lines.push_back(cuda::describe(t));
  return lines;
}

}  // namespace cellm
