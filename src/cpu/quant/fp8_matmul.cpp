#include "cpu/quant/fp8_matmul.h"

#include <algorithm>
#include <bit>
#include <vector>

#include "cellm/status.h"
#include "cpu/kernels/matmul.h"
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

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__F16C__))
// 2^-8 times the values of codes held one per 16-bit lane: sign to bit 15, exponent
// and mantissa bits to f16's (an e4m3 exponent field e is the f16 field e, bias 15
// instead of 7: hence 2^-8; e4m3 subnormals land on f16 subnormals, which the f16 ->
// f32 conversion widens exactly).
inline __m256i to_f16_bits_scaled(__m256i h) {
  const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x80)), 8);
  const __m256i mag = _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x7F)), 7);
  return _mm256_or_si256(sign, mag);
}
#endif

#if defined(__AVX512F__)
// 2^-8 times the values of the 16 codes at p, as f32.
inline __m512 load16(const uint8_t* p) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm512_cvtph_ps(to_f16_bits_scaled(_mm256_cvtepu8_epi16(b)));
}

// Rows [j0, j1) of y for M rows of x: 16 codes per step widened through f16, four
// independent sums per row of x (64 codes a step) to hide the FMA latency.
template <int64_t M>
void fused_rows(const float* x, int64_t k, const Fp8Weights& w, TypedPtr bias, float* y, int64_t n,
                int64_t j0, int64_t j1) {
  constexpr int64_t kSums = 4;
  for (int64_t j = j0; j < j1; ++j) {
    const uint8_t* row = w.codes + j * k;
    __m512 acc[M][kSums];
    for (int64_t i = 0; i < M; ++i) {
      for (int64_t s = 0; s < kSums; ++s) acc[i][s] = _mm512_setzero_ps();
    }
    int64_t c = 0;
    for (; c + kSums * kLanes <= k; c += kSums * kLanes) {
      for (int64_t s = 0; s < kSums; ++s) {
        const __m512 v = load16(row + c + s * kLanes);
        for (int64_t i = 0; i < M; ++i) {
          acc[i][s] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i * k + c + s * kLanes), v, acc[i][s]);
        }
      }
    }
    for (; c + kLanes <= k; c += kLanes) {
      const __m512 v = load16(row + c);
      for (int64_t i = 0; i < M; ++i) {
        acc[i][0] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i * k + c), v, acc[i][0]);
      }
    }
    for (int64_t i = 0; i < M; ++i) {
      const __m512 total =
          _mm512_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]), _mm512_add_ps(acc[i][2], acc[i][3]));
      float sum = _mm512_reduce_add_ps(total) * 256.0f;
      for (int64_t t = c; t < k; ++t) sum += x[i * k + t] * decode(row[t]);
      y[i * n + j] = sum * w.scales[j] + bias_at(bias, j);
    }
  }
}

// The bf16 bits of codes [begin, end) of `codes` into `out` (exact).
void decode_bf16(const uint8_t* codes, int64_t begin, int64_t end, uint16_t* out,
                 const uint16_t* table) {
  int64_t i = begin;
  for (; i + kLanes <= end; i += kLanes) {
    const __m512 v = _mm512_mul_ps(load16(codes + i), _mm512_set1_ps(256.0f));
    // Every value is a bf16: the f32's upper halves are its bits.
    const __m256i bf = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), bf);
  }
  for (; i < end; ++i) out[i] = table[codes[i]];
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
      const __m256i h = to_f16_bits_scaled(_mm256_cvtepu8_epi16(b));
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
// The bf16 bits of codes [begin, end) of `codes` into `out` (exact).
void decode_bf16(const uint8_t* codes, int64_t begin, int64_t end, uint16_t* out,
                 const uint16_t* table) {
  for (int64_t i = begin; i < end; ++i) out[i] = table[codes[i]];
}
#endif

template <int64_t M>
void fused(ThreadPool& pool, const float* x, const Fp8Weights& w, TypedPtr bias, float* y) {
  pool.parallel_for(w.rows, [&](int64_t j0, int64_t j1) {
    fused_rows<M>(x, w.cols, w, bias, y, w.rows, j0, j1);
  });
}

}  // namespace

void fp8_matmul(ThreadPool& pool, const float* x, int64_t m, const Fp8Weights& w, TypedPtr bias,
                float* y, bool bf16_dot) {
  CELLM_CHECK(m >= 0 && w.rows >= 0 && w.cols >= 0);
  if (m == 0 || w.rows == 0) return;
  CELLM_CHECK(w.codes != nullptr && w.scales != nullptr && x != nullptr && y != nullptr);
  // At m = 1 the fused path streams W once, 1 byte a weight. From m = 2 W is decoded
  // once to bf16 and shared by the rows through the bf16 kernels; at m = 2..4 both
  // this and a fused kernel that decodes per row measured about 2x bf16's time on a
  // 4096 x 4096 weight (a register-tiled fused kernel for a few rows is left to do).
  if (m == 1) return fused<1>(pool, x, w, bias, y);
  const int64_t n = w.rows, k = w.cols;
  // The bf16 bits of every code (exact).
  static const std::vector<uint16_t> table = [] {
    std::vector<uint16_t> t(256);
    for (int c = 0; c < 256; ++c) t[static_cast<size_t>(c)] = e4m3_to_bf16(static_cast<uint8_t>(c));
    return t;
  }();
  // W once into this thread's buffer, then the bf16 kernels over every row of x.
  thread_local std::vector<uint16_t> decoded;
  if (decoded.size() < static_cast<size_t>(n * k)) decoded.resize(static_cast<size_t>(n * k));
  uint16_t* wb = decoded.data();
  pool.parallel_for(
      n, [&](int64_t j0, int64_t j1) { decode_bf16(w.codes, j0 * k, j1 * k, wb, table.data()); });
  if (bf16_dot && bf16_dot_supported()) {
    bf16_dot_matmul(pool, x, m, k, wb, n, y);
  } else {
    matmul(pool, x, m, k, TypedPtr{wb, DType::kBF16}, n, TypedPtr{}, y);
  }
  pool.parallel_for(m, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      for (int64_t j = 0; j < n; ++j) y[i * n + j] = y[i * n + j] * w.scales[j] + bias_at(bias, j);
    }
  });
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
