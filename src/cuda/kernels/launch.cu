#include <atomic>

#include "cuda/kernels/launch.cuh"

namespace cellm::cuda {
namespace {

std::atomic<bool> g_programmatic_launch{true};

// Per device ordinal: 0 unknown, 1 supported, 2 not supported.
constexpr int kMaxDevices = 64;
std::atomic<int> g_device_support[kMaxDevices];

thread_local bool t_early_triggers = false;

}  // namespace

void set_programmatic_launch(bool enabled) {
  g_programmatic_launch.store(enabled, std::memory_order_relaxed);
}

bool programmatic_launch_enabled() {
  return g_programmatic_launch.load(std::memory_order_relaxed);
}

void set_early_triggers(bool early) {
  t_early_triggers = early;
}

namespace detail {

bool early_triggers() {
  return t_early_triggers;
}

bool use_programmatic_launch() {
  if (!programmatic_launch_enabled()) return false;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return false;
  int known = g_device_support[device].load(std::memory_order_relaxed);
  if (known == 0) {
    int major = 0;
    const bool ok =
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess;
    known = ok && major >= 9 ? 1 : 2;
    g_device_support[device].store(known, std::memory_order_relaxed);
  }
  return known == 1;
}

}  // namespace detail
}  // namespace cellm::cuda
