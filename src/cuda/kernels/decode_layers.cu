#include "cuda/kernels/decode_layers.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/mbarrier.cuh"

namespace cellm::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kWarps = 15;               // consumer warps (+ the producer: 16, 128 registers each)
constexpr int kConsumers = kWarps * 32;  // their threads
constexpr int kThreads = kConsumers + 32;  // and the producer warp
constexpr int kStageBytes = 16384;         // one ring stage
#ifndef CELLM_DL_STAGES
#define CELLM_DL_STAGES 12
#endif
constexpr int kMaxStages = CELLM_DL_STAGES;  // 192 KB of weights in flight per SM
constexpr int kVec = 8;                      // bf16 per 16-byte access
// A norm's packs per thread: d <= 2 x 3,840 = 7,680. The norm's row is held in registers
// (kVec floats a pack) across its block reduction; more packs spilled registers in every
// stage (session 25: 4 packs cost the 1B's step 5%).
constexpr int kMaxHeldPacks = 2;

// The products of a layer, in the order each block streams its share of them.
enum Product : int { kQkv = 0, kO = 1, kGateUp = 2, kDown = 3, kProducts = 4 };

// How a product's rows are cut into ring stages (the same for every block and layer).
// A stage holds `rpc` whole rows (`parts` == 1), or one of a row's `parts` column ranges
// of `kc` columns (`rpc` == 1); for gate_up it holds the gate rows and the matching up
// rows, so one warp computes both products of a pair.
struct ProductShape {
  int32_t n;      // output rows (gate_up: pairs)
  int32_t k;      // input width
  int32_t mats;   // 2 for gate_up, else 1
  int32_t rpc;    // rows per stage
  int32_t parts;  // stages per row
  int32_t kc;     // columns per stage
};

struct KernelArgs {
  DecodeLayersParams<bf16> p;
  ProductShape shapes[kProducts];
  int32_t stages;     // ring stages
  int32_t act_elems;  // activation staging, elements
};

// One block's share of a product: output rows [row0, row0 + rows).
struct Share {
  int64_t row0;
  int32_t rows;
  int32_t chunks;
};

__device__ __forceinline__ Share share_of(const ProductShape& s) {
  const int64_t g = gridDim.x;
  const int64_t b = blockIdx.x;
  Share sh;
  sh.row0 = s.n * b / g;
  sh.rows = static_cast<int32_t>(s.n * (b + 1) / g - sh.row0);
  sh.chunks = s.parts == 1 ? (sh.rows + s.rpc - 1) / s.rpc : sh.rows * s.parts;
  return sh;
}

// A chunk: its first unit (row or pair, within the share), unit count and column range.
// Producer and consumers walk a share's chunks in order, stepping with next_chunk (no
// division on the stream's path).
struct Chunk {
  int32_t u0 = 0;
  int32_t nrows = 0;
  int32_t part = 0;
};

__device__ __forceinline__ Chunk first_chunk(const ProductShape& s, const Share& sh) {
  Chunk ch;
  ch.nrows = s.parts == 1 ? min(s.rpc, sh.rows) : 1;
  return ch;
}

__device__ __forceinline__ void next_chunk(const ProductShape& s, const Share& sh, Chunk& ch) {
  if (s.parts == 1) {
    ch.u0 += s.rpc;
    ch.nrows = min(s.rpc, sh.rows - ch.u0);
  } else if (++ch.part == s.parts) {
    ch.part = 0;
    ++ch.u0;
  }
}

// A position in the ring: the stage, and how many times the ring has wrapped before it
// (the parity of the stage's barrier phases).
struct RingPos {
  uint32_t st = 0;
  uint32_t lap = 0;
  __device__ __forceinline__ void advance(uint32_t stages) {
    if (++st == stages) {
      st = 0;
      ++lap;
    }
  }
};

__device__ __forceinline__ const bf16* weights_of(const DecodeLayer<bf16>& layer, int product,
                                                  int32_t mat, int64_t ff, int64_t d) {
  switch (product) {
    case kQkv:
      return layer.qkv;
    case kO:
      return layer.o_proj;
    case kGateUp:
      return layer.gate_up + (mat == 0 ? 0 : ff * d);
    default:
      return layer.down;
  }
}

// The dynamic shared memory: the ring, the activation row, the attention's scratch, the
// block reduction's partials, then the ring's barriers.
struct Smem {
  bf16* ring;
  bf16* act;
  float* q;          // [head_dim] the rotated query head
  float* k;          // [head_dim] the row's rotated key
  float* v;          // [head_dim] the row's value
  float* merge_m;    // [kWarps]
  float* merge_l;    // [kWarps]
  float* merge_acc;  // [kWarps][head_dim]
  float* red;        // [kWarps]
  uint64_t* full;
  uint64_t* empty;
};

__host__ __device__ inline size_t align16(size_t n) {
  return (n + 15) / 16 * 16;
}

// Byte offsets of Smem's regions, and the whole size: one layout for the kernel (carve)
// and the launcher.
struct SmemLayout {
  size_t act, attn, red, barriers, bytes;
};

__host__ __device__ inline SmemLayout smem_layout(int32_t stages, int32_t act_elems,
                                                  int32_t head_dim) {
  const auto hd = static_cast<size_t>(head_dim);
  SmemLayout l{};
  l.act = static_cast<size_t>(stages) * kStageBytes;
  l.attn = l.act + align16(static_cast<size_t>(act_elems) * sizeof(bf16));
  l.red = l.attn + align16((3 * hd + 2 * kWarps + kWarps * hd) * sizeof(float));
  l.barriers = l.red + align16(kWarps * sizeof(float));
  l.bytes = l.barriers + 2 * static_cast<size_t>(stages) * sizeof(uint64_t);
  return l;
}

__device__ Smem carve(unsigned char* base, const KernelArgs& a) {
  const SmemLayout l = smem_layout(a.stages, a.act_elems, a.p.head_dim);
  const int32_t hd = a.p.head_dim;
  Smem m;
  m.ring = reinterpret_cast<bf16*>(base);
  m.act = reinterpret_cast<bf16*>(base + l.act);
  float* f = reinterpret_cast<float*>(base + l.attn);
  m.q = f;
  m.k = f + hd;
  m.v = f + 2 * hd;
  m.merge_m = f + 3 * hd;
  m.merge_l = m.merge_m + kWarps;
  m.merge_acc = m.merge_l + kWarps;
  m.red = reinterpret_cast<float*>(base + l.red);
  m.full = reinterpret_cast<uint64_t*>(base + l.barriers);
  m.empty = m.full + a.stages;
  return m;
}

// The consumer warps' barrier (the producer warp never joins it).
__device__ __forceinline__ void consumer_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kConsumers) : "memory");
}

// Grid-wide stage counts: a block counts itself in on sync[0] when it has finished a
// stage; stage s may start once the count reaches s * gridDim.x.
__device__ __forceinline__ void stage_done(uint32_t* count) {
  consumer_sync();
  if (threadIdx.x == 0) {
    // A release add: the block's writes (ordered before it by the barrier above) are
    // visible to whoever acquires the count (5% faster than a fence and an atomic).
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count) : "memory");
  }
}

__device__ __forceinline__ void stage_wait(const uint32_t* count, uint32_t target) {
  if (threadIdx.x == 0) {
    uint32_t seen = 0;
    for (uint32_t tries = 0;; ++tries) {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(count) : "memory");
      if (seen >= target) break;
      if (tries == (1u << 25)) __trap();  // a lost block: a launch error, not a hang
    }
  }
  consumer_sync();
}

__device__ __forceinline__ float bf(bf16 x) {
  return __bfloat162float(x);
}
__device__ __forceinline__ float round_bf(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}
// A bf16 another block wrote in this launch, from the L2.
__device__ __forceinline__ float load_l2(const bf16* p) {
  return __bfloat162float(__ushort_as_bfloat16(__ldcg(reinterpret_cast<const unsigned short*>(p))));
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// The sum of v over the consumer threads, in every one of them (fixed order).
__device__ __forceinline__ float consumer_sum(float v, float* red) {
  const int warp = static_cast<int>(threadIdx.x >> 5);
  v = detail::warp_sum(v);
  if ((threadIdx.x & 31u) == 0) red[warp] = v;
  consumer_sync();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += red[w];
  consumer_sync();  // red may be written again
  return total;
}

// act = rmsnorm(x) * weight with x = residual (+ delta), launch_add_rmsnorm's arithmetic;
// `out` (block 0's) receives x when delta is added. kPacks: a thread's packs of the row
// (d <= kPacks x kConsumers x kVec), held in registers.
template <int kPacks>
__device__ void norm_into_act(const float* residual, const bf16* delta, const bf16* weight,
                              float* out, int32_t d, float eps, bf16* act, float* red) {
  const int tid = static_cast<int>(threadIdx.x);
  float x[kPacks][kVec];
  uint4 held[kPacks];  // the weight's packs, loaded beside the row's
  float sum_sq = 0.0f;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int32_t c = (tid + k * kConsumers) * kVec;
    if (c >= d) continue;
    held[k] = __ldg(reinterpret_cast<const uint4*>(weight + c));
    const float4 r0 = __ldcg(reinterpret_cast<const float4*>(residual + c));
    const float4 r1 = __ldcg(reinterpret_cast<const float4*>(residual + c + 4));
    x[k][0] = r0.x, x[k][1] = r0.y, x[k][2] = r0.z, x[k][3] = r0.w;
    x[k][4] = r1.x, x[k][5] = r1.y, x[k][6] = r1.z, x[k][7] = r1.w;
    if (delta != nullptr) {
      const uint4 dv = __ldcg(reinterpret_cast<const uint4*>(delta + c));
      const bf16* dl = reinterpret_cast<const bf16*>(&dv);
#pragma unroll
      for (int j = 0; j < kVec; ++j) x[k][j] += bf(dl[j]);
      if (out != nullptr) {
        *reinterpret_cast<float4*>(out + c) = make_float4(x[k][0], x[k][1], x[k][2], x[k][3]);
        *reinterpret_cast<float4*>(out + c + 4) = make_float4(x[k][4], x[k][5], x[k][6], x[k][7]);
      }
    }
#pragma unroll
    for (int j = 0; j < kVec; ++j) sum_sq += x[k][j] * x[k][j];
  }
  const float total = consumer_sum(sum_sq, red);
  const float inv_rms = 1.0f / sqrtf(total / static_cast<float>(d) + eps);
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int32_t c = (tid + k * kConsumers) * kVec;
    if (c >= d) continue;
    const bf16* w = reinterpret_cast<const bf16*>(&held[k]);
    uint4 hv;
    bf16* h = reinterpret_cast<bf16*>(&hv);
#pragma unroll
    for (int j = 0; j < kVec; ++j) h[j] = __float2bfloat16_rn(x[k][j] * inv_rms * bf(w[j]));
    *reinterpret_cast<uint4*>(act + c) = hv;
  }
  consumer_sync();
}

// act[0, n) = src[0, n), a row another block wrote (from the L2).
__device__ void stage_row(const bf16* src, int32_t n, bf16* act) {
  constexpr int kAtOnce = 4;  // loads issued together
  for (int32_t c0 = static_cast<int32_t>(threadIdx.x) * kVec; c0 < n;
       c0 += kAtOnce * kConsumers * kVec) {
    uint4 v[kAtOnce];
#pragma unroll
    for (int t = 0; t < kAtOnce; ++t) {
      const int32_t c = c0 + t * kConsumers * kVec;
      if (c < n) v[t] = __ldcg(reinterpret_cast<const uint4*>(src + c));
    }
#pragma unroll
    for (int t = 0; t < kAtOnce; ++t) {
      const int32_t c = c0 + t * kConsumers * kVec;
      if (c < n) *reinterpret_cast<uint4*>(act + c) = v[t];
    }
  }
  consumer_sync();
}

// A lane's share of w[0, kc) · x[0, kc) (both in shared memory).
__device__ __forceinline__ float dot_lane(const bf16* w, const bf16* x, int32_t kc, int lane) {
  float acc = 0.0f;
  for (int32_t e = lane * kVec; e < kc; e += 32 * kVec) {
    const uint4 wv = *reinterpret_cast<const uint4*>(w + e);
    const uint4 xv = *reinterpret_cast<const uint4*>(x + e);
    const __nv_bfloat162* w2 = reinterpret_cast<const __nv_bfloat162*>(&wv);
    const __nv_bfloat162* x2 = reinterpret_cast<const __nv_bfloat162*>(&xv);
#pragma unroll
    for (int j = 0; j < kVec / 2; ++j) {
      const float2 a = __bfloat1622float2(w2[j]);
      const float2 b = __bfloat1622float2(x2[j]);
      acc = fmaf(a.x, b.x, acc);
      acc = fmaf(a.y, b.y, acc);
    }
  }
  return acc;
}

// The block's rows of one product of `layer`, input in act, from the ring (position
// `at`, the same in every consumer warp); each row's sums go to the product's epilogue.
template <int kProduct>
__device__ void run_product(const KernelArgs& a, const DecodeLayer<bf16>& layer, const Smem& m,
                            RingPos& at) {
  const ProductShape& s = a.shapes[kProduct];
  const Share sh = share_of(s);
  const int warp = static_cast<int>(threadIdx.x >> 5);
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const auto stages = static_cast<uint32_t>(a.stages);
  float acc0 = 0.0f;
  float acc1 = 0.0f;
  Chunk ch = first_chunk(s, sh);
  for (int32_t c = 0; c < sh.chunks; ++c, next_chunk(s, sh, ch), at.advance(stages)) {
    const uint32_t st = at.st;
    detail::barrier_wait(&m.full[st], at.lap & 1u);
    // This warp's unit of the chunk, if it has one: unit u belongs to warp u % kWarps.
    const int32_t first = ch.u0 + ((warp - ch.u0 % kWarps) + kWarps) % kWarps;
    if (first < ch.u0 + ch.nrows) {
      const bf16* stage = m.ring + static_cast<size_t>(st) * (kStageBytes / sizeof(bf16));
      const bf16* x = m.act + static_cast<size_t>(ch.part) * s.kc;
      const size_t row_at = static_cast<size_t>(first - ch.u0) * s.kc;
      acc0 += dot_lane(stage + row_at, x, s.kc, lane);
      if constexpr (kProduct == kGateUp) {
        acc1 += dot_lane(stage + static_cast<size_t>(ch.nrows) * s.kc + row_at, x, s.kc, lane);
      }
      if (ch.part == s.parts - 1) {
        const float sum0 = detail::warp_sum(acc0);
        const float sum1 = kProduct == kGateUp ? detail::warp_sum(acc1) : 0.0f;
        acc0 = acc1 = 0.0f;
        const int64_t row = sh.row0 + first;
        if (lane == 0) {
          const DecodeLayersParams<bf16>& p = a.p;
          if constexpr (kProduct == kQkv) {
            const float bias = layer.qkv_bias != nullptr ? bf(layer.qkv_bias[row]) : 0.0f;
            p.qkv[row] = __float2bfloat16_rn(sum0 + bias);
          } else if constexpr (kProduct == kO) {
            const float bias = layer.o_bias != nullptr ? bf(layer.o_bias[row]) : 0.0f;
            p.delta[row] = __float2bfloat16_rn(sum0 + bias);
          } else if constexpr (kProduct == kGateUp) {
            p.act[row] = __float2bfloat16_rn(detail::silu_mul(round_bf(sum0), round_bf(sum1)));
          } else {
            p.delta[row] = __float2bfloat16_rn(sum0);
          }
        }
      }
    }
    __syncwarp();
    if (lane == 0) detail::barrier_arrive(&m.empty[st]);
  }
}

// The producer warp's lane 0: every chunk of every product of every layer, in the order
// the consumers take them, as fast as the ring frees stages. Its work per stage is on the
// stream's path (the 8B's products take a stage per row or half row), so everything but
// the chunk's offset is settled per product, in registers.
__device__ void produce(const KernelArgs& a, const Smem& m) {
  const DecodeLayersParams<bf16>& p = a.p;
  const auto stages = static_cast<uint32_t>(a.stages);
  RingPos at;
  for (int32_t l = 0; l < p.n_layers; ++l) {
    const DecodeLayer<bf16>& layer = p.layers[l];
    for (int product = 0; product < kProducts; ++product) {
      const ProductShape& s = a.shapes[product];
      const Share sh = share_of(s);
      const bf16* w0 = weights_of(layer, product, 0, p.ff, p.d) + sh.row0 * s.k;
      const bf16* w1 = weights_of(layer, product, 1, p.ff, p.d) + sh.row0 * s.k;
      Chunk ch = first_chunk(s, sh);
      for (int32_t c = 0; c < sh.chunks; ++c, next_chunk(s, sh, ch), at.advance(stages)) {
        const uint32_t st = at.st;
        if (at.lap > 0) detail::barrier_wait(&m.empty[st], (at.lap - 1) & 1u);
        const auto bytes = static_cast<uint32_t>(ch.nrows * s.kc * sizeof(bf16));
        detail::barrier_arrive_expect(&m.full[st], bytes * static_cast<uint32_t>(s.mats));
        unsigned char* stage =
            reinterpret_cast<unsigned char*>(m.ring) + static_cast<size_t>(st) * kStageBytes;
        const int64_t off = int64_t{ch.u0} * s.k + int64_t{ch.part} * s.kc;
        detail::bulk_copy(stage, w0 + off, bytes, &m.full[st]);
        if (s.mats == 2) detail::bulk_copy(stage + bytes, w1 + off, bytes, &m.full[st]);
      }
    }
  }
}

// The attention's keys. Warp w of a head's block takes the contiguous run [kb, ke) of the
// positions [lo, pos]; a key's K (or V) row of the kv head is P = head_dim / 8 packs of 16
// bytes, held by a segment of `seg` lanes (the power of two >= P), so a warp covers
// 32 / seg keys a round: in round r lane l holds pack l % seg of key
// kb + r * (32 / seg) + l / seg. The older keys' K/V do not depend on the layer's q/k/v:
// a lane loads its first kPreRounds rounds into registers before the stage's wait (and
// asks the L2 for the rest), so after it the attention needs the L2 mostly for the row's
// own q/k/v. 4 rounds spilled registers in every stage (session 25, with 2: 1b 0.975 -> 0.936
// ms a step, 8b 4.52 -> 4.43; 1 round no better).
constexpr int kPreRounds = 2;  // rounds held in registers (8 registers each)

struct KeyRun {
  int32_t packs, seg, per_round;  // P, the segment, keys a round
  int32_t pack, slot;             // this lane's pack and key within a round
  int32_t kb, ke, pos, rounds;    // the warp's keys, the row's own position, rounds
  const int32_t* cells_of;        // the row's cell table
  const bf16* k_pool;             // the kv head's K (V) row of cell c: + c * kv_dim
  const bf16* v_pool;
  int64_t kv_dim;
};

__device__ __forceinline__ KeyRun key_run(const DecodeLayersParams<bf16>& p,
                                          const DecodeLayer<bf16>& layer, int32_t h) {
  const int warp = static_cast<int>(threadIdx.x >> 5);
  const int lane = static_cast<int>(threadIdx.x & 31u);
  KeyRun r;
  r.packs = p.head_dim / kVec;
  r.seg = 1;
  while (r.seg < r.packs) r.seg *= 2;
  r.per_round = 32 / r.seg;
  r.pack = lane % r.seg;
  r.slot = lane / r.seg;
  r.pos = p.positions[0];
  const int32_t lo = layer.window > 0 ? max(0, r.pos - layer.window + 1) : 0;
  const int32_t per_warp = (r.pos - lo + 1 + kWarps - 1) / kWarps;
  r.kb = lo + warp * per_warp;
  r.ke = min(r.kb + per_warp, r.pos + 1);
  r.rounds = r.ke > r.kb ? (r.ke - r.kb + r.per_round - 1) / r.per_round : 0;
  r.cells_of = p.table + int64_t{p.row_seq[0]} * p.table_stride;
  r.kv_dim = int64_t{p.n_kv_heads} * p.head_dim;
  const int64_t g = h / (p.n_heads / p.n_kv_heads);
  r.k_pool = layer.k_pool + g * p.head_dim + r.pack * kVec;
  r.v_pool = layer.v_pool + g * p.head_dim + r.pack * kVec;
  return r;
}

// Key j of round `round` for this lane, and its cell (-1: the row's own key, or none).
__device__ __forceinline__ int32_t key_of(const KeyRun& r, int32_t round) {
  return r.kb + round * r.per_round + r.slot;
}
__device__ __forceinline__ int32_t cell_of(const KeyRun& r, int32_t j) {
  return r.pack < r.packs && j < r.ke && j < r.pos ? r.cells_of[j] : -1;
}

// The older keys' packs of rounds [r0, r0 + kPreRounds), issued together.
struct KeyPacks {
  uint4 k[kPreRounds];
  uint4 v[kPreRounds];
};

__device__ __forceinline__ void load_keys(const KeyRun& r, int32_t r0, KeyPacks& kp) {
  int32_t cell[kPreRounds];
#pragma unroll
  for (int t = 0; t < kPreRounds; ++t) cell[t] = cell_of(r, key_of(r, r0 + t));
#pragma unroll
  for (int t = 0; t < kPreRounds; ++t) {
    if (cell[t] >= 0) {
      kp.k[t] = *reinterpret_cast<const uint4*>(r.k_pool + int64_t{cell[t]} * r.kv_dim);
      kp.v[t] = *reinterpret_cast<const uint4*>(r.v_pool + int64_t{cell[t]} * r.kv_dim);
    }
  }
}

// Before the stage's wait: the first rounds into registers, the L2 asked for the rest.
__device__ void preload_keys(const KeyRun& r, KeyPacks& kp) {
  load_keys(r, 0, kp);
  for (int32_t round = kPreRounds; round < r.rounds; ++round) {
    const int32_t cell = r.pack == 0 ? cell_of(r, key_of(r, round)) : -1;
    if (cell < 0) continue;
    const auto bytes = static_cast<uint32_t>(r.packs * kVec * sizeof(bf16));
    const int64_t at = int64_t{cell} * r.kv_dim;
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(r.k_pool + at), "r"(bytes)
                 : "memory");
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(r.v_pool + at), "r"(bytes)
                 : "memory");
  }
}

// A warp's running softmax over its keys: the largest score so far, this lane's share of
// the sum of weights (its segment's first lane counts each key) and of the weighted
// values (its pack's dims, for its keys).
struct Fold {
  float max = -INFINITY;
  float sum = 0.0f;
  float acc[kVec] = {};
};

__device__ __forceinline__ void unpack(const uint4& v, float (&out)[kVec]) {
  const bf16* b = reinterpret_cast<const bf16*>(&v);
#pragma unroll
  for (int x = 0; x < kVec; ++x) out[x] = bf(b[x]);
}

// Folds rounds [r0, r0 + kPreRounds) (packs in kp; the row's own key from m.k / m.v).
__device__ __forceinline__ void fold_keys(const KeyRun& r, int32_t r0, const KeyPacks& kp,
                                          const float (&q)[kVec], float scale, const Smem& m,
                                          Fold& f) {
  const bool mine = r.pack < r.packs;
  float score[kPreRounds];
  float top = -INFINITY;
#pragma unroll
  for (int t = 0; t < kPreRounds; ++t) {
    const int32_t j = key_of(r, r0 + t);
    float kf[kVec] = {};
    if (mine && j == r.pos) {
#pragma unroll
      for (int x = 0; x < kVec; ++x) kf[x] = m.k[r.pack * kVec + x];
    } else if (mine && j < r.ke) {
      unpack(kp.k[t], kf);
    }
    float dot = 0.0f;
#pragma unroll
    for (int x = 0; x < kVec; ++x) dot = fmaf(q[x], kf[x], dot);
    for (int off = r.seg / 2; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    score[t] = j < r.ke ? dot * scale : -INFINITY;
    top = fmaxf(top, score[t]);
  }
  // Finite: key kb + r0 * per_round is valid. The correction is 0 on the first rounds.
  const float new_max = fmaxf(f.max, warp_max(top));
  const float correction = expf(f.max - new_max);
  f.sum *= correction;
#pragma unroll
  for (int x = 0; x < kVec; ++x) f.acc[x] *= correction;
#pragma unroll
  for (int t = 0; t < kPreRounds; ++t) {
    const int32_t j = key_of(r, r0 + t);
    if (j >= r.ke) continue;
    const float w = expf(score[t] - new_max);
    if (r.pack == 0) f.sum += w;
    float vf[kVec] = {};
    if (mine && j == r.pos) {
#pragma unroll
      for (int x = 0; x < kVec; ++x) vf[x] = m.v[r.pack * kVec + x];
    } else if (mine) {
      unpack(kp.v[t], vf);
    }
#pragma unroll
    for (int x = 0; x < kVec; ++x) f.acc[x] = fmaf(w, vf[x], f.acc[x]);
  }
  f.max = new_max;
}

// Query head h of the row, after the stage's wait (kp: preload_keys's registers): its
// head norm and RoPE, the K/V write (the kv head's first query head) and the table entry
// (layer 0, head 0), then the attention over [lo, pos].
__device__ void attend_head(const KernelArgs& a, const DecodeLayer<bf16>& layer, int32_t l,
                            int32_t h, const KeyRun& r, KeyPacks& kp, const Smem& m) {
  const DecodeLayersParams<bf16>& p = a.p;
  const int warp = static_cast<int>(threadIdx.x >> 5);
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int32_t hd = p.head_dim;
  const int32_t half = hd / 2;
  const int32_t group = p.n_heads / p.n_kv_heads;
  const int32_t g = h / group;
  const int64_t q_dim = int64_t{p.n_heads} * hd;
  const int64_t kv_dim = int64_t{p.n_kv_heads} * hd;
  const int32_t pos = r.pos;
  const int32_t cell = p.cells[0];
  const int32_t seq = p.row_seq[0];

  if (warp == 0) {
    const bf16* q = p.qkv + int64_t{h} * hd;
    const bf16* k = p.qkv + q_dim + int64_t{g} * hd;
    const bf16* v = p.qkv + q_dim + kv_dim + int64_t{g} * hd;
    float q_sq = 0.0f;
    float k_sq = 0.0f;
    for (int32_t j = lane; j < hd; j += 32) {
      m.q[j] = load_l2(q + j);
      m.k[j] = load_l2(k + j);
      m.v[j] = load_l2(v + j);
      q_sq += m.q[j] * m.q[j];
      k_sq += m.k[j] * m.k[j];
    }
    if (layer.q_norm != nullptr) {  // launch_head_rmsnorm's arithmetic, rounded to T
      const float q_inv = 1.0f / sqrtf(detail::warp_sum(q_sq) / static_cast<float>(hd) + p.eps);
      const float k_inv = 1.0f / sqrtf(detail::warp_sum(k_sq) / static_cast<float>(hd) + p.eps);
      for (int32_t j = lane; j < hd; j += 32) {
        m.q[j] = round_bf(m.q[j] * q_inv * bf(layer.q_norm[j]));
        m.k[j] = round_bf(m.k[j] * k_inv * bf(layer.k_norm[j]));
      }
    }
    __syncwarp();
    for (int32_t j = lane; j < half; j += 32) {  // rope_kv_write.cu's arithmetic
      const float angle = static_cast<float>(pos) * p.inv_freq[j];
      const float c = cosf(angle);
      const float s = sinf(angle);
      const float qa = m.q[j], qb = m.q[j + half];
      const float ka = m.k[j], kb = m.k[j + half];
      m.q[j] = round_bf(__fsub_rn(__fmul_rn(qa, c), __fmul_rn(qb, s)));
      m.q[j + half] = round_bf(__fadd_rn(__fmul_rn(qb, c), __fmul_rn(qa, s)));
      m.k[j] = round_bf(__fsub_rn(__fmul_rn(ka, c), __fmul_rn(kb, s)));
      m.k[j + half] = round_bf(__fadd_rn(__fmul_rn(kb, c), __fmul_rn(ka, s)));
    }
    __syncwarp();
    if (h % group == 0) {
      bf16* k_dst = layer.k_pool + int64_t{cell} * kv_dim + int64_t{g} * hd;
      bf16* v_dst = layer.v_pool + int64_t{cell} * kv_dim + int64_t{g} * hd;
      for (int32_t j = lane; j < hd; j += 32) {
        k_dst[j] = __float2bfloat16_rn(m.k[j]);
        v_dst[j] = __float2bfloat16_rn(m.v[j]);  // exact: v holds bf16 values
      }
    }
    if (l == 0 && h == 0 && lane == 0) p.table[int64_t{seq} * p.table_stride + pos] = cell;
  }
  consumer_sync();

  float q[kVec] = {};
  if (r.pack < r.packs) {
#pragma unroll
    for (int x = 0; x < kVec; ++x) q[x] = m.q[r.pack * kVec + x];
  }
  Fold f;
  if (r.rounds > 0) fold_keys(r, 0, kp, q, p.scale, m, f);
  for (int32_t r0 = kPreRounds; r0 < r.rounds; r0 += kPreRounds) {
    load_keys(r, r0, kp);
    fold_keys(r, r0, kp, q, p.scale, m, f);
  }
  // The warp's sums: the weights over its segments' first lanes, the values over the
  // segments (lanes slot 0 then hold the warp's dims of their pack).
  f.sum = detail::warp_sum(f.sum);
  for (int off = r.seg; off < 32; off <<= 1) {
#pragma unroll
    for (int x = 0; x < kVec; ++x) f.acc[x] += __shfl_xor_sync(0xffffffffu, f.acc[x], off);
  }
  if (lane == 0) {
    m.merge_m[warp] = f.max;
    m.merge_l[warp] = f.sum;
  }
  if (r.slot == 0 && r.pack < r.packs) {
#pragma unroll
    for (int x = 0; x < kVec; ++x) m.merge_acc[warp * hd + r.pack * kVec + x] = f.acc[x];
  }
  consumer_sync();
  for (int32_t e = static_cast<int32_t>(threadIdx.x); e < hd; e += kConsumers) {
    float top = -INFINITY;
    for (int w = 0; w < kWarps; ++w) {
      if (m.merge_l[w] > 0.0f) top = fmaxf(top, m.merge_m[w]);
    }
    float total = 0.0f;
    float out = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      if (m.merge_l[w] > 0.0f) {
        const float f = expf(m.merge_m[w] - top);
        total += m.merge_l[w] * f;
        out += m.merge_acc[w * hd + e] * f;
      }
    }
    p.attn[int64_t{h} * hd + e] = __float2bfloat16_rn(out / total);
  }
  consumer_sync();
}

// kPacks: the norms' packs a thread (norm_into_act), 1 or kMaxHeldPacks; a kernel each, so
// the one-pack kernel's registers are not sized for two.
template <int kPacks>
__global__ void __maxnreg__(128) decode_layers_kernel(const KernelArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  const Smem m = carve(smem, a);
  if (threadIdx.x == 0) {
    for (int32_t s = 0; s < a.stages; ++s) {
      detail::barrier_init(&m.full[s], 1);
      detail::barrier_init(&m.empty[s], kWarps);
    }
    detail::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x >= kConsumers) {
    if (threadIdx.x == kConsumers) produce(a, m);
    return;
  }

  const DecodeLayersParams<bf16>& p = a.p;
  const uint32_t blocks = gridDim.x;
  uint32_t* count = p.sync;
  uint32_t stage = 0;  // grid stages finished before the current one
  RingPos at;          // the ring stage consumed next
  // The residual row the adds-th add reads (the other one is where it writes).
  const auto residual_at = [&](int n) { return n % 2 == 0 ? p.residual : p.residual_out; };
  int adds = 0;  // norms so far that added a delta into the residual
  const bool writer = blockIdx.x == 0;
  // act = rmsnorm(residual + delta) * weight (no delta: of the residual), block 0 storing
  // the new residual.
  const auto norm = [&](const float* residual, const bf16* delta, const bf16* weight, float* out) {
    norm_into_act<kPacks>(residual, delta, weight, out, p.d, p.eps, m.act, m.red);
  };
  const auto add_and_norm = [&](const bf16* weight) {
    norm(residual_at(adds), p.delta, weight, writer ? residual_at(adds + 1) : nullptr);
    ++adds;
  };
  const int64_t q_dim = int64_t{p.n_heads} * p.head_dim;
  for (int32_t l = 0; l < p.n_layers; ++l) {
    const DecodeLayer<bf16> layer = p.layers[l];
    // 1. input norm, q/k/v.
    if (stage > 0) stage_wait(count, stage * blocks);
    if (l == 0) {
      norm(p.residual, nullptr, layer.input_norm, nullptr);
    } else {
      add_and_norm(layer.input_norm);
    }
    run_product<kQkv>(a, layer, m, at);
    stage_done(count);
    // 2. RoPE, K/V, attention: a block per query head.
    // The block's first head's older keys load during the count.
    const auto h0 = static_cast<int32_t>(blockIdx.x);
    KeyPacks kp;
    KeyRun run{};
    if (h0 < p.n_heads) {
      run = key_run(p, layer, h0);
      preload_keys(run, kp);
    }
    stage_wait(count, ++stage * blocks);
    for (int32_t h = h0; h < p.n_heads; h += static_cast<int32_t>(blocks)) {
      if (h != h0) {
        run = key_run(p, layer, h);
        load_keys(run, 0, kp);
      }
      attend_head(a, layer, l, h, run, kp, m);
    }
    stage_done(count);
    // 3. o.
    stage_wait(count, ++stage * blocks);
    stage_row(p.attn, static_cast<int32_t>(q_dim), m.act);
    run_product<kO>(a, layer, m, at);
    stage_done(count);
    // 4. post-attention norm, gate/up and SwiGLU.
    stage_wait(count, ++stage * blocks);
    add_and_norm(layer.post_norm);
    run_product<kGateUp>(a, layer, m, at);
    stage_done(count);
    // 5. down.
    stage_wait(count, ++stage * blocks);
    stage_row(p.act, p.ff, m.act);
    run_product<kDown>(a, layer, m, at);
    stage_done(count);
    ++stage;
  }
  // The last block out zeroes both counters for the next launch: every block has passed
  // its last wait by then.
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(&count[1], 1u) == blocks - 1) {
      count[0] = 0;
      count[1] = 0;
      __threadfence();
    }
  }
}

ProductShape shape_of(int32_t n, int32_t k, int32_t mats) {
  ProductShape s{};
  s.n = n;
  s.k = k;
  s.mats = mats;
  const int32_t elems = kStageBytes / static_cast<int32_t>(sizeof(bf16)) / mats;
  if (k <= elems) {
    s.parts = 1;
    s.kc = k;
    s.rpc = std::min(elems / k, kWarps);
  } else {
    s.parts = (k + elems - 1) / elems;
    while (k % s.parts != 0 || (k / s.parts) % kVec != 0) ++s.parts;
    s.kc = k / s.parts;
    s.rpc = 1;
  }
  return s;
}

struct DeviceLimits {
  int sms = 0;
  int smem_optin = 0;
  bool cooperative = false;
  // Each kernel's (kernels[packs - 1]) dynamic shared memory allowed and checked so far.
  size_t smem_opted[kMaxHeldPacks] = {};
};

using KernelFn = void (*)(KernelArgs);
constexpr KernelFn kernels[kMaxHeldPacks] = {decode_layers_kernel<1>, decode_layers_kernel<2>};
static_assert(kMaxHeldPacks == 2, "a kernel for each pack count");

cudaError_t query_limits(int dev, DeviceLimits* out) {
  cudaError_t err = cudaSuccess;
  int coop = 0, major = 0;
  if ((err = cudaDeviceGetAttribute(&out->sms, cudaDevAttrMultiProcessorCount, dev)) !=
          cudaSuccess ||
      (err = cudaDeviceGetAttribute(&out->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                    dev)) != cudaSuccess ||
      (err = cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev)) != cudaSuccess ||
      (err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev)) !=
          cudaSuccess) {
    return err;
  }
  out->cooperative = coop != 0 && major >= 9;
  return cudaSuccess;
}

// The current device's limits, queried once per device: a one-row step launches the
// kernel every step, and these are host calls it need not repeat. The mutex also orders
// the shared-memory opt-in (prepare_smem).
std::mutex limits_mutex;
std::map<int, DeviceLimits> limits_by_device;

cudaError_t device_limits(DeviceLimits* out, int* device) {
  cudaError_t err = cudaGetDevice(device);
  if (err != cudaSuccess) return err;
  const std::lock_guard<std::mutex> lock(limits_mutex);
  auto it = limits_by_device.find(*device);
  if (it == limits_by_device.end()) {
    DeviceLimits lim;
    if ((err = query_limits(*device, &lim)) != cudaSuccess) return err;
    it = limits_by_device.emplace(*device, lim).first;
  }
  *out = it->second;
  return cudaSuccess;
}

bool shapes_ok(int64_t d, int64_t ff, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim) {
  return d > 0 && ff > 0 && n_heads > 0 && n_kv_heads > 0 && head_dim > 0 &&
         n_heads % n_kv_heads == 0 && d % kVec == 0 && ff % kVec == 0 && head_dim % kVec == 0 &&
         head_dim <= kMaxDecodeLayersHeadDim && d <= int64_t{kMaxHeldPacks} * kConsumers * kVec &&
         n_heads * head_dim <= (int64_t{1} << 24) && ff <= (int64_t{1} << 24);
}

// Allows kernel `k` `smem` bytes of dynamic shared memory on `device` (the current one)
// and checks a block then fits on an SM (all 16 warps' registers and the ring).
cudaError_t prepare_smem(int device, int k, size_t smem) {
  cudaError_t err = cudaFuncSetAttribute(kernels[k], cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  int per_sm = 0;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernels[k], kThreads, smem);
  if (err != cudaSuccess) return err;
  if (per_sm < 1) return cudaErrorNotSupported;
  const std::lock_guard<std::mutex> lock(limits_mutex);
  DeviceLimits& lim = limits_by_device[device];
  lim.smem_opted[k] = std::max(lim.smem_opted[k], smem);
  return cudaSuccess;
}

// Ring stages that fit beside the rest, or 0 when fewer than two do.
int32_t stages_for(int smem_optin, int32_t act_elems, int32_t head_dim) {
  for (int32_t s = kMaxStages; s >= 2; --s) {
    if (smem_layout(s, act_elems, head_dim).bytes <= static_cast<size_t>(smem_optin)) {
      return s;
    }
  }
  return 0;
}

}  // namespace

bool decode_layers_supported(int64_t d, int64_t ff, int64_t n_heads, int64_t n_kv_heads,
                             int64_t head_dim) {
  if (!shapes_ok(d, ff, n_heads, n_kv_heads, head_dim)) return false;
  DeviceLimits lim;
  int device = 0;
  if (device_limits(&lim, &device) != cudaSuccess || !lim.cooperative) return false;
  const int64_t act = std::max({d, ff, n_heads * head_dim});
  return stages_for(lim.smem_optin, static_cast<int32_t>(act), static_cast<int32_t>(head_dim)) > 0;
}

template <>
cudaError_t launch_decode_layers<bf16>(const DecodeLayersParams<bf16>& p, cudaStream_t stream) {
  if (p.n_layers < 0 || !shapes_ok(p.d, p.ff, p.n_heads, p.n_kv_heads, p.head_dim) ||
      !(p.eps >= 0.0f)) {
    return cudaErrorInvalidValue;
  }
  if (p.n_layers == 0) return cudaSuccess;
  if (p.layers == nullptr || p.positions == nullptr || p.cells == nullptr || p.row_seq == nullptr ||
      p.table == nullptr || p.table_stride <= 0 || p.inv_freq == nullptr || p.residual == nullptr ||
      p.residual_out == nullptr || p.residual == p.residual_out || p.qkv == nullptr ||
      p.attn == nullptr || p.act == nullptr || p.delta == nullptr || p.sync == nullptr) {
    return cudaErrorInvalidValue;
  }
  DeviceLimits lim;
  int device = 0;
  cudaError_t err = device_limits(&lim, &device);
  if (err != cudaSuccess) return err;
  if (!lim.cooperative) return cudaErrorNotSupported;
  KernelArgs a{};
  a.p = p;
  const int32_t q_dim = p.n_heads * p.head_dim;
  const int32_t qkv_dim = q_dim + 2 * p.n_kv_heads * p.head_dim;
  a.shapes[kQkv] = shape_of(qkv_dim, p.d, 1);
  a.shapes[kO] = shape_of(p.d, q_dim, 1);
  a.shapes[kGateUp] = shape_of(p.ff, p.d, 2);
  a.shapes[kDown] = shape_of(p.d, p.ff, 1);
  a.act_elems = std::max({p.d, p.ff, q_dim});
  a.stages = stages_for(lim.smem_optin, a.act_elems, p.head_dim);
  if (a.stages == 0) return cudaErrorNotSupported;
  const size_t smem = smem_layout(a.stages, a.act_elems, p.head_dim).bytes;
  const int k = p.d <= int64_t{kConsumers} * kVec ? 0 : 1;  // kernels[k] holds k + 1 packs
  if (smem > lim.smem_opted[k]) {
    err = prepare_smem(device, k, smem);
    if (err != cudaSuccess) return err;
  }

  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(lim.sms));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeCooperative;
  attribute.val.cooperative = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernels[k], a);
}

}  // namespace cellm::cuda
