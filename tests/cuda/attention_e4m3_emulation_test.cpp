// Host emulation of one tile step of the tensor-core attention over an e4m3 KV cache
// (fold_tile_e4m3 in src/cuda/kernels/attention_tile_e4m3.cuh, its maps in
// attention_e4m3_map.h), lane by lane on instruction models written from the PTX ISA
// (prmt.b32, cvt.f16x2.e4m3x2, fma.rn.bf16x2, mma.m16n8k16 with f16 and bf16 inputs):
//   - the V decode (prmt of two words, shift, mask, fma by 2^120) gives every e4m3 value
//     of every byte position exactly, signs of zero included;
//   - the scores' f16 fragments (K codes by 32-bit loads, Q in the same dim order) times
//     each key's scale equal the double dot product within f32 rounding (rel 2^-20 of
//     the sum of |terms|), Q rounded to f16 exactly (its bf16 values are f16 values);
//   - P·V with the V scale in the weight (two bf16 terms) and O's columns mapped back
//     (e4m3_o_dim) equals the double sum within 2^-15 of the sum of |terms|;
//   - the tiles of a chunk folded with the online softmax (K scale on the score, V scale on
//     the weight after it joined the sum) give the softmax of the decoded values within
//     1e-5 of the sum of |terms|;
//   - every 32-bit shared load of a fragment hits 32 distinct banks;
//   - the stage gathers (decode and prefill kernels) place every code and scale once.
// Runs without a GPU. When the kernel's index math changes, change it here too.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/kernels/attention_e4m3_map.h"
#include "mma_emulation.h"

namespace cellm::cuda {
namespace {

using detail::code_row_bytes;
using detail::e4m3_o_dim;
using detail::e4m3_q_dim;
using detail::e4m3_v_selector;
using testing::Acc4;
using testing::Frag4;
using testing::from_bf16;
using testing::from_e4m3;
using testing::Lanes;
using testing::to_bf16;

// IEEE binary16, round to nearest even (finite inputs inside its range).
uint16_t to_f16(float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const float a = std::fabs(x);
  EXPECT_LT(a, 65520.f);
  if (a < 0x1p-14f)
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(a * 0x1p24f)));
  int e = 0;
  const float f = std::frexp(a, &e);  // a = f 2^e, f in [0.5, 1)
  auto mant = static_cast<uint32_t>(std::nearbyint((2 * f - 1) * 1024));
  int exp = e - 1 + 15;
  if (mant == 1024) {
    mant = 0;
    ++exp;
  }
  return static_cast<uint16_t>(sign | (static_cast<uint32_t>(exp) << 10) | mant);
}
float from_f16(uint16_t h) {
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  const float mag = exp == 0 ? std::ldexp(static_cast<float>(mant), -24)
                             : std::ldexp(1.f + static_cast<float>(mant) / 1024.f, exp - 15);
  return (h & 0x8000) != 0 ? -mag : mag;
}

// prmt.b32 d, a, b, c (default mode): byte i of d is byte c[4i+2..4i] of {b, a} (a's
// bytes 0-3, b's 4-7), or, with bit 4i+3 of c set, that byte's sign bit replicated.
uint32_t prmt(uint32_t a, uint32_t b, uint32_t c) {
  const uint64_t bytes = uint64_t{a} | (uint64_t{b} << 32);
  uint32_t d = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t sel = (c >> (4 * i)) & 0xf;
    auto byte = static_cast<uint32_t>((bytes >> (8 * (sel & 7))) & 0xff);
    if ((sel & 8) != 0) byte = (byte & 0x80) != 0 ? 0xff : 0;
    d |= byte << (8 * i);
  }
  return d;
}
// fma.rn.bf16x2 d, a, 2^120, -0 on one half: exact products here (powers of two).
uint16_t times_2p120(uint16_t h) {
  return to_bf16(static_cast<float>(static_cast<double>(from_bf16(h)) * 0x1p120));
}
// The kernel's e4m3_pair_to_bf16x2<e>.
uint32_t pair_to_bf16x2(uint32_t lo_word, uint32_t hi_word, int e) {
  const uint32_t bits = (prmt(lo_word, hi_word, e4m3_v_selector(e)) << 4) & 0x87f087f0u;
  return uint32_t{times_2p120(static_cast<uint16_t>(bits & 0xffff))} |
         (uint32_t{times_2p120(static_cast<uint16_t>(bits >> 16))} << 16);
}
// cvt.rn.f16x2.e4m3x2 of the low 16 bits of `pair`: the low byte into the low half.
uint32_t e4m3x2_to_f16x2(uint32_t pair) {
  return uint32_t{to_f16(from_e4m3(static_cast<uint8_t>(pair)))} |
         (uint32_t{to_f16(from_e4m3(static_cast<uint8_t>(pair >> 8)))} << 16);
}

// mma.m16n8k16.row.col.f32.f16.f16.f32: mma_emulation.h's bf16 model with f16 halves.
void mma_f16(Acc4& acc, const Frag4& a, const Lanes<uint32_t>& b0, const Lanes<uint32_t>& b1) {
  float A[16][16], B[16][8];
  int seen_a[16][16] = {}, seen_b[16][8] = {};
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, q = lane % 4;
    const int rows[4] = {g, g + 8, g, g + 8};
    const int cols[4] = {2 * q, 2 * q, 2 * q + 8, 2 * q + 8};
    for (int i = 0; i < 4; ++i) {
      A[rows[i]][cols[i]] = from_f16(static_cast<uint16_t>(a[lane][i] & 0xffff));
      A[rows[i]][cols[i] + 1] = from_f16(static_cast<uint16_t>(a[lane][i] >> 16));
      ++seen_a[rows[i]][cols[i]];
      ++seen_a[rows[i]][cols[i] + 1];
    }
    B[2 * q][g] = from_f16(static_cast<uint16_t>(b0[lane] & 0xffff));
    B[2 * q + 1][g] = from_f16(static_cast<uint16_t>(b0[lane] >> 16));
    B[2 * q + 8][g] = from_f16(static_cast<uint16_t>(b1[lane] & 0xffff));
    B[2 * q + 9][g] = from_f16(static_cast<uint16_t>(b1[lane] >> 16));
    ++seen_b[2 * q][g];
    ++seen_b[2 * q + 1][g];
    ++seen_b[2 * q + 8][g];
    ++seen_b[2 * q + 9][g];
  }
  testing::mma_finish<16>(acc, A, B, seen_a, seen_b);
}

uint32_t load32(const std::vector<uint8_t>& smem, int offset) {
  EXPECT_EQ(offset % 4, 0);
  uint32_t w;
  std::memcpy(&w, smem.data() + offset, 4);
  return w;
}
// 32 lanes' 32-bit shared loads at these byte offsets hit 32 distinct banks.
void expect_distinct_banks(const Lanes<int>& offsets, const std::string& what) {
  std::array<int, 32> uses{};
  for (int off : offsets) ++uses[static_cast<size_t>((off / 4) % 32)];
  for (int u : uses) EXPECT_EQ(u, 1) << what;
}

uint8_t random_code(std::mt19937& rng) {
  for (;;) {
    const auto c = static_cast<uint8_t>(rng() & 0xff);
    if ((c & 0x7f) != 0x7f) return c;
  }
}

TEST(AttentionE4m3EmulationTest, TheVDecodeGivesEveryCodeExactlyAtEveryBytePosition) {
  for (int code = 0; code < 256; ++code) {
    const auto c = static_cast<uint8_t>(code);
    if ((c & 0x7f) == 0x7f) continue;
    const float want = from_e4m3(c);
    for (int e = 0; e < 4; ++e) {
      // The code at byte e of the first word (low half) and, with a neighbour, of the second.
      const uint32_t mine = uint32_t{c} << (8 * e);
      const uint32_t other = uint32_t{static_cast<uint8_t>(code ^ 0x35)} << (8 * e);
      const uint32_t lo = pair_to_bf16x2(mine, other, e);
      const uint32_t hi = pair_to_bf16x2(other, mine, e);
      EXPECT_EQ(testing::lo_half(lo), want) << "code " << code << " byte " << e;
      EXPECT_EQ(testing::hi_half(hi), want) << "code " << code << " byte " << e;
      EXPECT_EQ(std::signbit(testing::lo_half(lo)), std::signbit(want)) << "code " << code;
      // The other bytes of the words do not leak in.
      const uint32_t noisy = mine | (0x3b3b3b3bu & ~(0xffu << (8 * e)));
      EXPECT_EQ(testing::lo_half(pair_to_bf16x2(noisy, other, e)), want) << "code " << code;
    }
  }
}

// Q rows [16][HD] (rows past the group zero) as the f16 A fragments of the scores' k-steps,
// as the kernels' q_fragment_f16 builds them: dims 16 kk + 4q .. + 3 of rows g and g + 8.
template <int HD>
std::vector<Frag4> q_fragments(const std::vector<float>& qv, int group) {
  std::vector<Frag4> qa(HD / 16);
  for (int kk = 0; kk < HD / 16; ++kk) {
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, q = lane % 4;
      auto pair = [&](int row, int i) -> uint32_t {
        if (row >= group) return 0u;
        const float* x = qv.data() + row * HD + kk * 16 + 4 * q + i;
        return uint32_t{to_f16(x[0])} | (uint32_t{to_f16(x[1])} << 16);
      };
      qa[static_cast<size_t>(kk)][lane] = {pair(g, 0), pair(g + 8, 0), pair(g, 2), pair(g + 8, 2)};
    }
  }
  return qa;
}

// fold_tile_e4m3's scores: sc[nb] += the k-steps' f16 MMAs over the K codes of a stage.
template <int HD>
void tile_scores(const std::vector<uint8_t>& smem, const std::vector<Frag4>& qa, Acc4 (&sc)[2]) {
  constexpr int RB = code_row_bytes<HD>();
  for (int kk = 0; kk < HD / 16; ++kk) {
    for (int nb = 0; nb < 2; ++nb) {
      Lanes<uint32_t> b0, b1;
      Lanes<int> offsets;
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, q = lane % 4;
        offsets[lane] = (8 * nb + g) * RB + 16 * kk + 4 * q;
        const uint32_t word = load32(smem, offsets[lane]);
        b0[lane] = e4m3x2_to_f16x2(word);
        b1[lane] = e4m3x2_to_f16x2(word >> 16);
      }
      expect_distinct_banks(offsets, "K fragment loads");
      mma_f16(sc[nb], qa[static_cast<size_t>(kk)], b0, b1);
    }
  }
}

// Each lane's weights p[nb][c] (C layout: row g + 8 (c / 2), key 8 nb + 2q + (c & 1)) as
// P's A fragments: hi = bf16(p), lo = bf16(p - hi).
void weight_fragments(const Lanes<std::array<std::array<float, 4>, 2>>& p, Frag4& pa, Frag4& pl) {
  for (int lane = 0; lane < 32; ++lane) {
    float x[2][4], res[2][4];
    for (int nb = 0; nb < 2; ++nb) {
      for (int c = 0; c < 4; ++c) {
        x[nb][c] = p[lane][static_cast<size_t>(nb)][static_cast<size_t>(c)];
        res[nb][c] = x[nb][c] - from_bf16(to_bf16(x[nb][c]));
      }
    }
    pa[lane] = {testing::pack(x[0][0], x[0][1]), testing::pack(x[0][2], x[0][3]),
                testing::pack(x[1][0], x[1][1]), testing::pack(x[1][2], x[1][3])};
    pl[lane] = {testing::pack(res[0][0], res[0][1]), testing::pack(res[0][2], res[0][3]),
                testing::pack(res[1][0], res[1][1]), testing::pack(res[1][2], res[1][3])};
  }
}

// fold_tile_e4m3's P·V: o[4 m + e] += P · (V by prmt of the words of keys 2q, 2q + 1, 2q + 8,
// 2q + 9 at byte 32 m + 4 g of the stage's V codes), both bf16 terms of P.
template <int HD>
void tile_pv(const std::vector<uint8_t>& smem, const Frag4& pa, const Frag4& pl,
             std::vector<Acc4>& o) {
  constexpr int RB = code_row_bytes<HD>();
  for (int m = 0; m < HD / 32; ++m) {
    Lanes<uint32_t> w0, w1, w2, w3;
    Lanes<int> offsets;
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, q = lane % 4;
      const int col = 16 * RB + 32 * m + 4 * g;
      offsets[lane] = col + 2 * q * RB;
      w0[lane] = load32(smem, col + 2 * q * RB);
      w1[lane] = load32(smem, col + (2 * q + 1) * RB);
      w2[lane] = load32(smem, col + (2 * q + 8) * RB);
      w3[lane] = load32(smem, col + (2 * q + 9) * RB);
    }
    expect_distinct_banks(offsets, "V fragment loads");
    for (int e = 0; e < 4; ++e) {
      Lanes<uint32_t> b0, b1;
      for (int lane = 0; lane < 32; ++lane) {
        b0[lane] = pair_to_bf16x2(w0[lane], w1[lane], e);
        b1[lane] = pair_to_bf16x2(w2[lane], w3[lane], e);
      }
      testing::mma(o[static_cast<size_t>(4 * m + e)], pa, b0, b1);
      testing::mma(o[static_cast<size_t>(4 * m + e)], pl, b0, b1);
    }
  }
}

// O's fragments back in dim order (e4m3_o_dim): [16][HD].
template <int HD>
std::vector<float> o_rows(const std::vector<Acc4>& o) {
  std::vector<float> out(16 * HD, NAN);
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, q = lane % 4;
    for (int nd = 0; nd < HD / 8; ++nd) {
      for (int c = 0; c < 4; ++c) {
        const int row = g + 8 * (c / 2);
        out[static_cast<size_t>(row * HD + e4m3_o_dim(nd, 2 * q + (c & 1)))] =
            o[static_cast<size_t>(nd)][lane][static_cast<size_t>(c)];
      }
    }
  }
  return out;
}

template <int HD>
void check_tile(uint32_t seed, int group) {
  constexpr int RB = code_row_bytes<HD>();
  constexpr int KS = HD / 16;
  constexpr int ND = HD / 8;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> unit(-1.f, 1.f);
  // The stage: K codes [16][RB], V codes [16][RB] (padding poisoned), as the kernel's.
  std::vector<uint8_t> smem(2 * 16 * RB, 0x7f);
  float k_scale[16], v_scale[16];
  for (int key = 0; key < 16; ++key) {
    for (int d = 0; d < HD; ++d) {
      smem[static_cast<size_t>(key * RB + d)] = random_code(rng);
      smem[static_cast<size_t>((16 + key) * RB + d)] = random_code(rng);
    }
    k_scale[key] = std::ldexp(1.f, static_cast<int>(rng() % 13) - 9);
    v_scale[key] = std::ldexp(1.f, static_cast<int>(rng() % 13) - 9);
  }
  auto k_val = [&](int key, int d) { return from_e4m3(smem[static_cast<size_t>(key * RB + d)]); };
  auto v_val = [&](int key, int d) {
    return from_e4m3(smem[static_cast<size_t>((16 + key) * RB + d)]);
  };
  // Q rows as bf16 values (rows past the group zero), and the softmax weights of the tile.
  std::vector<float> qv(16 * HD, 0.f);
  for (int h = 0; h < group; ++h) {
    for (int d = 0; d < HD; ++d)
      qv[static_cast<size_t>(h * HD + d)] = from_bf16(to_bf16(unit(rng) * 8));
  }
  float w[16][16];
  for (auto& row : w) {
    for (float& x : row) x = std::fabs(unit(rng));
  }

  // Scores: the kernel's k-steps, lane by lane.
  Acc4 sc[2] = {};
  tile_scores<HD>(smem, q_fragments<HD>(qv, group), sc);
  size_t bad = 0;
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, q = lane % 4;
    for (int nb = 0; nb < 2; ++nb) {
      for (int c = 0; c < 4; ++c) {
        const int row = g + 8 * (c / 2), key = 8 * nb + 2 * q + (c & 1);
        const float got = sc[nb][lane][static_cast<size_t>(c)] * k_scale[key];
        double want = 0, mag = 0;
        for (int d = 0; d < HD; ++d) {
          const double t = double{qv[static_cast<size_t>(row * HD + d)]} * k_val(key, d);
          want += t;
          mag += std::fabs(t);
        }
        want *= k_scale[key];
        mag *= k_scale[key];
        if (std::fabs(got - want) > 0x1p-20 * mag) ++bad;
      }
    }
  }
  EXPECT_EQ(bad, 0u) << "scores, head_dim " << HD << " group " << group;
  // e4m3_q_dim names the dims the fragments took: every dim once per k-step's 16.
  for (int kk = 0; kk < KS; ++kk) {
    std::array<int, 16> seen{};
    for (int k = 0; k < 16; ++k) ++seen[static_cast<size_t>(e4m3_q_dim(kk, k) - 16 * kk)];
    for (int s : seen) EXPECT_EQ(s, 1);
  }

  // P·V: the weight times the key's V scale as two bf16 terms, V by prmt, O mapped back.
  Lanes<std::array<std::array<float, 4>, 2>> p;
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, q = lane % 4;
    for (int nb = 0; nb < 2; ++nb) {
      for (int c = 0; c < 4; ++c) {
        const int key = 8 * nb + 2 * q + (c & 1);
        p[lane][static_cast<size_t>(nb)][static_cast<size_t>(c)] =
            w[g + 8 * (c / 2)][key] * v_scale[key];
      }
    }
  }
  Frag4 pa, pl;
  weight_fragments(p, pa, pl);
  std::vector<Acc4> o(ND);
  for (Acc4& acc : o) acc = {};
  tile_pv<HD>(smem, pa, pl, o);
  const std::vector<float> out = o_rows<HD>(o);
  bad = 0;
  for (int row = 0; row < 16; ++row) {
    for (int d = 0; d < HD; ++d) {
      double want = 0, mag = 0;
      for (int key = 0; key < 16; ++key) {
        const double t = double{w[row][key]} * v_scale[key] * v_val(key, d);
        want += t;
        mag += std::fabs(t);
      }
      const float got = out[static_cast<size_t>(row * HD + d)];
      if (!(std::fabs(got - want) <= 0x1p-15 * mag)) ++bad;
    }
  }
  EXPECT_EQ(bad, 0u) << "P·V, head_dim " << HD << " group " << group;
}

TEST(AttentionE4m3EmulationTest, ScoresAndWeightedValuesOfATileMatchTheDefinition) {
  for (int group : {1, 4, 8, 16}) {
    check_tile<64>(11u + static_cast<uint32_t>(group), group);
    check_tile<128>(29u + static_cast<uint32_t>(group), group);
  }
}

// fold_tile_e4m3 over the tiles of n_keys keys (the last one partial: its keys past the
// chunk zero-filled, scale 0, masked), transcribed lane by lane with its online softmax
// (log2 domain, the K scale on the score, the V scale on the weight after the running
// sum), then O / sum against the double softmax of the decoded values.
template <int HD>
void check_fold(uint32_t seed, int group, int n_keys) {
  constexpr int RB = code_row_bytes<HD>();
  constexpr int ND = HD / 8;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> unit(-1.f, 1.f);
  const int n_tiles = (n_keys + 15) / 16;
  std::vector<uint8_t> kc(static_cast<size_t>(n_keys * HD)), vc(kc.size());
  std::vector<float> ks(static_cast<size_t>(n_keys)), vs(ks.size());
  for (uint8_t& c : kc) c = random_code(rng);
  for (uint8_t& c : vc) c = random_code(rng);
  for (float& x : ks) x = std::ldexp(1.f, static_cast<int>(rng() % 6) - 10);
  for (float& x : vs) x = std::ldexp(1.f, static_cast<int>(rng() % 13) - 9);
  std::vector<float> qv(16 * HD, 0.f);
  for (int h = 0; h < group; ++h) {
    for (int d = 0; d < HD; ++d) {
      qv[static_cast<size_t>(h * HD + d)] = from_bf16(to_bf16(unit(rng) * 3));
    }
  }
  const float scale = 1.f / std::sqrt(static_cast<float>(HD));
  const float q_scale = scale * 1.4426950408889634f;  // kLog2e
  const std::vector<Frag4> qa = q_fragments<HD>(qv, group);

  Lanes<std::array<float, 2>> m, l;
  for (int lane = 0; lane < 32; ++lane) {
    m[lane] = {-INFINITY, -INFINITY};
    l[lane] = {0.f, 0.f};
  }
  std::vector<Acc4> o(ND);
  for (Acc4& acc : o) acc = {};
  for (int t = 0; t < n_tiles; ++t) {
    // The stage as the gather leaves it: K codes, V codes, K scales, V scales.
    std::vector<uint8_t> smem(2 * 16 * RB, 0x7f);
    float k_scale[16], v_scale[16];
    for (int key = 0; key < 16; ++key) {
      const int j = 16 * t + key;
      for (int d = 0; d < HD; ++d) {
        smem[static_cast<size_t>(key * RB + d)] =
            j < n_keys ? kc[static_cast<size_t>(j * HD + d)] : 0;
        smem[static_cast<size_t>((16 + key) * RB + d)] =
            j < n_keys ? vc[static_cast<size_t>(j * HD + d)] : 0;
      }
      k_scale[key] = j < n_keys ? ks[static_cast<size_t>(j)] : 0.f;
      v_scale[key] = j < n_keys ? vs[static_cast<size_t>(j)] : 0.f;
    }
    Acc4 sc[2] = {};
    tile_scores<HD>(smem, qa, sc);
    Lanes<std::array<float, 2>> tile_max;
    for (int lane = 0; lane < 32; ++lane) {
      const int q = lane % 4;
      tile_max[lane] = {-INFINITY, -INFINITY};
      for (int nb = 0; nb < 2; ++nb) {
        for (int c = 0; c < 4; ++c) {
          const int key = 8 * nb + 2 * q + (c & 1);
          float& x = sc[nb][lane][static_cast<size_t>(c)];
          x = 16 * t + key < n_keys ? x * k_scale[key] * q_scale : -INFINITY;
          tile_max[lane][static_cast<size_t>(c / 2)] =
              std::max(tile_max[lane][static_cast<size_t>(c / 2)], x);
        }
      }
    }
    Lanes<std::array<std::array<float, 4>, 2>> p;
    for (int lane = 0; lane < 32; ++lane) {
      const int q = lane % 4, quad = lane - q;
      float corr[2];
      for (size_t i = 0; i < 2; ++i) {
        float qmax = -INFINITY;
        for (int k = 0; k < 4; ++k) qmax = std::max(qmax, tile_max[quad + k][i]);
        const float m_new = std::max(m[lane][i], qmax);
        corr[i] = std::exp2(m[lane][i] - m_new);
        m[lane][i] = m_new;
        l[lane][i] *= corr[i];
      }
      for (int nb = 0; nb < 2; ++nb) {
        for (int c = 0; c < 4; ++c) {
          const int key = 8 * nb + 2 * q + (c & 1);
          const float w =
              std::exp2(sc[nb][lane][static_cast<size_t>(c)] - m[lane][static_cast<size_t>(c / 2)]);
          l[lane][static_cast<size_t>(c / 2)] += w;
          p[lane][static_cast<size_t>(nb)][static_cast<size_t>(c)] = w * v_scale[key];
        }
      }
      for (int nd = 0; nd < ND; ++nd) {
        for (int c = 0; c < 4; ++c)
          o[static_cast<size_t>(nd)][lane][static_cast<size_t>(c)] *= corr[c / 2];
      }
    }
    Frag4 pa, pl;
    weight_fragments(p, pa, pl);
    tile_pv<HD>(smem, pa, pl, o);
  }
  const std::vector<float> out = o_rows<HD>(o);
  size_t bad = 0;
  for (int row = 0; row < group; ++row) {
    // This row's sum: lanes 4 (row % 8) .. + 3, index row / 8.
    float sum = 0.f;
    for (int k = 0; k < 4; ++k) sum += l[4 * (row % 8) + k][static_cast<size_t>(row / 8)];
    std::vector<double> sd(static_cast<size_t>(n_keys));
    double mx = -INFINITY;
    for (int j = 0; j < n_keys; ++j) {
      double dot = 0;
      for (int d = 0; d < HD; ++d) {
        dot += double{qv[static_cast<size_t>(row * HD + d)]} *
               from_e4m3(kc[static_cast<size_t>(j * HD + d)]);
      }
      sd[static_cast<size_t>(j)] = dot * ks[static_cast<size_t>(j)] * scale;
      mx = std::max(mx, sd[static_cast<size_t>(j)]);
    }
    double z = 0;
    for (double& x : sd) z += (x = std::exp(x - mx));
    for (int d = 0; d < HD; ++d) {
      double want = 0, mag = 0;
      for (int j = 0; j < n_keys; ++j) {
        const double t = sd[static_cast<size_t>(j)] / z * vs[static_cast<size_t>(j)] *
                         from_e4m3(vc[static_cast<size_t>(j * HD + d)]);
        want += t;
        mag += std::fabs(t);
      }
      const float got = out[static_cast<size_t>(row * HD + d)] / sum;
      if (!(std::fabs(got - want) <= 1e-5 * mag + 1e-30)) ++bad;
    }
  }
  EXPECT_EQ(bad, 0u) << "fold, head_dim " << HD << " group " << group << " keys " << n_keys;
}

TEST(AttentionE4m3EmulationTest, FoldedTilesMatchTheSoftmaxOfTheDecodedValues) {
  for (int group : {1, 4, 8, 16}) {
    for (int n_keys : {1, 16, 41}) {
      check_fold<64>(100u + static_cast<uint32_t>(group * 7 + n_keys), group, n_keys);
      check_fold<128>(200u + static_cast<uint32_t>(group * 7 + n_keys), group, n_keys);
    }
  }
}

// The gathers of a stage (attention_mma.cu's load_tile_e4m3: 32 lanes, 16 keys;
// attention_prefill.cu's load_stage_e4m3: 128 threads, 64 keys), transcribed: every code of
// every key that lies in range lands at its place of the stage (K codes, V codes, K
// scales, V scales, attention_e4m3_map.h), keys out of range read as zeros, and the row
// padding is never written.
template <int HD>
void check_gather(int stage_keys, uint32_t seed) {
  constexpr int RB = code_row_bytes<HD>();
  constexpr int kChunks = HD / 16;
  const int n_kv_heads = 3, kv_head = 2, max_cells = 200;
  std::mt19937 rng(seed);
  std::vector<uint8_t> k_codes(static_cast<size_t>(max_cells * n_kv_heads * HD)),
      v_codes(k_codes.size());
  for (uint8_t& c : k_codes) c = random_code(rng);
  for (uint8_t& c : v_codes) c = random_code(rng);
  std::vector<float> k_scales(static_cast<size_t>(max_cells * n_kv_heads)),
      v_scales(k_scales.size());
  for (float& x : k_scales) x = std::ldexp(1.f, static_cast<int>(rng() % 20) - 10);
  for (float& x : v_scales) x = std::ldexp(1.f, static_cast<int>(rng() % 20) - 10);
  // Keys [0, valid) name distinct cells; the rest lie past the chunk (cell -1).
  const int valid = 1 + static_cast<int>(rng() % static_cast<uint32_t>(stage_keys));
  std::vector<int> cell(static_cast<size_t>(stage_keys), -1);
  for (int k = 0; k < valid; ++k) cell[static_cast<size_t>(k)] = (k * 37 + 11) % max_cells;

  const size_t code_bytes = static_cast<size_t>(2 * stage_keys * RB);
  std::vector<uint8_t> smem(code_bytes, 0xee);
  std::vector<float> scales(static_cast<size_t>(2 * stage_keys), NAN);
  std::vector<int> writes(code_bytes, 0);
  const int64_t cell_stride = int64_t{n_kv_heads} * HD;
  auto copy16 = [&](int key, int col) {  // cp_async16 of K and V, zero fill past the chunk
    const int c = cell[static_cast<size_t>(key)];
    for (int b = 0; b < 16; ++b) {
      const auto src = static_cast<size_t>(int64_t{c < 0 ? 0 : c} * cell_stride +
                                           int64_t{kv_head} * HD + col + b);
      const auto kd = static_cast<size_t>(key * RB + col + b);
      const auto vd = static_cast<size_t>((stage_keys + key) * RB + col + b);
      smem[kd] = c < 0 ? uint8_t{0} : k_codes[src];
      smem[vd] = c < 0 ? uint8_t{0} : v_codes[src];
      ++writes[kd];
      ++writes[vd];
    }
  };
  auto copy4 = [&](int slot, int key) {  // cp_async4 of slot's scale (K below stage_keys)
    const int c = cell[static_cast<size_t>(key)];
    const auto at = static_cast<size_t>(int64_t{c < 0 ? 0 : c} * n_kv_heads + kv_head);
    scales.at(static_cast<size_t>(slot)) =
        c < 0 ? 0.f : (slot < stage_keys ? k_scales : v_scales)[at];
  };
  if (stage_keys == 16) {
    constexpr int kRowsPerPass = 32 / kChunks;
    for (int lane = 0; lane < 32; ++lane) {
      for (int pass = 0; pass < 16 / kRowsPerPass; ++pass) {
        copy16(pass * kRowsPerPass + lane / kChunks, (lane % kChunks) * 16);
      }
      copy4(lane, lane % 16);
    }
  } else {
    for (int t = 0; t < 128; ++t) {
      for (int c = t; c < stage_keys * kChunks; c += 128) copy16(c / kChunks, (c % kChunks) * 16);
      copy4(t, t % stage_keys);
    }
  }
  size_t bad = 0;
  for (int key = 0; key < stage_keys; ++key) {
    const int c = cell[static_cast<size_t>(key)];
    for (int d = 0; d < RB; ++d) {
      const auto kd = static_cast<size_t>(key * RB + d);
      const auto vd = static_cast<size_t>((stage_keys + key) * RB + d);
      if (d >= HD) {
        bad += (writes[kd] != 0) + (writes[vd] != 0);
        continue;
      }
      bad += (writes[kd] != 1) + (writes[vd] != 1);
      const auto src = static_cast<size_t>(int64_t{c} * cell_stride + int64_t{kv_head} * HD + d);
      bad += smem[kd] != (c < 0 ? 0 : k_codes[c < 0 ? 0 : src]);
      bad += smem[vd] != (c < 0 ? 0 : v_codes[c < 0 ? 0 : src]);
    }
    const auto at = static_cast<size_t>(int64_t{c < 0 ? 0 : c} * n_kv_heads + kv_head);
    bad += scales[static_cast<size_t>(key)] != (c < 0 ? 0.f : k_scales[at]);
    bad += scales[static_cast<size_t>(stage_keys + key)] != (c < 0 ? 0.f : v_scales[at]);
  }
  EXPECT_EQ(bad, 0u) << "head_dim " << HD << ", " << stage_keys << " keys a stage, " << valid
                     << " in range";
}

TEST(AttentionE4m3EmulationTest, StageGathersPlaceEveryCodeAndScaleOnce) {
  for (uint32_t seed = 1; seed <= 8; ++seed) {
    check_gather<64>(16, seed);
    check_gather<128>(16, seed);
    check_gather<64>(64, seed);
    check_gather<128>(64, seed);
  }
}

}  // namespace
}  // namespace cellm::cuda
