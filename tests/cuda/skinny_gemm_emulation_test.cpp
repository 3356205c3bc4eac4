// Host emulation of the skinny GEMM (src/cuda/kernels/skinny_gemm.cu), lane by lane, for
// both operand types: bf16 (launch_skinny_gemm) and e4m3 (launch_skinny_gemm_e4m3). The
// TMA boxes written into shared memory with the 128-byte swizzle (16-byte chunk c of box
// row r at chunk c ^ (r % 8); rows past the matrix zero; a box row is 128 bytes, 64 bf16
// or 128 e4m3 columns), the consumer warps' ldmatrix addresses and mma.m16n8k16 (bf16) or
// mma.m16n8k32 (e4m3) fragments transcribed from the kernel and run on the instruction
// models of mma_emulation.h (or, for the sm_90a build, the warpgroups' wgmma descriptors
// read through a model of the descriptor and their D registers mapped onto the same
// sums), e4m3's per-box partial sums added to the f32 sums, the split over k and the
// cluster's sum of the splits' partial sums in split order, and the epilogue (bf16: +
// bias; e4m3: fmaf(sum, x_scale * w_scale, bias)), compared with a double reference. It
// checks the swizzle, the fragment layouts and the tile, stage and split bookkeeping on
// machines without a GPU (not the mbarrier pipeline: the order in which stages land
// changes no sum). When the kernel's index math changes, change it here too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda/kernels/skinny_gemm.h"
#include "mma_emulation.h"
#include "model/fp8.h"

namespace cellm::cuda {
namespace {

using testing::Acc4;
using testing::from_bf16;
using testing::from_e4m3;
using testing::Lanes;
using testing::ldmatrix_x4;
using testing::mma;
using testing::mma_e4m3;
using testing::registers;
using testing::to_bf16;

// The operand types of the kernel: launch_skinny_gemm's bf16 and
// launch_skinny_gemm_e4m3's float8_e4m3fn codes.
enum class Operand { kBf16, kE4m3 };

// The kernel's constants (skinny_gemm.cu); its warps and rows a block follow m. A box row
// is 128 bytes whatever the operand type; a stage is kBoxes boxes side by side.
constexpr int kRowBytes = 128;
constexpr int kBoxes = 2;
constexpr int element_bytes(Operand op) {
  return op == Operand::kE4m3 ? 1 : 2;
}
constexpr int box_cols(Operand op) {
  return kRowBytes / element_bytes(op);
}
constexpr int stage_cols(Operand op) {
  return kBoxes * box_cols(op);
}
static_assert(stage_cols(Operand::kBf16) == kSkinnyKStep);
static_assert(stage_cols(Operand::kE4m3) == kSkinnyE4m3KStep);

int swizzled(int row, int chunk) {  // bytes, as the kernel's
  return row * kRowBytes + ((chunk ^ (row & 7)) << 4);
}

// Shared memory is held as b16 elements (the ldmatrix model's unit): byte b is the low
// (b even) or high half of element b / 2, little-endian.
uint8_t smem_byte(const std::vector<uint16_t>& smem, size_t b) {
  return static_cast<uint8_t>(smem.at(b / 2) >> (8 * (b % 2)));
}
void set_smem_byte(std::vector<uint16_t>& smem, size_t b, uint8_t v) {
  uint16_t& e = smem.at(b / 2);
  const int shift = static_cast<int>(8 * (b % 2));
  e = static_cast<uint16_t>((e & ~(0xff << shift)) | (v << shift));
}

// The value of the element whose bytes start at p.
float element_value(Operand op, const uint8_t* p) {
  return op == Operand::kE4m3 ? from_e4m3(p[0])
                              : from_bf16(static_cast<uint16_t>(p[0] | (p[1] << 8)));
}

// A TMA box of `box_rows` rows x 128 bytes of the row-major matrix src [rows, cols] (bytes,
// element_bytes(op) an element, little-endian) at (column col, row), into smem from byte
// `at`; zeros past rows. The 128-byte swizzle as the hardware applies it to a box's byte
// offsets (from a 1024-byte aligned start): bits 4-6 XOR bits 7-9
// (CU_TENSOR_MAP_SWIZZLE_128B), written apart from the kernel's `swizzled` so that a
// mistake there shows.
void tma_box(std::vector<uint16_t>& smem, size_t at, const std::vector<uint8_t>& src, int64_t rows,
             int64_t cols, int col, int64_t row, int box_rows, Operand op) {
  const int eb = element_bytes(op);
  EXPECT_EQ(at % 1024, 0u);
  EXPECT_LE(col + box_cols(op), cols);
  for (int r = 0; r < box_rows; ++r) {
    for (int c = 0; c < kRowBytes; ++c) {
      const int64_t src_row = row + r;
      const uint8_t v =
          src_row < rows ? src[static_cast<size_t>((src_row * cols + col) * eb + c)] : uint8_t{0};
      const int linear = r * kRowBytes + c;
      const int byte = linear ^ (((linear >> 7) & 7) << 4);
      set_smem_byte(smem, at + static_cast<size_t>(byte), v);
    }
  }
}

struct Case {
  Case(int64_t m_, int64_t n_, int64_t k_, int splits_, Operand op_ = Operand::kBf16,
       bool with_bias_ = false)
      : m(m_), n(n_), k(k_), splits(splits_), op(op_), with_bias(with_bias_) {}
  int64_t m, n, k;
  int splits;
  Operand op;
  bool with_bias;
  std::vector<uint8_t> x, w;            // [m, k], [n, k]: element_bytes(op) bytes an element
  std::vector<float> x_scale, w_scale;  // e4m3: [m], [n]
  std::vector<uint16_t> bias;           // bf16 [n], when with_bias
};

// The consumers' two ways to multiply a stage (wgmma on sm_90a, else mma.sync).
enum class Consumer { kMmaSync, kWgmma };

// The value of element (r, c) of a K-major wgmma operand whose descriptor starts at byte
// `start` of shared memory (128-byte swizzle, 1024 bytes from one 8-row group to the
// next), as the tensor cores address it: the row's bytes laid out unswizzled from the
// start, then the swizzle applied to the address (16-byte chunk bits 4-6 XOR bits 7-9;
// every 8-row group starts 1024-byte aligned). Written from the PTX ISA's description of
// the descriptor, apart from the TMA model above.
float wgmma_element(const std::vector<uint16_t>& smem, int start, int r, int c, Operand op) {
  const int eb = element_bytes(op);
  const int linear = start + (r / 8) * 1024 + (r % 8) * 128 + eb * c;
  const int byte = linear ^ (((linear >> 7) & 7) << 4);
  uint8_t bytes[2] = {};
  for (int e = 0; e < eb; ++e) bytes[e] = smem_byte(smem, static_cast<size_t>(byte + e));
  return element_value(op, bytes);
}

// Output (x row i, weight row j) before its rounding to TOut, from its sum v, as the
// kernel's `finish`: bf16 operands add the bias; e4m3 ones fmaf(v, x_scale[i] *
// w_scale[j], bias or 0), the scale product and the fma each rounded once.
float finish(const Case& c, int64_t i, int64_t j, float v) {
  const float bias = c.with_bias ? from_bf16(c.bias[static_cast<size_t>(j)]) : 0.f;
  if (c.op == Operand::kE4m3) {
    const float s = c.x_scale[static_cast<size_t>(i)] * c.w_scale[static_cast<size_t>(j)];
    return std::fma(v, s, bias);
  }
  return c.with_bias ? v + bias : v;
}

// y [m, n] as the kernel computes it: every (tile, split) block, then the cluster's sum of
// the splits in split order and the epilogue.
std::vector<float> emulate(const Case& c, Consumer consumer) {
  const bool e4m3 = c.op == Operand::kE4m3;
  const int mt = c.m <= 16 ? 2 : c.m <= 32 ? 4 : c.m <= 64 ? 8 : 16;
  EXPECT_LE(c.m, e4m3 ? kSkinnyE4m3MaxRows : kSkinnyMaxRows);
  const int kBoxCols = box_cols(c.op);
  const int kStageCols = stage_cols(c.op);
  const int kBlockRows = static_cast<int>(skinny_gemm_block_rows(c.m));
  const int kConsumers = kBlockRows / 16;
  const int kWeightBoxBytes = kBlockRows * kRowBytes;
  const int kXBoxBytes = 8 * mt * kRowBytes;
  const int kWeightBytes = kBoxes * kWeightBoxBytes;
  const int k_stages = static_cast<int>(c.k / kStageCols);
  const int split_stages = (k_stages + c.splits - 1) / c.splits;
  const int splits = (k_stages + split_stages - 1) / split_stages;
  const int64_t tiles = (c.n + kBlockRows - 1) / kBlockRows;
  std::vector<float> partials(static_cast<size_t>(splits * c.m * c.n), 0.f);
  const size_t stage_elems = static_cast<size_t>(kWeightBytes + kBoxes * kXBoxBytes) / 2;
  std::vector<uint16_t> smem(stage_elems);
  // Per consumer warp, per x tile: the f32 sums (acc) and, for e4m3, a box's partial sums
  // (part).
  using WarpSums = std::vector<std::vector<Acc4>>;
  const auto tiles_of = [&](float v) {
    std::vector<Acc4> s(static_cast<size_t>(mt));
    for (Acc4& a : s) {
      for (auto& lane : a) lane = {v, v, v, v};
    }
    return s;
  };
  const auto filled = [&](float v) {
    return WarpSums(static_cast<size_t>(kConsumers), tiles_of(v));
  };
  const auto add = [&](std::vector<Acc4>& acc, const std::vector<Acc4>& part) {
    for (size_t t = 0; t < acc.size(); ++t) {
      for (int lane = 0; lane < 32; ++lane) {
        for (size_t e = 0; e < 4; ++e) acc[t][lane][e] += part[t][lane][e];
      }
    }
  };
  for (int64_t tile = 0; tile < tiles; ++tile) {
    const int64_t row0 = tile * kBlockRows;
    for (int split = 0; split < splits; ++split) {
      const int first = split * split_stages;
      const int n_stages = std::min(split_stages, k_stages - first);
      WarpSums acc = filled(0.f);
      for (int s = 0; s < n_stages; ++s) {
        for (int box = 0; box < kBoxes; ++box) {
          const int col = (first + s) * kStageCols + box * kBoxCols;
          tma_box(smem, static_cast<size_t>(box * kWeightBoxBytes), c.w, c.n, c.k, col, row0,
                  kBlockRows, c.op);
          tma_box(smem, static_cast<size_t>(kWeightBytes + box * kXBoxBytes), c.x, c.m, c.k, col, 0,
                  8 * mt, c.op);
        }
        if (consumer == Consumer::kWgmma) {
          // Warpgroup `group` (warps 4 group .. 4 group + 3): D[64 x 8 mt] (+)= its 64 weight
          // rows x the x rows, one 32-byte slice (k16 bf16, k32 e4m3) at a time from
          // descriptors 32 kk bytes on; D[r][n] is register (j = n / 8, (r % 16) / 8 * 2 +
          // n % 2) of lane 4 (r % 8) + (n % 8) / 2 of warp 4 group + (r % 64) / 16. bf16's
          // D is acc; e4m3's is part, which the box's first step overwrites (scale-d 0: the
          // kernel's part is unset before it, here NaN) and the others add to, then acc +=
          // part.
          const int step_cols = 32 / element_bytes(c.op);
          for (int group = 0; group < kConsumers / 4; ++group) {
            for (int box = 0; box < kBoxes; ++box) {
              WarpSums part = filled(std::numeric_limits<float>::quiet_NaN());
              WarpSums& d = e4m3 ? part : acc;
              for (int kk = 0; kk < kRowBytes / 32; ++kk) {
                const bool accumulate = !e4m3 || kk != 0;
                const int a_start = box * kWeightBoxBytes + group * 64 * kRowBytes + 32 * kk;
                const int b_start = kWeightBytes + box * kXBoxBytes + 32 * kk;
                // The step's operands as the tensor cores read them: A [64 x step_cols],
                // B [8 mt x step_cols].
                float A[64][32], B[128][32];
                for (int col = 0; col < step_cols; ++col) {
                  for (int r = 0; r < 64; ++r) {
                    A[r][col] = wgmma_element(smem, a_start, r, col, c.op);
                  }
                  for (int n = 0; n < 8 * mt; ++n) {
                    B[n][col] = wgmma_element(smem, b_start, n, col, c.op);
                  }
                }
                for (int r = 0; r < 64; ++r) {
                  for (int n = 0; n < 8 * mt; ++n) {
                    float sum = 0.f;
                    for (int col = 0; col < step_cols; ++col) sum += A[r][col] * B[n][col];
                    const int warp = 4 * group + r / 16;
                    const int lane = 4 * (r % 8) + (n % 8) / 2;
                    const int reg = ((r % 16) / 8) * 2 + n % 2;
                    float& dst = d[static_cast<size_t>(warp)][static_cast<size_t>(n / 8)][lane]
                                  [static_cast<size_t>(reg)];
                    dst = accumulate ? dst + sum : sum;
                  }
                }
              }
              if (e4m3) {
                for (int warp = 4 * group; warp < 4 * group + 4; ++warp) {
                  add(acc[static_cast<size_t>(warp)], part[static_cast<size_t>(warp)]);
                }
              }
            }
          }
          continue;
        }
        // mma.sync: per box, 4 steps of 32 bytes a row (k16 bf16 into acc; k32 e4m3 into
        // part, zeroed at the box's start, then acc += part).
        for (int warp = 0; warp < kConsumers; ++warp) {
          for (int box = 0; box < kBoxes; ++box) {
            const int a_base = box * kWeightBoxBytes / 2;
            const int b_base = (kWeightBytes + box * kXBoxBytes) / 2;
            std::vector<Acc4> part = tiles_of(0.f);
            std::vector<Acc4>& sums = e4m3 ? part : acc[static_cast<size_t>(warp)];
            for (int kk = 0; kk < kRowBytes / 32; ++kk) {
              Lanes<int> a_addr, b_addr[8];  // up to 16 x tiles: 8 pairs
              for (int lane = 0; lane < 32; ++lane) {
                const int a_row = warp * 16 + lane % 8 + ((lane / 8) % 2) * 8;
                const int a_chunk = lane / 16;
                a_addr[lane] = a_base + swizzled(a_row, 2 * kk + a_chunk) / 2;
                const int b_row = (lane / 16) * 8 + lane % 8;
                const int b_chunk = (lane / 8) % 2;
                for (int t2 = 0; t2 < mt / 2; ++t2) {
                  b_addr[t2][lane] = b_base + swizzled(16 * t2 + b_row, 2 * kk + b_chunk) / 2;
                }
              }
              const testing::Frag4 a = ldmatrix_x4(smem, a_addr, false);
              for (int t2 = 0; t2 < mt / 2; ++t2) {
                const testing::Frag4 b = ldmatrix_x4(smem, b_addr[t2], false);
                const auto [b0, b1, b2, b3] = registers(b);
                if (e4m3) {
                  mma_e4m3(sums[static_cast<size_t>(2 * t2)], a, b0, b1);
                  mma_e4m3(sums[static_cast<size_t>(2 * t2 + 1)], a, b2, b3);
                } else {
                  mma(sums[static_cast<size_t>(2 * t2)], a, b0, b1);
                  mma(sums[static_cast<size_t>(2 * t2 + 1)], a, b2, b3);
                }
              }
            }
            if (e4m3) add(acc[static_cast<size_t>(warp)], sums);
          }
        }
      }
      // for_each_sum: element e of tile t is row row0 + 16 warp + g + 8 (e / 2), x row
      // 8 t + 2q + e % 2.
      for (int warp = 0; warp < kConsumers; ++warp) {
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane / 4, q = lane % 4;
          for (int t = 0; t < mt; ++t) {
            for (int e = 0; e < 4; ++e) {
              const int64_t row = row0 + warp * 16 + g + 8 * (e / 2);
              const int i = 8 * t + 2 * q + e % 2;
              if (i < c.m && row < c.n) {
                partials[static_cast<size_t>((split * c.m + i) * c.n + row)] =
                    acc[warp][static_cast<size_t>(t)][lane][e];
              }
            }
          }
        }
      }
    }
  }
  std::vector<float> y(static_cast<size_t>(c.m * c.n), 0.f);
  for (int64_t e = 0; e < c.m * c.n; ++e) {
    float v = 0.f;
    for (int s = 0; s < splits; ++s) v += partials[static_cast<size_t>(s * c.m * c.n + e)];
    y[static_cast<size_t>(e)] = finish(c, e / c.n, e % c.n, v);
  }
  return y;
}

// Runs both consumer paths on `c` and compares with a double reference: the products of
// the decoded operands summed in double, then scaled (e4m3) and the bias added. The
// emulated sums are f32 (e4m3 products are exact in f32, bf16 ones too), so the tolerance
// is relative to the sum of the products' magnitudes.
void check(const Case& c) {
  const int eb = element_bytes(c.op);
  const auto values = [&](const std::vector<uint8_t>& bytes) {
    std::vector<double> v(bytes.size() / static_cast<size_t>(eb));
    for (size_t e = 0; e < v.size(); ++e) v[e] = element_value(c.op, &bytes[e * eb]);
    return v;
  };
  const std::vector<double> x = values(c.x), w = values(c.w);
  std::vector<double> want(static_cast<size_t>(c.m * c.n)), tolerance(want.size());
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double sum = 0, scale = 0;
      for (int64_t col = 0; col < c.k; ++col) {
        const double p =
            x[static_cast<size_t>(i * c.k + col)] * w[static_cast<size_t>(j * c.k + col)];
        sum += p;
        scale += std::fabs(p);
      }
      if (c.op == Operand::kE4m3) {
        const double s =
            double{c.x_scale[static_cast<size_t>(i)]} * double{c.w_scale[static_cast<size_t>(j)]};
        sum *= s;
        scale *= std::fabs(s);
      }
      if (c.with_bias) {
        const double bias = from_bf16(c.bias[static_cast<size_t>(j)]);
        sum += bias;
        scale += std::fabs(bias);
      }
      want[static_cast<size_t>(i * c.n + j)] = sum;
      tolerance[static_cast<size_t>(i * c.n + j)] = 1e-5 * scale + 1e-6;
    }
  }
  for (const Consumer consumer : {Consumer::kMmaSync, Consumer::kWgmma}) {
    const std::string what = std::string(c.op == Operand::kE4m3 ? "e4m3" : "bf16") +
                             " m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) +
                             " k=" + std::to_string(c.k) + " splits=" + std::to_string(c.splits) +
                             (c.with_bias ? " bias" : "") +
                             (consumer == Consumer::kWgmma ? " wgmma" : " mma.sync");
    SCOPED_TRACE(what);
    const std::vector<float> y = emulate(c, consumer);
    size_t bad = 0;
    for (size_t e = 0; e < y.size(); ++e) {
      const double got = y[e];
      if (!(std::fabs(got - want[e]) <= tolerance[e]) && ++bad <= 5) {
        ADD_FAILURE() << "[" << e / static_cast<size_t>(c.n) << ", " << e % static_cast<size_t>(c.n)
                      << "]: got " << got << " want " << want[e];
      }
    }
    EXPECT_EQ(bad, 0u);
  }
}

TEST(SkinnyGemmEmulationTest, SwizzledTmaBoxesAndFragmentsGiveTheProduct) {
  std::mt19937 rng(95);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  // m across the four x tile sizes; n with a partial tile; k of one stage and several;
  // splits that divide the stages and one that does not.
  const Case shapes[] = {{9, 70, 256, 1},  {16, 64, 128, 1},  {17, 130, 384, 2},
                         {32, 64, 512, 3}, {33, 96, 256, 2},  {64, 200, 384, 1},
                         {65, 70, 256, 1}, {128, 130, 384, 2}};
  for (Case c : shapes) {
    for (int64_t e = 0; e < c.m * c.k; ++e) {
      const uint16_t v = to_bf16(dist(rng));
      c.x.push_back(static_cast<uint8_t>(v & 0xff));
      c.x.push_back(static_cast<uint8_t>(v >> 8));
    }
    for (int64_t e = 0; e < c.n * c.k; ++e) {
      const uint16_t v = to_bf16(dist(rng));
      c.w.push_back(static_cast<uint8_t>(v & 0xff));
      c.w.push_back(static_cast<uint8_t>(v >> 8));
    }
    check(c);
  }
}

// The decode written from the format's definition agrees with cellm's codec (model/fp8.h)
// on every code but the NaNs, and on a few values known by heart.
TEST(SkinnyGemmEmulationTest, E4m3DecodeMatchesTheFormat) {
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7f) == 0x7f) continue;
    EXPECT_EQ(from_e4m3(static_cast<uint8_t>(code)), e4m3_to_f32(static_cast<uint8_t>(code)))
        << "code " << code;
  }
  EXPECT_EQ(from_e4m3(0x00), 0.f);
  EXPECT_TRUE(std::signbit(from_e4m3(0x80)));
  EXPECT_EQ(from_e4m3(0x01), std::ldexp(1.f, -9));  // the least subnormal
  EXPECT_EQ(from_e4m3(0x07), 7.f * std::ldexp(1.f, -9));
  EXPECT_EQ(from_e4m3(0x08), std::ldexp(1.f, -6));  // the least normal
  EXPECT_EQ(from_e4m3(0x38), 1.f);
  EXPECT_EQ(from_e4m3(0x3c), 1.5f);
  EXPECT_EQ(from_e4m3(0x7e), 448.f);
  EXPECT_EQ(from_e4m3(0xfe), -448.f);
  EXPECT_EQ(from_e4m3(0xc0), -2.f);
}

// The e4m3 variant: every x tile count (m 9, 16: 2 tiles; 17, 32: 4; 33, 64: 8), partial
// row tiles (n past a multiple of the block's 64 or 128 rows), one stage and many, splits
// that divide the stages and ones that do not, with and without bias. Codes uniform over
// the 254 non-NaN ones (zeros, subnormals and ±448 included).
TEST(SkinnyGemmEmulationTest, E4m3SwizzledTmaBoxesAndFragmentsGiveTheScaledProduct) {
  std::mt19937 rng(96);
  std::uniform_int_distribution<int> code(0, 253);
  // Scales about 1/448, as a quantizer's amax / 448, so outputs and biases are alike in size.
  std::uniform_real_distribution<float> x_scale(0.5f / 448, 2.f / 448);
  std::uniform_real_distribution<float> w_scale(0.25f / 448, 1.f / 448);
  std::uniform_real_distribution<float> bias(-1.f, 1.f);
  const Case shapes[] = {
      {9, 70, 256, 1, Operand::kE4m3, true},      // one stage, a partial 64-row tile
      {16, 64, 512, 1, Operand::kE4m3, false},    // whole tile, two stages
      {16, 70, 2048, 8, Operand::kE4m3, true},    // a split a stage
      {17, 130, 768, 2, Operand::kE4m3, true},    // 3 stages over 2 splits: 2 + 1
      {32, 100, 2048, 3, Operand::kE4m3, false},  // 8 stages over 3 splits: 3 + 3 + 2
      {33, 96, 512, 2, Operand::kE4m3, true},     // a partial 128-row tile
      {64, 200, 1024, 1, Operand::kE4m3, true},   // 4 stages, no split
      {64, 130, 4096, 8, Operand::kE4m3, false},  // 16 stages over 8 splits
      {48, 260, 3072, 5, Operand::kE4m3, true},   // 12 stages, 5 splits asked: 4 of 3
  };
  const auto e4m3_code = [&] {
    const int v = code(rng);  // 0..253: skip 0x7f
    return static_cast<uint8_t>(v < 0x7f ? v : v + 1);
  };
  for (Case c : shapes) {
    for (int64_t e = 0; e < c.m * c.k; ++e) c.x.push_back(e4m3_code());
    for (int64_t e = 0; e < c.n * c.k; ++e) c.w.push_back(e4m3_code());
    for (int64_t i = 0; i < c.m; ++i) c.x_scale.push_back(x_scale(rng));
    for (int64_t j = 0; j < c.n; ++j) c.w_scale.push_back(w_scale(rng));
    if (c.with_bias) {
      for (int64_t j = 0; j < c.n; ++j) c.bias.push_back(to_bf16(bias(rng)));
    }
    check(c);
  }
}

}  // namespace
}  // namespace cellm::cuda
