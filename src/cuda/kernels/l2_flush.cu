#include "cuda/kernels/l2_flush.h"

#include "cuda/kernels/launch.cuh"

namespace cellm::cuda {
namespace {

constexpr int kThreads = 512;

__global__ void __launch_bounds__(kThreads)
    l2_flush_kernel(const uint4* buffer, size_t n, uint32_t* sink) {
  detail::wait_for_prior_grids();
  detail::allow_dependent_grids();  // as the small kernels between decode GEMMs do
  uint32_t fold = 0;
  for (size_t i = size_t{blockIdx.x} * kThreads + threadIdx.x; i < n;
       i += size_t{gridDim.x} * kThreads) {
    const uint4 v = __ldcg(buffer + i);
    fold ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (fold == 0x9e3779b9u) *sink = fold;  // keeps the loads; the word is scratch
}

}  // namespace

cudaError_t launch_l2_flush(const void* buffer, size_t bytes, uint32_t* sink, cudaStream_t stream) {
  if (buffer == nullptr || sink == nullptr || bytes % 16 != 0 ||
      reinterpret_cast<uintptr_t>(buffer) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  if (bytes == 0) return cudaSuccess;
  int device = 0, sms = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  if (const cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
      e != cudaSuccess) {
    return e;
  }
  return detail::launch_kernel(l2_flush_kernel, dim3(static_cast<unsigned>(4 * sms)),
                               dim3(kThreads), 0, stream, static_cast<const uint4*>(buffer),
                               bytes / 16, sink);
}

}  // namespace cellm::cuda
