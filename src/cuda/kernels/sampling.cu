// Device sampling: the public launchers, and the one-block-per-row path for rows
// of fewer than kMinChunkedVocab logits (longer rows take sampling_chunked.cu's).
// See sampling.h for the contract; the steps mirror src/core/sampler.cpp one for one.
#include "cuda/kernels/sampling.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/sampling_device.cuh"

namespace cellm::cuda {
namespace {

// ---- The one-kernel path, for rows of fewer than kMinChunkedVocab logits.

// One block per row: the argmax, the weights (stored in the row's workspace), the
// draw. weights: [n_rows, vocab] f32.
__global__ void __launch_bounds__(kThreads)
    sample_rows_kernel(const float* __restrict__ logits, int32_t vocab,
                       const SamplingRow* __restrict__ params, int32_t* __restrict__ out_tokens,
                       float* __restrict__ weights, int mass_shift) {
  __shared__ Shared sh;
  detail::wait_for_prior_grids();
  const int64_t row = blockIdx.x;
  const float* x = logits + row * vocab;
  float* weight = weights + row * vocab;
  const SamplingRow p = params[row];
  const int32_t tid = static_cast<int32_t>(threadIdx.x);

  // Argmax: the answer at temperature 0, and the fallback without mass.
  Best best;
  for (int32_t i = tid; i < vocab; i += kThreads) best = better(best, candidate_of(x[i], i));
  best = block_best(best, sh.best);
  detail::allow_dependent_grids();
  const int32_t argmax = best.valid ? best.index : 0;
  const RowScale scale = row_scale(x, argmax, p.temperature);
  if (!scale.drawn) {
    if (tid == 0) out_tokens[row] = argmax;
    return;
  }
  for (int32_t i = tid; i < vocab; i += kThreads) weight[i] = weight_of(x[i], scale);
  __syncthreads();

  const Mass mass{ldexp(1.0, mass_shift)};
  const StoredRow list{weight, vocab};
  int32_t token = argmax;
  if (is_cut(p, vocab)) {
    uint64_t local = 0;
    for (int32_t i = tid; i < vocab; i += kThreads) local += mass(weight[i]);
    const uint64_t total = block_sum(local, sh);
    token = draw_after_cut(list, p, vocab, total, mass, argmax, sh);
  } else {
    const float min_p = p.min_p;
    auto kept_mass_of = [min_p, mass](int32_t, float w) -> uint64_t {
      return w >= min_p ? mass(w) : 0;
    };
    uint64_t local = 0;
    for (int32_t i = tid; i < vocab; i += kThreads) local += kept_mass_of(i, weight[i]);
    const uint64_t kept_mass = block_sum(local, sh);
    if (kept_mass > 0) {  // else only invalid params
      const uint64_t u = uniform_bits24(p.seed, p.position);
      const uint64_t r = (__umul64hi(u, kept_mass) << 40) | ((u * kept_mass) >> 24);
      if (!first_crossing_in_id_order(list, kept_mass_of, r, sh, &token)) token = argmax;
    }
  }
  if (tid == 0) out_tokens[row] = token;
}

__global__ void sampling_uniform_kernel(const uint64_t* __restrict__ seeds,
                                        const int32_t* __restrict__ positions, int64_t n,
                                        float* __restrict__ out) {
  detail::wait_for_prior_grids();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = static_cast<float>(uniform_bits24(seeds[i], positions[i])) * 0x1.0p-24f;
  detail::allow_dependent_grids();
}

int bit_width(uint64_t v) {
  int bits = 0;
  while (v != 0) {
    ++bits;
    v >>= 1;
  }
  return bits;
}

}  // namespace

SampleSplit sample_split(int64_t n_rows, int64_t vocab) {
  SampleSplit split;
  if (n_rows < 1 || n_rows > kMaxRows || vocab < 1 || vocab > kMaxVocab) return split;
  // Enough chunks for about kTargetChunkBlocks blocks, none shorter than
  // kMinChunkLogits (so 2 * n_chunks <= vocab: the chunk bests fit in the row).
  const int64_t by_occupancy = (kTargetChunkBlocks + n_rows - 1) / n_rows;
  const int64_t by_length = vocab / kMinChunkLogits;
  const int64_t n_chunks = std::max<int64_t>(1, std::min(by_occupancy, by_length));
  split.n_chunks = static_cast<int32_t>(n_chunks);
  split.chunk_logits = static_cast<int32_t>((vocab + n_chunks - 1) / n_chunks);
  return split;
}

size_t sample_workspace_bytes(int64_t n_rows, int64_t vocab) {
  if (n_rows <= 0 || vocab <= 0) return 0;
  const size_t bytes = static_cast<size_t>(n_rows) * static_cast<size_t>(vocab) * sizeof(float);
  return (bytes + 255) / 256 * 256;
}

cudaError_t launch_sample(const float* logits, int64_t n_rows, int64_t vocab,
                          const SamplingRow* params, int32_t* out_tokens, void* workspace,
                          size_t workspace_bytes, cudaStream_t stream) {
  // REQUIRES: a valid shape, device pointers, enough workspace.
  if (n_rows < 0 || n_rows > kMaxRows || vocab < 1 || vocab > kMaxVocab) {
    return cudaErrorInvalidValue;
  }
  if (n_rows == 0) return cudaSuccess;
  if (logits == nullptr || params == nullptr || out_tokens == nullptr || workspace == nullptr ||
      workspace_bytes < sample_workspace_bytes(n_rows, vocab)) {
    return cudaErrorInvalidValue;
  }
  const int mass_shift = 62 - bit_width(static_cast<uint64_t>(vocab));
  const int32_t v = static_cast<int32_t>(vocab);
  const unsigned rows = static_cast<unsigned>(n_rows);
  if (vocab < kMinChunkedVocab) {
    return detail::launch_kernel(sample_rows_kernel, rows, kThreads, 0, stream, logits, v, params,
                                 out_tokens, static_cast<float*>(workspace), mass_shift);
  }
  return detail::launch_sample_chunked(logits, v, rows, params, out_tokens, workspace, mass_shift,
                                       stream);
}

cudaError_t launch_sampling_uniform(const uint64_t* seeds, const int32_t* positions, int64_t n,
                                    float* out, cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (seeds == nullptr || positions == nullptr || out == nullptr) return cudaErrorInvalidValue;
  constexpr int kBlock = 256;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  if (blocks > 0x7FFFFFFF) return cudaErrorInvalidValue;
  return detail::launch_kernel(sampling_uniform_kernel, static_cast<unsigned>(blocks), kBlock, 0,
                               stream, seeds, positions, n, out);
}

}  // namespace cellm::cuda
