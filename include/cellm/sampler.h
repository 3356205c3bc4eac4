// Sampling a token from one row of logits, with randomness keyed by
// (seed, position) so a seeded generation draws the same tokens whatever else
// shares its batches, on any executor (the CUDA sampler computes the same
// uniform with the same function).
//
// temperature 0 is argmax (lowest id on ties). Otherwise p = softmax(logits/T);
// then top-k (if 0 < k < V: the k most probable, descending, stable) else top-p
// (if 0 < p < 1: descending, keep up to and including the token where the
// cumulative mass first exceeds p); then min-p (drop tokens whose probability is
// below min_p times the most probable one's); then a draw r = u * (kept mass)
// walking the kept tokens in that order (descending after top-k/top-p, token-id
// order otherwise) until the cumulative mass exceeds r.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "cellm/logits_processor.h"
#include "cellm/status.h"
#include "cellm/types.h"

namespace cellm {

// Ok, or InvalidArgument naming the field: temperature finite and >= 0,
// top_k >= 0, top_p in (0, 1], min_p in [0, 1], num_logprobs in [0, kMaxLogprobs].
Status validate_sampling(const SamplingParams& params);

// The uniform draw in [0, 1) for the token at `position` of a generation seeded
// with `seed`: a counter-based hash (splitmix64 of seed and position), 24 bits.
// Exactly, in wrapping uint64 arithmetic (the CUDA sampler reproduces it bit for
// bit):
//   G      = 0x9E3779B97F4A7C15
//   mix(z) = z ^= z >> 30; z *= 0xBF58476D1CE4E5B9;
//            z ^= z >> 27; z *= 0x94D049BB133111EB; z ^= z >> 31
//   key    = mix(seed + G)
//   p      = uint64(uint32(position))
//   bits   = mix(key + (p + 1) * G)
//   u      = float(bits >> 40) * 2^-24   (exact in float; u in [0, 1 - 2^-24])
// Hashing the seed first keeps the streams of nearby seeds unrelated.
float sampling_uniform(uint64_t seed, Position position);

// Samples one token from `logits` (one row, V entries) with the uniform `u`.
// Reuses `scratch` between calls to avoid allocation (plus thread-local key and
// index buffers when top-k or top-p is on).
// NaN logits count as probability 0; when no logit is a number the result is
// token 0. With +inf logits the mass splits evenly among them.
// REQUIRES: !logits.empty(), params valid, 0 <= u < 1.
Token sample_token(std::span<const float> logits, const SamplingParams& params, float u,
                   std::vector<float>& scratch);

// The log-probabilities of `sampled` and of the n most likely tokens of one raw
// logits row (V entries), as TokenLogprobs documents: log-softmax in f32 with a
// stable log-sum-exp, top by partial selection (no full sort), most likely first,
// ties by lower id; min(n, V) entries. At the edges: a NaN logit counts as -inf
// (logprob -inf, ranked with the -inf logits by id); +inf logits share the mass
// evenly; a row with no mass (every logit NaN or -inf) is -inf everywhere.
// Reuses `scratch` between calls to avoid allocation (beyond the result).
// REQUIRES: !logits.empty(), 0 <= sampled < V, n >= 0.
TokenLogprobs token_logprobs(std::span<const float> logits, Token sampled, int32_t n,
                             std::vector<float>& scratch);

// A generation's sampling policy as a session table keeps it.
struct SamplingPolicy {
  SamplingParams params;
  uint64_t seed = 0;
  std::shared_ptr<LogitsProcessor> processor;  // null: none
};

}  // namespace cellm
