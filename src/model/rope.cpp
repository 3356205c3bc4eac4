#include "rope.h"

#include <cmath>
#include <numbers>

#include "cellm/status.h"

namespace cellm {
namespace {

// x as a stored f32: the compiler may not fuse the operation that produced it
// into a later one (C++ allows contracting a * b + c into an FMA; torch rounds
// every op on its own, and inv_freq must match it bit for bit).
float op(float x) {
  volatile float stored = x;
  return stored;
}

}  // namespace

std::vector<float> rope_inv_freq(double theta, int64_t rotary_dim, const RopeScaling& scaling) {
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
  if (scaling.type != RopeScalingType::kLlama3) return inv_freq;

  // _compute_llama3_parameters, op by op in f32. `s / t` with a Python scalar s
  // is t.reciprocal() * s in torch (Tensor.__rtruediv__), so it is too here.
  const double old_context_f64 = static_cast<double>(scaling.original_max_position_embeddings);
  const float factor = static_cast<float>(scaling.factor);
  const float low = static_cast<float>(scaling.low_freq_factor);
  const float old_context = static_cast<float>(old_context_f64);
  // Python floats, compared against f32 tensors after a cast to f32.
  const float low_freq_wavelen = static_cast<float>(old_context_f64 / scaling.low_freq_factor);
  const float high_freq_wavelen = static_cast<float>(old_context_f64 / scaling.high_freq_factor);
  const float two_pi = static_cast<float>(2.0 * std::numbers::pi);
  const float band = static_cast<float>(scaling.high_freq_factor - scaling.low_freq_factor);
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

std::vector<float> rope_inv_freq_for(const ModelConfig& config) {
  return rope_inv_freq(config.rope_theta(), config.head_dim(), config.rope_scaling());
}

}  // namespace cellm
