// What a CUDA device's clock and power did while a phase of work ran, for benchmark logs
// (`cellm bench --clocks`). Under a sustained load a GPU holds its power limit by lowering
// its SM clock, and chips of one kind hold different clocks there (one long decode row
// has run at 1,485 MHz on one chip and 1,770-1,800 on another of the same kind, 6% apart in
// tokens a second). A benchmark row that reports the clock it ran at can be compared
// across machines.
//
// The sampler reads the device through NVML, loaded at run time from the driver's
// libnvidia-ml.so.1 (no build dependency; a machine without the driver gets an error from
// create, not a crash). Built with the CUDA executor (cellm_cuda).
#pragma once

#include <cstdint>
#include <memory>

#include "cellm/status.h"

namespace cellm {

struct GpuPowerSummary {
  int64_t samples = 0;       // readings between start() and stop()
  double sm_mhz_median = 0;  // SM clock
  double sm_mhz_min = 0;
  double watts_median = 0;  // board power as NVML reports it (on Hopper, a short average)
  double watts_max = 0;
  double power_capped = 0;       // share of readings with the clock held down by the power cap
  double power_limit_watts = 0;  // the limit the driver enforces
};

// Samples one device every `period_ms` on a thread of its own between start() and stop().
// Not thread-safe: one caller drives it.
class GpuPowerSampler {
 public:
  // The CUDA device `cuda_device` (found in NVML by its UUID), read every period_ms (>= 1).
  // Errors: InvalidArgument for a period below 1 ms; NotSupported when there is no such
  // CUDA device or NVML cannot be loaded or does not know the device (the message says
  // which, with NVML's own words).
  static Result<std::unique_ptr<GpuPowerSampler>> create(int cuda_device = 0, int period_ms = 20);
  ~GpuPowerSampler();
  GpuPowerSampler(const GpuPowerSampler&) = delete;
  GpuPowerSampler& operator=(const GpuPowerSampler&) = delete;

  // Forgets earlier readings and starts reading; a sampler already reading goes on.
  void start();
  // Stops reading (waits for the thread) and summarizes the readings since start(); all
  // zero when none was taken (a phase shorter than one period still gets one: start()
  // reads once at once).
  GpuPowerSummary stop();

  struct Impl;

 private:
  explicit GpuPowerSampler(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cellm
