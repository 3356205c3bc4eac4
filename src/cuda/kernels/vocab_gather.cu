#include "cuda/kernels/vocab_gather.h"

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/launch.cuh"

namespace cellm::cuda {
namespace {

struct VocabGatherParams {
  const float* gathered;
  int64_t chunk;
  VocabSlices slices;
  int64_t rows;
  int64_t vocab;
  float* out;
};

// Grid-stride over the [rows, vocab] output; each element finds its rank among at most
// kMaxVocabRanks slices.
__global__ void vocab_gather_kernel(VocabGatherParams p) {
  detail::wait_for_prior_grids();
  const int64_t total = p.rows * p.vocab;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t e = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t s = e / p.vocab;
    const int64_t v = e - s * p.vocab;
    int r = 0;
    while (r + 1 < p.slices.world && v >= p.slices.begin[r + 1]) ++r;
    const int64_t j = v - p.slices.begin[r];
    p.out[e] = p.gathered[r * p.chunk + s * p.slices.size[r] + j];
  }
  detail::allow_dependent_grids();
}

}  // namespace

cudaError_t launch_gather_vocab_slices(const float* gathered, int64_t chunk,
                                       const VocabSlices& slices, int64_t rows, int64_t vocab,
                                       float* out, cudaStream_t stream) {
  if (slices.world < 1 || slices.world > kMaxVocabRanks || rows < 0 || vocab <= 0 || chunk < 0) {
    return cudaErrorInvalidValue;
  }
  int64_t next = 0;
  for (int r = 0; r < slices.world; ++r) {
    if (slices.begin[r] != next || slices.size[r] <= 0 || rows * slices.size[r] > chunk) {
      return cudaErrorInvalidValue;
    }
    next += slices.size[r];
  }
  if (next != vocab) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (gathered == nullptr || out == nullptr) return cudaErrorInvalidValue;
  const VocabGatherParams p{gathered, chunk, slices, rows, vocab, out};
  constexpr int kThreads = 256;
  return detail::launch_kernel(vocab_gather_kernel, detail::blocks_for(rows * vocab, kThreads),
                               kThreads, 0, stream, p);
}

}  // namespace cellm::cuda
