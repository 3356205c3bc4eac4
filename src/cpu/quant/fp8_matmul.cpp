#include "cpu/quant/fp8_matmul.h"

#include <algorithm>
#include <bit>
#include <vector>

#include "cellm/status.h"
#include "cpu/kernels/e4m3.h"
#include "cpu/kernels/simd.h"
#include "cpu/quant/bf16_dot_matmul.h"
#include "model/fp8.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__F16C__))
#include "cpu/kernels/x86_intrinsics.h"
#endif

namespace cellm::cpu::quant {
namespace {

constexpr int64_t kLanes = 16;

// The value of e4m3 `code` without a table, in a form that vectorizes: a normal code's
// exponent and mantissa bits go to f32's (exponent rebiased by 127 - 7 = 120), a
// subnormal's value is m * 2^-9; the sign bit moves to bit 31.
inline float decode(uint32_t code) {
  const uint32_t magnitude = code & 0x7F;
  const uint32_t sign = (code & 0x80) << 24;
  const float normal = std::bit_cast<float>((magnitude << 20) + (120u << 23));
  const float subnormal = static_cast<float>(magnitude) * 0x1p-9f;
  const float v = magnitude >= 8 ? normal : subnormal;
  return std::bit_cast<float>(std::bit_cast<uint32_t>(v) | sign);
}

float bias_at(TypedPtr bias, int64_t j) {
  return bias.data != nullptr ? load_as_f32(bias.data, bias.dtype, j) : 0.0f;
}

#if defined(__AVX512F__)
#if defined(__AVX512VBMI__)
// The bf16 bytes of the 128 e4m3 magnitudes as byte-permute tables: low bytes of
// magnitudes 0-63 and 64-127, then high bytes likewise (every e4m3 value is a bf16);
// and for each quarter q of 64 codes the indices that put code 16q + i's low byte
// (first source) and high byte (second source) at bytes 4i + 2 and 4i + 3.
struct alignas(64) Bf16Tables {
  uint8_t lo[2][64];
  uint8_t hi[2][64];
  uint8_t place[4][64];
};

const Bf16Tables& bf16_tables() {
  static const Bf16Tables t = [] {
    Bf16Tables r{};
    for (int c = 0; c < 128; ++c) {
      const uint16_t b = e4m3_to_bf16(static_cast<uint8_t>(c));
      r.lo[c / 64][c % 64] = static_cast<uint8_t>(b & 0xFF);
      r.hi[c / 64][c % 64] = static_cast<uint8_t>(b >> 8);
    }
    for (int q = 0; q < 4; ++q) {
      for (int i = 0; i < 16; ++i) {
        r.place[q][4 * i + 2] = static_cast<uint8_t>(16 * q + i);
        r.place[q][4 * i + 3] = static_cast<uint8_t>(64 + 16 * q + i);
      }
    }
    return r;
  }();
  return t;
}

// The values of the 64 codes at p as four vectors of 16 f32 (exact), by table: two
// 128-entry byte lookups (vpermi2b: the magnitude's 7 bits index both tables) give
// each code's bf16 low and high bytes, the sign bit is or-ed into the high byte, and
// one masked two-source byte permute per 16 codes places them in the upper half of
// each f32 lane (a bf16 is the f32 with its low 16 bits zero). About 7 instructions
// per 64 codes against 9 per 16 through f16.
struct Decoder {
  __m512i lo0, lo1, hi0, hi1, sign, place[4];
  Decoder() {
    const Bf16Tables& t = bf16_tables();
    lo0 = _mm512_load_si512(t.lo[0]);
    lo1 = _mm512_load_si512(t.lo[1]);
    hi0 = _mm512_load_si512(t.hi[0]);
    hi1 = _mm512_load_si512(t.hi[1]);
    sign = _mm512_set1_epi8(static_cast<char>(0x80));
    for (int q = 0; q < 4; ++q) place[q] = _mm512_load_si512(t.place[q]);
  }
  void operator()(const uint8_t* p, __m512 out[4]) const {
    const __m512i c = _mm512_loadu_si512(p);
    const __m512i lo = _mm512_permutex2var_epi8(lo0, c, lo1);
    // hi | (c & 0x80): ternary-logic table A | (B & C).
    const __m512i hi =
        _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(hi0, c, hi1), c, sign, 0xF8);
    constexpr __mmask64 kUpperHalves = 0xCCCCCCCCCCCCCCCCull;
    for (int q = 0; q < 4; ++q) {
      out[q] = _mm512_castsi512_ps(_mm512_maskz_permutex2var_epi8(kUpperHalves, lo, place[q], hi));
    }
  }
};
#else
// Without VBMI: the values of the 64 codes at p as four vectors of 16 f32 through f16.
struct Decoder {
  void operator()(const uint8_t* p, __m512 out[4]) const {
    for (int q = 0; q < 4; ++q)
      out[q] = _mm512_mul_ps(load_e4m3x16_scaled(p + 16 * q), _mm512_set1_ps(256.0f));
  }
};
#endif

// Rows [j0, j1) of y for M rows of x (M <= 4): 64 codes per step decoded once in
// registers and multiplied into every row of x, four independent sums per row.
template <int64_t M>
void fused_rows(const float* x, int64_t k, const Fp8Weights& w, TypedPtr bias, float* y, int64_t n,
                int64_t j0, int64_t j1) {
  constexpr int64_t kSums = 4;
  const Decoder decode64;
  for (int64_t j = j0; j < j1; ++j) {
    const uint8_t* row = w.codes + j * k;
    __m512 acc[M][kSums];
    for (int64_t i = 0; i < M; ++i) {
      for (int64_t s = 0; s < kSums; ++s) acc[i][s] = _mm512_setzero_ps();
    }
    int64_t c = 0;
    for (; c + kSums * kLanes <= k; c += kSums * kLanes) {
      __m512 v[kSums];
      decode64(row + c, v);
      for (int64_t s = 0; s < kSums; ++s) {
        for (int64_t i = 0; i < M; ++i) {
          acc[i][s] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i * k + c + s * kLanes), v[s], acc[i][s]);
        }
      }
    }
    for (; c + kLanes <= k; c += kLanes) {
      const __m512 v = _mm512_mul_ps(load_e4m3x16_scaled(row + c), _mm512_set1_ps(256.0f));
      for (int64_t i = 0; i < M; ++i) {
        acc[i][0] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i * k + c), v, acc[i][0]);
      }
    }
    for (int64_t i = 0; i < M; ++i) {
      const __m512 total =
          _mm512_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]), _mm512_add_ps(acc[i][2], acc[i][3]));
      float sum = _mm512_reduce_add_ps(total);
      for (int64_t t = c; t < k; ++t) sum += x[i * k + t] * decode(row[t]);
      y[i * n + j] = sum * w.scales[j] + bias_at(bias, j);
    }
  }
}

// The values of the `count` codes at `codes` into `out` as f32 (exact).
void decode_f32(const uint8_t* codes, int64_t count, float* out) {
  const Decoder decode64;
  int64_t i = 0;
  for (; i + 4 * kLanes <= count; i += 4 * kLanes) {
    __m512 v[4];
    decode64(codes + i, v);
    for (int q = 0; q < 4; ++q) _mm512_storeu_ps(out + i + q * kLanes, v[q]);
  }
  for (; i + kLanes <= count; i += kLanes) {
    _mm512_storeu_ps(out + i,
                     _mm512_mul_ps(load_e4m3x16_scaled(codes + i), _mm512_set1_ps(256.0f)));
  }
  for (; i < count; ++i) out[i] = decode(codes[i]);
}

// The bf16 bits of the `count` codes at `codes` into `out` (exact).
void decode_bf16(const uint8_t* codes, int64_t count, uint16_t* out, const uint16_t* table) {
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    const __m512 v = _mm512_mul_ps(load_e4m3x16_scaled(codes + i), _mm512_set1_ps(256.0f));
    // Every value is a bf16: the f32's upper halves are its bits.
    const __m256i bf = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), bf);
  }
  for (; i < count; ++i) out[i] = table[codes[i]];
}
#elif defined(__AVX2__) && defined(__F16C__)
// Rows [j0, j1) of y for M rows of x: 16 codes per step widened through f16.
template <int64_t M>
void fused_rows(const float* x, int64_t k, const Fp8Weights& w, TypedPtr bias, float* y, int64_t n,
                int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; ++j) {
    const uint8_t* row = w.codes + j * k;
    __m256 acc[M][2];
    for (int64_t i = 0; i < M; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + kLanes <= k; c += kLanes) {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c));
      const __m256i h = e4m3_to_f16_bits_scaled(_mm256_cvtepu8_epi16(b));
      const __m256 lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
      const __m256 hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
      for (int64_t i = 0; i < M; ++i) {
        acc[i][0] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i * k + c), lo, acc[i][0]);
        acc[i][1] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i * k + c + 8), hi, acc[i][1]);
      }
    }
    for (int64_t i = 0; i < M; ++i) {
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, _mm256_add_ps(acc[i][0], acc[i][1]));
      float sum = 0.0f;
      for (float l : lanes) sum += l;
      sum *= 256.0f;
      for (int64_t t = c; t < k; ++t) sum += x[i * k + t] * decode(row[t]);
      y[i * n + j] = sum * w.scales[j] + bias_at(bias, j);
    }
  }
}

// The values of the `count` codes at `codes` into `out` as f32 (exact).
void decode_f32(const uint8_t* codes, int64_t count, float* out) {
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i));
    const __m256i h = e4m3_to_f16_bits_scaled(_mm256_cvtepu8_epi16(b));
    const __m256 k256 = _mm256_set1_ps(256.0f);
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), k256));
    _mm256_storeu_ps(out + i + 8,
                     _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), k256));
  }
  for (; i < count; ++i) out[i] = decode(codes[i]);
}
#else
// Rows [j0, j1) of y for M rows of x, W decoded in registers.
template <int64_t M>
void fused_rows(const float* x, int64_t k, const Fp8Weights& w, TypedPtr bias, float* y, int64_t n,
                int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; ++j) {
    const uint8_t* row = w.codes + j * k;
    float acc[M][kLanes] = {};
    int64_t c = 0;
    for (; c + kLanes <= k; c += kLanes) {
      float v[kLanes];
      for (int64_t l = 0; l < kLanes; ++l) v[l] = decode(row[c + l]);
      for (int64_t i = 0; i < M; ++i) {
        for (int64_t l = 0; l < kLanes; ++l) acc[i][l] += x[i * k + c + l] * v[l];
      }
    }
    for (int64_t i = 0; i < M; ++i) {
      float sum = 0.0f;
      for (int64_t l = 0; l < kLanes; ++l) sum += acc[i][l];
      for (int64_t t = c; t < k; ++t) sum += x[i * k + t] * decode(row[t]);
      y[i * n + j] = sum * w.scales[j] + bias_at(bias, j);
    }
  }
}
#endif

#if !defined(__AVX512F__)
// The bf16 bits of the `count` codes at `codes` into `out` (exact).
void decode_bf16(const uint8_t* codes, int64_t count, uint16_t* out, const uint16_t* table) {
  for (int64_t i = 0; i < count; ++i) out[i] = table[codes[i]];
}
#endif
#if !defined(__AVX512F__) && !(defined(__AVX2__) && defined(__F16C__))
// The values of the `count` codes at `codes` into `out` as f32 (exact).
void decode_f32(const uint8_t* codes, int64_t count, float* out) {
  for (int64_t i = 0; i < count; ++i) out[i] = decode(codes[i]);
}
#endif

// Up to this many rows of x the fused path (decode in registers) is used.
constexpr int64_t kFusedMaxRows = 4;

template <int64_t M>
void fused(ThreadPool& pool, const float* x, const Fp8Weights& w, TypedPtr bias, float* y) {
  pool.parallel_for(w.rows, [&](int64_t j0, int64_t j1) {
    fused_rows<M>(x, w.cols, w, bias, y, w.rows, j0, j1);
  });
}

// The blocked product for m > kFusedMaxRows (x exact). Each thread takes a band of W rows and
// walks it in cache tiles of kNb rows by kKc columns: a tile's codes are read once
// from memory and decoded once into an f32 tile (128 KiB, in L2), which every row
// of x then meets in 4 x 4 register tiles; the f32 sums of the column blocks
// accumulate in y, scaled by the row scale (and the bias added) once at the end.
constexpr int kMr = 4;                  // rows of x per register tile
constexpr int kNr = 4;                  // rows of W per register tile
constexpr int64_t kNb = 64;             // rows of W per cache tile
constexpr int64_t kKc = 512;            // columns per cache tile
constexpr int64_t kStaticMaxRows = 16;  // above: compute-bound, W rows claimed dynamically
constexpr int64_t kDynamicGroups = 8;   // register tiles of W rows per claim

// y[i, j] (+)= dot(x row i, w row j) over kc columns, for MR x NR rows; w is the
// decoded f32 tile (row stride ldw).
template <int MR, int NR>
void micro_tile(const float* x, int64_t ldx, const float* w, int64_t ldw, int64_t kc, float* y,
                int64_t ldy, bool accumulate) {
  using simd::Vf;
  constexpr int kL = simd::kLanes;
  Vf acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = simd::zero();
  int64_t c = 0;
  for (; c + kL <= kc; c += kL) {
    Vf wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = simd::load<DType::kF32>(w + j * ldw + c);
    for (int i = 0; i < MR; ++i) {
      const Vf xv = simd::load<DType::kF32>(x + i * ldx + c);
      for (int j = 0; j < NR; ++j) acc[i][j] = simd::fma(xv, wv[j], acc[i][j]);
    }
  }
  if (c < kc) {
    const int r = static_cast<int>(kc - c);
    Vf wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = simd::load_partial<DType::kF32>(w + j * ldw + c, r);
    for (int i = 0; i < MR; ++i) {
      const Vf xv = simd::load_partial<DType::kF32>(x + i * ldx + c, r);
      for (int j = 0; j < NR; ++j) acc[i][j] = simd::fma(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    float sums[4];
    simd::reduce4(acc[i][0], NR > 1 ? acc[i][NR > 1 ? 1 : 0] : simd::zero(),
                  NR > 2 ? acc[i][NR > 2 ? 2 : 0] : simd::zero(),
                  NR > 3 ? acc[i][NR > 3 ? 3 : 0] : simd::zero(), sums);
    float* yi = y + i * ldy;
    for (int j = 0; j < NR; ++j) yi[j] = accumulate ? yi[j] + sums[j] : sums[j];
  }
}

using MicroFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t,
                         bool);

template <int MR>
constexpr MicroFn pick_nr(int nr) {
  switch (nr) {
    case 1:
      return &micro_tile<MR, 1>;
    case 2:
      return &micro_tile<MR, 2>;
    case 3:
      return &micro_tile<MR, 3>;
    default:
      return &micro_tile<MR, 4>;
  }
}

constexpr MicroFn pick(int mr, int nr) {
  switch (mr) {
    case 1:
      return pick_nr<1>(nr);
    case 2:
      return pick_nr<2>(nr);
    case 3:
      return pick_nr<3>(nr);
    default:
      return pick_nr<4>(nr);
  }
}

// Asks for `bytes` bytes from `p` in L2 (the next tile's codes while this one is
// used). Integer arithmetic: past W's end the address leaves it, which a prefetch
// tolerates but pointer arithmetic would not.
void prefetch_l2([[maybe_unused]] const uint8_t* base, [[maybe_unused]] int64_t offset,
                 [[maybe_unused]] int64_t bytes) {
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__F16C__))
  const uintptr_t begin = reinterpret_cast<uintptr_t>(base) + static_cast<uintptr_t>(offset);
  for (uintptr_t p = begin; p < begin + static_cast<uintptr_t>(bytes); p += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1);
  }
#endif
}

// y rows [0, m) x columns [j_begin, j_end).
void blocked_band(const float* x, int64_t m, const Fp8Weights& w, TypedPtr bias, float* y,
                  int64_t j_begin, int64_t j_end) {
  const int64_t n = w.rows, k = w.cols;
  thread_local std::vector<float> tile;
  tile.resize(static_cast<size_t>(kNb * std::min(k, kKc)));
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kNb) {
    const int64_t j1 = std::min(j_end, j0 + kNb);
    for (int64_t kb = 0; kb < k; kb += kKc) {
      const int64_t kc = std::min(kKc, k - kb);
      for (int64_t j = j0; j < j1; ++j) {
        prefetch_l2(w.codes, (j + kNb) * k + kb, kc);
        decode_f32(w.codes + j * k + kb, kc, tile.data() + (j - j0) * kc);
      }
      for (int64_t i = 0; i < m; i += kMr) {
        const int mr = static_cast<int>(std::min<int64_t>(kMr, m - i));
        for (int64_t j = j0; j < j1; j += kNr) {
          const int nr = static_cast<int>(std::min<int64_t>(kNr, j1 - j));
          pick(mr, nr)(x + i * k + kb, k, tile.data() + (j - j0) * kc, kc, kc, y + i * n + j, n,
                       kb > 0);
        }
      }
    }
    // The row scale once per output, then the bias (k == 0: the bias alone).
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = j0; j < j1; ++j) {
        const float sum = k > 0 ? y[i * n + j] : 0.0f;
        y[i * n + j] = sum * w.scales[j] + bias_at(bias, j);
      }
    }
  }
}

void blocked(ThreadPool& pool, const float* x, int64_t m, const Fp8Weights& w, TypedPtr bias,
             float* y) {
  const int64_t n = w.rows, k = w.cols;
  const int64_t groups = (n + kNr - 1) / kNr;
  const auto band = [&](int64_t g0, int64_t g1) {
    blocked_band(x, m, w, bias, y, g0 * kNr, std::min(n, g1 * kNr));
  };
  if (m * n * k < (int64_t{1} << 16)) {
    band(0, groups);  // a second thread costs more than it saves
  } else if (m > kStaticMaxRows) {
    // Compute-bound: claims of kDynamicGroups register tiles, so a thread that loses
    // its core for a while (a busy machine) leaves its share to the other.
    pool.parallel_for_dynamic(groups, kDynamicGroups, band);
  } else {
    // Bound by streaming W: one contiguous band per thread.
    pool.parallel_for(groups, band);
  }
}

// The bf16_dot product for m >= 2: blocks of kDotRows W rows decoded to bf16 (exact)
// in parallel, then multiplied by bf16_dot_matmul (x rounded to bf16) and scaled.
constexpr int64_t kDotRows = 256;

void bf16_dot_blocks(ThreadPool& pool, const float* x, int64_t m, const Fp8Weights& w,
                     TypedPtr bias, float* y) {
  const int64_t n = w.rows, k = w.cols;
  // The bf16 bits of every code (exact).
  static const std::vector<uint16_t> table = [] {
    std::vector<uint16_t> t(256);
    for (int c = 0; c < 256; ++c) t[static_cast<size_t>(c)] = e4m3_to_bf16(static_cast<uint8_t>(c));
    return t;
  }();
  // The calling thread's; the pool's threads only use them during this call.
  thread_local std::vector<uint16_t> wb;
  thread_local std::vector<float> yb;
  wb.resize(static_cast<size_t>(std::min(n, kDotRows) * k));
  yb.resize(static_cast<size_t>(m * std::min(n, kDotRows)));
  // Pointers, not the names: inside a pool task a thread_local names the task's
  // thread's own (empty) copy.
  uint16_t* const wbp = wb.data();
  for (int64_t j0 = 0; j0 < n; j0 += kDotRows) {
    const int64_t nb = std::min(kDotRows, n - j0);
    pool.parallel_for(nb, [&](int64_t r0, int64_t r1) {
      decode_bf16(w.codes + (j0 + r0) * k, (r1 - r0) * k, wbp + r0 * k, table.data());
    });
    bf16_dot_matmul(pool, x, m, k, wbp, nb, yb.data());
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < nb; ++j) {
        y[i * n + j0 + j] =
            yb[static_cast<size_t>(i * nb + j)] * w.scales[j0 + j] + bias_at(bias, j0 + j);
      }
    }
  }
}

}  // namespace

void fp8_matmul(ThreadPool& pool, const float* x, int64_t m, const Fp8Weights& w, TypedPtr bias,
                float* y, bool bf16_dot) {
  CELLM_CHECK(m >= 0 && w.rows >= 0 && w.cols >= 0);
  if (m == 0 || w.rows == 0) return;
  CELLM_CHECK(w.codes != nullptr && w.scales != nullptr && x != nullptr && y != nullptr);
  // m = 1 (decode): the fused path streams W once, decoding in registers.
  if (m == 1) return fused<1>(pool, x, w, bias, y);
  if (bf16_dot && bf16_dot_supported()) return bf16_dot_blocks(pool, x, m, w, bias, y);
  // A few rows: each code decoded once in registers and used by every row of x.
  if (m <= kFusedMaxRows) {
    switch (m) {
      case 2:
        return fused<2>(pool, x, w, bias, y);
      case 3:
        return fused<3>(pool, x, w, bias, y);
      default:
        return fused<4>(pool, x, w, bias, y);
    }
  }
  blocked(pool, x, m, w, bias, y);
}

void fp8_matmul_scalar(const float* x, int64_t m, const Fp8Weights& w, TypedPtr bias, float* y) {
  const std::array<float, 256>& table = e4m3_table();
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < w.rows; ++j) {
      float sum = 0.0f;
      for (int64_t c = 0; c < w.cols; ++c) {
        sum += x[i * w.cols + c] * table[w.codes[j * w.cols + c]];
      }
      y[i * w.rows + j] = sum * w.scales[j] + bias_at(bias, j);
    }
  }
}

}  // namespace cellm::cpu::quant
