#include <atomic>

#include "cuda/kernels/launch.cuh"

namespace cellm::cuda {
namespace {

std::atomic<bool> g_programmatic_launch{true};

// Per device ordinal: 0 unknown, 1 sm_90 or newer, 2 older.
constexpr int kMaxDevices = 64;
std::atomic<int> g_device_support[kMaxDevices];
// Per device ordinal: its SM count, 0 while unknown.
std::atomic<int> g_sm_count[kMaxDevices];

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

bool device_is_sm90() {
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

bool use_programmatic_launch() {
  return programmatic_launch_enabled() && device_is_sm90();
}

cudaError_t sm_count(int* sms) {
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  if (device < 0 || device >= kMaxDevices) {
    return cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, device);
  }
  int known = g_sm_count[device].load(std::memory_order_relaxed);
  if (known == 0) {
    if (const cudaError_t e =
            cudaDeviceGetAttribute(&known, cudaDevAttrMultiProcessorCount, device);
        e != cudaSuccess) {
      return e;
    }
    g_sm_count[device].store(known, std::memory_order_relaxed);
  }
  *sms = known;
  return cudaSuccess;
}

}  // namespace detail
}  // namespace cellm::cuda
