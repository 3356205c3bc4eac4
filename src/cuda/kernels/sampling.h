// Token sampling on the device: for each row of logits, launch_sample draws exactly the
// token the host's cellm::sample_token (include/cellm/sampler.h) draws for the
// same row, policy and uniform sampling_uniform(seed, position), so only token
// ids cross to the host and a seeded generation is reproducible on any executor
// (DESIGN.md §7 Sampling, §9.4-5).
//
// Semantics (the host's, step for step): temperature 0 is argmax (lowest id on
// ties, NaN skipped, token 0 when every logit is NaN); a row without a finite or
// +inf maximum falls back to argmax. Otherwise weights w = exp((x - max) / T)
// (NaN -> 0; with +inf logits each +inf weighs 1 and the rest 0), then top-k
// (0 < k < V) else top-p (0 < p < 1), then min-p (drop w < min_p: the largest
// weight is exactly 1), then r = u * kept mass and a walk in (weight desc, id
// asc) order after top-k/top-p, id order otherwise, to the token where the
// cumulative mass first exceeds r.
//
// The weights are the host's bit for bit (the device evaluates the host libm's
// expf algorithm), so ties, thresholds and min-p cuts are the host's exactly.
// How the device differs: it never sorts. The k-th largest weight, the top-p
// cut and the walk's crossing are radix selects over the weights' float bits
// (4 passes of 8 bits, block-wide histograms in shared memory), and ties at a
// threshold are resolved by a scan in id order. Masses are summed in 64-bit
// fixed point (w * 2^S with S = 62 - bit_width(V)), exact and deterministic, so
// a launch always gives the same tokens for the same inputs, however a row is
// split. The host sums in double; the two agree on the token unless r (or
// top-p's p * total) lies within 2^(2 bit_width(V) - 63) of the kept mass
// (< 1e-8 below 2^18 tokens) from a cumulative boundary.
//
// Rows of fewer than 4096 logits take one kernel, one block per row doing all
// of the above (sampling.cu). Longer rows are cut into chunks (sample_split:
// about 512 blocks in all) and take six launches (sampling_chunked.cu), the same
// six for every policy so that a graph captured once stays valid:
//   1. (rows, chunks): each chunk's best logit (value desc, id asc, NaN skipped).
//   2. (rows): the chunk bests merged: the scan's argmax exactly (the order is
//      total), stored in out_tokens; argmax rows (temperature 0, no mass) are
//      done, and every later launch skips them.
//   3. (rows, chunks): each chunk's weights. A row drawn in id order (no top-k,
//      top-p) stores them and its chunk's kept mass (w >= min_p); a cut row
//      (top-k or top-p) stores its chunk's mass and a 1024-bin histogram of the
//      keys (float bits >> 20: eighths of an octave) of its positive weights.
//   4. (rows): an id-order row sums its chunk masses, draws r, finds the chunk
//      where the cumulative crosses r and walks it: done. A cut row sums its
//      chunks' masses (the total) and histograms, and finds the lowest key a
//      candidate needs: for top-k the largest key b with at least k positive
//      weights at keys >= b (the k-th largest weight has a key >= b); for
//      top-p the largest key b where the masses at keys >= b, bounded below by
//      count times the key's smallest weight, exceed floor(p * total) (then the
//      true mass of weights >= that smallest weight exceeds it too, so the
//      crossing weight v, F(w > v) <= floor(p * total) < F(w >= v), is at least
//      it). Either way every weight the cut keeps, and every weight tied with
//      the threshold, is a candidate: a positive weight with key >= b. Stores b,
//      the candidate count and each chunk's offset (from the chunk histograms).
//   5. (rows, chunks): each chunk compacts its candidates (weight bits, id) at
//      its offset, so the list is in id order.
//   6. (rows): the cut, min-p and the walk, as above, over the candidates (a
//      few hundred to a few thousand for model-like rows) instead of the row.
//      Zero weights carry no mass: with fewer than k positive weights, top-k
//      keeps them all, and the walk's token is the host's. Where the candidates
//      do not fit in the workspace (about vocab / 2: flat rows, or ties on most
//      of the row) it runs over the whole row, weights recomputed: the same
//      token, at the old one-block-per-row speed.
//
// Launches are asynchronous on `stream`, allocate nothing and never synchronize
// with the host, so they can be captured in a CUDA graph.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace cellm::cuda {

// One row's sampling policy: cellm::SamplingParams plus the draw's key. A plain
// 32-byte struct with the same layout on host and device.
struct SamplingRow {
  float temperature = 0.f;  // 0 = argmax; else finite and > 0
  int32_t top_k = 0;        // 0 or >= V: off
  float top_p = 1.f;        // in (0, 1]; 1: off
  float min_p = 0.f;        // in [0, 1]
  uint64_t seed = 0;        // the generation's seed
  int32_t position = 0;     // the position the sampled token takes (keys the uniform)
  int32_t pad = 0;
};
static_assert(sizeof(SamplingRow) == 32, "SamplingRow is uploaded as raw bytes");

// Bytes of scratch launch_sample needs for n_rows rows of `vocab` logits:
// [n_rows, vocab] 32-bit words, rounded up to 256 bytes. 0 when either is <= 0.
// Each row's words hold, in turn, its chunk bests, its chunk masses and key
// histograms, and its candidate list (RowLayout in sampling_chunked.cu). After a
// launch a row that was drawn (temperature > 0, with mass) in id order (no top-k or
// top-p), and any drawn row of fewer than 4096 logits, holds its weights f32;
// other rows hold scratch.
size_t sample_workspace_bytes(int64_t n_rows, int64_t vocab);

// How launch_sample splits each row for its chunked launches: n_chunks chunks of
// chunk_logits consecutive logits (the last may be shorter), one block
// each, about 512 blocks in all, no chunk shorter than 2048 logits. n_chunks == 1
// is no split. Exposed for the tests that put ties and NaN at chunk boundaries.
struct SampleSplit {
  int32_t n_chunks = 1;
  int32_t chunk_logits = 0;  // 0 for a shape launch_sample refuses
};
SampleSplit sample_split(int64_t n_rows, int64_t vocab);

// For each row r in [0, n_rows): out_tokens[r] = the token the host's
// sample_token(logits row r, params[r], sampling_uniform(params[r].seed,
// params[r].position)) returns (see the file comment for where float sums may
// differ).
//   logits      [n_rows, vocab] f32, row-major, device
//   params      [n_rows] device
//   out_tokens  [n_rows] int32, device
//   workspace   device, >= sample_workspace_bytes(n_rows, vocab) bytes
// REQUIRES: 1 <= vocab < 2^31, params valid (cellm::validate_sampling).
// Returns cudaErrorInvalidValue (launching nothing) for a bad shape, a null
// pointer or a short workspace; cudaSuccess with no launch when n_rows == 0;
// otherwise the launch's error.
cudaError_t launch_sample(const float* logits, int64_t n_rows, int64_t vocab,
                          const SamplingRow* params, int32_t* out_tokens, void* workspace,
                          size_t workspace_bytes, cudaStream_t stream);

// A device twin of cellm::sampling_uniform, exposed for its test:
// out[i] = sampling_uniform(seeds[i], positions[i]) bit for bit, i in [0, n).
//   seeds [n] u64, positions [n] int32, out [n] f32, all device.
cudaError_t launch_sampling_uniform(const uint64_t* seeds, const int32_t* positions, int64_t n,
                                    float* out, cudaStream_t stream);

}  // namespace cellm::cuda
