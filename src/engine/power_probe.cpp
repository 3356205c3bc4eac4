// DevicePowerProbe (engine.h): GpuPowerSampler behind a type every build links, so a
// benchmark reads clocks without knowing whether this build has CUDA.
#include <memory>
#include <utility>

#include "cellm/engine.h"

namespace cellm {

struct DevicePowerProbe::Impl {
#ifdef CELLM_HAVE_CUDA
  std::unique_ptr<GpuPowerSampler> sampler;
#endif
};

DevicePowerProbe::DevicePowerProbe(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DevicePowerProbe::~DevicePowerProbe() = default;

Result<std::unique_ptr<DevicePowerProbe>> DevicePowerProbe::create(int device, int period_ms) {
#ifdef CELLM_HAVE_CUDA
  auto impl = std::make_unique<Impl>();
  CELLM_ASSIGN_OR_RETURN(impl->sampler, GpuPowerSampler::create(device, period_ms));
  return std::unique_ptr<DevicePowerProbe>(new DevicePowerProbe(std::move(impl)));
#else
  (void)device;
  (void)period_ms;
  return NotSupported("reading a GPU's clock needs cellm built with its CUDA executor");
#endif
}

void DevicePowerProbe::start() {
#ifdef CELLM_HAVE_CUDA
  impl_->sampler->start();
#endif
}

GpuPowerSummary DevicePowerProbe::stop() {
#ifdef CELLM_HAVE_CUDA
  return impl_->sampler->stop();
#else
  return {};
#endif
}

}  // namespace cellm
