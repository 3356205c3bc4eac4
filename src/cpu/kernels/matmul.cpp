#include "cpu/kernels/matmul.h"

#include <algorithm>
#include <vector>

#include "cellm/status.h"
#include "cpu/kernels/simd.h"

namespace cellm::cpu {
namespace {

using simd::kLanes;
using simd::Storage;
using simd::Vf;

constexpr int kMr = 4;               // rows of x per micro tile
constexpr int kNr = 4;               // rows of W per micro tile
constexpr int64_t kNb = 64;          // rows of W per cache tile
constexpr int64_t kKc = 512;         // columns (k) per cache tile
constexpr int64_t kPackMinRows = 5;  // widen W tiles once when m reaches this
// Above this many x rows a product is compute-bound and its W rows are claimed
// dynamically, kDynamicGroups groups of kNr (32 W rows) at a time.
constexpr int64_t kStaticMaxRows = 16;
constexpr int64_t kDynamicGroups = 8;

// acc[i][j] = dot(x row i, w row j) over kc columns, for MR x NR rows; then
// y[i, j] = acc + y[i, j] (accumulate) or acc + bias[j]. kStream: W comes from
// memory (not a packed tile in cache), so the next tile's rows are prefetched.
template <DType T, int MR, int NR, bool kStream>
void micro_tile(const float* x, int64_t ldx, const Storage<T>* w, int64_t ldw, int64_t kc, float* y,
                int64_t ldy, bool accumulate, const float* bias) {
  Vf acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = simd::zero();
  int64_t kk = 0;
  for (; kk + kLanes <= kc; kk += kLanes) {
#if defined(CELLM_SIMD_AVX512) || defined(CELLM_SIMD_AVX2)
    // Streaming W from memory: prefetch into L2 the rows two tiles ahead, one line
    // per row per 64 bytes (streams about a quarter faster in decode than L1 one
    // tile ahead).
    if constexpr (kStream) {
      if ((kk * static_cast<int64_t>(sizeof(Storage<T>))) % 64 == 0) {
        // Integer arithmetic: past the last tile the address leaves W, which a
        // prefetch tolerates but pointer arithmetic would not.
        const auto base = reinterpret_cast<uintptr_t>(w + kk);
        for (int j = 0; j < NR; ++j) {
          const uintptr_t ahead = static_cast<uintptr_t>((2 * NR + j) * ldw) * sizeof(Storage<T>);
          _mm_prefetch(reinterpret_cast<const char*>(base + ahead), _MM_HINT_T1);
        }
      }
    }
#endif
    Vf wv[NR];
    for (int j = 0; j < NR; ++j) {
      wv[j] = simd::load<T>(w + j * ldw + kk);
      simd::keep_in_register(wv[j]);
    }
    for (int i = 0; i < MR; ++i) {
      Vf xv = simd::load<DType::kF32>(x + i * ldx + kk);
      simd::keep_in_register(xv);
      for (int j = 0; j < NR; ++j) acc[i][j] = simd::fma(xv, wv[j], acc[i][j]);
    }
  }
  if (kk < kc) {
    const int r = static_cast<int>(kc - kk);
    Vf wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = simd::load_partial<T>(w + j * ldw + kk, r);
    for (int i = 0; i < MR; ++i) {
      const Vf xv = simd::load_partial<DType::kF32>(x + i * ldx + kk, r);
      for (int j = 0; j < NR; ++j) acc[i][j] = simd::fma(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    float sums[4];
    simd::reduce4(acc[i][0], NR > 1 ? acc[i][NR > 1 ? 1 : 0] : simd::zero(),
                  NR > 2 ? acc[i][NR > 2 ? 2 : 0] : simd::zero(),
                  NR > 3 ? acc[i][NR > 3 ? 3 : 0] : simd::zero(), sums);
    float* yi = y + i * ldy;
    for (int j = 0; j < NR; ++j) yi[j] = sums[j] + (accumulate ? yi[j] : bias[j]);
  }
}

template <DType T>
using MicroFn = void (*)(const float*, int64_t, const Storage<T>*, int64_t, int64_t, float*,
                         int64_t, bool, const float*);

template <DType T, int MR, bool kStream>
constexpr MicroFn<T> pick_nr(int nr) {
  switch (nr) {
    case 1:
      return &micro_tile<T, MR, 1, kStream>;
    case 2:
      return &micro_tile<T, MR, 2, kStream>;
    case 3:
      return &micro_tile<T, MR, 3, kStream>;
    default:
      return &micro_tile<T, MR, 4, kStream>;
  }
}

template <DType T, bool kStream>
constexpr MicroFn<T> pick(int mr, int nr) {
  switch (mr) {
    case 1:
      return pick_nr<T, 1, kStream>(nr);
    case 2:
      return pick_nr<T, 2, kStream>(nr);
    case 3:
      return pick_nr<T, 3, kStream>(nr);
    default:
      return pick_nr<T, 4, kStream>(nr);
  }
}

// Every row of x against W rows [j0, j1), for columns [kb, kb + kc), with W
// elements of type T at w (row stride ldw, already offset to row j0 / column kb).
template <DType T, bool kStream>
void tile_all_rows(const float* x, int64_t m, int64_t k, int64_t kb, int64_t kc,
                   const Storage<T>* w, int64_t ldw, int64_t j0, int64_t j1, float* y, int64_t n,
                   const float* bias) {
  const bool accumulate = kb > 0;
  for (int64_t i = 0; i < m; i += kMr) {
    const int mr = static_cast<int>(std::min<int64_t>(kMr, m - i));
    for (int64_t j = j0; j < j1; j += kNr) {
      const int nr = static_cast<int>(std::min<int64_t>(kNr, j1 - j));
      pick<T, kStream>(mr, nr)(x + i * k + kb, k, w + (j - j0) * ldw, ldw, kc, y + i * n + j, n,
                               accumulate, bias + (j - j0));
    }
  }
}

// Asks for elements [base + offset, base + offset + n) in L2 (the next W tile while this one is
// widened). Integer arithmetic: past the band's end the address may leave W,
// which a prefetch tolerates but pointer arithmetic would not.
template <typename E>
void prefetch_l2([[maybe_unused]] const E* base, [[maybe_unused]] int64_t offset,
                 [[maybe_unused]] int64_t n) {
#if defined(CELLM_SIMD_AVX512) || defined(CELLM_SIMD_AVX2)
  const uintptr_t begin =
      reinterpret_cast<uintptr_t>(base) + static_cast<uintptr_t>(offset) * sizeof(E);
  const uintptr_t end = begin + static_cast<uintptr_t>(n) * sizeof(E);
  for (uintptr_t a = begin; a < end; a += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(a), _MM_HINT_T1);
  }
#endif
}

template <DType T>
void matmul_band(const float* x, int64_t m, int64_t k, const Storage<T>* w, int64_t n,
                 TypedPtr bias, float* y, int64_t band_begin, int64_t band_end) {
  const bool pack = T != DType::kF32 && m >= kPackMinRows;
  thread_local std::vector<float> packed;
  if (pack) packed.resize(static_cast<size_t>(kNb * std::min(k, kKc)));
  float bias_tile[kNb];
  for (int64_t j0 = band_begin; j0 < band_end; j0 += kNb) {
    const int64_t j1 = std::min(band_end, j0 + kNb);
    for (int64_t j = j0; j < j1; ++j) {
      bias_tile[j - j0] = bias.data == nullptr ? 0.0f : load_as_f32(bias.data, bias.dtype, j);
    }
    // k == 0 still takes one (empty) block, which writes the bias.
    const int64_t k_blocks = k == 0 ? 1 : (k + kKc - 1) / kKc;
    for (int64_t b = 0; b < k_blocks; ++b) {
      const int64_t kb = b * kKc;
      const int64_t kc = std::min(kKc, k - kb);
      if (pack) {
        for (int64_t j = j0; j < j1; ++j) {
          prefetch_l2(w, (j + kNb) * k + kb, kc);
          simd::widen<T>(w + j * k + kb, kc, packed.data() + (j - j0) * kc);
        }
        tile_all_rows<DType::kF32, false>(x, m, k, kb, kc, packed.data(), kc, j0, j1, y, n,
                                          bias_tile);
      } else {
        tile_all_rows<T, true>(x, m, k, kb, kc, w + j0 * k + kb, k, j0, j1, y, n, bias_tile);
      }
    }
  }
}

template <DType T>
void matmul_typed(ThreadPool& pool, const float* x, int64_t m, int64_t k, const Storage<T>* w,
                  int64_t n, TypedPtr bias, float* y) {
  // Bands are whole groups of kNr rows; each thread takes a contiguous run of them.
  const int64_t groups = (n + kNr - 1) / kNr;
  const auto band = [&](int64_t g0, int64_t g1) {
    matmul_band<T>(x, m, k, w, n, bias, y, g0 * kNr, std::min(n, g1 * kNr));
  };
  // Below ~64k multiply-adds a second thread costs more than it saves.
  if (m * n * k < (int64_t{1} << 16)) {
    band(0, groups);
  } else if (m > kStaticMaxRows) {
    // Compute-bound: threads claim kDynamicGroups groups at a time, so one that
    // loses its core for a while (a busy machine) leaves its share to the other.
    pool.parallel_for_dynamic(groups, kDynamicGroups, band);
  } else {
    // Bound by streaming W: one contiguous band per thread.
    pool.parallel_for(groups, band);
  }
}

}  // namespace

void matmul(ThreadPool& pool, const float* x, int64_t m, int64_t k, TypedPtr w, int64_t n,
            TypedPtr bias, float* y) {
  // REQUIRES: non-negative shapes, and data for every non-empty operand.
  CELLM_CHECK(m >= 0 && n >= 0 && k >= 0);
  if (m == 0 || n == 0) return;
  CELLM_CHECK(y != nullptr && (k == 0 || (x != nullptr && w.data != nullptr)));
  switch (w.dtype) {
    case DType::kF32:
      matmul_typed<DType::kF32>(pool, x, m, k, static_cast<const float*>(w.data), n, bias, y);
      return;
    case DType::kF16:
      matmul_typed<DType::kF16>(pool, x, m, k, static_cast<const uint16_t*>(w.data), n, bias, y);
      return;
    case DType::kBF16:
      matmul_typed<DType::kBF16>(pool, x, m, k, static_cast<const uint16_t*>(w.data), n, bias, y);
      return;
    case DType::kF8E4M3:
      CELLM_CHECK_MSG(false, "matmul: F8_E4M3 weights need their row scales (quant::fp8_matmul)");
  }
}

}  // namespace cellm::cpu
