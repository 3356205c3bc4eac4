#include "cuda/kernels/embedding.h"

#include <limits>

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/launch.cuh"

namespace cellm::cuda {
namespace {

using detail::kPack;

template <typename T>
struct GatherParams {
  const T* table;         // [vocab, d]
  int64_t vocab;          // rows of table; an index outside [0, vocab) gives zeros
  int64_t d;              // row width, elements
  const int32_t* tokens;  // [n] row indices
  float* out;             // [n, d]
  const int32_t* fed;     // [n] or null: the index of a row whose index is kFedToken
};

// One block per output row; each thread moves N consecutive elements per step.
// The row index (step metadata, or rows of x) is read after the wait.
template <typename T, int N>
__global__ void gather_kernel(GatherParams<T> p, bool early) {
  detail::wait_and_allow(early);  // the next kernel may launch once every block is here
  const int64_t i = blockIdx.x;
  int32_t t = p.tokens[i];
  if (t == kFedToken && p.fed != nullptr) t = p.fed[i];
  const bool valid = t >= 0 && t < p.vocab;
  const T* src = p.table + (valid ? int64_t{t} * p.d : 0);
  float* dst = p.out + i * p.d;
  for (int64_t c = int64_t{threadIdx.x} * N; c < p.d; c += int64_t{blockDim.x} * N) {
    float v[N];
    if (valid) {
      detail::load_floats<N>(src + c, v);
    } else {
#pragma unroll
      for (int j = 0; j < N; ++j) v[j] = 0.0f;
    }
    detail::store_floats<N>(dst + c, v);
  }
}

template <typename T>
cudaError_t launch_gather(const GatherParams<T>& p, int64_t n, cudaStream_t stream) {
  if (p.vocab <= 0 || p.d <= 0 || n < 0 || n > std::numeric_limits<int32_t>::max()) {
    return cudaErrorInvalidValue;
  }
  if (n == 0) return cudaSuccess;
  if (p.table == nullptr || p.tokens == nullptr || p.out == nullptr) return cudaErrorInvalidValue;
  const bool packed = p.d % kPack == 0 && detail::aligned_to(p.table, sizeof(T) * kPack) &&
                      detail::aligned_to(p.out, sizeof(float) * kPack);
  const int64_t packs = packed ? p.d / kPack : p.d;
  const int threads = detail::threads_for_row(packs, 256);
  const auto blocks = static_cast<unsigned>(n);
  return packed ? detail::launch_kernel(gather_kernel<T, kPack>, blocks, threads, 0, stream, p,
                                        detail::early_triggers())
                : detail::launch_kernel(gather_kernel<T, 1>, blocks, threads, 0, stream, p,
                                        detail::early_triggers());
}

}  // namespace

template <typename T>
cudaError_t launch_embedding(const T* table, int64_t vocab, int64_t d, const int32_t* tokens,
                             int64_t n, float* out, cudaStream_t stream, const int32_t* fed) {
  return launch_gather(GatherParams<T>{table, vocab, d, tokens, out, fed}, n, stream);
}

cudaError_t launch_gather_rows(const float* x, int64_t d, const int32_t* rows, int64_t n_rows,
                               float* out, cudaStream_t stream) {
  // The row count of x is not known here: every non-negative row is taken as valid.
  return launch_gather(
      GatherParams<float>{x, std::numeric_limits<int64_t>::max(), d, rows, out, nullptr}, n_rows,
      stream);
}

template cudaError_t launch_embedding<float>(const float*, int64_t, int64_t, const int32_t*,
                                             int64_t, float*, cudaStream_t, const int32_t*);
template cudaError_t launch_embedding<__nv_bfloat16>(const __nv_bfloat16*, int64_t, int64_t,
                                                     const int32_t*, int64_t, float*, cudaStream_t,
                                                     const int32_t*);

}  // namespace cellm::cuda
