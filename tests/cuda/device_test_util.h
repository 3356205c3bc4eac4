// Helpers of the CUDA kernel tests: device arrays of float or __nv_bfloat16 filled from
// host f32 values (rounded as the device type stores them), poisoned with NaN before a
// launch, and read back widened to f32; random non-zero test data.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu/kernels/convert.h"
#include "cuda/device_memory.h"

namespace cellm::cuda::testing {

// The CPU DType of a device element type, and a printable name.
template <typename T>
inline constexpr cpu::DType kDType =
    std::is_same_v<T, float> ? cpu::DType::kF32 : cpu::DType::kBF16;

template <typename T>
const char* type_name() {
  return std::is_same_v<T, float> ? "f32" : "bf16";
}

// Names typed tests by their element type (f32 / bf16).
struct TypeNames {
  template <typename T>
  static std::string GetName(int) {
    return type_name<T>();
  }
};

// x as T stores it (bf16: rounded to nearest even), widened back to f32.
template <typename T>
float round_to(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return cpu::bf16_to_f32(cpu::f32_to_bf16(x));
  }
}

template <typename T>
std::vector<float> round_all(std::vector<float> v) {
  for (float& x : v) x = round_to<T>(x);
  return v;
}

// n values with magnitude in [0.1, 1) * scale and a random sign (never zero), rounded to T.
template <typename T>
std::vector<float> random_values(std::mt19937& rng, int64_t n, float scale = 1.0f) {
  std::uniform_real_distribution<float> magnitude(0.1f, 1.0f);
  std::bernoulli_distribution negative(0.5);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = round_to<T>((negative(rng) ? -scale : scale) * magnitude(rng));
  return v;
}

// A device array of n elements of T (float or __nv_bfloat16), freed on destruction.
// Allocation failure aborts the test binary (it means the GPU is unusable).
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(int64_t n)
      : n_(n), buffer_(DeviceBuffer::allocate(static_cast<size_t>(n) * sizeof(T)).value()) {}
  explicit DeviceArray(const std::vector<float>& values)
      : DeviceArray(static_cast<int64_t>(values.size())) {
    upload(values);
  }

  T* get() const { return buffer_.as<T>(); }
  int64_t size() const { return n_; }

  // Stores values (rounded to T) into the whole array.
  void upload(const std::vector<float>& values) {
    ASSERT_EQ(static_cast<int64_t>(values.size()), n_);
    if constexpr (std::is_same_v<T, float>) {
      copy_in(values.data());
    } else {
      std::vector<uint16_t> bits(values.size());
      for (size_t i = 0; i < values.size(); ++i) bits[i] = cpu::f32_to_bf16(values[i]);
      copy_in(bits.data());
    }
  }

  // The whole array widened to f32 (synchronises the device first).
  std::vector<float> download() const {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> values(static_cast<size_t>(n_));
    if constexpr (std::is_same_v<T, float>) {
      copy_out(values.data());
    } else {
      std::vector<uint16_t> bits(values.size());
      copy_out(bits.data());
      for (size_t i = 0; i < bits.size(); ++i) values[i] = cpu::bf16_to_f32(bits[i]);
    }
    return values;
  }

  // Every byte 0xFF: a NaN in f32 and in bf16, so an element a kernel leaves unwritten
  // fails any comparison.
  void poison() { EXPECT_EQ(cudaMemset(get(), 0xFF, bytes()), cudaSuccess); }

 private:
  size_t bytes() const { return static_cast<size_t>(n_) * sizeof(T); }
  void copy_in(const void* src) {
    EXPECT_EQ(cudaMemcpy(get(), src, bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  void copy_out(void* dst) const {
    EXPECT_EQ(cudaMemcpy(dst, get(), bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  }

  int64_t n_;
  DeviceBuffer buffer_;
};

// A device copy of a host vector of plain values (int32 ids, f32 tables).
template <typename U>
DeviceBuffer to_device(const std::vector<U>& values) {
  DeviceBuffer b = DeviceBuffer::allocate(values.size() * sizeof(U)).value();
  EXPECT_EQ(cudaMemcpy(b.get(), values.data(), values.size() * sizeof(U), cudaMemcpyHostToDevice),
            cudaSuccess);
  return b;
}

// The bits of a T array as the CPU twins take them: f32 values, or bf16 bit patterns.
template <typename T>
struct HostTyped {
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  explicit HostTyped(const std::vector<float>& values) {
    if constexpr (std::is_same_v<T, float>) {
      f32 = values;
    } else {
      bf16.resize(values.size());
      for (size_t i = 0; i < values.size(); ++i) bf16[i] = cpu::f32_to_bf16(values[i]);
    }
  }
  cpu::TypedPtr ptr() const {
    if constexpr (std::is_same_v<T, float>) {
      return {f32.data(), cpu::DType::kF32};
    } else {
      return {bf16.data(), cpu::DType::kBF16};
    }
  }
};

// Tolerance of a T output against the f32 CPU twin: f32 outputs to 1e-5 relative (the
// twins differ only in summation order and 1-2 ulp of expf/cosf/sinf); bf16 outputs to
// 8e-3 relative, twice the worst relative half-ulp of bf16 (2^-8), since the device
// rounds its f32 result once.
template <typename T>
struct OutputTolerance {
  static constexpr float kRel = std::is_same_v<T, float> ? 1e-5f : 8e-3f;
  static constexpr float kAbs = 1e-6f;
};

}  // namespace cellm::cuda::testing
