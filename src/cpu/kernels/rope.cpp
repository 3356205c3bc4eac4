#include "cpu/kernels/rope.h"

#include <cmath>

#include "cellm/status.h"

namespace cellm::cpu {
namespace {

// x as a stored f32: the compiler may not fuse the operation that produced it
// into a later one (C++ allows contracting a * b + c into an FMA; torch rounds
// every op on its own, and inv_freq must match it bit for bit).
float op(float x) {
  volatile float stored = x;
  return stored;
}

}  // namespace

std::vector<float> rope_inv_freq(double theta, int64_t rotary_dim,
                                 const std::optional<Llama3RopeScaling>& llama3) {
  // REQUIRES: a positive base and an even, positive rotary dimension.
  CELLM_CHECK(theta > 0.0 && rotary_dim > 0 && rotary_dim % 2 == 0);
  const int64_t half = rotary_dim / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  // torch: 1.0 / (base ** (arange(0, dim, 2).float() / dim)). Every tensor op is an
  // f32 op, Python scalars enter as f32; the f32 pow is computed in f64 and rounded
  // once (correctly rounded, as torch's 1-ulp pow is for these arguments); `1.0 / t`
  // is t.reciprocal() * 1.0.
  const float base = static_cast<float>(theta);
  const float dim = static_cast<float>(rotary_dim);
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = op(static_cast<float>(2 * i) / dim);
    const float p = static_cast<float>(std::pow(static_cast<double>(base), double{exponent}));
    inv_freq[static_cast<size_t>(i)] = op(1.0f / p);
  }
  if (!llama3) return inv_freq;

  // _compute_llama3_parameters, op by op in f32. `s / t` with a Python scalar s
  // is t.reciprocal() * s in torch (Tensor.__rtruediv__), so it is too here.
  const Llama3RopeScaling& s = *llama3;
  const float factor = static_cast<float>(s.factor);
  const float low = static_cast<float>(s.low_freq_factor);
  const float old_context = static_cast<float>(s.original_max_position_embeddings);
  // Python floats, compared against f32 tensors after a cast to f32.
  const float low_freq_wavelen =
      static_cast<float>(s.original_max_position_embeddings / s.low_freq_factor);
  const float high_freq_wavelen =
      static_cast<float>(s.original_max_position_embeddings / s.high_freq_factor);
  const float two_pi = static_cast<float>(2.0 * M_PI);
  const float band = static_cast<float>(s.high_freq_factor - s.low_freq_factor);
  for (float& f : inv_freq) {
    const float wavelen = op(op(1.0f / f) * two_pi);
    float scaled = wavelen > low_freq_wavelen ? op(f / factor) : f;
    const float smooth = op(op(op(op(1.0f / wavelen) * old_context) - low) / band);
    const float smoothed = op(op(op(op(1.0f - smooth) * scaled) / factor) + op(smooth * scaled));
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    if (medium) scaled = smoothed;
    f = scaled;
  }
  return inv_freq;
}

void rope(ThreadPool& pool, float* q, int64_t n_heads, float* k, int64_t n_kv_heads, int64_t m,
          int64_t head_dim, std::span<const int32_t> positions, std::span<const float> inv_freq) {
  // REQUIRES: one position per row and a rotary part that fits the head.
  CELLM_CHECK(m >= 0 && n_heads >= 0 && n_kv_heads >= 0 && head_dim > 0);
  CELLM_CHECK(static_cast<int64_t>(positions.size()) == m);
  CELLM_CHECK(2 * static_cast<int64_t>(inv_freq.size()) <= head_dim);
  CELLM_CHECK((q != nullptr || n_heads == 0) && (k != nullptr || n_kv_heads == 0));
  const int64_t half = static_cast<int64_t>(inv_freq.size());
  const auto rows = [&](int64_t begin, int64_t end) {
    std::vector<float> cos_sin(static_cast<size_t>(2 * half));
    float* cs = cos_sin.data();
    float* sn = cs + half;
    for (int64_t r = begin; r < end; ++r) {
      const float pos = static_cast<float>(positions[static_cast<size_t>(r)]);
      for (int64_t i = 0; i < half; ++i) {
        const float angle = pos * inv_freq[static_cast<size_t>(i)];
        cs[i] = std::cos(angle);
        sn[i] = std::sin(angle);
      }
      const auto rotate = [&](float* x, int64_t heads) {
        for (int64_t h = 0; h < heads; ++h) {
          float* v = x + (r * heads + h) * head_dim;
          for (int64_t i = 0; i < half; ++i) {
            const float a = v[i], b = v[i + half];
            // Two products rounded apart, then the sum, as torch's
            // q * cos + rotate_half(q) * sin.
            const float ac = a * cs[i], bs = b * sn[i], bc = b * cs[i], as = a * sn[i];
            v[i] = ac - bs;
            v[i + half] = bc + as;
          }
        }
      };
      if (n_heads > 0) rotate(q, n_heads);
      if (n_kv_heads > 0) rotate(k, n_kv_heads);
    }
  };
  if (m < 8) {
    rows(0, m);
  } else {
    pool.parallel_for(m, rows);
  }
}

}  // namespace cellm::cpu
