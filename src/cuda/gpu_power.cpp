#include "cellm/gpu_power.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cuda/cuda_check.h"

namespace cellm {
namespace {

// The few NVML entry points the sampler calls, declared here (the driver's library is
// loaded at run time; its header is not needed). Signatures and values as NVML documents
// them: every call returns an nvmlReturn_t, 0 = NVML_SUCCESS; a device is an opaque handle.
using NvmlReturn = int;
using NvmlDevice = struct NvmlDeviceOpaque*;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr unsigned kNvmlClockSm = 1;                       // nvmlClockType_t NVML_CLOCK_SM
constexpr unsigned long long kNvmlReasonSwPowerCap = 0x4;  // the clock held by the power cap

struct Nvml {
  void* library = nullptr;
  NvmlReturn (*init)() = nullptr;
  NvmlReturn (*shutdown)() = nullptr;
  const char* (*error_string)(NvmlReturn) = nullptr;
  NvmlReturn (*handle_by_uuid)(const char*, NvmlDevice*) = nullptr;
  NvmlReturn (*clock_info)(NvmlDevice, unsigned, unsigned*) = nullptr;
  NvmlReturn (*power_usage)(NvmlDevice, unsigned*) = nullptr;  // milliwatts
  NvmlReturn (*power_limit)(NvmlDevice, unsigned*) = nullptr;  // milliwatts
  NvmlReturn (*throttle_reasons)(NvmlDevice, unsigned long long*) = nullptr;

  std::string error(NvmlReturn r) const {
    return error_string != nullptr ? error_string(r) : "NVML error " + std::to_string(r);
  }
};

template <typename F>
bool bind(void* library, const char* name, F& f) {
  f = reinterpret_cast<F>(dlsym(library, name));
  return f != nullptr;
}

// NVML, loaded and initialized, or why not.
Result<Nvml> load_nvml() {
  Nvml n;
  n.library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (n.library == nullptr) {
    const char* why = dlerror();
    return NotSupported(std::string("GpuPowerSampler: cannot load NVML (libnvidia-ml.so.1, from "
                                    "the NVIDIA driver): ") +
                        (why != nullptr ? why : "unknown error"));
  }
  const bool bound =
      bind(n.library, "nvmlInit_v2", n.init) && bind(n.library, "nvmlShutdown", n.shutdown) &&
      bind(n.library, "nvmlErrorString", n.error_string) &&
      bind(n.library, "nvmlDeviceGetHandleByUUID", n.handle_by_uuid) &&
      bind(n.library, "nvmlDeviceGetClockInfo", n.clock_info) &&
      bind(n.library, "nvmlDeviceGetPowerUsage", n.power_usage) &&
      bind(n.library, "nvmlDeviceGetEnforcedPowerLimit", n.power_limit) &&
      bind(n.library, "nvmlDeviceGetCurrentClocksThrottleReasons", n.throttle_reasons);
  if (!bound) {
    dlclose(n.library);
    return NotSupported("GpuPowerSampler: this NVML lacks a function the sampler calls");
  }
  if (const NvmlReturn r = n.init(); r != kNvmlSuccess) {
    const std::string why = n.error(r);
    dlclose(n.library);
    return NotSupported("GpuPowerSampler: nvmlInit failed: " + why);
  }
  return n;
}

// NVML's name of a CUDA device: "GPU-" and its UUID's 16 bytes in hex, grouped 4-2-2-2-6.
std::string nvml_uuid(const cudaUUID_t& uuid) {
  std::string text = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) text += '-';
    char hex[3];
    std::snprintf(hex, sizeof(hex), "%02x", static_cast<unsigned char>(uuid.bytes[i]));
    text += hex;
  }
  return text;
}

struct Reading {
  unsigned sm_mhz = 0;
  unsigned milliwatts = 0;
  bool capped = false;
};

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

}  // namespace

struct GpuPowerSampler::Impl {
  Nvml nvml;
  NvmlDevice device = nullptr;
  std::chrono::milliseconds period{20};
  double limit_watts = 0;
  std::mutex mutex;  // guards readings
  std::vector<Reading> readings;
  std::atomic<bool> running{false};
  std::thread thread;

  // One reading (skipped when NVML fails: a reading is all three values or none).
  void read() {
    Reading r;
    unsigned long long reasons = 0;
    if (nvml.clock_info(device, kNvmlClockSm, &r.sm_mhz) != kNvmlSuccess ||
        nvml.power_usage(device, &r.milliwatts) != kNvmlSuccess ||
        nvml.throttle_reasons(device, &reasons) != kNvmlSuccess) {
      return;
    }
    r.capped = (reasons & kNvmlReasonSwPowerCap) != 0;
    const std::lock_guard<std::mutex> lock(mutex);
    readings.push_back(r);
  }

  ~Impl() {
    running = false;
    if (thread.joinable()) thread.join();
    if (nvml.library != nullptr) {
      nvml.shutdown();
      dlclose(nvml.library);
    }
  }
};

GpuPowerSampler::GpuPowerSampler(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

GpuPowerSampler::~GpuPowerSampler() = default;

Result<std::unique_ptr<GpuPowerSampler>> GpuPowerSampler::create(int cuda_device, int period_ms) {
  if (period_ms < 1) {
    return InvalidArgument("GpuPowerSampler: the period must be at least 1 ms, not " +
                           std::to_string(period_ms));
  }
  int count = 0;
  cudaDeviceProp prop{};
  if (!cuda::gpu_available() || cudaGetDeviceCount(&count) != cudaSuccess || cuda_device < 0 ||
      cuda_device >= count || cudaGetDeviceProperties(&prop, cuda_device) != cudaSuccess) {
    cudaGetLastError();
    return NotSupported("GpuPowerSampler: no CUDA device " + std::to_string(cuda_device));
  }
  CELLM_ASSIGN_OR_RETURN(Nvml nvml, load_nvml());
  auto impl = std::make_unique<Impl>();
  impl->nvml = nvml;  // from here the Impl shuts NVML down and unloads it
  impl->period = std::chrono::milliseconds(period_ms);
  const std::string uuid = nvml_uuid(prop.uuid);
  if (const NvmlReturn r = nvml.handle_by_uuid(uuid.c_str(), &impl->device); r != kNvmlSuccess) {
    return NotSupported("GpuPowerSampler: NVML does not know CUDA device " +
                        std::to_string(cuda_device) + " (" + uuid + "): " + nvml.error(r));
  }
  unsigned limit_mw = 0;
  if (nvml.power_limit(impl->device, &limit_mw) == kNvmlSuccess) impl->limit_watts = limit_mw / 1e3;
  return std::unique_ptr<GpuPowerSampler>(new GpuPowerSampler(std::move(impl)));
}

void GpuPowerSampler::start() {
  Impl& s = *impl_;
  if (s.running) return;
  {
    const std::lock_guard<std::mutex> lock(s.mutex);
    s.readings.clear();
  }
  s.read();
  s.running = true;
  s.thread = std::thread([&s] {
    auto next = std::chrono::steady_clock::now() + s.period;
    while (s.running) {
      std::this_thread::sleep_until(next);
      next += s.period;
      if (s.running) s.read();
    }
  });
}

GpuPowerSummary GpuPowerSampler::stop() {
  Impl& s = *impl_;
  s.running = false;
  if (s.thread.joinable()) s.thread.join();
  std::vector<Reading> readings;
  {
    const std::lock_guard<std::mutex> lock(s.mutex);
    readings.swap(s.readings);
  }
  GpuPowerSummary summary;
  summary.power_limit_watts = s.limit_watts;
  if (readings.empty()) return summary;
  std::vector<double> mhz, watts;
  int64_t capped = 0;
  for (const Reading& r : readings) {
    mhz.push_back(r.sm_mhz);
    watts.push_back(r.milliwatts / 1e3);
    capped += r.capped ? 1 : 0;
  }
  summary.samples = static_cast<int64_t>(readings.size());
  summary.sm_mhz_median = median_of(mhz);
  summary.sm_mhz_min = *std::min_element(mhz.begin(), mhz.end());
  summary.watts_median = median_of(watts);
  summary.watts_max = *std::max_element(watts.begin(), watts.end());
  summary.power_capped = static_cast<double>(capped) / static_cast<double>(summary.samples);
  return summary;
}

}  // namespace cellm
