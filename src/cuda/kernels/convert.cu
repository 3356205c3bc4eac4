#include "cuda/kernels/convert.h"

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/launch.cuh"

namespace cellm::cuda {
namespace {

using detail::kPack;

template <typename T>
struct ConvertParams {
  const float* src;  // [n]
  int64_t n;         // elements
  T* dst;            // [n]
};

// Grid-stride over packs of N elements; REQUIRES: n % N == 0.
template <typename T, int N>
__global__ void convert_kernel(ConvertParams<T> p) {
  detail::wait_for_prior_grids();
  const int64_t total = p.n / N;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t e = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; e < total; e += stride) {
    float v[N];
    detail::load_floats<N>(p.src + e * N, v);
    detail::store_floats<N>(p.dst + e * N, v);
  }
  detail::allow_dependent_grids();
}

}  // namespace

template <typename T>
cudaError_t launch_f32_to(const float* src, int64_t n, T* dst, cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (src == nullptr || dst == nullptr) return cudaErrorInvalidValue;
  const ConvertParams<T> p{src, n, dst};
  const bool packed = n % kPack == 0 && detail::aligned_to(src, sizeof(float) * kPack) &&
                      detail::aligned_to(dst, sizeof(T) * kPack);
  constexpr int kThreads = 256;
  if (packed) {
    return detail::launch_kernel(convert_kernel<T, kPack>, detail::blocks_for(n / kPack, kThreads),
                                 kThreads, 0, stream, p);
  }
  return detail::launch_kernel(convert_kernel<T, 1>, detail::blocks_for(n, kThreads), kThreads, 0,
                               stream, p);
}

template cudaError_t launch_f32_to<float>(const float*, int64_t, float*, cudaStream_t);
template cudaError_t launch_f32_to<__nv_bfloat16>(const float*, int64_t, __nv_bfloat16*,
                                                  cudaStream_t);

}  // namespace cellm::cuda
