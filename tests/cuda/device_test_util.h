// Helpers of the CUDA kernel tests over device_array.h: device arrays of float or
// __nv_bfloat16 filled from host f32 values (rounded as the device type stores them),
// poisoned with NaN before a launch and read back widened to f32; random non-zero test
// data; the CPU twins' view of T data; output tolerances.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpu/kernels/convert.h"
#include "cuda/device_memory.h"
#include "device_array.h"

namespace cellm::cuda::testing {

// The CUDA graph of what `enqueue()` puts on `stream` (captured thread-locally), not yet
// instantiated (the caller destroys it). A failed capture is a test failure and gives
// nullptr; `enqueue` checks its own launches' results.
template <typename Enqueue>
cudaGraph_t capture_raw_graph(cudaStream_t stream, Enqueue&& enqueue) {
  if (const cudaError_t e = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
      e != cudaSuccess) {
    ADD_FAILURE() << "cudaStreamBeginCapture: " << cudaGetErrorString(e);
    return nullptr;
  }
  enqueue();
  cudaGraph_t graph = nullptr;
  if (const cudaError_t e = cudaStreamEndCapture(stream, &graph); e != cudaSuccess) {
    ADD_FAILURE() << "cudaStreamEndCapture: " << cudaGetErrorString(e);
    return nullptr;
  }
  return graph;
}

// `graph` instantiated, then destroyed; an empty GraphExec (and a test failure) if that
// fails or graph is nullptr.
inline GraphExec instantiate_graph(cudaGraph_t graph) {
  if (graph == nullptr) return GraphExec();
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (instantiated != cudaSuccess) {
    ADD_FAILURE() << "cudaGraphInstantiate: " << cudaGetErrorString(instantiated);
    return GraphExec();
  }
  return GraphExec(exec);
}

// capture_raw_graph, instantiated.
template <typename Enqueue>
GraphExec capture_graph(cudaStream_t stream, Enqueue&& enqueue) {
  return instantiate_graph(capture_raw_graph(stream, std::forward<Enqueue>(enqueue)));
}

// The first `elements` elements of a and b hold the same bits.
template <typename T>
bool same_bits(const DeviceArray<T>& a, const DeviceArray<T>& b, int64_t elements) {
  const std::vector<T> ha = a.download();
  const std::vector<T> hb = b.download();
  return std::memcmp(ha.data(), hb.data(), static_cast<size_t>(elements) * sizeof(T)) == 0;
}

// A printable name of a device element type.
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

// n values with magnitude in [0.1, 1) * scale and a random sign (never zero), rounded to T.
template <typename T>
std::vector<float> random_values(std::mt19937& rng, int64_t n, float scale = 1.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = round_to<T>(random_nonzero(rng, 0.1f * scale, scale));
  return v;
}

// A device array of T holding values (rounded to T).
template <typename T>
DeviceArray<T> device_array(const std::vector<float>& values) {
  return DeviceArray<T>(to_typed<T>(values));
}

// A device array of T widened to f32 (cudaMemcpy: ordered after the legacy default stream;
// synchronise other streams first).
template <typename T>
std::vector<float> download_floats(const DeviceArray<T>& a) {
  return to_floats(a.download());
}

// Every byte 0xFF: a NaN in f32 and in bf16, so an element a kernel leaves unwritten
// fails any comparison.
template <typename T>
void poison(DeviceArray<T>& a) {
  a.fill_bytes(0xFF);
}

// Every element of `got` has the bits of the same element of `want`; names the
// first few that differ with both values.
template <typename T>
void expect_bitwise_equal(const std::vector<T>& got, const std::vector<T>& want,
                          const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0 && ++bad <= 5) {
      ADD_FAILURE() << what << " [" << i << "]: got " << to_f32<T>(got[i]) << ", want "
                    << to_f32<T>(want[i]);
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements differ";
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
