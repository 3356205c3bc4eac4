#include "cpu/quant/bf16_dot_matmul.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "cellm/status.h"
#include "cpu/quant/cpu_features.h"
#include "cpu/quant/isa_target.h"
#include "model/half.h"

#if defined(__x86_64__) || defined(__i386__)
#include "cpu/kernels/x86_intrinsics.h"
#define CELLM_BF16_DOT_X86 1
#endif

namespace cellm::cpu::quant {
namespace {

constexpr int64_t kNr = 4;  // W rows per tile
// Above this many x rows a product is compute-bound and its W tiles are claimed
// dynamically, kDynamicGroups tiles (32 W rows) at a time.
constexpr int64_t kStaticMaxRows = 16;
constexpr int64_t kDynamicGroups = 8;
constexpr int kLanesBf16 = 32;

struct Args {
  const uint16_t* xb;  // [m, ldx] bf16, zero past k
  int64_t ldx, m, k;
  const uint16_t* w;  // [n, k]
  float* y;
  int64_t n;
};

// The scalar twin: every product bf16 x bf16 is exact in f32; summed in order.
void rows_scalar(const Args& a, int64_t j0, int64_t j1) {
  for (int64_t i = 0; i < a.m; ++i) {
    for (int64_t j = j0; j < j1; ++j) {
      float acc = 0.0f;
      for (int64_t c = 0; c < a.k; ++c) {
        acc += bf16_to_f32(a.xb[i * a.ldx + c]) * bf16_to_f32(a.w[j * a.k + c]);
      }
      a.y[i * a.n + j] = acc;
    }
  }
}

#if defined(CELLM_BF16_DOT_X86)
CELLM_TARGET_BEGIN(CELLM_ISA_AVX512)

// The 32 bf16 lanes of v. A value conversion, not a pointer cast: a type-punned
// reference would let GCC assume it aliases the accumulators and store them to
// memory in every iteration.
__m512bh as_bf16(__m512i v) {
  __m512bh r;
  std::memcpy(&r, &v, sizeof(r));
  return r;
}

// {sum(a), sum(b), sum(c), sum(d)}.
__m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  const __m512 abcd = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 h =
      _mm256_add_ps(_mm512_castps512_ps256(abcd),
                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(abcd), 1)));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// x rows rounded to bf16 (nearest even), zero-padded to ldx.
void to_bf16_avx512(const float* x, int64_t m, int64_t k, int64_t ldx, uint16_t* xb) {
  for (int64_t i = 0; i < m; ++i) {
    const float* src = x + i * k;
    uint16_t* dst = xb + i * ldx;
    for (int64_t c = 0; c < ldx; c += kLanesBf16) {
      const int64_t left = k - c;
      const __mmask16 lo_mask = left >= 16  ? 0xFFFF
                                : left <= 0 ? 0
                                            : static_cast<__mmask16>((1u << left) - 1u);
      const __mmask16 hi_mask = left >= 32   ? 0xFFFF
                                : left <= 16 ? 0
                                             : static_cast<__mmask16>((1u << (left - 16)) - 1u);
      const __m512 lo = _mm512_maskz_loadu_ps(lo_mask, src + c);
      const __m512 hi = _mm512_maskz_loadu_ps(hi_mask, src + c + 16);
      const __m512bh v = _mm512_cvtne2ps_pbh(hi, lo);
      std::memcpy(dst + c, &v, sizeof(v));
    }
  }
}

// kPrefetch: the first block of x rows to meet a W tile streams it from memory, so
// it asks for the rows two tiles ahead; later blocks find W in L2 already.
// The steps are written out in the body, not in a lambda: GCC kept the accumulators of
// a lambda's captured array on the stack (a load and a store around every vdpbf16ps).
template <int MR, bool kPrefetch>
void tile_avx512(const Args& a, int64_t i0, int64_t j0, int nr) {
  const int64_t k = a.k;
  const uint16_t* w[kNr];
  for (int j = 0; j < kNr; ++j) w[j] = a.w + (j0 + (j < nr ? j : nr - 1)) * k;
  const uint16_t* x = a.xb + i0 * a.ldx;
  const int64_t ldx = a.ldx;
  // The same line of the row two tiles ahead, into L2 (see matmul.cpp); integer
  // arithmetic, as past W's end the address leaves it.
  const auto ahead = static_cast<uintptr_t>(2 * kNr * k * 2);
  __m512 acc[MR][kNr];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < kNr; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  const int64_t k_full = k / kLanesBf16 * kLanesBf16;
  for (int64_t c = 0; c < k_full; c += kLanesBf16) {
    __m512bh wv[kNr];
#pragma GCC unroll 4
    for (int j = 0; j < kNr; ++j) {
      if constexpr (kPrefetch) {
        _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(w[j] + c) + ahead),
                     _MM_HINT_T1);
      }
      wv[j] = as_bf16(_mm512_loadu_si512(w[j] + c));
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const __m512bh xv = as_bf16(_mm512_loadu_si512(x + i * ldx + c));
#pragma GCC unroll 4
      for (int j = 0; j < kNr; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, wv[j]);
    }
  }
  if (k_full < k) {  // the tail: masked W loads (x is zero-padded to ldx)
    const auto mask = static_cast<__mmask32>((1u << (k - k_full)) - 1u);
    __m512bh wv[kNr];
#pragma GCC unroll 4
    for (int j = 0; j < kNr; ++j) wv[j] = as_bf16(_mm512_maskz_loadu_epi16(mask, w[j] + k_full));
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const __m512bh xv = as_bf16(_mm512_loadu_si512(x + i * ldx + k_full));
#pragma GCC unroll 4
      for (int j = 0; j < kNr; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, wv[j]);
    }
  }
  // One (masked) store per row: a loop of nr scalar stores became a memcpy call.
  const auto keep = static_cast<__mmask8>((1u << nr) - 1u);
  for (int i = 0; i < MR; ++i) {
    _mm_mask_storeu_ps(a.y + (i0 + i) * a.n + j0, keep,
                       reduce4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
  }
}

// One x row against one W tile: the tile's rows one after another, so W is read as one
// sequential stream (the tile's rows are adjacent in memory), which the hardware
// prefetchers follow; the four interleaved rows of tile_avx512 are four short streams,
// and at one row (bound by streaming W) this order decodes 7-12% more tokens a second on
// SmolLM2 bf16, with no software prefetch (which measured no better here). Each row's
// sum is the same chain of vdpbf16ps as in tile_avx512, so the bits do not change.
void row_stream_avx512(const Args& a, int64_t i0, int64_t j0, int nr) {
  const int64_t k = a.k;
  const uint16_t* x = a.xb + i0 * a.ldx;
  const int64_t k_full = k / kLanesBf16 * kLanesBf16;
  __m512 acc[kNr];
#pragma GCC unroll 4
  for (int j = 0; j < kNr; ++j) {
    const uint16_t* w = a.w + (j0 + (j < nr ? j : nr - 1)) * k;
    __m512 sum = _mm512_setzero_ps();
    for (int64_t c = 0; c < k_full; c += kLanesBf16) {
      sum = _mm512_dpbf16_ps(sum, as_bf16(_mm512_loadu_si512(x + c)),
                             as_bf16(_mm512_loadu_si512(w + c)));
    }
    if (k_full < k) {
      const auto mask = static_cast<__mmask32>((1u << (k - k_full)) - 1u);
      sum = _mm512_dpbf16_ps(sum, as_bf16(_mm512_loadu_si512(x + k_full)),
                             as_bf16(_mm512_maskz_loadu_epi16(mask, w + k_full)));
    }
    acc[j] = sum;
  }
  const auto keep = static_cast<__mmask8>((1u << nr) - 1u);
  _mm_mask_storeu_ps(a.y + i0 * a.n + j0, keep, reduce4(acc[0], acc[1], acc[2], acc[3]));
}

// x rows [i0, i1) against one W tile: 4-row blocks, then the 1-3 rows left.
template <bool kPrefetch>
void block_avx512(const Args& a, int64_t i0, int64_t i1, int64_t j, int nr) {
  int64_t i = i0;
  for (; i + 4 <= i1; i += 4) tile_avx512<4, kPrefetch>(a, i, j, nr);
  switch (i1 - i) {
    case 1:
      row_stream_avx512(a, i, j, nr);
      break;
    case 2:
      tile_avx512<2, kPrefetch>(a, i, j, nr);
      break;
    case 3:
      tile_avx512<3, kPrefetch>(a, i, j, nr);
      break;
    default:
      break;
  }
}

// Rows of x per pass over a W chunk: kMb bf16 rows of k <= 768 are <= 36 KiB, so a
// block stays in L1 while every W tile of the chunk passes over it; kNc W rows of
// k <= 1,536 are <= 384 KiB, so the chunk stays in L2 for every block after the
// first (which streams it from memory).
constexpr int64_t kMb = 24;
constexpr int64_t kNc = 128;

void rows_avx512(const Args& a, int64_t j0, int64_t j1) {
  for (int64_t jc = j0; jc < j1; jc += kNc) {
    const int64_t je = std::min(j1, jc + kNc);
    for (int64_t ib = 0; ib < a.m; ib += kMb) {
      const int64_t ie = std::min(a.m, ib + kMb);
      for (int64_t j = jc; j < je; j += kNr) {
        const int nr = static_cast<int>(std::min<int64_t>(kNr, je - j));
        if (ib == 0) {
          block_avx512<true>(a, ib, ie, j, nr);
        } else {
          block_avx512<false>(a, ib, ie, j, nr);
        }
      }
    }
  }
}

CELLM_TARGET_END
#endif

}  // namespace

bool bf16_dot_supported() {
  return cpu_features().avx512_bf16;
}

void bf16_dot_matmul(ThreadPool& pool, const float* x, int64_t m, int64_t k, const uint16_t* w,
                     int64_t n, float* y, bool simd) {
  const Bf16Product product{w, n, y};
  bf16_dot_matmul_shared(pool, x, m, k, std::span<const Bf16Product>(&product, 1), simd);
}

void bf16_dot_matmul_shared(ThreadPool& pool, const float* x, int64_t m, int64_t k,
                            std::span<const Bf16Product> products, bool simd) {
  // REQUIRES: non-negative shapes; the instructions when simd.
  CELLM_CHECK(m >= 0 && k >= 0);
  CELLM_CHECK_MSG(!simd || bf16_dot_supported(), "bf16_dot_matmul: the CPU lacks AVX-512 BF16");
  constexpr size_t kMaxProducts = 4;
  CELLM_CHECK(products.size() <= kMaxProducts);
  // Each product's W tiles, numbered one after another: a tile never spans two products,
  // so each y has the sums it gets alone.
  std::array<Args, kMaxProducts> args;
  std::array<int64_t, kMaxProducts + 1> first_group{};
  size_t count = 0;
  int64_t rows = 0;
  for (const Bf16Product& p : products) {
    CELLM_CHECK(p.n >= 0);
    if (m == 0 || p.n == 0) continue;
    CELLM_CHECK(p.y != nullptr && (k == 0 || (x != nullptr && p.w != nullptr)));
    args[count] = Args{nullptr, 0, m, k, p.w, p.y, p.n};
    first_group[count + 1] = first_group[count] + (p.n + kNr - 1) / kNr;
    rows += p.n;
    ++count;
  }
  if (count == 0) return;
  const int64_t ldx = (k + kLanesBf16 - 1) / kLanesBf16 * kLanesBf16;
  // The calling thread's; the pool's threads only read it during this call.
  thread_local std::vector<uint16_t> xb;
  xb.resize(static_cast<size_t>(m * ldx));
  for (size_t p = 0; p < count; ++p) {
    args[p].xb = xb.data();
    args[p].ldx = ldx;
  }
  void (*run_rows)(const Args&, int64_t, int64_t) = rows_scalar;
#if defined(CELLM_BF16_DOT_X86)
  if (simd) {
    to_bf16_avx512(x, m, k, ldx, xb.data());
    run_rows = rows_avx512;
  }
#endif
  if (run_rows == rows_scalar) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t c = 0; c < ldx; ++c)
        xb[static_cast<size_t>(i * ldx + c)] = c < k ? f32_to_bf16(x[i * k + c]) : 0;
    }
  }
  const int64_t groups = first_group[count];
  // Tiles [g0, g1) of the numbering, product by product.
  const auto band = [&](int64_t g0, int64_t g1) {
    for (size_t p = 0; p < count && g0 < g1; ++p) {
      const int64_t lo = std::max(g0, first_group[p]), hi = std::min(g1, first_group[p + 1]);
      if (lo >= hi) continue;
      const Args& a = args[p];
      run_rows(a, (lo - first_group[p]) * kNr, std::min(a.n, (hi - first_group[p]) * kNr));
    }
  };
  if (m * rows * k < (int64_t{1} << 16)) {
    band(0, groups);
  } else if (m > kStaticMaxRows) {
    // Compute-bound: threads claim kDynamicGroups tiles at a time, so one that
    // loses its core for a while (a busy machine) leaves its share to the other.
    pool.parallel_for_dynamic(groups, kDynamicGroups, band);
  } else {
    // Bound by streaming W: one contiguous band per thread.
    pool.parallel_for(groups, band);
  }
}

}  // namespace cellm::cpu::quant
