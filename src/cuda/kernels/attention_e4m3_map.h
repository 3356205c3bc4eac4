// The index maps of the tensor-core attention over an e4m3 KV cache
// (attention_tile_e4m3.cuh), apart from the kernel so the host emulation
// (tests/cuda/attention_e4m3_emulation_test.cpp) runs the same maps lane by lane.
//
// Shared stage of one tile of 16 keys: K codes [16][head_dim + kCodeRowPad] bytes, V codes
// the same, then K scales [16] f32, V scales [16] f32.
//
// Scores S = Q·Kᵀ (f16 mma.m16n8k16): the dot product does not care in which order the
// dims are summed, so lane (g, q) of k-step kk takes the 4 codes of dims 16 kk + 4q ..
// + 3 of its key (one 32-bit shared load): bytes 0, 1 are B rows 2q, 2q + 1 and bytes 2,
// 3 rows 2q + 8, 2q + 9. Q's A fragment follows the same map (e4m3_q_dim).
//
// O += P·V (bf16 mma.m16n8k16): the keys are the k of the MMA, fixed by P's fragment
// (the scores' C layout); the dims are its columns, free to permute. For dims [32 m, 32 m
// + 32) lane (g, q) loads the 32-bit words at byte 32 m + 4 g of keys 2q, 2q + 1, 2q + 8
// and 2q + 9; byte e of those words makes the b0 / b1 pairs of column g of column block
// 4 m + e (a prmt of two words, e4m3_v_selector). So O column c of block nd holds dim
// e4m3_o_dim(nd, c), which the kernel maps back when it stores O.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define CELLM_E4M3_MAP_FN __host__ __device__ constexpr
#else
#define CELLM_E4M3_MAP_FN constexpr
#endif

namespace cellm::cuda::detail {

inline constexpr int kCodeRowPad = 16;  // bytes of padding per shared K/V code row

// Bytes between shared code rows: 16-byte aligned for cp.async; 36 or 20 words, so the
// 32 lanes' 32-bit loads of a fragment (rows g at word q, or rows 2q at word g) hit 32
// distinct banks.
template <int HD>
CELLM_E4M3_MAP_FN int code_row_bytes() {
  return HD + kCodeRowPad;
}

// The dim of Q (and K) that k index k (0..15) of k-step kk stands for.
CELLM_E4M3_MAP_FN int e4m3_q_dim(int kk, int k) {
  return 16 * kk + 4 * ((k % 8) / 2) + 2 * (k / 8) + k % 2;
}

// The dim that column c (0..7) of O's column block nd holds.
CELLM_E4M3_MAP_FN int e4m3_o_dim(int nd, int c) {
  return 32 * (nd / 4) + 4 * c + nd % 4;
}

// prmt.b32 selector taking byte e of its first word (key 2q or 2q + 8) into byte 0 and
// byte e of its second (key 2q + 1 or 2q + 9) into byte 2, each sign-replicated into the
// byte above: the two 16-bit halves are the bytes sign-extended, the first word's low.
CELLM_E4M3_MAP_FN uint32_t e4m3_v_selector(int e) {
  const auto b = static_cast<uint32_t>(e);
  return b | ((b | 8u) << 4) | ((b + 4u) << 8) | (((b + 4u) | 8u) << 12);
}

}  // namespace cellm::cuda::detail
