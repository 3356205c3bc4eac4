#include "cpu/kernels/activation.h"

#include <algorithm>
#include <cmath>

#include "cellm/status.h"
#include "cpu/kernels/simd.h"

namespace cellm::cpu {
namespace {

using simd::kLanes;
using simd::Vf;

// Cephes expf: exp(x) = 2^n * exp(r), n = round(x / ln2), r = x - n ln2 (ln2 split
// in two for an exact product), exp(r) by a degree-6 polynomial on |r| <= ln2/2.
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kP0 = 1.9875691500e-4f;
constexpr float kP1 = 1.3981999507e-3f;
constexpr float kP2 = 8.3334519073e-3f;
constexpr float kP3 = 4.1665795894e-2f;
constexpr float kP4 = 1.6666665459e-1f;
constexpr float kP5 = 5.0000001201e-1f;
// Beyond these exp overflows to inf / underflows to 0 in f32.
constexpr float kMaxArg = 88.7228394f;
constexpr float kMinArg = -103.972084f;

float exp_scalar(float x) {
  if (std::isnan(x)) return x;
  if (x > kMaxArg) return INFINITY;
  if (x < kMinArg) return 0.0f;
  const float n = std::nearbyint(x * kLog2e);
  float r = x - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float p = kP0;
  p = p * r + kP1;
  p = p * r + kP2;
  p = p * r + kP3;
  p = p * r + kP4;
  p = p * r + kP5;
  p = p * r * r + r + 1.0f;
  return std::ldexp(p, static_cast<int>(n));
}

#if defined(CELLM_SIMD_AVX512)
Vf exp_vec(Vf x) {
  // max/min return their second operand when either is NaN, so NaN passes through.
  x = _mm512_min_ps(_mm512_set1_ps(kMaxArg), _mm512_max_ps(_mm512_set1_ps(kMinArg), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kP0);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP5));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);  // p * 2^n, to inf / 0 at the ends of the range
}
#endif

void silu_mul_range(const float* gate, const float* up, int64_t begin, int64_t end, float* out) {
  int64_t i = begin;
#if defined(CELLM_SIMD_AVX512)
  const Vf one = simd::set1(1.0f);
  for (; i + kLanes <= end; i += kLanes) {
    const Vf g = simd::load<DType::kF32>(gate + i);
    const Vf e = exp_vec(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const Vf s = _mm512_div_ps(g, simd::add(one, e));
    simd::store(out + i, simd::mul(s, simd::load<DType::kF32>(up + i)));
  }
#endif
  for (; i < end; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + exp_scalar(-g)) * up[i];
  }
}

}  // namespace

float fast_exp(float x) {
#if defined(CELLM_SIMD_AVX512)
  return _mm512_cvtss_f32(exp_vec(_mm512_set1_ps(x)));
#else
  return exp_scalar(x);
#endif
}

void exp_array(const float* x, int64_t n, float* out) {
  int64_t i = 0;
#if defined(CELLM_SIMD_AVX512)
  for (; i + kLanes <= n; i += kLanes)
    simd::store(out + i, exp_vec(simd::load<DType::kF32>(x + i)));
  if (i < n) {
    const int r = static_cast<int>(n - i);
    simd::store_partial(out + i, exp_vec(simd::load_partial<DType::kF32>(x + i, r)), r);
    return;
  }
#endif
  for (; i < n; ++i) out[i] = exp_scalar(x[i]);
}

void silu_mul(ThreadPool& pool, const float* gate, const float* up, int64_t n, float* out) {
  CELLM_CHECK(n >= 0);
  if (n == 0) return;
  CELLM_CHECK(gate != nullptr && up != nullptr && out != nullptr);
  if (n < (1 << 14)) {
    silu_mul_range(gate, up, 0, n, out);
    return;
  }
  // Chunks in whole vectors so every chunk but the last runs the vector loop only.
  const int64_t blocks = (n + 63) / 64;
  pool.parallel_for(blocks, [&](int64_t b0, int64_t b1) {
    silu_mul_range(gate, up, b0 * 64, std::min(n, b1 * 64), out);
  });
}

}  // namespace cellm::cpu
