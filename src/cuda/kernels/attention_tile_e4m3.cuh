// One warp's step of the tensor-core attention over an e4m3 KV cache (AttentionParams'
// k_codes, v_codes, k_scales, v_scales): 16 keys of e4m3 codes, one f32 scale per key,
// folded into the online softmax of 16 query rows, as fold_tile (attention_tile.cuh)
// folds bf16 keys. The index maps: attention_e4m3_map.h.
//
// Scores: every e4m3 value is an f16, so K's codes become an f16 mma's B operand exactly
// (cvt.f16x2.e4m3x2) against Q rounded to f16 (exact for |q| in [2^-14, 65504]: a bf16's
// 8 significant bits fit an f16's 11), f32 accumulation; each key's column is then
// multiplied by its scale (a power of two: exact) and the softmax scale.
//
// P·V: the bf16 pair of two codes comes from a byte permute and a shift and mask, which
// leave value × 2^-120 (the bf16 exponent bias 127 against e4m3's 7; an e4m3 subnormal
// lands on a bf16 subnormal), then an fma by 2^120 (exact, as gemv_fp8.cu's
// e4m3x2_to_bf16x2). Each key's V scale multiplies its softmax weight (exact in f32, a
// power of two) after the weight joined the running sum and before the weight is split
// into its two bf16 terms. O's columns come out in e4m3_o_dim order.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "cuda/kernels/attention_e4m3_map.h"
#include "cuda/kernels/attention_tile.cuh"
#include "cuda/kernels/mma.cuh"

namespace cellm::cuda::detail {

// The f16 pair of the e4m3 codes in the low (first) and high bytes of `pair`.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t pair) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair & 0xffffu), __NV_E4M3);
  return uint32_t{h.x} | (uint32_t{h.y} << 16);
}

// The bf16 pair (byte e of `lo_word`, byte e of `hi_word`), each the e4m3 value exactly.
template <int E>
__device__ __forceinline__ uint32_t e4m3_pair_to_bf16x2(uint32_t lo_word, uint32_t hi_word) {
  uint32_t half_bytes;
  asm("prmt.b32 %0, %1, %2, %3;"
      : "=r"(half_bytes)
      : "r"(lo_word), "r"(hi_word), "n"(e4m3_v_selector(E)));
  const uint32_t bits = (half_bytes << 4) & 0x87f087f0u;
  uint32_t out;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;"
      : "=r"(out)
      : "r"(bits), "r"(0x7b807b80u), "r"(0x80008000u));  // 2^120 (bf16 0x7b80), -0
  return out;
}

// Q rows g and g + 8 of k-step kk as the f16 A fragment of the scores (dims e4m3_q_dim):
// lo / hi point at dims 16 kk + 4q .. + 3 of the two rows (bf16), or nullptr for a zero row.
__device__ __forceinline__ void q_fragment_f16(const __nv_bfloat16* lo, const __nv_bfloat16* hi,
                                               uint32_t (&a)[4]) {
  auto pair = [](const __nv_bfloat16* x, int i) -> uint32_t {
    if (x == nullptr) return 0u;
    const __half2 h = __floats2half2_rn(__bfloat162float(x[i]), __bfloat162float(x[i + 1]));
    return *reinterpret_cast<const uint32_t*>(&h);
  };
  a[0] = pair(lo, 0);
  a[1] = pair(hi, 0);
  a[2] = pair(lo, 2);
  a[3] = pair(hi, 2);
}

// Folds the 16 keys of a stage (K codes kc, V codes vc, code_row_bytes<HD>() a row, and
// their scales k_scale[16], v_scale[16]) into `st`; valid(nb, c) and kRowsMayBeEmpty as
// fold_tile's.
template <int HD, bool kRowsMayBeEmpty, typename Valid>
__device__ __forceinline__ void fold_tile_e4m3(const uint32_t (&qa)[HD / 16][4], const uint8_t* kc,
                                               const uint8_t* vc, const float* k_scale,
                                               const float* v_scale, int lane, float q_scale,
                                               TileState<HD>& st, Valid valid) {
  constexpr int KS = HD / 16;
  constexpr int ND = HD / 8;
  constexpr int RB = code_row_bytes<HD>();
  const int g = lane / 4;
  const int q = lane % 4;
  float sc[2][4];  // scores of keys 0-7 and 8-15, C layout
#pragma unroll
  for (int nb = 0; nb < 2; ++nb) {
#pragma unroll
    for (int c = 0; c < 4; ++c) sc[nb][c] = 0.f;
  }
#pragma unroll
  for (int kk = 0; kk < KS; ++kk) {
#pragma unroll
    for (int nb = 0; nb < 2; ++nb) {
      const uint32_t w =
          *reinterpret_cast<const uint32_t*>(kc + (8 * nb + g) * RB + 16 * kk + 4 * q);
      mma_16816_f16(sc[nb], qa[kk], e4m3x2_to_f16x2(w), e4m3x2_to_f16x2(w >> 16));
    }
  }

  // Keys 8 nb + 2q and + 1 are C columns c & 1 = 0 and 1.
  float2 ks[2], vs[2];
#pragma unroll
  for (int nb = 0; nb < 2; ++nb) {
    ks[nb] = *reinterpret_cast<const float2*>(k_scale + 8 * nb + 2 * q);
    vs[nb] = *reinterpret_cast<const float2*>(v_scale + 8 * nb + 2 * q);
  }
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nb = 0; nb < 2; ++nb) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const float key_scale = (c & 1) != 0 ? ks[nb].y : ks[nb].x;
      sc[nb][c] = valid(nb, c) ? sc[nb][c] * key_scale * q_scale : -INFINITY;
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
      sc[nb][c] *= (c & 1) != 0 ? vs[nb].y : vs[nb].x;  // the key's V scale
    }
  }
#pragma unroll
  for (int nd = 0; nd < ND; ++nd) {
    st.o[nd][0] *= corr[0];
    st.o[nd][1] *= corr[0];
    st.o[nd][2] *= corr[1];
    st.o[nd][3] *= corr[1];
  }

  // The weight as two bf16 terms, as fold_tile takes it.
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
  for (int m = 0; m < HD / 32; ++m) {
    const uint8_t* col = vc + 32 * m + 4 * g;
    const uint32_t w0 = *reinterpret_cast<const uint32_t*>(col + (2 * q) * RB);
    const uint32_t w1 = *reinterpret_cast<const uint32_t*>(col + (2 * q + 1) * RB);
    const uint32_t w2 = *reinterpret_cast<const uint32_t*>(col + (2 * q + 8) * RB);
    const uint32_t w3 = *reinterpret_cast<const uint32_t*>(col + (2 * q + 9) * RB);
    const uint32_t b[4][2] = {
        {e4m3_pair_to_bf16x2<0>(w0, w1), e4m3_pair_to_bf16x2<0>(w2, w3)},
        {e4m3_pair_to_bf16x2<1>(w0, w1), e4m3_pair_to_bf16x2<1>(w2, w3)},
        {e4m3_pair_to_bf16x2<2>(w0, w1), e4m3_pair_to_bf16x2<2>(w2, w3)},
        {e4m3_pair_to_bf16x2<3>(w0, w1), e4m3_pair_to_bf16x2<3>(w2, w3)},
    };
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      mma_16816(st.o[4 * m + e], pa, b[e][0], b[e][1]);
      mma_16816(st.o[4 * m + e], pl, b[e][0], b[e][1]);
    }
  }
}

}  // namespace cellm::cuda::detail
