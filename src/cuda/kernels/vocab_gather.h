// The logits of a tensor-parallel step put together. Each rank computes the logits of
// its vocabulary slice [begin[r], begin[r] + size[r]) for the step's rows, [rows,
// size[r]] row-major, and an all-gather places rank r's at gathered + r * chunk; this
// writes them as the whole step's [rows, vocab]:
//   out[s, begin[r] + j] = gathered[r * chunk + s * size[r] + j].
//
// The launcher enqueues on `stream`, never allocates or synchronises (safe inside CUDA
// graph capture), and returns the launch error: cudaErrorInvalidValue when the slices
// do not cover [0, vocab) in rank order without gaps, a rank's rows do not fit its
// chunk, or world is outside [1, kMaxVocabRanks].
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cellm::cuda {

constexpr int kMaxVocabRanks = 8;

struct VocabSlices {
  int world = 1;
  int64_t begin[kMaxVocabRanks] = {};
  int64_t size[kMaxVocabRanks] = {};
};

// gathered: [world * chunk] f32; out: [rows, vocab] f32, not overlapping gathered.
cudaError_t launch_gather_vocab_slices(const float* gathered, int64_t chunk,
                                       const VocabSlices& slices, int64_t rows, int64_t vocab,
                                       float* out, cudaStream_t stream);

}  // namespace cellm::cuda
