// Instruction models for the host emulations of cellm's tensor-core kernels
// (attention_mma_emulation_test.cpp, skinny_gemm_emulation_test.cpp), written from the
// PTX ISA: bf16 rounding, the e4m3 (float8_e4m3fn) decode, mma.m16n8k16 bf16 and
// mma.m16n8k32 e4m3 fragments, ldmatrix with and without .trans, cp.async 16-byte copies
// with zero fill in commit groups. Lane by lane, so a kernel's index arithmetic can be
// transcribed and run on machines without a GPU.
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace cellm::cuda::testing {

inline uint16_t to_bf16(float x) {  // round to nearest even; NaN stays NaN
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if (std::isnan(x)) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float from_bf16(uint16_t h) {
  const uint32_t u = uint32_t{h} << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
inline float lo_half(uint32_t w) {
  return from_bf16(static_cast<uint16_t>(w & 0xffffu));
}
inline float hi_half(uint32_t w) {
  return from_bf16(static_cast<uint16_t>(w >> 16));
}
inline uint32_t pack(float lo, float hi) {
  return uint32_t{to_bf16(lo)} | (uint32_t{to_bf16(hi)} << 16);
}

// The value of float8_e4m3fn code `code`: sign bit 7, exponent bits 6-3 with bias 7,
// mantissa bits 2-0; exponent 0 holds the subnormals m / 8 * 2^-6. The two NaN codes
// (0x7f, 0xff) are no value: the emulations never generate them.
inline float from_e4m3(uint8_t code) {
  if ((code & 0x7f) == 0x7f) ADD_FAILURE() << "e4m3 NaN code " << int{code};
  const int exponent = (code >> 3) & 0xf;
  const int mantissa = code & 0x7;
  const float magnitude = exponent == 0
                              ? std::ldexp(static_cast<float>(mantissa) / 8.f, -6)
                              : std::ldexp(1.f + static_cast<float>(mantissa) / 8.f, exponent - 7);
  return (code & 0x80) != 0 ? -magnitude : magnitude;
}
// Byte j of a fragment register (j = 0 the least significant) as e4m3.
inline float e4m3_byte(uint32_t w, int j) {
  return from_e4m3(static_cast<uint8_t>(w >> (8 * j)));
}

template <typename T>
using Lanes = std::array<T, 32>;
using Frag4 = Lanes<std::array<uint32_t, 4>>;
using Acc4 = Lanes<std::array<float, 4>>;

// The four registers of an ldmatrix.x4 result, each across the lanes: (0, 1) and (2, 3)
// are the B operands of two mma.m16n8k16.
inline std::array<Lanes<uint32_t>, 4> registers(const Frag4& f) {
  std::array<Lanes<uint32_t>, 4> r;
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 4; ++i) r[static_cast<size_t>(i)][lane] = f[lane][static_cast<size_t>(i)];
  }
  return r;
}

// The end of an m16n8kK MMA model: every element of A [16 x K] and B [K x 8] came from
// exactly one lane; D = A B summed exactly and rounded once; C += D in the fragment
// layout of C (lane 4 g + q: rows g, g + 8, columns 2q, 2q + 1).
template <int K>
void mma_finish(Acc4& acc, const float (&A)[16][K], const float (&B)[K][8],
                const int (&seen_a)[16][K], const int (&seen_b)[K][8]) {
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < K; ++j) EXPECT_EQ(seen_a[i][j], 1);
  }
  for (int i = 0; i < K; ++i) {
    for (int j = 0; j < 8; ++j) EXPECT_EQ(seen_b[i][j], 1);
  }
  float D[16][8];
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 8; ++j) {
      double s = 0;
      for (int k = 0; k < K; ++k) s += double{A[i][k]} * double{B[k][j]};
      D[i][j] = static_cast<float>(s);
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, q = lane % 4;
    acc[lane][0] += D[g][2 * q];
    acc[lane][1] += D[g][2 * q + 1];
    acc[lane][2] += D[g + 8][2 * q];
    acc[lane][3] += D[g + 8][2 * q + 1];
  }
}

// mma.m16n8k16.row.col.f32.bf16.bf16.f32, from the PTX ISA's fragment figures:
// A row g / g+8, columns 2q.. / 2q+8..; B rows (k) 2q.. / 2q+8.., column g; C rows g,
// g+8, columns 2q, 2q+1. Every element of A and B must come from exactly one lane.
inline void mma(Acc4& acc, const Frag4& a, const Lanes<uint32_t>& b0, const Lanes<uint32_t>& b1) {
  float A[16][16], B[16][8];
  int seen_a[16][16] = {}, seen_b[16][8] = {};
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, q = lane % 4;
    const int rows[4] = {g, g + 8, g, g + 8};
    const int cols[4] = {2 * q, 2 * q, 2 * q + 8, 2 * q + 8};
    for (int i = 0; i < 4; ++i) {
      A[rows[i]][cols[i]] = lo_half(a[lane][i]);
      A[rows[i]][cols[i] + 1] = hi_half(a[lane][i]);
      ++seen_a[rows[i]][cols[i]];
      ++seen_a[rows[i]][cols[i] + 1];
    }
    B[2 * q][g] = lo_half(b0[lane]);
    B[2 * q + 1][g] = hi_half(b0[lane]);
    B[2 * q + 8][g] = lo_half(b1[lane]);
    B[2 * q + 9][g] = hi_half(b1[lane]);
    ++seen_b[2 * q][g];
    ++seen_b[2 * q + 1][g];
    ++seen_b[2 * q + 8][g];
    ++seen_b[2 * q + 9][g];
  }
  mma_finish<16>(acc, A, B, seen_a, seen_b);
}

// mma.m16n8k32.row.col.f32.e4m3.e4m3.f32, from the PTX ISA's fragment figures ("Matrix
// Fragments for mma.m16n8k32", .e4m3), lane = 4 g + q, byte j of a register the j-th
// element of its 4: A: a0 row g, k 4q..4q+3; a1 row g+8, the same k; a2 row g, k
// 16+4q..16+4q+3; a3 row g+8, the same k. B: b0 k 4q..4q+3 of column g, b1 k
// 16+4q..16+4q+3 of column g. C as mma.m16n8k16's. The products of two e4m3 values are
// exact in f32; the 32 of an element are summed exactly and rounded once before the f32
// add. Every element of A and B must come from exactly one lane.
inline void mma_e4m3(Acc4& acc, const Frag4& a, const Lanes<uint32_t>& b0,
                     const Lanes<uint32_t>& b1) {
  float A[16][32] = {}, B[32][8] = {};
  int seen_a[16][32] = {}, seen_b[32][8] = {};
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, q = lane % 4;
    const int rows[4] = {g, g + 8, g, g + 8};
    const int cols[4] = {4 * q, 4 * q, 16 + 4 * q, 16 + 4 * q};
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 4; ++j) {
        A[rows[i]][cols[i] + j] = e4m3_byte(a[lane][static_cast<size_t>(i)], j);
        ++seen_a[rows[i]][cols[i] + j];
      }
    }
    for (int j = 0; j < 4; ++j) {
      B[4 * q + j][g] = e4m3_byte(b0[lane], j);
      B[16 + 4 * q + j][g] = e4m3_byte(b1[lane], j);
      ++seen_b[4 * q + j][g];
      ++seen_b[16 + 4 * q + j][g];
    }
  }
  mma_finish<32>(acc, A, B, seen_a, seen_b);
}

// ldmatrix.m8n8.x4.b16: lane 8 i + j addresses row j of matrix i (8 b16 at that
// element offset). Without .trans register i of lane l holds row l / 4, elements
// 2 (l % 4), +1; with .trans it holds (row 2 (l % 4), column l / 4) and (row
// 2 (l % 4) + 1, column l / 4). smem holds b16 elements; for byte operands (e4m3) element
// e is bytes 2e (low half) and 2e + 1 (high half), little-endian as shared memory is.
inline Frag4 ldmatrix_x4(const std::vector<uint16_t>& smem, const Lanes<int>& addr, bool trans) {
  Frag4 r;
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 4; ++i) {
      uint16_t lo, hi;
      if (!trans) {
        const int row = addr[8 * i + lane / 4];
        lo = smem.at(static_cast<size_t>(row + 2 * (lane % 4)));
        hi = smem.at(static_cast<size_t>(row + 2 * (lane % 4) + 1));
      } else {
        lo = smem.at(static_cast<size_t>(addr[8 * i + 2 * (lane % 4)] + lane / 4));
        hi = smem.at(static_cast<size_t>(addr[8 * i + 2 * (lane % 4) + 1] + lane / 4));
      }
      r[lane][i] = uint32_t{lo} | (uint32_t{hi} << 16);
    }
  }
  // Every address is a 16-byte aligned row.
  for (int lane = 0; lane < 32; ++lane) EXPECT_EQ(addr[lane] % 8, 0);
  return r;
}

// cp.async of 16 bytes (8 bf16) with zero fill; groups complete at wait_group.
struct CopyEngine {
  struct Copy {
    size_t dst;
    const uint16_t* src;  // nullptr: zero fill
  };
  std::vector<std::vector<Copy>> groups;
  std::vector<Copy> open;
  void copy(size_t dst, const uint16_t* src) { open.push_back({dst, src}); }
  void commit() {
    groups.push_back(open);
    open.clear();
  }
  void wait(size_t pending, std::vector<uint16_t>& smem) {
    while (groups.size() > pending) {
      for (const Copy& c : groups.front()) {
        for (int e = 0; e < 8; ++e) smem.at(c.dst + e) = c.src ? c.src[e] : uint16_t{0};
      }
      groups.erase(groups.begin());
    }
  }
};

}  // namespace cellm::cuda::testing
