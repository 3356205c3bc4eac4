// Host emulation of the skinny GEMM (src/cuda/kernels/skinny_gemm.cu), lane by lane: the
// TMA boxes written into shared memory with the 128-byte swizzle (16-byte chunk c of box
// row r at chunk c ^ (r % 8); rows past the matrix zero), the consumer warps' ldmatrix
// addresses and mma.m16n8k16 fragments transcribed from the kernel and run on the
// instruction models of mma_emulation.h (or, for the sm_90a build, the warpgroups'
// wgmma descriptors read through a model of the descriptor and their D registers mapped
// onto the same sums), the split over k and the cluster's sum of the splits' partial sums
// in split order, compared with a double reference. It checks the swizzle,
// the fragment layouts and the tile, stage and split bookkeeping on machines without a
// GPU (not the mbarrier pipeline: the order in which stages land changes no sum). When
// the kernel's index math changes, change it here too.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cuda/kernels/skinny_gemm.h"
#include "mma_emulation.h"

namespace cellm::cuda {
namespace {

using testing::Acc4;
using testing::from_bf16;
using testing::Lanes;
using testing::ldmatrix_x4;
using testing::mma;
using testing::registers;
using testing::to_bf16;

// The kernel's constants (skinny_gemm.cu); its warps and rows a block follow m.
constexpr int kKStep = 64;  // columns of a box; a stage is kBoxes boxes side by side
constexpr int kStageCols = static_cast<int>(kSkinnyKStep);
constexpr int kBoxes = kStageCols / kKStep;
constexpr int kRowBytes = kKStep * 2;

int swizzled(int row, int chunk) {  // bytes, as the kernel's
  return row * kRowBytes + ((chunk ^ (row & 7)) << 4);
}

// A TMA box of `box_rows` rows x kKStep columns of the row-major bf16 matrix src [rows,
// cols] at (col, row), into smem from element `at`; zeros past rows. The 128-byte swizzle
// as the hardware applies it to a box's byte offsets (from a 1024-byte aligned start):
// bits 4-6 XOR bits 7-9 (CU_TENSOR_MAP_SWIZZLE_128B), written apart from the kernel's
// `swizzled` so that a mistake there shows.
void tma_box(std::vector<uint16_t>& smem, size_t at, const std::vector<uint16_t>& src, int64_t rows,
             int64_t cols, int col, int64_t row, int box_rows) {
  for (int r = 0; r < box_rows; ++r) {
    for (int c = 0; c < kKStep; ++c) {
      const int64_t src_row = row + r;
      const uint16_t v =
          src_row < rows ? src[static_cast<size_t>(src_row * cols + col + c)] : uint16_t{0};
      const int linear = r * kRowBytes + 2 * c;
      const int byte = linear ^ (((linear >> 7) & 7) << 4);
      smem.at(at + static_cast<size_t>(byte / 2)) = v;
    }
  }
}

struct Case {
  int64_t m, n, k;
  int splits;
  std::vector<uint16_t> x, w;
};

// The consumers' two ways to multiply a stage (wgmma on sm_90a, else mma.sync).
enum class Consumer { kMmaSync, kWgmma };

// Element (r, c) of a K-major wgmma operand whose descriptor starts at byte `start` of
// shared memory (128-byte swizzle, 1024 bytes from one 8-row group to the next), as the
// tensor cores address it: the row's bytes laid out unswizzled from the start, then the
// swizzle applied to the address (16-byte chunk bits 4-6 XOR bits 7-9; every 8-row group
// starts 1024-byte aligned). Written from the PTX ISA's description of the descriptor,
// apart from the TMA model above.
uint16_t wgmma_element(const std::vector<uint16_t>& smem, int start, int r, int c) {
  const int linear = start + (r / 8) * 1024 + (r % 8) * 128 + 2 * c;
  const int byte = linear ^ (((linear >> 7) & 7) << 4);
  return smem.at(static_cast<size_t>(byte / 2));
}

// y [m, n] as the kernel computes it: every (tile, split) block, then the cluster's sum of
// the splits in split order.
std::vector<float> emulate(const Case& c, Consumer consumer) {
  const int mt = c.m <= 16 ? 2 : c.m <= 32 ? 4 : c.m <= 64 ? 8 : 16;
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
  for (int64_t tile = 0; tile < tiles; ++tile) {
    const int64_t row0 = tile * kBlockRows;
    for (int split = 0; split < splits; ++split) {
      const int first = split * split_stages;
      const int n_stages = std::min(split_stages, k_stages - first);
      std::vector<std::vector<Acc4>> acc(kConsumers, std::vector<Acc4>(static_cast<size_t>(mt)));
      for (auto& warp_acc : acc) {
        for (Acc4& a : warp_acc) {
          for (auto& lane : a) lane = {0.f, 0.f, 0.f, 0.f};
        }
      }
      for (int s = 0; s < n_stages; ++s) {
        for (int box = 0; box < kBoxes; ++box) {
          const int col = (first + s) * kStageCols + box * kKStep;
          tma_box(smem, static_cast<size_t>(box * kWeightBoxBytes / 2), c.w, c.n, c.k, col, row0,
                  kBlockRows);
          tma_box(smem, static_cast<size_t>((kWeightBytes + box * kXBoxBytes) / 2), c.x, c.m, c.k,
                  col, 0, 8 * mt);
        }
        if (consumer == Consumer::kWgmma) {
          // Warpgroup `group` (warps 4 group .. 4 group + 3): D[64 x 8 mt] += its 64 weight
          // rows x the x rows, one k16 slice at a time from descriptors 32 kk bytes on;
          // D[r][n] is register (j = n / 8, (r % 16) / 8 * 2 + n % 2) of lane 4 (r % 8) +
          // (n % 8) / 2 of warp 4 group + (r % 64) / 16.
          for (int group = 0; group < kConsumers / 4; ++group) {
            for (int box = 0; box < kBoxes; ++box) {
              for (int kk = 0; kk < kKStep / 16; ++kk) {
                const int a_start = box * kWeightBoxBytes + group * 64 * kRowBytes + 32 * kk;
                const int b_start = kWeightBytes + box * kXBoxBytes + 32 * kk;
                for (int r = 0; r < 64; ++r) {
                  for (int n = 0; n < 8 * mt; ++n) {
                    float sum = 0.f;
                    for (int col = 0; col < 16; ++col) {
                      sum += from_bf16(wgmma_element(smem, a_start, r, col)) *
                             from_bf16(wgmma_element(smem, b_start, n, col));
                    }
                    const int warp = 4 * group + r / 16;
                    const int lane = 4 * (r % 8) + (n % 8) / 2;
                    const int reg = ((r % 16) / 8) * 2 + n % 2;
                    acc[static_cast<size_t>(warp)][static_cast<size_t>(n / 8)][lane]
                       [static_cast<size_t>(reg)] += sum;
                  }
                }
              }
            }
          }
          continue;
        }
        for (int warp = 0; warp < kConsumers; ++warp) {
          for (int kk = 0; kk < kBoxes * kKStep / 16; ++kk) {
            const int box = kk / (kKStep / 16);  // kk of the box: kk % 4
            const int a_base = box * kWeightBoxBytes / 2;
            const int b_base = (kWeightBytes + box * kXBoxBytes) / 2;
            Lanes<int> a_addr, b_addr[8];  // up to 16 x tiles: 8 pairs
            for (int lane = 0; lane < 32; ++lane) {
              const int a_row = warp * 16 + lane % 8 + ((lane / 8) % 2) * 8;
              const int a_chunk = lane / 16;
              a_addr[lane] = a_base + swizzled(a_row, 2 * (kk % 4) + a_chunk) / 2;
              const int b_row = (lane / 16) * 8 + lane % 8;
              const int b_chunk = (lane / 8) % 2;
              for (int t2 = 0; t2 < mt / 2; ++t2) {
                b_addr[t2][lane] = b_base + swizzled(16 * t2 + b_row, 2 * (kk % 4) + b_chunk) / 2;
              }
            }
            const testing::Frag4 a = ldmatrix_x4(smem, a_addr, false);
            for (int t2 = 0; t2 < mt / 2; ++t2) {
              const testing::Frag4 b = ldmatrix_x4(smem, b_addr[t2], false);
              const auto [b0, b1, b2, b3] = registers(b);
              mma(acc[warp][static_cast<size_t>(2 * t2)], a, b0, b1);
              mma(acc[warp][static_cast<size_t>(2 * t2 + 1)], a, b2, b3);
            }
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
    y[static_cast<size_t>(e)] = v;
  }
  return y;
}

TEST(SkinnyGemmEmulationTest, SwizzledTmaBoxesAndFragmentsGiveTheProduct) {
  std::mt19937 rng(95);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  // m across the four x tile sizes; n with a partial tile; k of one stage and several;
  // splits that divide the stages and one that does not.
  const Case shapes[] = {{9, 70, 256, 1, {}, {}},   {16, 64, 128, 1, {}, {}},
                         {17, 130, 384, 2, {}, {}}, {32, 64, 512, 3, {}, {}},
                         {33, 96, 256, 2, {}, {}},  {64, 200, 384, 1, {}, {}},
                         {65, 70, 256, 1, {}, {}},  {128, 130, 384, 2, {}, {}}};
  for (Case c : shapes) {
    for (int64_t e = 0; e < c.m * c.k; ++e) c.x.push_back(to_bf16(dist(rng)));
    for (int64_t e = 0; e < c.n * c.k; ++e) c.w.push_back(to_bf16(dist(rng)));
    for (const Consumer consumer : {Consumer::kMmaSync, Consumer::kWgmma}) {
      const std::string what = "m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) +
                               " k=" + std::to_string(c.k) + " splits=" + std::to_string(c.splits) +
                               (consumer == Consumer::kWgmma ? " wgmma" : " mma.sync");
      SCOPED_TRACE(what);
      const std::vector<float> y = emulate(c, consumer);
      size_t bad = 0;
      for (int64_t i = 0; i < c.m; ++i) {
        for (int64_t j = 0; j < c.n; ++j) {
          double want = 0, scale = 0;
          for (int64_t col = 0; col < c.k; ++col) {
            const double p = double{from_bf16(c.x[static_cast<size_t>(i * c.k + col)])} *
                             double{from_bf16(c.w[static_cast<size_t>(j * c.k + col)])};
            want += p;
            scale += std::fabs(p);
          }
          const double got = y[static_cast<size_t>(i * c.n + j)];
          if (!(std::fabs(got - want) <= 1e-5 * scale + 1e-6) && ++bad <= 5) {
            ADD_FAILURE() << "[" << i << ", " << j << "]: got " << got << " want " << want;
          }
        }
      }
      EXPECT_EQ(bad, 0u);
    }
  }
}

}  // namespace
}  // namespace cellm::cuda
