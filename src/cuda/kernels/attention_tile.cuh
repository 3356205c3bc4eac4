// One warp's step of the tensor-core attention: 16 keys folded into the online
// softmax of 16 query rows (mma.m16n8k16, bf16 in, f32 accumulators). Shared by the
// decode kernel (attention_mma.cu: the rows are one query row's heads) and the prefill
// kernel (attention_prefill.cu: the rows are a few consecutive query rows' heads).
//
// Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type").
// Lane = 4 g + q. A (16 x 16, row): {a0, a1, a2, a3} = A[g][2q, 2q+1], A[g+8][2q, 2q+1],
// A[g][2q+8, 2q+9], A[g+8][2q+8, 2q+9], the lower index in the low half. B (16 x 8,
// col): {b0, b1} = B[2q, 2q+1][g], B[2q+8, 2q+9][g]. C (16 x 8, f32): {c0, c1, c2, c3} =
// C[g][2q], C[g][2q+1], C[g+8][2q], C[g+8][2q+1].
//   S = Q·Kᵀ: A = Q[rows][16 dims of step kk]; B[d][n] = K[key n][d]: ldmatrix (no
//     transpose) of 8 x 8 blocks of K rows, lane l addressing row l % 8 of block l / 8,
//     gives lane (g, q) row g, elements 2q, 2q+1: b0/b1.
//   O += P·V: the two S fragments of a tile (keys 0-7, 8-15) are P's A fragment as they
//     stand ({s0.c0c1, s0.c2c3, s1.c0c1, s1.c2c3}), taken twice: rounded to bf16, then
//     the rounding's remainder rounded to bf16 (two MMAs); B[key][d] = V[key][d]:
//     ldmatrix.trans of 8 x 8 blocks of V rows gives lane (g, q) elements (row 2q,
//     column g), (row 2q+1, column g): b0/b1.
// tests/cuda/attention_mma_emulation_test.cpp checks these index maps on the host.
//
// Shared K/V rows are head_dim + kKvRowPad bf16 apart: the 8 rows an ldmatrix phase
// reads then sit in distinct banks (a row is 68 or 36 words: 8 rows start at banks 0,
// 4, ..., 28), and rows stay 16-byte aligned for cp.async.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/kernels/mma.cuh"

namespace cellm::cuda::detail {

inline constexpr int kKvRowPad = 8;   // bf16 of padding per shared K/V row
inline constexpr int kTileKeys = 16;  // keys per warp step: P·V's k

// (lo, hi) rounded to bf16 (nearest even), lo in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// This lane's ldmatrix row addresses (block b = lane / 8, row lane % 8), in bf16 from
// a stage's K or V base, for rows `re` bf16 apart:
//   K, step kk: blocks (keys 0-7, dims +0), (keys 0-7, +8), (keys 8-15, +0), (keys
//     8-15, +8) of dims [16 kk, 16 kk + 16): b0, b1 of keys 0-7, then of keys 8-15.
//   V, dims [16 n2, 16 n2 + 16): blocks (keys 0-7, +0), (keys 8-15, +0), (keys 0-7,
//     +8), (keys 8-15, +8), transposed: b0, b1 of dims +0..7, then of dims +8..15.
__device__ __forceinline__ int k_lane_offset(int lane, int re) {
  return ((lane / 16) * 8 + lane % 8) * re + ((lane / 8) % 2) * 8;
}
__device__ __forceinline__ int v_lane_offset(int lane, int re) {
  return (((lane / 8) % 2) * 8 + lane % 8) * re + (lane / 16) * 8;
}

// One warp's running softmax state for its 16 rows: per row g (index 0) and g + 8
// (index 1) the running max (log2 units), this lane's part of the running sum, and O
// columns nd * 8 + 2q, +1.
template <int HD>
struct TileState {
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};
  float o[HD / 8][4] = {};
};

// Folds the 16 keys at `ks`/`vs` (shared memory, `re` bf16 a row, at this lane's
// ldmatrix offsets k_off / v_off) into `st`. valid(nb, c) says whether C element c of
// the scores of keys 8 nb..8 nb + 7 (row g + 8 (c / 2), key 8 nb + 2q + (c & 1)) counts;
// an invalid one weighs exactly 0. kRowsMayBeEmpty: a row may have no valid key in
// this tile and none before it (its max stays -inf); without it every row must hold a
// valid key here or earlier, which spares the guard.
template <int HD, bool kRowsMayBeEmpty, typename Valid>
__device__ __forceinline__ void fold_tile(const uint32_t (&qa)[HD / 16][4], const __nv_bfloat16* ks,
                                          const __nv_bfloat16* vs, int k_off, int v_off,
                                          float q_scale, TileState<HD>& st, Valid valid) {
  constexpr int KS = HD / 16;
  constexpr int ND = HD / 8;
  float sc[2][4];  // scores of keys 0-7 and 8-15, C layout
#pragma unroll
  for (int nb = 0; nb < 2; ++nb) {
#pragma unroll
    for (int c = 0; c < 4; ++c) sc[nb][c] = 0.f;
  }
#pragma unroll
  for (int kk = 0; kk < KS; ++kk) {
    uint32_t b[4];
    ldmatrix_x4(b, ks + k_off + kk * 16);
    mma_16816(sc[0], qa[kk], b[0], b[1]);
    mma_16816(sc[1], qa[kk], b[2], b[3]);
  }

  // Online softmax per row: c0, c1 are row g, c2, c3 row g + 8.
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nb = 0; nb < 2; ++nb) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      sc[nb][c] = valid(nb, c) ? sc[nb][c] * q_scale : -INFINITY;
      tile_max[c / 2] = fmaxf(tile_max[c / 2], sc[nb][c]);
    }
  }
  float corr[2];
  float base[2];  // what the weights are taken against: the new max, or 0 while it is -inf
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float m_new = fmaxf(st.m[i], quad_max(tile_max[i]));
    base[i] = kRowsMayBeEmpty && m_new == -INFINITY ? 0.f : m_new;
    corr[i] = exp2f(st.m[i] - base[i]);  // 0 on a row's first keys (m = -inf)
    st.m[i] = m_new;
    st.l[i] *= corr[i];
  }
#pragma unroll
  for (int nb = 0; nb < 2; ++nb) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      sc[nb][c] = exp2f(sc[nb][c] - base[c / 2]);  // exactly 0 where invalid
      st.l[c / 2] += sc[nb][c];
    }
  }
#pragma unroll
  for (int nd = 0; nd < ND; ++nd) {
    st.o[nd][0] *= corr[0];
    st.o[nd][1] *= corr[0];
    st.o[nd][2] *= corr[1];
    st.o[nd][3] *= corr[1];
  }

  // P·V takes each weight as two bf16 terms, hi = bf16(w) and lo = bf16(w - hi) (w - hi
  // is exact in f32), so the product keeps ~16 bits of the weight: one bf16 term errs
  // by up to 2^-9 of it, ~1e-3 on outputs whose values cancel, which the CPU twin's
  // tolerance does not allow. The extra MMAs are cheap next to the tile's loads.
  float res[2][4];
#pragma unroll
  for (int nb = 0; nb < 2; ++nb) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      res[nb][c] = sc[nb][c] - __bfloat162float(__float2bfloat16(sc[nb][c]));
    }
  }
  const uint32_t pa[4] = {pack_bf16x2(sc[0][0], sc[0][1]), pack_bf16x2(sc[0][2], sc[0][3]),
                          pack_bf16x2(sc[1][0], sc[1][1]), pack_bf16x2(sc[1][2], sc[1][3])};
  const uint32_t pl[4] = {pack_bf16x2(res[0][0], res[0][1]), pack_bf16x2(res[0][2], res[0][3]),
                          pack_bf16x2(res[1][0], res[1][1]), pack_bf16x2(res[1][2], res[1][3])};
#pragma unroll
  for (int n2 = 0; n2 < ND / 2; ++n2) {
    uint32_t b[4];
    ldmatrix_x4_trans(b, vs + v_off + n2 * 16);
    mma_16816(st.o[2 * n2], pa, b[0], b[1]);
    mma_16816(st.o[2 * n2 + 1], pa, b[2], b[3]);
    mma_16816(st.o[2 * n2], pl, b[0], b[1]);
    mma_16816(st.o[2 * n2 + 1], pl, b[2], b[3]);
  }
}

}  // namespace cellm::cuda::detail
