#include "cpu/quant/weight_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cellm/weight_quant.h"
#include "model/half.h"

namespace cellm::cpu::quant {
namespace {

int round_clamp(float v, int lo, int hi) {
  return std::clamp(static_cast<int>(std::lround(v)), lo, hi);
}

// round(v) clamped to [0, hi], for the search's inner loops: clamped first, then
// rounded half up by truncation (v >= 0 there), no library call. NaN-free input.
inline int round_clamp_fast(float v, float hi) {
  return static_cast<int>(std::min(std::max(v, 0.0f), hi) + 0.5f);
}

// ---- Q4_K / Q5_K ---------------------------------------------------------------------------

// A sub-block's fit y = s q - m.
struct AffineFit {
  float s = 0.0f;
  float m = 0.0f;
};

// Squared error of x against s q - m with q rounded to [0, levels].
float affine_error(const float* x, int n, int levels, float s, float m) {
  if (!(s > 0.0f)) {
    float err = 0.0f;
    for (int l = 0; l < n; ++l) err += (m + x[l]) * (m + x[l]);
    return err;
  }
  const float inv = 1.0f / s, top = static_cast<float>(levels);
  float err = 0.0f;
  for (int l = 0; l < n; ++l) {
    const auto q = static_cast<float>(round_clamp_fast((x[l] + m) * inv, top));
    const float e = s * q - m - x[l];
    err += e * e;
  }
  return err;
}

// The least-squares s, m for x given the levels q, m >= 0; nullopt when no
// positive step fits.
std::optional<AffineFit> refit_affine(const float* x, const int* q, int n) {
  float sq = 0, sqq = 0, sx = 0, sqx = 0;
  for (int l = 0; l < n; ++l) {
    const auto ql = static_cast<float>(q[l]);
    sq += ql;
    sqq += ql * ql;
    sx += x[l];
    sqx += ql * x[l];
  }
  // The normal equations in double: det cancels when the levels are nearly equal.
  const double det = n * double{sqq} - double{sq} * sq;
  if (det <= 0.0) return std::nullopt;
  double s = (n * double{sqx} - double{sq} * sx) / det;
  double b = (double{sqq} * sx - double{sq} * sqx) / det;  // the offset: y = s q + b
  if (b > 0.0) {                                           // the format's offset is -m <= 0
    b = 0.0;
    s = double{sqx} / sqq;
  }
  if (!(s > 0.0)) return std::nullopt;
  return AffineFit{static_cast<float>(s), static_cast<float>(-b)};
}

AffineFit search_affine(const float* x, int n, int levels) {
  float lo = 0.0f, hi = x[0];
  for (int l = 0; l < n; ++l) {
    lo = std::min(lo, x[l]);
    hi = std::max(hi, x[l]);
  }
  const float range = hi - lo;
  if (!(range > 0.0f)) return AffineFit{0.0f, -lo};  // every weight equals lo <= 0
  AffineFit best{range / static_cast<float>(levels), -lo};
  float best_err = affine_error(x, n, levels, best.s, best.m);
  int q[32];
  const float top = static_cast<float>(levels);
  for (int i = 0; i <= 12; ++i) {
    const float inv = (top - 2.0f + 0.5f * static_cast<float>(i)) / range;
    for (int l = 0; l < n; ++l) q[l] = round_clamp_fast((x[l] - lo) * inv, top);
    const std::optional<AffineFit> fit = refit_affine(x, q, n);
    if (!fit) continue;
    const float err = affine_error(x, n, levels, fit->s, fit->m);
    if (err < best_err) {
      best_err = err;
      best = *fit;
    }
  }
  return best;
}

// Q4_K / Q5_K (levels 15 / 31): the searched sub-block fits on the 6-bit grids.
void quantize_k45(const float* x, int levels, uint16_t* d16, uint16_t* dmin16, uint8_t* scales,
                  int* q) {
  AffineFit fit[8];
  float max_s = 0.0f, max_m = 0.0f;
  for (int s = 0; s < 8; ++s) {
    fit[s] = search_affine(x + 32 * s, 32, levels);
    max_s = std::max(max_s, fit[s].s);
    max_m = std::max(max_m, fit[s].m);
  }
  *d16 = f32_to_f16(max_s / 63.0f);
  *dmin16 = f32_to_f16(max_m / 63.0f);
  const float d = f16_to_f32(*d16), dmin = f16_to_f32(*dmin16);
  uint8_t sc[8], m[8];
  for (int s = 0; s < 8; ++s) {
    sc[s] = static_cast<uint8_t>(d > 0.0f ? round_clamp(fit[s].s / d, 0, 63) : 0);
    m[s] = static_cast<uint8_t>(dmin > 0.0f ? round_clamp(fit[s].m / dmin, 0, 63) : 0);
    const float step = d * static_cast<float>(sc[s]);
    const float offset = dmin * static_cast<float>(m[s]);
    for (int l = 0; l < 32; ++l) {
      q[32 * s + l] = step > 0.0f ? round_clamp((x[32 * s + l] + offset) / step, 0, levels) : 0;
    }
  }
  for (int s = 0; s < 4; ++s) {
    scales[s] = static_cast<uint8_t>((sc[s] & 63) | ((sc[s + 4] >> 4) << 6));
    scales[s + 4] = static_cast<uint8_t>((m[s] & 63) | ((m[s + 4] >> 4) << 6));
    scales[s + 8] = static_cast<uint8_t>((sc[s + 4] & 0x0F) | ((m[s + 4] & 0x0F) << 4));
  }
}

// Weights [64c, 64c + 32) in the low nibbles of qs[32c, 32c + 32), the next 32 high.
void pack_k_nibbles(const int* q, uint8_t* qs) {
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      qs[32 * c + l] =
          static_cast<uint8_t>((q[64 * c + l] & 0x0F) | ((q[64 * c + 32 + l] & 0x0F) << 4));
    }
  }
}

void quantize_q4_k(const float* x, BlockQ4_K& b) {
  int q[256];
  quantize_k45(x, 15, &b.d, &b.dmin, b.scales, q);
  pack_k_nibbles(q, b.qs);
}

void quantize_q5_k(const float* x, BlockQ5_K& b) {
  int q[256];
  quantize_k45(x, 31, &b.d, &b.dmin, b.scales, q);
  pack_k_nibbles(q, b.qs);
  std::memset(b.qh, 0, sizeof(b.qh));
  for (int w = 0; w < 256; ++w) {
    b.qh[w % 32] = static_cast<uint8_t>(b.qh[w % 32] | (((q[w] >> 4) & 1) << (w / 32)));
  }
}

// ---- Q6_K ----------------------------------------------------------------------------------

// Squared error of x against s * q with q rounded to [-32, 31].
float symmetric_error(const float* x, int n, float s) {
  float err = 0.0f;
  if (s == 0.0f) {
    for (int l = 0; l < n; ++l) err += x[l] * x[l];
    return err;
  }
  const float inv = 1.0f / s;
  for (int l = 0; l < n; ++l) {
    // q + 32 in [0, 63], rounded as the search does.
    const auto q = static_cast<float>(round_clamp_fast(x[l] * inv + 32.0f, 63.0f) - 32);
    const float e = s * q - x[l];
    err += e * e;
  }
  return err;
}

// The searched scale s of a sub-block of 16 (y = s q, q in [-32, 31]).
float search_symmetric(const float* x, int n) {
  float mx = 0.0f;
  for (int l = 0; l < n; ++l) {
    if (std::fabs(x[l]) > std::fabs(mx)) mx = x[l];
  }
  if (mx == 0.0f) return 0.0f;
  float best = mx / -32.0f;
  float best_err = symmetric_error(x, n, best);
  // Inverse steps that send mx to -36 .. -24 (weights past -32 clip), and one that
  // sends it to +31.
  for (int i = -4; i <= 9; ++i) {
    const float target = i == 9 ? 31.0f : -32.0f + 1.0f * static_cast<float>(i);
    const float inv = target / mx;
    float sqx = 0, sqq = 0;
    for (int l = 0; l < n; ++l) {
      const auto q = static_cast<float>(round_clamp_fast(x[l] * inv + 32.0f, 63.0f) - 32);
      sqx += q * x[l];
      sqq += q * q;
    }
    if (sqq <= 0.0f) continue;
    const float s = sqx / sqq;
    const float err = symmetric_error(x, n, s);
    if (err < best_err) {
      best_err = err;
      best = s;
    }
  }
  return best;
}

void quantize_q6_k(const float* x, BlockQ6_K& b) {
  float sub[16], max_abs = 0.0f;
  for (int g = 0; g < 16; ++g) {
    sub[g] = search_symmetric(x + 16 * g, 16);
    max_abs = std::max(max_abs, std::fabs(sub[g]));
  }
  b.d = f32_to_f16(max_abs / 127.0f);
  const float d = f16_to_f32(b.d);
  int q[256];
  for (int g = 0; g < 16; ++g) {
    b.scales[g] = static_cast<int8_t>(d > 0.0f ? round_clamp(sub[g] / d, -128, 127) : 0);
    const float step = d * static_cast<float>(b.scales[g]);
    for (int l = 0; l < 16; ++l) {
      q[16 * g + l] = step != 0.0f ? round_clamp(x[16 * g + l] / step, -32, 31) + 32 : 32;
    }
  }
  std::memset(b.ql, 0, sizeof(b.ql));
  std::memset(b.qh, 0, sizeof(b.qh));
  for (int w = 0; w < 256; ++w) {
    const int h = w / 128, t = (w % 128) / 32, l = w % 32;
    uint8_t& lo = b.ql[64 * h + l + 32 * (t & 1)];
    lo = static_cast<uint8_t>(lo | ((q[w] & 0x0F) << (t < 2 ? 0 : 4)));
    b.qh[32 * h + l] = static_cast<uint8_t>(b.qh[32 * h + l] | ((q[w] >> 4) << (2 * t)));
  }
}

template <typename Block, typename Fn>
void each_block(const float* src, int64_t n, void* dst, Fn fn) {
  auto* blocks = static_cast<Block*>(dst);
  for (int64_t b = 0; b < n / kBlockK; ++b) fn(src + b * kBlockK, blocks[b]);
}

}  // namespace

bool is_weight_quant_type(QuantType type) {
  switch (type) {
    case QuantType::kQ8_0:
    case QuantType::kQ4_0:
    case QuantType::kQ4_1:
    case QuantType::kQ5_0:
    case QuantType::kQ5_1:
    case QuantType::kQ4_K:
    case QuantType::kQ5_K:
    case QuantType::kQ6_K:
      return true;
    default:
      return false;
  }
}

void quantize_weight_row(QuantType type, const float* src, int64_t n, void* dst) {
  // REQUIRES: n whole blocks of `type`, and not the activations' Q8_K.
  CELLM_CHECK(n >= 0 && n % type_info(type).block_weights == 0 && type != QuantType::kQ8_K);
  switch (type) {
    case QuantType::kQ4_K:
      return each_block<BlockQ4_K>(src, n, dst, quantize_q4_k);
    case QuantType::kQ5_K:
      return each_block<BlockQ5_K>(src, n, dst, quantize_q5_k);
    case QuantType::kQ6_K:
      return each_block<BlockQ6_K>(src, n, dst, quantize_q6_k);
    default:
      return quantize_row(type, src, n, dst);
  }
}

Status quantize_weight_matrix(QuantType src_type, const void* src, int64_t rows, int64_t cols,
                              QuantType type, void* dst, int threads) {
  CELLM_ASSIGN_OR_RETURN(const int64_t src_row, row_bytes(src_type, cols));
  CELLM_ASSIGN_OR_RETURN(const int64_t dst_row, row_bytes(type, cols));
  if (rows < 0) return InvalidArgument("a weight of " + std::to_string(rows) + " rows");
  if (type == QuantType::kQ8_K) return InvalidArgument("q8_k is not a weight format");
  const auto work = [&](int64_t begin, int64_t end) {
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = begin; r < end; ++r) {
      dequantize_row(src_type, static_cast<const std::byte*>(src) + r * src_row, cols, row.data());
      quantize_weight_row(type, row.data(), cols, static_cast<std::byte*>(dst) + r * dst_row);
    }
  };
  int n = threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency());
  // Small weights are not worth a thread each.
  constexpr int64_t kMinWeightsPerThread = int64_t{1} << 16;
  n = static_cast<int>(std::clamp<int64_t>(rows * cols / kMinWeightsPerThread, 1, std::max(1, n)));
  n = static_cast<int>(std::min<int64_t>(n, std::max<int64_t>(rows, 1)));
  std::vector<std::thread> workers;
  const int64_t per = (rows + n - 1) / n;
  for (int t = 1; t < n; ++t) {
    const int64_t begin = std::min(rows, t * per), end = std::min(rows, begin + per);
    if (begin < end) workers.emplace_back(work, begin, end);
  }
  work(0, std::min(rows, per));
  for (std::thread& w : workers) w.join();
  return Status::Ok();
}

}  // namespace cellm::cpu::quant

namespace cellm {
namespace {

std::optional<cpu::quant::QuantType> quant_type(GgmlType type) {
  const std::optional<cpu::quant::QuantType> t =
      cpu::quant::type_from_ggml_id(static_cast<uint32_t>(type));
  if (!t || *t == cpu::quant::QuantType::kQ8_K) return std::nullopt;
  return t;
}

Status unsupported(GgmlType type) {
  const std::optional<GgmlTypeInfo> info = ggml_type_info(static_cast<uint32_t>(type));
  return InvalidArgument(std::string("weights of type ") + (info ? info->name : "?") +
                         " are not read or written by the CPU layer");
}

}  // namespace

bool cpu_weight_type_supported(GgmlType type) {
  return quant_type(type).has_value();
}

Result<size_t> weight_bytes(GgmlType type, int64_t rows, int64_t cols) {
  const std::optional<cpu::quant::QuantType> t = quant_type(type);
  if (!t) return unsupported(type);
  if (rows < 0) return InvalidArgument("a weight of " + std::to_string(rows) + " rows");
  CELLM_ASSIGN_OR_RETURN(const int64_t row, cpu::quant::row_bytes(*t, cols));
  return static_cast<size_t>(rows * row);
}

Status reencode_weight(GgmlType src_type, const void* src, int64_t rows, int64_t cols,
                       GgmlType type, void* dst, int threads) {
  const std::optional<cpu::quant::QuantType> from = quant_type(src_type);
  if (!from) return unsupported(src_type);
  const std::optional<cpu::quant::QuantType> to = quant_type(type);
  if (!to) return unsupported(type);
  return cpu::quant::quantize_weight_matrix(*from, src, rows, cols, *to, dst, threads);
}

}  // namespace cellm
