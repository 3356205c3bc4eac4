// Helpers of the kernel tests: typed device arrays filled from host vectors, and
// the element types the kernels are instantiated for (f32 and bf16) as host values.
// Failures of the CUDA runtime here abort with file:line (they are test bugs or a
// broken device, not outcomes under test).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cellm/status.h"
#include "cpu/kernels/convert.h"
#include "cuda/device_memory.h"

namespace cellm::cuda::testing {

// f32 -> T on the host (bf16: round to nearest even, as the device does).
template <typename T>
T from_f32(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    __nv_bfloat16_raw raw;
    raw.x = cpu::f32_to_bf16(x);
    return T(raw);
  }
}

template <typename T>
float to_f32(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    const __nv_bfloat16_raw raw(x);
    return cpu::bf16_to_f32(raw.x);
  }
}

// x as the kernel sees it once stored as T.
template <typename T>
float round_to(float x) {
  return to_f32<T>(from_f32<T>(x));
}

template <typename T>
std::vector<T> to_typed(const std::vector<float>& v) {
  std::vector<T> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = from_f32<T>(v[i]);
  return out;
}

template <typename T>
std::vector<float> to_floats(const std::vector<T>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = to_f32<T>(v[i]);
  return out;
}

// A random value whose magnitude lies in [lo, hi] (lo > 0, so never zero), either sign.
inline float random_nonzero(std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> magnitude(lo, hi);
  const float m = magnitude(rng);
  return (rng() & 1u) != 0 ? m : -m;
}

// `size` elements of T in device memory.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t size) : size_(size) {
    Result<DeviceBuffer> b = DeviceBuffer::allocate(size * sizeof(T));
    CELLM_CHECK_MSG(b.ok(), b.status().to_string());
    buffer_ = std::move(b).value();
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }

  T* get() const { return buffer_.as<T>(); }
  size_t size() const { return size_; }

  void upload(const std::vector<T>& host) {
    CELLM_CHECK(host.size() == size_);
    check(cudaMemcpy(get(), host.data(), size_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(size_);
    check(cudaMemcpy(host.data(), get(), size_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  // Every byte = `byte` (0xff makes f32 and bf16 NaN).
  void fill_bytes(int byte) { check(cudaMemset(get(), byte, size_ * sizeof(T))); }

 private:
  static void check(cudaError_t err) {
    CELLM_CHECK_MSG(err == cudaSuccess, std::string("CUDA: ") + cudaGetErrorString(err));
  }
  DeviceBuffer buffer_;
  size_t size_ = 0;
};

}  // namespace cellm::cuda::testing
