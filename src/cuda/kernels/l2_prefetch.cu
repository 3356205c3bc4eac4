#include "cuda/kernels/l2_prefetch.h"

namespace cellm::cuda {
namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads)
    l2_prefetch_rows_kernel(const char* base, int64_t rows, size_t row_bytes, uint32_t lead) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  for (int64_t r = int64_t{blockIdx.x} * kThreads + threadIdx.x; r < rows;
       r += int64_t{gridDim.x} * kThreads) {
    const char* row = base + r * static_cast<int64_t>(row_bytes);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(row), "r"(lead) : "memory");
  }
#endif
}

}  // namespace

cudaError_t launch_l2_prefetch_rows(const void* base, int64_t rows, size_t row_bytes, size_t lead,
                                    int blocks, cudaStream_t stream) {
  if (base == nullptr || rows < 0 || blocks <= 0 || lead > row_bytes || lead % 16 != 0 ||
      row_bytes % 16 != 0 || reinterpret_cast<uintptr_t>(base) % 16 != 0 || lead > UINT32_MAX) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0 || lead == 0) return cudaSuccess;
  // A plain launch: the kernel sits on a side branch of the graph, behind an ordinary edge.
  l2_prefetch_rows_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const char*>(base), rows,
                                                           row_bytes, static_cast<uint32_t>(lead));
  return cudaGetLastError();
}

}  // namespace cellm::cuda
