#include "cuda/kernels/bias.h"

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/launch.cuh"

namespace cellm::cuda {
namespace {

template <typename TOut, typename TBias>
struct AddBiasParams {
  TOut* y;            // [m, n]
  int64_t m;          // rows
  int64_t n;          // columns
  const TBias* bias;  // [n]
};

template <typename TOut, typename TBias>
__global__ void add_bias_kernel(AddBiasParams<TOut, TBias> p) {
  detail::wait_for_prior_grids();
  const int64_t total = p.m * p.n;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t e = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; e < total; e += stride) {
    p.y[e] = detail::from_float<TOut>(detail::to_float(p.y[e]) + detail::to_float(p.bias[e % p.n]));
  }
  detail::allow_dependent_grids();
}

}  // namespace

template <typename TOut, typename TBias>
cudaError_t launch_add_bias(TOut* y, int64_t m, int64_t n, const TBias* bias, cudaStream_t stream) {
  if (m < 0 || n <= 0) return cudaErrorInvalidValue;
  if (m == 0) return cudaSuccess;
  if (y == nullptr || bias == nullptr) return cudaErrorInvalidValue;
  constexpr int kThreads = 256;
  return detail::launch_kernel(add_bias_kernel<TOut, TBias>, detail::blocks_for(m * n, kThreads),
                               kThreads, 0, stream, AddBiasParams<TOut, TBias>{y, m, n, bias});
}

template cudaError_t launch_add_bias<float, float>(float*, int64_t, int64_t, const float*,
                                                   cudaStream_t);
template cudaError_t launch_add_bias<float, __nv_bfloat16>(float*, int64_t, int64_t,
                                                           const __nv_bfloat16*, cudaStream_t);
template cudaError_t launch_add_bias<__nv_bfloat16, __nv_bfloat16>(__nv_bfloat16*, int64_t, int64_t,
                                                                   const __nv_bfloat16*,
                                                                   cudaStream_t);

}  // namespace cellm::cuda
