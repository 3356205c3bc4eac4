#include "cuda/kernels/swiglu.h"

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/launch.cuh"

namespace cellm::cuda {
namespace {

using detail::kPack;

template <typename T>
struct SwigluParams {
  const T* gate_up;  // [m, 2 ff]
  int64_t m;         // rows
  int64_t ff;        // intermediate size
  T* out;            // [m, ff]
};

// Grid-stride over packs of N consecutive columns of one row.
template <typename T, int N>
__global__ void swiglu_kernel(SwigluParams<T> p, bool early) {
  detail::wait_and_allow(early);  // the next kernel may launch once every block is here
  const int64_t packs_per_row = p.ff / N;
  const int64_t total = p.m * packs_per_row;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t e = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t row = e / packs_per_row;
    const int64_t c = (e % packs_per_row) * N;
    const T* gate = p.gate_up + row * 2 * p.ff + c;
    float g[N], u[N], o[N];
    detail::load_floats<N>(gate, g);
    detail::load_floats<N>(gate + p.ff, u);
#pragma unroll
    for (int j = 0; j < N; ++j) o[j] = detail::silu_mul(g[j], u[j]);
    detail::store_floats<N>(p.out + row * p.ff + c, o);
  }
}

}  // namespace

template <typename T>
cudaError_t launch_swiglu(const T* gate_up, int64_t m, int64_t ff, T* out, cudaStream_t stream) {
  if (m < 0 || ff <= 0) return cudaErrorInvalidValue;
  if (m == 0) return cudaSuccess;
  if (gate_up == nullptr || out == nullptr) return cudaErrorInvalidValue;
  const SwigluParams<T> p{gate_up, m, ff, out};
  const bool packed = ff % kPack == 0 && detail::aligned_to(gate_up, sizeof(T) * kPack) &&
                      detail::aligned_to(out, sizeof(T) * kPack);
  constexpr int kThreads = 256;
  if (packed) {
    return detail::launch_kernel(swiglu_kernel<T, kPack>,
                                 detail::blocks_for(m * ff / kPack, kThreads), kThreads, 0, stream,
                                 p, detail::early_triggers());
  }
  return detail::launch_kernel(swiglu_kernel<T, 1>, detail::blocks_for(m * ff, kThreads), kThreads,
                               0, stream, p, detail::early_triggers());
}

template cudaError_t launch_swiglu<float>(const float*, int64_t, int64_t, float*, cudaStream_t);
template cudaError_t launch_swiglu<__nv_bfloat16>(const __nv_bfloat16*, int64_t, int64_t,
                                                  __nv_bfloat16*, cudaStream_t);

}  // namespace cellm::cuda
