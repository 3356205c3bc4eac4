// Device-side pieces shared by the sampler's two paths (sampling.cu: one block
// per row; sampling_chunked.cu: rows spread over chunks): the constants, the
// uniform draw, the host's expf, the block reductions, the radix selects and the
// draw after a cut. Included only by those two files; everything is file-local
// to each (an anonymous namespace), but for the chunked path's launcher.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "cuda/kernels/sampling.h"

namespace cellm::cuda {
namespace detail {

// Enqueues the chunked path's six launches for `rows` rows of `vocab` logits
// (vocab >= kMinChunkedVocab); the arguments are launch_sample's, checked.
cudaError_t launch_sample_chunked(const float* logits, int32_t vocab, unsigned rows,
                                  const SamplingRow* params, int32_t* out_tokens, void* workspace,
                                  int mass_shift, cudaStream_t stream);

}  // namespace detail

namespace {

constexpr int kThreads = 1024;  // the per-row kernels' blocks
constexpr int kWarps = kThreads / 32;
// The split (sample_split): blocks of kChunkThreads, each on a chunk of at least
// kMinChunkLogits logits (a block streams it at full speed), about
// kTargetChunkBlocks blocks in all (4 per SM on a 132-SM GPU).
constexpr int kChunkThreads = 256;
constexpr int kChunkUnroll = 8;  // loads in flight per thread
constexpr int64_t kMinChunkLogits = 2048;
constexpr int64_t kTargetChunkBlocks = 512;
constexpr int kMaxChunks = static_cast<int>(kTargetChunkBlocks);
// Rows of fewer logits (never split) take the one-kernel path.
constexpr int64_t kMinChunkedVocab = 2 * kMinChunkLogits;
constexpr unsigned kFullMask = 0xFFFFFFFFu;
constexpr int kBins = 256;  // one radix digit of 8 bits
// A weight's coarse key: its float bits >> 20 (sign, exponent and 3 mantissa
// bits: eighths of an octave). Weights lie in [0, 1], so keys are <= 0x3F8.
constexpr int kKeyShift = 20;
constexpr int kKeyBins = 1024;
static_assert(kKeyBins == kThreads, "row_plan_kernel gives each key one thread");
static_assert(kMaxChunks <= kThreads, "the per-row kernels give each chunk one thread");
constexpr int64_t kMaxVocab = int64_t{1} << 30;  // ids and loop indices stay in int32
constexpr int64_t kMaxRows = int64_t{1} << 24;   // keeps the workspace size in range
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

__device__ uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The 24 bits of sampling_uniform(seed, position): u = bits * 2^-24.
__device__ uint32_t uniform_bits24(uint64_t seed, int32_t position) {
  const uint64_t key = splitmix64_mix(seed + kGolden);
  const uint64_t counter = static_cast<uint64_t>(static_cast<uint32_t>(position));
  const uint64_t bits = splitmix64_mix(key + (counter + 1) * kGolden);
  return static_cast<uint32_t>(bits >> 40);
}

// expf exactly as the host's libm computes it: the algorithm of ARM's optimized
// routines expf (glibc's since 2.27; x86-64 glibc picks its FMA build on FMA
// CPUs), with the same double operations and the same fused multiply-adds,
// checked on the host against std::exp over every float in [-inf, -0]. CUDA's own
// expf is up to 2 ulp off and would break ties that the host keeps.
// kExp2Table[i] = bits(2^(i/32)) - (i << 47), the exponent added back per use.
// In global memory, read through the L1: the lanes of a warp index it by their own
// x, and the constant cache would serve 32 different words one at a time (that
// serialisation made the weights' kernels compute-bound).
__device__ const uint64_t kExp2Table[32] = {
    0x3ff0000000000000ull, 0x3fefd9b0d3158574ull, 0x3fefb5586cf9890full, 0x3fef9301d0125b51ull,
    0x3fef72b83c7d517bull, 0x3fef54873168b9aaull, 0x3fef387a6e756238ull, 0x3fef1e9df51fdee1ull,
    0x3fef06fe0a31b715ull, 0x3feef1a7373aa9cbull, 0x3feedea64c123422ull, 0x3feece086061892dull,
    0x3feebfdad5362a27ull, 0x3feeb42b569d4f82ull, 0x3feeab07dd485429ull, 0x3feea47eb03a5585ull,
    0x3feea09e667f3bcdull, 0x3fee9f75e8ec5f74ull, 0x3feea11473eb0187ull, 0x3feea589994cce13ull,
    0x3feeace5422aa0dbull, 0x3feeb737b0cdc5e5ull, 0x3feec49182a3f090ull, 0x3feed503b23e255dull,
    0x3feee89f995ad3adull, 0x3feeff76f2fb5e47ull, 0x3fef199bdd85529cull, 0x3fef3720dcef9069ull,
    0x3fef5818dcfba487ull, 0x3fef7c97337b9b5full, 0x3fefa4afa2a490daull, 0x3fefd0765b6e4540ull};

__device__ float host_expf(float x) {
  constexpr double kInvLn2N = 0x1.71547652b82fep+0 * 32;
  constexpr double kShift = 0x1.8p+52;
  constexpr double kC0 = 0x1.c6af84b912394p-5 / 32 / 32 / 32;
  constexpr double kC1 = 0x1.ebfce50fac4f3p-3 / 32 / 32;
  constexpr double kC2 = 0x1.62e42ff0c52d6p-1 / 32;
  const uint32_t ix = __float_as_uint(x);
  const uint32_t abstop = (ix >> 20) & 0x7FFu;
  if (abstop >= 0x42Bu) {  // |x| >= 88, inf or NaN
    if (ix == 0xFF800000u) return 0.f;
    if (abstop >= 0x7F8u) return x + x;
    if (x > 0x1.62e42ep6f) return __int_as_float(0x7F800000);
    if (x < -0x1.9fe368p6f) return 0.f;
  }
  const double xd = static_cast<double>(x);
  double kd = fma(kInvLn2N, xd, kShift);
  const uint64_t ki = static_cast<uint64_t>(__double_as_longlong(kd));
  kd = __dsub_rn(kd, kShift);
  const double r = fma(kInvLn2N, xd, -kd);
  const uint64_t t =
      __ldg(reinterpret_cast<const unsigned long long*>(kExp2Table) + ki % 32) + (ki << 47);
  const double s = __longlong_as_double(static_cast<long long>(t));
  const double z = fma(kC0, r, kC1);
  const double r2 = __dmul_rn(r, r);
  double y = fma(kC2, r, 1.0);
  y = fma(z, r2, y);
  return __double2float_rn(__dmul_rn(y, s));
}

// The best logit seen: largest value, lowest id on ties; NaN never enters.
struct Best {
  float value = 0.f;
  int32_t index = 0;
  bool valid = false;
};

// (value desc, id asc) is a total order on the numbers of a row, so `better` is
// associative and commutative: any grouping of a row (threads, warps, chunks)
// reduces to the same best.
__device__ Best better(const Best& a, const Best& b) {
  if (!a.valid) return b;
  if (!b.valid) return a;
  if (a.value > b.value) return a;
  if (b.value > a.value) return b;
  return a.index < b.index ? a : b;
}

// The candidate of logit x[i]: none when it is NaN.
__device__ Best candidate_of(float v, int32_t i) {
  Best b;
  b.value = v;
  b.index = i;
  b.valid = !isnan(v);
  return b;
}

// block_best's per-warp slots, for a block of kBlockThreads threads.
template <int kBlockThreads>
struct BestSlots {
  float value[kBlockThreads / 32];
  int32_t index[kBlockThreads / 32];
  int32_t valid[kBlockThreads / 32];
};

// The per-row kernels' shared state. Every helper below is called by all
// threads of the block together and leaves the state free for the next helper.
struct Shared {
  unsigned long long hist[kBins];  // radix histogram: count or fixed-point mass per digit
  uint64_t partial[kWarps];        // per-warp partial sums
  BestSlots<kThreads> best;
  uint32_t chunk_count[kMaxChunks];  // row_plan_kernel: candidates per chunk
  uint32_t bin;                      // select_crossing: the digit found in this pass
  uint64_t above;                    // select_crossing: measure above that digit
  int32_t found_id;                  // first_crossing_in_id_order
  int32_t found;
  int32_t first;  // row_plan_kernel: the first thread whose key crosses
};

__device__ unsigned lane_id() {
  return threadIdx.x & 31u;
}
__device__ unsigned warp_id() {
  return threadIdx.x >> 5;
}

__device__ uint64_t warp_sum(uint64_t v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

__device__ uint64_t warp_inclusive_scan(uint64_t v) {
  const unsigned lane = lane_id();
  for (int offset = 1; offset < 32; offset <<= 1) {
    const uint64_t other = __shfl_up_sync(kFullMask, v, offset);
    if (lane >= static_cast<unsigned>(offset)) v += other;
  }
  return v;
}

// The sum of `v` over a block of kBlockThreads threads, returned to every thread
// (exact: integers). `partial` holds kBlockThreads / 32 entries.
template <int kBlockThreads>
__device__ uint64_t block_sum(uint64_t v, uint64_t* partial) {
  v = warp_sum(v);
  if (lane_id() == 0) partial[warp_id()] = v;
  __syncthreads();
  uint64_t total = 0;
  for (int w = 0; w < kBlockThreads / 32; ++w) total += partial[w];
  __syncthreads();
  return total;
}

__device__ uint64_t block_sum(uint64_t v, Shared& sh) {
  return block_sum<kThreads>(v, sh.partial);
}

// The sum of `v` over the threads before this one (thread order).
__device__ uint64_t block_exclusive_sum(uint64_t v, Shared& sh) {
  const uint64_t inclusive = warp_inclusive_scan(v);
  if (lane_id() == 31) sh.partial[warp_id()] = inclusive;
  __syncthreads();
  uint64_t offset = 0;
  for (unsigned w = 0; w < warp_id(); ++w) offset += sh.partial[w];
  __syncthreads();
  return offset + inclusive - v;
}

// The best of every thread's `b` in a block of kBlockThreads threads, returned to
// every thread. Ends with a barrier, so every thread's reads before the call
// precede every write after it.
template <int kBlockThreads>
__device__ Best block_best(Best b, BestSlots<kBlockThreads>& slots) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    Best other;
    other.value = __shfl_xor_sync(kFullMask, b.value, offset);
    other.index = __shfl_xor_sync(kFullMask, b.index, offset);
    other.valid = __shfl_xor_sync(kFullMask, static_cast<int>(b.valid), offset) != 0;
    b = better(b, other);
  }
  if (lane_id() == 0) {
    slots.value[warp_id()] = b.value;
    slots.index[warp_id()] = b.index;
    slots.valid[warp_id()] = b.valid ? 1 : 0;
  }
  __syncthreads();
  Best result;
  for (int w = 0; w < kBlockThreads / 32; ++w) {
    Best other;
    other.value = slots.value[w];
    other.index = slots.index[w];
    other.valid = slots.valid[w] != 0;
    result = better(result, other);
  }
  __syncthreads();
  return result;
}

// hist[key] += value for every active lane, with one shared atomic per distinct
// key in the warp (the lanes of a key sum their values first, by halving within
// the group: Westphal's reduce_peers). All 32 lanes must call it together.
__device__ void warp_aggregated_add(unsigned long long* hist, uint32_t key, uint64_t value,
                                    bool active) {
  if (__ballot_sync(kFullMask, active) == 0) return;
  const unsigned lane = lane_id();
  const uint32_t group_key = active ? key : 0xFFFFFFFFu;  // keys are < kBins
  unsigned peers = __match_any_sync(kFullMask, group_key);
  const unsigned leader = static_cast<unsigned>(__ffs(static_cast<int>(peers)) - 1);
  unsigned rank = static_cast<unsigned>(__popc(peers & ((1u << lane) - 1u)));
  peers &= 0xFFFFFFFEu << lane;  // the peers above this lane
  uint64_t sum = active ? value : 0;
  while (__any_sync(kFullMask, peers != 0)) {
    const int next = __ffs(static_cast<int>(peers));  // 1-based; 0 when none is left
    const uint64_t other =
        __shfl_sync(kFullMask, sum, next > 0 ? next - 1 : static_cast<int>(lane));
    if (next > 0) sum += other;
    peers &= ~__ballot_sync(kFullMask, (rank & 1u) != 0);  // odd ranks have handed theirs on
    rank >>= 1;
  }
  if (active && lane == leader && sum != 0)
    atomicAdd(&hist[key], static_cast<unsigned long long>(sum));
}

// Warp 0 only: the digit (from kBins - 1 down) where `above` plus the histogram's
// cumulative first exceeds `target`; stores it in sh.bin and the measure above it
// in sh.above. REQUIRES: above <= target < above + sum(hist).
__device__ void find_crossing_bin(Shared& sh, uint64_t above, uint64_t target) {
  const unsigned lane = lane_id();
  constexpr unsigned kPerLane = kBins / 32;
  const unsigned top = kBins - 1 - kPerLane * lane;  // lane covers [top - 7, top], descending
  uint64_t local = 0;
  for (unsigned q = 0; q < kPerLane; ++q) local += sh.hist[top - q];
  const uint64_t inclusive = warp_inclusive_scan(local);
  const unsigned crossing = __ballot_sync(kFullMask, above + inclusive > target);
  if (crossing == 0) {  // unreachable under REQUIRES; keeps the result defined
    if (lane == 0) {
      sh.bin = 0;
      sh.above = above;
    }
    return;
  }
  if (lane == static_cast<unsigned>(__ffs(static_cast<int>(crossing)) - 1)) {
    uint64_t cumulative = above + inclusive - local;
    for (unsigned q = 0; q < kPerLane; ++q) {
      const uint64_t count = sh.hist[top - q];
      if (cumulative + count > target) {
        sh.bin = top - q;
        sh.above = cumulative;
        break;
      }
      cumulative += count;
    }
  }
}

// What a row's draw needs of its logits: the maximum (the argmax's logit) and the
// temperature. Every kernel after row_max_kernel rebuilds it from the argmax
// that kernel left in out_tokens[row].
struct RowScale {
  float max_logit = 0.f;
  float temperature = 0.f;
  bool drawn = false;  // temperature > 0 and the row has mass; else its token is the argmax
};

__device__ RowScale row_scale(const float* x, int32_t argmax, float temperature) {
  RowScale s;
  s.max_logit = x[argmax];
  s.temperature = temperature;
  // The argmax's logit is NaN only when every logit is (argmax 0), -inf only
  // when no logit is larger: no mass either way.
  s.drawn = temperature != 0.f && !isnan(s.max_logit) && !(isinf(s.max_logit) && s.max_logit < 0.f);
  return s;
}

// The host's weight of logit v, bit for bit: the quotient in float, then the
// host's expf; the largest is exactly 1.
__device__ float weight_of(float v, const RowScale& s) {
  float w;
  if (isnan(v)) {
    w = 0.f;
  } else if (isinf(s.max_logit)) {
    w = v == s.max_logit ? 1.f : 0.f;
  } else {
    w = host_expf((v - s.max_logit) / s.temperature);
  }
  return w >= 0.f && w <= 1.f ? w : 0.f;  // only invalid params fail the test
}

__device__ uint32_t key_of(float w) {
  return __float_as_uint(w) >> kKeyShift;
}

// How a row is drawn after its weights: by a walk in id order (no top-k or
// top-p; min-p at most), or after a top-k / top-p cut in (weight desc, id asc)
// order.
__device__ bool use_top_k(const SamplingRow& p, int32_t vocab) {
  return p.top_k > 0 && p.top_k < vocab;
}
__device__ bool use_top_p(const SamplingRow& p, int32_t vocab) {
  return !use_top_k(p, vocab) && p.top_p > 0.f && p.top_p < 1.f;
}
__device__ bool is_cut(const SamplingRow& p, int32_t vocab) {
  return use_top_k(p, vocab) || use_top_p(p, vocab);
}

// A token's mass: its weight in fixed point, round(w * 2^mass_shift); the masses
// of a row sum below 2^62. Monotone in w.
struct Mass {
  double scale;
  __device__ uint64_t operator()(float w) const {
    return __double2ull_rn(static_cast<double>(w) * scale);
  }
};

// Lists the selections below run over: n entries, each an id and its weight, in
// ascending id order.
//   StoredRow: a whole row's weights in memory.
//   RecomputedRow: a whole row, each weight recomputed from its logit.
//   CandidateList: compacted (weight bits, id) pairs.
//   StoredChunk: ids [begin, begin + n) of a stored row whose ids below
//                `deferred` are not stored yet and are recomputed.
struct StoredRow {
  const float* weight;
  int32_t n;
  __device__ float weight_at(int32_t j) const { return weight[j]; }
  __device__ int32_t id_at(int32_t j) const { return j; }
};

struct RecomputedRow {
  const float* x;
  RowScale scale;
  int32_t n;
  __device__ float weight_at(int32_t j) const { return weight_of(x[j], scale); }
  __device__ int32_t id_at(int32_t j) const { return j; }
};

struct CandidateList {
  const uint32_t* bits;
  const int32_t* ids;
  int32_t n;
  __device__ float weight_at(int32_t j) const { return __uint_as_float(bits[j]); }
  __device__ int32_t id_at(int32_t j) const { return ids[j]; }
};

struct StoredChunk {
  const float* weight;  // the row's weights, indexed by id
  const float* x;       // the row's logits
  RowScale scale;
  int32_t begin;
  int32_t n;
  int32_t deferred;
  __device__ float weight_at(int32_t j) const {
    const int32_t id = begin + j;
    return id < deferred ? weight_of(x[id], scale) : weight[id];
  }
  __device__ int32_t id_at(int32_t j) const { return begin + j; }
};

struct Selection {
  uint32_t bits = 0;   // the weight's float bits
  uint64_t above = 0;  // the measure of the set's elements strictly above it
};

// The weight v where the set's cumulative measure, taken in descending weight
// order, crosses `target`: F(w > v) <= target < F(w >= v), F(.) summing
// measure(w) over the list's entries (id i, weight w) with in_set(i, w). Weights
// are >= 0, so their float bits order like the values; four radix passes of 8
// bits fix v digit by digit. REQUIRES: target < F(the whole list).
template <typename List, typename InSet, typename Measure>
__device__ Selection select_crossing(const List& list, InSet in_set, Measure measure,
                                     uint64_t target, Shared& sh) {
  uint32_t prefix = 0;
  uint32_t prefix_mask = 0;
  uint64_t above = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = static_cast<int>(threadIdx.x); b < kBins; b += kThreads) sh.hist[b] = 0;
    __syncthreads();
    for (int32_t base = 0; base < list.n; base += kThreads) {
      const int32_t j = base + static_cast<int32_t>(threadIdx.x);
      uint32_t key = 0;
      uint64_t value = 0;
      if (j < list.n) {
        const float w = list.weight_at(j);
        const uint32_t bits = __float_as_uint(w);
        if ((bits & prefix_mask) == prefix && in_set(list.id_at(j), w)) {
          key = (bits >> shift) & 0xFFu;
          value = measure(w);
        }
      }
      warp_aggregated_add(sh.hist, key, value, value != 0);
    }
    __syncthreads();
    if (warp_id() == 0) find_crossing_bin(sh, above, target);
    __syncthreads();
    prefix |= sh.bin << shift;
    prefix_mask |= 0xFFu << shift;
    above = sh.above;
    // sh.bin and sh.above are next written after the next pass's first barrier.
  }
  Selection s;
  s.bits = prefix;
  s.above = above;
  return s;
}

// The id of the first entry j (in list order) where the sum of measure(id, w)
// over the entries up to j exceeds `target`, in *id; false when the whole list's
// sum does not. Each thread sums a contiguous run of entries; a block scan places
// the runs; the one run that holds the crossing is walked by its thread.
template <typename List, typename Measure>
__device__ bool first_crossing_in_id_order(const List& list, Measure measure, uint64_t target,
                                           Shared& sh, int32_t* id) {
  const int32_t run = (list.n + kThreads - 1) / kThreads;
  const int32_t begin = min(static_cast<int32_t>(threadIdx.x) * run, list.n);
  const int32_t end = min(begin + run, list.n);
  uint64_t sum = 0;
  for (int32_t j = begin; j < end; ++j) sum += measure(list.id_at(j), list.weight_at(j));
  const uint64_t before = block_exclusive_sum(sum, sh);
  if (threadIdx.x == 0) sh.found = 0;
  __syncthreads();
  if (before <= target && target - before < sum) {  // exactly one thread when it exists
    uint64_t cumulative = before;
    for (int32_t j = begin; j < end; ++j) {
      const int32_t i = list.id_at(j);
      cumulative += measure(i, list.weight_at(j));
      if (cumulative > target) {
        sh.found_id = i;
        sh.found = 1;
        break;
      }
    }
  }
  __syncthreads();
  const bool found = sh.found != 0;
  *id = sh.found_id;
  __syncthreads();
  return found;
}

// The id of the rank-th (1-based) lowest id whose weight has float bits `bits`.
template <typename List>
__device__ bool nth_id_with_weight(const List& list, uint32_t bits, uint64_t rank, Shared& sh,
                                   int32_t* id) {
  auto is_tie = [bits](int32_t, float w) -> uint64_t {
    return __float_as_uint(w) == bits ? 1u : 0u;
  };
  return first_crossing_in_id_order(list, is_tie, rank - 1, sh, id);
}

// The draw of a row with top-k or top-p on (is_cut), over a list that holds every
// entry of the row at or above the cut's weight (so every entry the walk can
// meet, and all entries tied at the cut): the cut, then min-p, then the walk in
// (weight desc, id asc) order. `total` is the whole row's mass. Returns the
// token, or `fallback` where the walk finds none (only invalid params).
// Zero weights carry no mass and no rank: with fewer than k positive weights,
// top-k keeps them all, as the host's does (its zeros weigh nothing in the walk).
template <typename List>
__device__ int32_t draw_after_cut(const List& list, const SamplingRow& p, int32_t vocab,
                                  uint64_t total, Mass mass, int32_t fallback, Shared& sh) {
  auto everything = [](int32_t, float) { return true; };
  // The kept set before min-p: {w > threshold} and, at the threshold, the ids up
  // to and including `cutoff` (the host's stable order keeps the lowest ids).
  uint32_t threshold_bits = 0;
  int32_t cutoff = INT32_MAX;
  if (use_top_k(p, vocab)) {
    auto positive = [](float w) -> uint64_t { return w > 0.f ? 1u : 0u; };
    uint64_t local = 0;
    for (int32_t j = static_cast<int32_t>(threadIdx.x); j < list.n; j += kThreads) {
      local += positive(list.weight_at(j));
    }
    const uint64_t n_positive = block_sum(local, sh);
    const uint64_t k = static_cast<uint64_t>(p.top_k);
    if (k <= n_positive) {
      const Selection s = select_crossing(list, everything, positive, k - 1, sh);
      threshold_bits = s.bits;
      if (!nth_id_with_weight(list, s.bits, k - s.above, sh, &cutoff)) cutoff = INT32_MAX;
    }
  } else {
    // The host keeps tokens until the cumulative exceeds p * total; for an
    // integer cumulative that is exceeding floor(p * total).
    const uint64_t target =
        __double2ull_rd(static_cast<double>(p.top_p) * static_cast<double>(total));
    if (target < total) {
      const Selection s = select_crossing(list, everything, mass, target, sh);
      const uint64_t tie_mass = mass(__uint_as_float(s.bits));
      const uint64_t rank = tie_mass > 0 ? (target - s.above) / tie_mass + 1 : 1;
      threshold_bits = s.bits;
      if (!nth_id_with_weight(list, s.bits, rank, sh, &cutoff)) cutoff = INT32_MAX;
    }
  }

  // Min-p, the kept mass and the draw r = u * kept (exact: 24-bit u times a
  // mass below 2^62, shifted back).
  const float min_p = p.min_p;
  auto kept = [threshold_bits, cutoff, min_p](int32_t i, float w) {
    const uint32_t bits = __float_as_uint(w);
    return (bits > threshold_bits || (bits == threshold_bits && i <= cutoff)) && w >= min_p;
  };
  uint64_t local = 0;
  for (int32_t j = static_cast<int32_t>(threadIdx.x); j < list.n; j += kThreads) {
    const float w = list.weight_at(j);
    if (kept(list.id_at(j), w)) local += mass(w);
  }
  const uint64_t kept_mass = block_sum(local, sh);
  if (kept_mass == 0) return fallback;  // only invalid params get here
  const uint64_t u = uniform_bits24(p.seed, p.position);
  const uint64_t r = (__umul64hi(u, kept_mass) << 40) | ((u * kept_mass) >> 24);

  // The walk in (weight desc, id asc) order; the kept ids at any weight are the
  // lowest ids with that weight.
  const Selection s = select_crossing(list, kept, mass, r, sh);
  const uint64_t tie_mass = mass(__uint_as_float(s.bits));
  const uint64_t rank = tie_mass > 0 ? (r - s.above) / tie_mass + 1 : 1;
  int32_t token = fallback;
  if (!nth_id_with_weight(list, s.bits, rank, sh, &token)) token = fallback;
  return token;
}

}  // namespace
}  // namespace cellm::cuda
