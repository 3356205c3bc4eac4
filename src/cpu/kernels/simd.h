// A thin vector layer for the CPU kernels: one f32 vector type `Vf` of kLanes
// lanes, loads that widen bf16/f16/f32 storage to f32, FMA, horizontal sums and a
// vector exp. Three builds, chosen by the preprocessor: AVX-512 (F+BW+VL, 16
// lanes, masked tails), AVX2+FMA+F16C (8 lanes) and plain scalar (1 lane), so the
// kernels compile anywhere and run fast where the instructions exist.
//
// `*_partial(p, n)` loads/stores the first n < kLanes lanes and zero-fills the rest
// of a load; they never touch memory past p + n.
// Thread-safety: pure functions.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cpu/kernels/convert.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define CELLM_SIMD_AVX512 1
#include "cpu/kernels/x86_intrinsics.h"
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define CELLM_SIMD_AVX2 1
#include <immintrin.h>
#else
#define CELLM_SIMD_SCALAR 1
#endif

namespace cellm::cpu::simd {

// The storage type of one element of dtype T.
template <DType T>
using Storage = std::conditional_t<T == DType::kF32, float, uint16_t>;

#if defined(CELLM_SIMD_AVX512)

inline constexpr int kLanes = 16;
using Vf = __m512;

inline const char* isa_name() {
  return "avx512";
}
inline Vf zero() {
  return _mm512_setzero_ps();
}
inline Vf set1(float v) {
  return _mm512_set1_ps(v);
}
inline Vf add(Vf a, Vf b) {
  return _mm512_add_ps(a, b);
}
inline Vf mul(Vf a, Vf b) {
  return _mm512_mul_ps(a, b);
}
inline Vf fma(Vf a, Vf b, Vf c) {
  return _mm512_fmadd_ps(a, b, c);
}  // a * b + c
inline Vf max(Vf a, Vf b) {
  return _mm512_max_ps(a, b);
}
inline float reduce_add(Vf v) {
  return _mm512_reduce_add_ps(v);
}
inline float reduce_max(Vf v) {
  return _mm512_reduce_max_ps(v);
}
inline __mmask16 tail_mask(int n) {
  return static_cast<__mmask16>((1u << n) - 1u);
}

template <DType T>
inline Vf load(const Storage<T>* p) {
  if constexpr (T == DType::kF32) {
    return _mm512_loadu_ps(p);
  } else if constexpr (T == DType::kBF16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
}

template <DType T>
inline Vf load_partial(const Storage<T>* p, int n) {
  const __mmask16 m = tail_mask(n);
  if constexpr (T == DType::kF32) {
    return _mm512_maskz_loadu_ps(m, p);
  } else if constexpr (T == DType::kBF16) {
    const __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
  }
}

inline void store(float* p, Vf v) {
  _mm512_storeu_ps(p, v);
}
inline void store_partial(float* p, Vf v, int n) {
  _mm512_mask_storeu_ps(p, tail_mask(n), v);
}

// {sum(a), sum(b), sum(c), sum(d)} into out[0..4).
inline void reduce4(Vf a, Vf b, Vf c, Vf d, float* out) {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  const __m512 abcd = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 h =
      _mm256_add_ps(_mm512_castps512_ps256(abcd),
                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(abcd), 1)));
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
}

#elif defined(CELLM_SIMD_AVX2)

inline constexpr int kLanes = 8;
using Vf = __m256;

inline const char* isa_name() {
  return "avx2";
}
inline Vf zero() {
  return _mm256_setzero_ps();
}
inline Vf set1(float v) {
  return _mm256_set1_ps(v);
}
inline Vf add(Vf a, Vf b) {
  return _mm256_add_ps(a, b);
}
inline Vf mul(Vf a, Vf b) {
  return _mm256_mul_ps(a, b);
}
inline Vf fma(Vf a, Vf b, Vf c) {
  return _mm256_fmadd_ps(a, b, c);
}
inline Vf max(Vf a, Vf b) {
  return _mm256_max_ps(a, b);
}
inline float reduce_add(Vf v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float reduce_max(Vf v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <DType T>
inline Vf load(const Storage<T>* p) {
  if constexpr (T == DType::kF32) {
    return _mm256_loadu_ps(p);
  } else if constexpr (T == DType::kBF16) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
}

template <DType T>
inline Vf load_partial(const Storage<T>* p, int n) {
  Storage<T> buf[kLanes] = {};
  std::memcpy(buf, p, static_cast<size_t>(n) * sizeof(Storage<T>));
  return load<T>(buf);
}

inline void store(float* p, Vf v) {
  _mm256_storeu_ps(p, v);
}
inline void store_partial(float* p, Vf v, int n) {
  float buf[kLanes];
  _mm256_storeu_ps(buf, v);
  std::memcpy(p, buf, static_cast<size_t>(n) * sizeof(float));
}

inline void reduce4(Vf a, Vf b, Vf c, Vf d, float* out) {
  const __m256 ab = _mm256_hadd_ps(a, b);
  const __m256 cd = _mm256_hadd_ps(c, d);
  const __m256 abcd = _mm256_hadd_ps(ab, cd);
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1)));
}

#else  // scalar

inline constexpr int kLanes = 1;
using Vf = float;

inline const char* isa_name() {
  return "scalar";
}
inline Vf zero() {
  return 0.0f;
}
inline Vf set1(float v) {
  return v;
}
inline Vf add(Vf a, Vf b) {
  return a + b;
}
inline Vf mul(Vf a, Vf b) {
  return a * b;
}
inline Vf fma(Vf a, Vf b, Vf c) {
  return std::fma(a, b, c);
}
inline Vf max(Vf a, Vf b) {
  return a > b ? a : b;
}
inline float reduce_add(Vf v) {
  return v;
}
inline float reduce_max(Vf v) {
  return v;
}

template <DType T>
inline Vf load(const Storage<T>* p) {
  if constexpr (T == DType::kF32) {
    return *p;
  } else if constexpr (T == DType::kBF16) {
    return bf16_to_f32(*p);
  } else {
    return f16_to_f32(*p);
  }
}
template <DType T>
inline Vf load_partial(const Storage<T>* p, int /*n*/) {
  return load<T>(p);
}
inline void store(float* p, Vf v) {
  *p = v;
}
inline void store_partial(float* p, Vf v, int /*n*/) {
  *p = v;
}
inline void reduce4(Vf a, Vf b, Vf c, Vf d, float* out) {
  out[0] = a;
  out[1] = b;
  out[2] = c;
  out[3] = d;
}

#endif

// Pins v to a register at this point: GCC otherwise re-reads a value that many
// FMAs share as a memory operand of each, which makes the kernels load-bound.
inline void keep_in_register([[maybe_unused]] Vf& v) {
#if (defined(CELLM_SIMD_AVX512) || defined(CELLM_SIMD_AVX2)) && defined(__GNUC__)
  asm("" : "+v"(v));
#endif
}

// sum(a[i] * b[i]) for i in [0, n), f32.
inline float dot(const float* a, const float* b, int64_t n) {
  Vf acc0 = zero(), acc1 = zero();
  int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    acc0 = fma(load<DType::kF32>(a + i), load<DType::kF32>(b + i), acc0);
    acc1 = fma(load<DType::kF32>(a + i + kLanes), load<DType::kF32>(b + i + kLanes), acc1);
  }
  for (; i + kLanes <= n; i += kLanes) {
    acc0 = fma(load<DType::kF32>(a + i), load<DType::kF32>(b + i), acc0);
  }
  if (i < n) {
    const int r = static_cast<int>(n - i);
    acc1 = fma(load_partial<DType::kF32>(a + i, r), load_partial<DType::kF32>(b + i, r), acc1);
  }
  return reduce_add(add(acc0, acc1));
}

// y[i] = y[i] * scale + a * x[i] for i in [0, n).
inline void scale_axpy(float* y, float scale, float a, const float* x, int64_t n) {
  const Vf vs = set1(scale), va = set1(a);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    store(y + i, fma(va, load<DType::kF32>(x + i), mul(load<DType::kF32>(y + i), vs)));
  }
  if (i < n) {
    const int r = static_cast<int>(n - i);
    store_partial(
        y + i,
        fma(va, load_partial<DType::kF32>(x + i, r), mul(load_partial<DType::kF32>(y + i, r), vs)),
        r);
  }
}

// Widens n elements of src (dtype T) to f32 at dst.
template <DType T>
inline void widen(const Storage<T>* src, int64_t n, float* dst) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) store(dst + i, load<T>(src + i));
  if (i < n) {
    const int r = static_cast<int>(n - i);
    store_partial(dst + i, load_partial<T>(src + i, r), r);
  }
}

inline void widen(const void* src, DType t, int64_t n, float* dst) {
  switch (t) {
    case DType::kF32:
      widen<DType::kF32>(static_cast<const float*>(src), n, dst);
      return;
    case DType::kF16:
      widen<DType::kF16>(static_cast<const uint16_t*>(src), n, dst);
      return;
    case DType::kBF16:
      widen<DType::kBF16>(static_cast<const uint16_t*>(src), n, dst);
      return;
    case DType::kF8E4M3:  // unscaled code values (convert.h)
      for (int64_t i = 0; i < n; ++i) dst[i] = load_as_f32(src, t, i);
  }
}

}  // namespace cellm::cpu::simd
