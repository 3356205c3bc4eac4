// The tensor-core attention of a prefill: rows in runs of consecutive rows of one
// sequence (AttentionParams::row_runs).
//
// The decode kernel (attention_mma.cu) gives each query row its own blocks, one per kv
// head, and puts the kv head's query heads in the 16 rows of its MMAs. A prefill chunk's
// rows then each gather their whole prefix again: a 512-row step of a 1,024-token
// prompt reads ~768 keys x 512 row-blocks x 8 kv heads a layer through the L2, and its
// MMAs carry 4 useful rows of 16 for the Llamas' 4 query heads a kv head. Here one block
// of 4 warps takes QB = 4 x 16 / G consecutive rows of the launch and one kv head (G its
// query heads): warp w's 16 MMA rows are the G heads of each of its 16 / G rows (MMA
// row i is block row w 16 / G + i / G, head i % G). The block gathers each key of its
// rows' sequence once, 64 keys a stage into shared memory (cp.async, two stages), and
// every warp folds the stage's four 16-key tiles into its rows' online softmax
// (attention_tile.cuh), each row counting only the keys in its own [lo, position]. No
// split, no fold: each warp holds every key of its rows and writes them out.
//
// A block's rows may belong to several sequences (a chunk's edge, or rows of different
// sessions): it takes them one sequence at a time (a segment: the keys of that
// sequence's rows' union), the other rows masked out. Rows of one sequence need not be
// consecutive positions; runs only make the gathers shared.
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>

#include "cuda/kernels/attention_mma.h"
#include "cuda/kernels/attention_span.cuh"
#include "cuda/kernels/attention_tile.cuh"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/mma.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "attention_prefill.cu needs sm_80 or newer (bf16 mma.sync, cp.async, ldmatrix)"
#endif

namespace cellm::cuda::detail {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kWarps = 4;
constexpr int kStageKeys = 64;  // keys a stage: 4 tiles, one gather for every warp
constexpr int kStages = 2;
// head_dim 128: 34 KB a stage, 68 KB a block, 3 blocks (12 warps) an SM at <= 170 registers.
constexpr int kBlocksPerSm = 3;

template <int HD>
constexpr size_t smem_bytes() {  // K then V, [kStageKeys][HD + pad] bf16, per stage
  return sizeof(bf16) * 2 * kStageKeys * (HD + kKvRowPad) * kStages;
}

template <int HD, int G>
__global__ void __launch_bounds__(kWarps * 32, kBlocksPerSm)
    attention_prefill_kernel(const AttentionParams<bf16> p, const bool early) {
  constexpr int kThreads = kWarps * 32;
  constexpr int KS = HD / 16;                          // k-steps of Q·Kᵀ
  constexpr int ND = HD / 8;                           // 8-dim column blocks of O
  constexpr int RE = HD + kKvRowPad;                   // bf16 per shared K/V row
  constexpr int RW = 16 / G;                           // query rows a warp
  constexpr int QB = kWarps * RW;                      // query rows a block
  constexpr int kChunksPerRow = HD / 8;                // 16-byte copies per K/V row
  constexpr int kCopies = kStageKeys * kChunksPerRow;  // per stage, K and V each
  static_assert(HD == 64 || HD == 128);
  static_assert(G >= 1 && G <= 16 && 16 % G == 0);
  static_assert(kCopies % kThreads == 0);
  extern __shared__ __align__(16) unsigned char smem[];
  // The block's rows: sequence (-1 past the launch), lowest and highest position attended.
  __shared__ int32_t s_seq[QB], s_lo[QB], s_hi[QB];

  const int64_t r0 = int64_t{blockIdx.x} * QB;
  const int kv_head = static_cast<int>(blockIdx.y);
  const int64_t h0 = int64_t{kv_head} * G;  // first query head
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4;
  const int q = lane % 4;

  // Everything it reads but the K/V of older steps comes from the kernels ahead of it
  // (the step's upload, the RoPE/K/V write); a prefill is not latency-bound enough to
  // gather before the wait.
  if (early) allow_dependent_grids();
  wait_for_prior_grids();
  for (int i = static_cast<int>(threadIdx.x); i < QB; i += kThreads) {
    const int64_t r = r0 + i;
    int32_t seq = -1, lo = 0, hi = -1;
    if (r < p.n_rows) {
      seq = p.row_seq[r];
      hi = p.positions[r];
      lo = p.window > 0 ? max(0, hi - p.window + 1) : 0;
    }
    s_seq[i] = seq;
    s_lo[i] = lo;
    s_hi[i] = hi;
  }
  __syncthreads();

  // This lane's MMA rows g and g + 8: block row row_of[i], query head h0 + head_of[i].
  int row_of[2], head_of[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    row_of[i] = warp * RW + (g + 8 * i) / G;
    head_of[i] = (g + 8 * i) % G;
  }
  // Q as A fragments (zero past the launch's rows), unscaled bf16 as stored.
  uint32_t qa[KS][4];
  {
    const bf16* q_at[2];
    bool ok[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int64_t r = r0 + row_of[i];
      ok[i] = r < p.n_rows;
      q_at[i] =
          p.qkv + (ok[i] ? r : 0) * p.row_stride + p.q_offset + (h0 + head_of[i]) * HD + 2 * q;
    }
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
      qa[kk][0] = ok[0] ? *reinterpret_cast<const uint32_t*>(q_at[0] + kk * 16) : 0u;
      qa[kk][1] = ok[1] ? *reinterpret_cast<const uint32_t*>(q_at[1] + kk * 16) : 0u;
      qa[kk][2] = ok[0] ? *reinterpret_cast<const uint32_t*>(q_at[0] + kk * 16 + 8) : 0u;
      qa[kk][3] = ok[1] ? *reinterpret_cast<const uint32_t*>(q_at[1] + kk * 16 + 8) : 0u;
    }
  }

  const float q_scale = p.scale * kLog2e;  // scores in log2 units
  TileState<HD> st;
  const int k_off = k_lane_offset(lane, RE);
  const int v_off = v_lane_offset(lane, RE);
  const int64_t cell_stride = p.n_kv_heads * HD;
  const bf16* k_base = p.k_pool + int64_t{kv_head} * HD;
  const bf16* v_base = p.v_pool + int64_t{kv_head} * HD;
  auto stage_k = [&](int s) { return reinterpret_cast<bf16*>(smem) + s * 2 * kStageKeys * RE; };

  // One segment per sequence among the block's rows, in the order of its first row.
  for (int first = 0; first < QB; ++first) {
    const int32_t seq = s_seq[first];
    if (seq < 0) break;  // the launch's rows end here
    bool seen = false;
    for (int k = 0; k < first; ++k) seen |= s_seq[k] == seq;
    if (seen) continue;
    // Keys [lo, hi] serve every row of the segment; [w_lo, w_hi] this warp's (none: hi -1).
    int32_t lo = INT_MAX, hi = -1, w_lo = INT_MAX, w_hi = -1;
    for (int k = first; k < QB; ++k) {
      if (s_seq[k] != seq) continue;
      lo = min(lo, s_lo[k]);
      hi = max(hi, s_hi[k]);
      if (k / RW == warp) {
        w_lo = min(w_lo, s_lo[k]);
        w_hi = max(w_hi, s_hi[k]);
      }
    }
    // This lane's rows count keys [my_lo, my_hi] of the segment (none when not in it).
    int32_t my_lo[2], my_hi[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      my_lo[i] = s_lo[row_of[i]];
      my_hi[i] = s_seq[row_of[i]] == seq ? s_hi[row_of[i]] : -1;
    }
    const int32_t* cells = p.table + int64_t{seq} * p.table_stride;
    // Keys past hi load zeros (never a stale cell's NaN); every row masks them.
    auto load_stage = [&](int64_t j_begin, int s) {
      bf16* ks = stage_k(s);
      bf16* vs = ks + kStageKeys * RE;
#pragma unroll
      for (int c = static_cast<int>(threadIdx.x); c < kCopies; c += kThreads) {
        const int key = c / kChunksPerRow;
        const int col = (c % kChunksPerRow) * 8;
        const int64_t j = j_begin + key;
        const bool ok = j <= hi;
        const int64_t off = int64_t{ok ? cells[j] : 0} * cell_stride + col;
        cp_async16(ks + key * RE + col, k_base + off, ok);
        cp_async16(vs + key * RE + col, v_base + off, ok);
      }
    };
    const int64_t n_stages = (int64_t{hi} - lo + kStageKeys) / kStageKeys;
    load_stage(lo, 0);
    cp_async_commit();
    for (int64_t u = 0; u < n_stages; ++u) {
      const int s = static_cast<int>(u % kStages);
      // The next stage loads while this one is folded; an empty group keeps the count.
      if (u + 1 < n_stages) load_stage(lo + (u + 1) * kStageKeys, s ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
      __syncthreads();  // every thread's copies of stage u are visible to the block
      const bf16* ks = stage_k(s);
      const bf16* vs = ks + kStageKeys * RE;
#pragma unroll
      for (int t = 0; t < kStageKeys / kTileKeys; ++t) {
        const int64_t j0 = lo + u * kStageKeys + t * kTileKeys;
        // Warp-uniform: a tile none of the warp's rows counts is skipped.
        if (j0 > w_hi || j0 + kTileKeys - 1 < w_lo) continue;
        fold_tile<HD, true>(qa, ks + t * kTileKeys * RE, vs + t * kTileKeys * RE, k_off, v_off,
                            q_scale, st, [&](int nb, int c) {
                              const int64_t j = j0 + nb * 8 + 2 * q + (c & 1);
                              return j >= my_lo[c / 2] && j <= my_hi[c / 2];
                            });
      }
      __syncthreads();  // the stage is read before the next round refills it
    }
  }
  if (!early) allow_dependent_grids();

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    // A row of the launch saw at least its own position: its sum is positive.
    const float sum = quad_sum(st.l[i]);
    const int64_t r = r0 + row_of[i];
    if (r >= p.n_rows) continue;
    bf16* out = p.out + (r * p.n_heads + h0 + head_of[i]) * HD + 2 * q;
#pragma unroll
    for (int nd = 0; nd < ND; ++nd) {
      *reinterpret_cast<__nv_bfloat162*>(out + nd * 8) =
          __floats2bfloat162_rn(st.o[nd][2 * i] / sum, st.o[nd][2 * i + 1] / sum);
    }
  }
}

template <int HD, int G>
cudaError_t launch_prefill(const AttentionParams<bf16>& p, cudaStream_t stream) {
  constexpr size_t bytes = smem_bytes<HD>();
  // Above 48 KB a kernel must opt in; not a stream operation, so capture-safe.
  if constexpr (bytes > 48 * 1024) {
    if (const cudaError_t err = cudaFuncSetAttribute(attention_prefill_kernel<HD, G>,
                                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                     static_cast<int>(bytes));
        err != cudaSuccess) {
      return err;
    }
  }
  constexpr int64_t kRowsPerBlock = kWarps * 16 / G;
  const dim3 grid(static_cast<unsigned>((p.n_rows + kRowsPerBlock - 1) / kRowsPerBlock),
                  static_cast<unsigned>(p.n_kv_heads));
  return launch_kernel(attention_prefill_kernel<HD, G>, grid, dim3(kWarps * 32), bytes, stream, p,
                       early_triggers());
}

template <int HD>
cudaError_t launch_prefill_group(const AttentionParams<bf16>& p, int group, cudaStream_t stream) {
  switch (group) {
    case 1:
      return launch_prefill<HD, 1>(p, stream);
    case 2:
      return launch_prefill<HD, 2>(p, stream);
    case 4:
      return launch_prefill<HD, 4>(p, stream);
    case 8:
      return launch_prefill<HD, 8>(p, stream);
    case 16:
      return launch_prefill<HD, 16>(p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

bool attention_prefill_takes_group(int64_t group) {
  return group == 1 || group == 2 || group == 4 || group == 8 || group == 16;
}

cudaError_t launch_attention_prefill_mma(const AttentionParams<bf16>& p, cudaStream_t stream) {
  if (p.n_kv_heads > 65535 || (p.n_rows + 63) / 64 > 0x7fffffff) return cudaErrorInvalidValue;
  const int64_t group = p.n_heads / p.n_kv_heads;
  if (!attention_prefill_takes_group(group)) return cudaErrorInvalidValue;
  if (p.head_dim == 64) return launch_prefill_group<64>(p, static_cast<int>(group), stream);
  if (p.head_dim == 128) return launch_prefill_group<128>(p, static_cast<int>(group), stream);
  return cudaErrorInvalidValue;
}

}  // namespace cellm::cuda::detail
