#include "cuda/kernels/rope.h"

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/launch.cuh"

namespace cellm::cuda {
namespace {

template <typename T>
struct RopeParams {
  T* x;                // [m, row_stride]
  int64_t m;           // rows
  int64_t row_stride;  // elements between rows
  int64_t q_offset;    // first q element within a row
  int64_t n_q_heads;
  int64_t k_offset;  // first k element within a row
  int64_t n_kv_heads;
  int64_t head_dim;
  int64_t half;              // head_dim / 2 = length of inv_freq
  const int32_t* positions;  // [m]
  const float* inv_freq;     // [half]
};

// One thread per (row, head, j): it owns the pair (j, j + half) of that head, so the
// rotation is in place without hazards. Consecutive threads take consecutive j.
template <typename T>
__global__ void rope_kernel(RopeParams<T> p) {
  detail::wait_for_prior_grids();
  const int64_t heads = p.n_q_heads + p.n_kv_heads;
  const int64_t total = p.m * heads * p.half;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t e = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t j = e % p.half;
    const int64_t unit = e / p.half;
    const int64_t head = unit % heads;
    const int64_t row = unit / heads;
    const int64_t start = head < p.n_q_heads ? p.q_offset + head * p.head_dim
                                             : p.k_offset + (head - p.n_q_heads) * p.head_dim;
    T* v = p.x + row * p.row_stride + start;
    const float angle = static_cast<float>(p.positions[row]) * p.inv_freq[j];
    const float c = cosf(angle);
    const float s = sinf(angle);
    const float a = detail::to_float(v[j]);
    const float b = detail::to_float(v[j + p.half]);
    // __fmul_rn / __fadd_rn are never contracted into an FMA.
    v[j] = detail::from_float<T>(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)));
    v[j + p.half] = detail::from_float<T>(__fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s)));
  }
  detail::allow_dependent_grids();
}

}  // namespace

template <typename T>
cudaError_t launch_rope(T* x, int64_t m, int64_t row_stride, int64_t q_offset, int64_t n_q_heads,
                        int64_t k_offset, int64_t n_kv_heads, int64_t head_dim,
                        const int32_t* positions, const float* inv_freq, cudaStream_t stream) {
  if (m < 0 || n_q_heads < 0 || n_kv_heads < 0 || head_dim <= 0 || head_dim % 2 != 0 ||
      q_offset < 0 || k_offset < 0 || q_offset + n_q_heads * head_dim > row_stride ||
      k_offset + n_kv_heads * head_dim > row_stride) {
    return cudaErrorInvalidValue;
  }
  const int64_t q_end = q_offset + n_q_heads * head_dim;
  const int64_t k_end = k_offset + n_kv_heads * head_dim;
  if (n_q_heads > 0 && n_kv_heads > 0 && q_offset < k_end && k_offset < q_end) {
    return cudaErrorInvalidValue;  // overlapping q and k ranges would rotate twice
  }
  const int64_t half = head_dim / 2;
  const int64_t total = m * (n_q_heads + n_kv_heads) * half;
  if (total == 0) return cudaSuccess;
  if (x == nullptr || positions == nullptr || inv_freq == nullptr) return cudaErrorInvalidValue;
  constexpr int kThreads = 256;
  return detail::launch_kernel(rope_kernel<T>, detail::blocks_for(total, kThreads), kThreads, 0,
                               stream,
                               RopeParams<T>{x, m, row_stride, q_offset, n_q_heads, k_offset,
                                             n_kv_heads, head_dim, half, positions, inv_freq});
}

template cudaError_t launch_rope<float>(float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                                        int64_t, int64_t, const int32_t*, const float*,
                                        cudaStream_t);
template cudaError_t launch_rope<__nv_bfloat16>(__nv_bfloat16*, int64_t, int64_t, int64_t, int64_t,
                                                int64_t, int64_t, int64_t, const int32_t*,
                                                const float*, cudaStream_t);

}  // namespace cellm::cuda
