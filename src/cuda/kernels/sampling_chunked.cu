// The device sampler's chunked path, for rows of kMinChunkedVocab logits or
// more: six launches over grids of (rows, chunks) and (rows), so one row's work
// spreads over many SMs. See sampling.h for the contract and the launch sequence.
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/sampling_device.cuh"

namespace cellm::cuda {
namespace {

// ---- The chunked path: six launches, grids of (rows, chunks) or (rows).
//
// A row's workspace, [vocab] 32-bit words, as the launches leave it:
//   chunk_best_kernel   [0, C) chunk best values, [C, 2C) their ids
//   id-order rows (no top-k / top-p):
//     chunk_weights     [0, 2C) each chunk's kept mass (u64 as lo, hi words),
//                       [2C, vocab) the weights
//     row_walk          [0, 2C) the weights too: the row holds all its weights
//   cut rows (top-k / top-p):
//     chunk_weights     header: [2C, 2C + 2) nothing; kSums + 2c: chunk c's mass;
//                       [hist, + C * kKeyBins) chunk c's key histogram (counts of
//                       positive weights per key)
//     row_plan          header: min key, candidate count, total mass; each
//                       chunk's offset into the candidate list
//     chunk_compact     [bits, + capacity) candidate weights' bits, [ids, +
//                       capacity) their ids, in id order
struct RowLayout {
  int32_t vocab;
  int32_t n_chunks;
  static constexpr int32_t kMinKey = 0;  // header words of a cut row
  static constexpr int32_t kCount = 1;
  static constexpr int32_t kTotal = 2;  // lo, hi
  static constexpr int32_t kSums = 4;   // C chunk masses, lo, hi each
  __device__ int32_t offsets() const { return kSums + 2 * n_chunks; }
  __device__ int32_t hist() const { return offsets() + n_chunks; }
  __device__ int32_t capacity() const { return (vocab - hist()) / 2; }
  __device__ int32_t bits() const { return hist(); }
  __device__ int32_t ids() const { return hist() + capacity(); }
  __device__ int32_t deferred() const { return 2 * n_chunks; }  // id-order rows
};

__device__ void store_u64(uint32_t* words, uint64_t v) {
  words[0] = static_cast<uint32_t>(v);
  words[1] = static_cast<uint32_t>(v >> 32);
}
__device__ uint64_t load_u64(const uint32_t* words) {
  return static_cast<uint64_t>(words[0]) | (static_cast<uint64_t>(words[1]) << 32);
}

// Launch 1: one block per (row, chunk) = (blockIdx.x, blockIdx.y) reduces logits
// [chunk * chunk_logits, + chunk_logits) of its row (clipped to vocab) to their
// best and stores it in the row's workspace:
//   words[chunk]            the best value
//   words[n_chunks + chunk] the best id, -1 when the chunk holds no number
__global__ void __launch_bounds__(kChunkThreads)
    chunk_best_kernel(const float* __restrict__ logits, int32_t vocab, int32_t chunk_logits,
                      int32_t n_chunks, float* __restrict__ workspace) {
  __shared__ BestSlots<kChunkThreads> slots;
  detail::wait_for_prior_grids();
  const int64_t row = blockIdx.x;
  const int32_t chunk = static_cast<int32_t>(blockIdx.y);
  const float* x = logits + row * vocab;
  const int32_t begin = chunk * chunk_logits;
  const int32_t end = min(begin + chunk_logits, vocab);
  Best best;
  // kChunkUnroll independent loads first, then their comparisons, so the loads
  // are in flight together.
  for (int32_t base = begin + static_cast<int32_t>(threadIdx.x); base < end;
       base += kChunkThreads * kChunkUnroll) {
    float v[kChunkUnroll];
#pragma unroll
    for (int u = 0; u < kChunkUnroll; ++u) {
      const int32_t i = base + u * kChunkThreads;
      v[u] = i < end ? x[i] : __int_as_float(0x7FFFFFFF);  // NaN: never a candidate
    }
#pragma unroll
    for (int u = 0; u < kChunkUnroll; ++u) {
      best = better(best, candidate_of(v[u], base + u * kChunkThreads));
    }
  }
  detail::allow_dependent_grids();
  best = block_best(best, slots);
  if (threadIdx.x == 0) {
    float* partials = workspace + row * vocab;
    partials[chunk] = best.valid ? best.value : 0.f;
    partials[n_chunks + chunk] = __int_as_float(best.valid ? best.index : -1);
  }
}

// Launch 2: one block per row merges the chunk bests into the argmax, which is
// the scan's best exactly (see `better`), and stores it in out_tokens[row]: the
// token of an argmax row, and for the others the id of the maximum logit, which
// the later launches read back.
__global__ void __launch_bounds__(kChunkThreads)
    row_max_kernel(int32_t vocab, int32_t n_chunks, const float* __restrict__ workspace,
                   int32_t* __restrict__ out_tokens) {
  __shared__ BestSlots<kChunkThreads> slots;
  detail::wait_for_prior_grids();
  const int64_t row = blockIdx.x;
  const float* partials = workspace + row * vocab;
  Best best;
  for (int32_t c = static_cast<int32_t>(threadIdx.x); c < n_chunks; c += kChunkThreads) {
    const int32_t index = __float_as_int(partials[n_chunks + c]);
    if (index >= 0) best = better(best, candidate_of(partials[c], index));
  }
  detail::allow_dependent_grids();
  best = block_best(best, slots);
  if (threadIdx.x == 0) out_tokens[row] = best.valid ? best.index : 0;
}

// Launch 3: one block per (row, chunk) computes its chunk's weights. An id-order
// row stores them (but for ids below layout.deferred(), where the chunk masses
// go) and its chunk's kept mass (w >= min_p); a cut row stores its chunk's mass
// and its histogram of keys of positive weights. Argmax rows do nothing.
__global__ void __launch_bounds__(kChunkThreads)
    chunk_weights_kernel(const float* __restrict__ logits, int32_t vocab, int32_t chunk_logits,
                         int32_t n_chunks, const SamplingRow* __restrict__ params,
                         const int32_t* __restrict__ out_tokens, uint32_t* __restrict__ workspace,
                         int mass_shift) {
  __shared__ uint32_t hist[kKeyBins];
  __shared__ uint64_t partial[kChunkThreads / 32];
  detail::wait_for_prior_grids();
  const int64_t row = blockIdx.x;
  const int32_t chunk = static_cast<int32_t>(blockIdx.y);
  const float* x = logits + row * vocab;
  const SamplingRow p = params[row];
  const RowScale scale = row_scale(x, out_tokens[row], p.temperature);
  if (!scale.drawn) return;
  const RowLayout layout{vocab, n_chunks};
  uint32_t* words = workspace + row * vocab;
  const int32_t begin = chunk * chunk_logits;
  const int32_t end = min(begin + chunk_logits, vocab);
  const int32_t tid = static_cast<int32_t>(threadIdx.x);
  const Mass mass{ldexp(1.0, mass_shift)};
  constexpr int kUnroll = 4;

  if (!is_cut(p, vocab)) {
    float* weight = reinterpret_cast<float*>(words);
    const int32_t deferred = layout.deferred();
    uint64_t local = 0;
    for (int32_t base = begin + tid; base < end; base += kChunkThreads * kUnroll) {
      float v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int32_t i = base + u * kChunkThreads;
        v[u] = i < end ? x[i] : __int_as_float(0x7FFFFFFF);  // NaN: weight 0
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int32_t i = base + u * kChunkThreads;
        const float w = weight_of(v[u], scale);
        if (i < end && i >= deferred) weight[i] = w;
        if (w >= p.min_p) local += mass(w);
      }
    }
    detail::allow_dependent_grids();
    const uint64_t kept = block_sum<kChunkThreads>(local, partial);
    if (tid == 0) store_u64(words + 2 * chunk, kept);
    return;
  }

  for (int b = tid; b < kKeyBins; b += kChunkThreads) hist[b] = 0;
  __syncthreads();
  uint64_t local = 0;
  for (int32_t base = begin + tid; base < end; base += kChunkThreads * kUnroll) {
    float v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int32_t i = base + u * kChunkThreads;
      v[u] = i < end ? x[i] : __int_as_float(0x7FFFFFFF);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const float w = weight_of(v[u], scale);
      local += mass(w);
      if (w > 0.f) atomicAdd(&hist[key_of(w)], 1u);
    }
  }
  detail::allow_dependent_grids();
  const uint64_t total = block_sum<kChunkThreads>(local, partial);  // its barriers order hist
  uint32_t* chunk_hist = words + layout.hist() + chunk * kKeyBins;
  for (int b = tid; b < kKeyBins; b += kChunkThreads) chunk_hist[b] = hist[b];
  if (tid == 0) store_u64(words + RowLayout::kSums + 2 * chunk, total);
}

// Launch 4: one block per drawn row.
// An id-order row: the kept mass (the chunks' sum), r, the chunk where the
// cumulative crosses r and the id in it; then the weights of the ids below
// layout.deferred(), over the chunk masses.
// A cut row: the total mass and the row's key histogram (the chunks' sums), and
// from them the lowest key a candidate needs (see sampling.h): top-k's k-th
// largest weight, and top-p's crossing weight, have a key >= min_key. Every
// positive weight with key >= min_key is a candidate; this stores min_key, the
// candidate count and each chunk's offset into the candidate list.
__global__ void __launch_bounds__(kThreads)
    row_plan_kernel(const float* __restrict__ logits, int32_t vocab, int32_t chunk_logits,
                    int32_t n_chunks, const SamplingRow* __restrict__ params,
                    int32_t* __restrict__ out_tokens, uint32_t* __restrict__ workspace,
                    int mass_shift) {
  __shared__ Shared sh;
  detail::wait_for_prior_grids();
  const int64_t row = blockIdx.x;
  const float* x = logits + row * vocab;
  const SamplingRow p = params[row];
  const int32_t argmax = out_tokens[row];
  const RowScale scale = row_scale(x, argmax, p.temperature);
  if (!scale.drawn) return;
  const RowLayout layout{vocab, n_chunks};
  uint32_t* words = workspace + row * vocab;
  const int32_t tid = static_cast<int32_t>(threadIdx.x);
  const Mass mass{ldexp(1.0, mass_shift)};

  if (!is_cut(p, vocab)) {
    const uint64_t chunk_kept = tid < n_chunks ? load_u64(words + 2 * tid) : 0;
    const uint64_t before = block_exclusive_sum(chunk_kept, sh);
    const uint64_t kept_mass = block_sum(chunk_kept, sh);  // its barriers end the reads
    int32_t token = argmax;
    if (kept_mass > 0) {  // else only invalid params
      const uint64_t u = uniform_bits24(p.seed, p.position);
      const uint64_t r = (__umul64hi(u, kept_mass) << 40) | ((u * kept_mass) >> 24);
      if (tid == 0) sh.found = -1;
      __syncthreads();
      if (tid < n_chunks && before <= r && r - before < chunk_kept) {
        sh.found = tid;  // exactly one chunk
        sh.above = before;
      }
      __syncthreads();
      const int32_t chunk = sh.found;
      const uint64_t above = sh.above;
      __syncthreads();
      if (chunk >= 0) {
        const int32_t begin = chunk * chunk_logits;
        const StoredChunk list{reinterpret_cast<const float*>(words),
                               x,
                               scale,
                               begin,
                               min(begin + chunk_logits, vocab) - begin,
                               layout.deferred()};
        const float min_p = p.min_p;
        auto kept_mass_of = [min_p, mass](int32_t, float w) -> uint64_t {
          return w >= min_p ? mass(w) : 0;
        };
        if (!first_crossing_in_id_order(list, kept_mass_of, r - above, sh, &token)) {
          token = argmax;
        }
      }
    }
    detail::allow_dependent_grids();
    float* weight = reinterpret_cast<float*>(words);
    for (int32_t i = tid; i < layout.deferred(); i += kThreads) weight[i] = weight_of(x[i], scale);
    if (tid == 0) out_tokens[row] = token;
    return;
  }

  const uint64_t total =
      block_sum(tid < n_chunks ? load_u64(words + RowLayout::kSums + 2 * tid) : 0, sh);
  // Thread t holds key b = kKeyBins - 1 - t, so thread order is descending key
  // order; `contribution` is what key b adds to the measure F taken from the top
  // (a lower bound of its mass for top-p), `target` what F must exceed.
  const int32_t key = kKeyBins - 1 - tid;
  uint32_t count = 0;
  for (int32_t c = 0; c < n_chunks; ++c) count += words[layout.hist() + c * kKeyBins + key];
  uint64_t contribution = count;
  uint64_t target = 0;
  if (use_top_k(p, vocab)) {
    target = static_cast<uint64_t>(p.top_k) - 1;
  } else {
    target = __double2ull_rd(static_cast<double>(p.top_p) * static_cast<double>(total));
    contribution = count * mass(__uint_as_float(static_cast<uint32_t>(key) << kKeyShift));
  }
  const uint64_t from_top = block_exclusive_sum(contribution, sh) + contribution;
  if (tid == 0) sh.first = kThreads;
  __syncthreads();
  if (from_top > target) atomicMin(&sh.first, tid);
  __syncthreads();
  // No key crosses (top-k's k exceeds the positive weights, top-p's target is
  // not below the total, or the lower bounds fall short): every positive weight.
  const uint32_t min_key =
      sh.first < kThreads ? static_cast<uint32_t>(kKeyBins - 1 - sh.first) : 0u;

  // Candidates per chunk: warp w sums chunks w, w + 32, ... over keys >= min_key.
  for (int32_t c = static_cast<int32_t>(warp_id()); c < n_chunks; c += kWarps) {
    const uint32_t* chunk_hist = words + layout.hist() + c * kKeyBins;
    uint64_t n = 0;
    for (int32_t b = static_cast<int32_t>(min_key + lane_id()); b < kKeyBins; b += 32) {
      n += chunk_hist[b];
    }
    n = warp_sum(n);
    if (lane_id() == 0) sh.chunk_count[c] = static_cast<uint32_t>(n);
  }
  __syncthreads();
  const uint64_t chunk_n = tid < n_chunks ? sh.chunk_count[tid] : 0;
  const uint64_t offset = block_exclusive_sum(chunk_n, sh);
  const uint64_t n_candidates = block_sum(chunk_n, sh);
  detail::allow_dependent_grids();
  if (tid < n_chunks) words[layout.offsets() + tid] = static_cast<uint32_t>(offset);
  if (tid == 0) {
    words[RowLayout::kMinKey] = min_key;
    words[RowLayout::kCount] = static_cast<uint32_t>(n_candidates);
    store_u64(words + RowLayout::kTotal, total);
  }
}

// Launch 5: one block per (row, chunk) of a cut row whose candidates fit:
// stores its chunk's candidates (positive weights with key >= min_key) at its
// offset in the candidate list, in id order.
__global__ void __launch_bounds__(kChunkThreads)
    chunk_compact_kernel(const float* __restrict__ logits, int32_t vocab, int32_t chunk_logits,
                         int32_t n_chunks, const SamplingRow* __restrict__ params,
                         const int32_t* __restrict__ out_tokens, uint32_t* __restrict__ workspace) {
  __shared__ uint32_t warp_count[kChunkThreads / 32];
  detail::wait_for_prior_grids();
  const int64_t row = blockIdx.x;
  const int32_t chunk = static_cast<int32_t>(blockIdx.y);
  const float* x = logits + row * vocab;
  const SamplingRow p = params[row];
  const RowScale scale = row_scale(x, out_tokens[row], p.temperature);
  if (!scale.drawn || !is_cut(p, vocab)) return;
  const RowLayout layout{vocab, n_chunks};
  uint32_t* words = workspace + row * vocab;
  const uint32_t n_candidates = words[RowLayout::kCount];
  if (n_candidates > static_cast<uint32_t>(layout.capacity())) return;
  const uint32_t min_key = words[RowLayout::kMinKey];
  uint32_t offset = words[layout.offsets() + chunk];
  uint32_t* bits = words + layout.bits();
  uint32_t* ids = words + layout.ids();
  const int32_t begin = chunk * chunk_logits;
  const int32_t end = min(begin + chunk_logits, vocab);
  const unsigned lane = lane_id();
  const unsigned warp = warp_id();
  // A pass takes kCompactPer logits a thread, each warp a run of 32 * kCompactPer
  // consecutive ids (element e of lane l: id run + 32 e + l, so each load is
  // coalesced), all loads in flight before the weights; a block-wide count per
  // pass places each warp's candidates after those of the warps before it, and
  // within a warp ballots in element order keep the ids ascending.
  constexpr int kCompactPer = 8;
  constexpr int32_t kWarpRun = 32 * kCompactPer;
  constexpr int32_t kPass = kChunkThreads * kCompactPer;
  const float nan = __int_as_float(0x7FFFFFFF);  // weight 0: never a candidate
  for (int32_t base = begin; base < end; base += kPass) {
    const int32_t run = base + static_cast<int32_t>(warp) * kWarpRun;
    float v[kCompactPer];
#pragma unroll
    for (int e = 0; e < kCompactPer; ++e) {
      const int32_t i = run + 32 * e + static_cast<int32_t>(lane);
      v[e] = i < end ? x[i] : nan;
    }
    unsigned ballot[kCompactPer];
    uint32_t count = 0;
#pragma unroll
    for (int e = 0; e < kCompactPer; ++e) {
      v[e] = weight_of(v[e], scale);
      ballot[e] = __ballot_sync(kFullMask, v[e] > 0.f && key_of(v[e]) >= min_key);
      count += static_cast<uint32_t>(__popc(static_cast<int>(ballot[e])));
    }
    if (lane == 0) warp_count[warp] = count;
    __syncthreads();
    uint32_t at = offset;
    uint32_t pass = 0;
    for (unsigned q = 0; q < kChunkThreads / 32; ++q) {
      at += q < warp ? warp_count[q] : 0u;
      pass += warp_count[q];
    }
    const unsigned lanes_before = (1u << lane) - 1u;
#pragma unroll
    for (int e = 0; e < kCompactPer; ++e) {
      if ((ballot[e] >> lane) & 1u) {
        const uint32_t slot =
            at + static_cast<uint32_t>(__popc(static_cast<int>(ballot[e] & lanes_before)));
        bits[slot] = __float_as_uint(v[e]);
        ids[slot] = static_cast<uint32_t>(run + 32 * e + static_cast<int32_t>(lane));
      }
      at += static_cast<uint32_t>(__popc(static_cast<int>(ballot[e])));
    }
    offset += pass;
    __syncthreads();
  }
  detail::allow_dependent_grids();
}

// Launch 6: one block per cut row draws its token over the candidate list, or
// over the whole row (weights recomputed) when the candidates did not fit.
__global__ void __launch_bounds__(kThreads)
    row_draw_kernel(const float* __restrict__ logits, int32_t vocab, int32_t n_chunks,
                    const SamplingRow* __restrict__ params, int32_t* __restrict__ out_tokens,
                    const uint32_t* __restrict__ workspace, int mass_shift) {
  __shared__ Shared sh;
  detail::wait_for_prior_grids();
  const int64_t row = blockIdx.x;
  const float* x = logits + row * vocab;
  const SamplingRow p = params[row];
  const int32_t argmax = out_tokens[row];
  const RowScale scale = row_scale(x, argmax, p.temperature);
  if (!scale.drawn || !is_cut(p, vocab)) return;
  const RowLayout layout{vocab, n_chunks};
  const uint32_t* words = workspace + row * vocab;
  const Mass mass{ldexp(1.0, mass_shift)};
  const uint32_t n_candidates = words[RowLayout::kCount];
  const uint64_t total = load_u64(words + RowLayout::kTotal);
  int32_t token;
  if (n_candidates <= static_cast<uint32_t>(layout.capacity())) {
    const CandidateList list{words + layout.bits(),
                             reinterpret_cast<const int32_t*>(words + layout.ids()),
                             static_cast<int32_t>(n_candidates)};
    token = draw_after_cut(list, p, vocab, total, mass, argmax, sh);
  } else {
    const RecomputedRow list{x, scale, vocab};
    token = draw_after_cut(list, p, vocab, total, mass, argmax, sh);
  }
  detail::allow_dependent_grids();
  if (threadIdx.x == 0) out_tokens[row] = token;
}

}  // namespace

namespace detail {

cudaError_t launch_sample_chunked(const float* logits, int32_t vocab, unsigned rows,
                                  const SamplingRow* params, int32_t* out_tokens, void* workspace,
                                  int mass_shift, cudaStream_t stream) {
  // The six launches of the chunked path (the file comment of sampling.h). The
  // same sequence for every (n_rows, vocab), whatever the policies, so a graph
  // captured once stays valid; each kernel skips the rows it has nothing to do for.
  const SampleSplit split = sample_split(rows, vocab);
  const int32_t c = split.n_chunks;
  const int32_t chunk = split.chunk_logits;
  const dim3 grid(rows, static_cast<unsigned>(c));  // c <= kMaxChunks, inside gridDim.y
  float* ws_f32 = static_cast<float*>(workspace);
  uint32_t* ws_u32 = static_cast<uint32_t*>(workspace);
  cudaError_t err = launch_kernel(chunk_best_kernel, grid, kChunkThreads, 0, stream, logits, vocab,
                                  chunk, c, ws_f32);
  if (err != cudaSuccess) return err;
  err = launch_kernel(row_max_kernel, rows, kChunkThreads, 0, stream, vocab, c, ws_f32, out_tokens);
  if (err != cudaSuccess) return err;
  err = launch_kernel(chunk_weights_kernel, grid, kChunkThreads, 0, stream, logits, vocab, chunk, c,
                      params, out_tokens, ws_u32, mass_shift);
  if (err != cudaSuccess) return err;
  err = launch_kernel(row_plan_kernel, rows, kThreads, 0, stream, logits, vocab, chunk, c, params,
                      out_tokens, ws_u32, mass_shift);
  if (err != cudaSuccess) return err;
  err = launch_kernel(chunk_compact_kernel, grid, kChunkThreads, 0, stream, logits, vocab, chunk, c,
                      params, out_tokens, ws_u32);
  if (err != cudaSuccess) return err;
  return launch_kernel(row_draw_kernel, rows, kThreads, 0, stream, logits, vocab, c, params,
                       out_tokens, ws_u32, mass_shift);
}

}  // namespace detail
}  // namespace cellm::cuda
