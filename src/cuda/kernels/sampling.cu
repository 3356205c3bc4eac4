// Device sampling. See sampling.h for the contract and the launch sequence; the
// steps below mirror src/core/sampler.cpp one for one.
#include "cuda/kernels/sampling.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace cellm::cuda {
namespace {

constexpr int kThreads = 1024;  // the per-row kernels' blocks
constexpr int kWarps = kThreads / 32;
// The split (sample_split): blocks of kChunkThreads, each on a chunk of at least
// kMinChunkLogits logits (a block streams it at full speed), about
// kTargetChunkBlocks blocks in all (4 per SM on a 132-SM H100/H200).
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
__constant__ uint64_t kExp2Table[32] = {
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
  const uint64_t t = kExp2Table[ki % 32] + (ki << 47);
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

// ---- The one-kernel path, for rows of fewer than kMinChunkedVocab logits.

// One block per row: the argmax, the weights (stored in the row's workspace), the
// draw. weights: [n_rows, vocab] f32.
__global__ void __launch_bounds__(kThreads)
    sample_rows_kernel(const float* __restrict__ logits, int32_t vocab,
                       const SamplingRow* __restrict__ params, int32_t* __restrict__ out_tokens,
                       float* __restrict__ weights, int mass_shift) {
  __shared__ Shared sh;
  const int64_t row = blockIdx.x;
  const float* x = logits + row * vocab;
  float* weight = weights + row * vocab;
  const SamplingRow p = params[row];
  const int32_t tid = static_cast<int32_t>(threadIdx.x);

  // Argmax: the answer at temperature 0, and the fallback without mass.
  Best best;
  for (int32_t i = tid; i < vocab; i += kThreads) best = better(best, candidate_of(x[i], i));
  best = block_best(best, sh.best);
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
  const int64_t row = blockIdx.x;
  const float* partials = workspace + row * vocab;
  Best best;
  for (int32_t c = static_cast<int32_t>(threadIdx.x); c < n_chunks; c += kChunkThreads) {
    const int32_t index = __float_as_int(partials[n_chunks + c]);
    if (index >= 0) best = better(best, candidate_of(partials[c], index));
  }
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
  for (int32_t base = begin; base < end; base += kChunkThreads) {
    const int32_t i = base + static_cast<int32_t>(threadIdx.x);
    const float w = i < end ? weight_of(x[i], scale) : 0.f;
    const bool take = w > 0.f && key_of(w) >= min_key;
    const unsigned ballot = __ballot_sync(kFullMask, take);
    if (lane == 0) warp_count[warp] = static_cast<uint32_t>(__popc(static_cast<int>(ballot)));
    __syncthreads();
    uint32_t before = 0;
    uint32_t tile = 0;
    for (unsigned q = 0; q < kChunkThreads / 32; ++q) {
      before += q < warp ? warp_count[q] : 0u;
      tile += warp_count[q];
    }
    if (take) {
      const uint32_t at =
          offset + before +
          static_cast<uint32_t>(__popc(static_cast<int>(ballot & ((1u << lane) - 1u))));
      bits[at] = __float_as_uint(w);
      ids[at] = static_cast<uint32_t>(i);
    }
    offset += tile;
    __syncthreads();
  }
}

// Launch 6: one block per cut row draws its token over the candidate list, or
// over the whole row (weights recomputed) when the candidates did not fit.
__global__ void __launch_bounds__(kThreads)
    row_draw_kernel(const float* __restrict__ logits, int32_t vocab, int32_t n_chunks,
                    const SamplingRow* __restrict__ params, int32_t* __restrict__ out_tokens,
                    const uint32_t* __restrict__ workspace, int mass_shift) {
  __shared__ Shared sh;
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
  if (threadIdx.x == 0) out_tokens[row] = token;
}

__global__ void sampling_uniform_kernel(const uint64_t* __restrict__ seeds,
                                        const int32_t* __restrict__ positions, int64_t n,
                                        float* __restrict__ out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = static_cast<float>(uniform_bits24(seeds[i], positions[i])) * 0x1.0p-24f;
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
    sample_rows_kernel<<<rows, kThreads, 0, stream>>>(logits, v, params, out_tokens,
                                                      static_cast<float*>(workspace), mass_shift);
    return cudaGetLastError();
  }
  // The six launches of the chunked path (the file comment of sampling.h). The
  // same sequence for every (n_rows, vocab), whatever the policies, so a graph
  // captured once stays valid; each kernel skips the rows it has nothing to do for.
  const SampleSplit split = sample_split(n_rows, vocab);
  const int32_t c = split.n_chunks;
  const int32_t chunk = split.chunk_logits;
  const dim3 grid(rows, static_cast<unsigned>(c));  // c <= kMaxChunks, inside gridDim.y
  float* ws_f32 = static_cast<float*>(workspace);
  uint32_t* ws_u32 = static_cast<uint32_t*>(workspace);
  chunk_best_kernel<<<grid, kChunkThreads, 0, stream>>>(logits, v, chunk, c, ws_f32);
  row_max_kernel<<<rows, kChunkThreads, 0, stream>>>(v, c, ws_f32, out_tokens);
  chunk_weights_kernel<<<grid, kChunkThreads, 0, stream>>>(logits, v, chunk, c, params, out_tokens,
                                                           ws_u32, mass_shift);
  row_plan_kernel<<<rows, kThreads, 0, stream>>>(logits, v, chunk, c, params, out_tokens, ws_u32,
                                                 mass_shift);
  chunk_compact_kernel<<<grid, kChunkThreads, 0, stream>>>(logits, v, chunk, c, params, out_tokens,
                                                           ws_u32);
  row_draw_kernel<<<rows, kThreads, 0, stream>>>(logits, v, c, params, out_tokens, ws_u32,
                                                 mass_shift);
  return cudaGetLastError();
}

cudaError_t launch_sampling_uniform(const uint64_t* seeds, const int32_t* positions, int64_t n,
                                    float* out, cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (seeds == nullptr || positions == nullptr || out == nullptr) return cudaErrorInvalidValue;
  constexpr int kBlock = 256;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  if (blocks > 0x7FFFFFFF) return cudaErrorInvalidValue;
  sampling_uniform_kernel<<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(seeds, positions, n,
                                                                                out);
  return cudaGetLastError();
}

}  // namespace cellm::cuda
