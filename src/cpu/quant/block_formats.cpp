#include "cpu/quant/block_formats.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <iterator>
#include <string>

#include "cellm/dtype.h"
#include "model/half.h"

namespace cellm::cpu::quant {
namespace {

constexpr QuantTypeInfo kTypes[kNumQuantTypes] = {
    {QuantType::kF32, "f32", 1, 4},
    {QuantType::kF16, "f16", 1, 2},
    {QuantType::kQ4_0, "q4_0", kBlock32, sizeof(BlockQ4_0)},
    {QuantType::kQ4_1, "q4_1", kBlock32, sizeof(BlockQ4_1)},
    {QuantType::kQ5_0, "q5_0", kBlock32, sizeof(BlockQ5_0)},
    {QuantType::kQ5_1, "q5_1", kBlock32, sizeof(BlockQ5_1)},
    {QuantType::kQ8_0, "q8_0", kBlock32, sizeof(BlockQ8_0)},
    {QuantType::kQ4_K, "q4_k", kBlockK, sizeof(BlockQ4_K)},
    {QuantType::kQ5_K, "q5_k", kBlockK, sizeof(BlockQ5_K)},
    {QuantType::kQ6_K, "q6_k", kBlockK, sizeof(BlockQ6_K)},
    {QuantType::kQ8_K, "q8_k", kBlockK, sizeof(BlockQ8_K)},
    {QuantType::kBF16, "bf16", 1, 2},
};

// The kernels' table is the subset of the format's (cellm/dtype.h) they run: same ids,
// same block geometry, so a tensor the loader accepted is read with the layout it has.
constexpr bool matches_format(const QuantTypeInfo& t) {
  const std::optional<GgmlTypeInfo> f = ggml_type_info(static_cast<uint32_t>(t.type));
  return f && f->block_elements == t.block_weights &&
         static_cast<int64_t>(f->block_bytes) == t.block_bytes;
}
static_assert(std::all_of(std::begin(kTypes), std::end(kTypes), matches_format),
              "a block format disagrees with the GGUF type table in cellm/dtype.h");

float h2f(uint16_t h) {
  return f16_to_f32(h);
}

// The low nibbles of qs[0, 16) are weights [0, 16), the high nibbles [16, 32).
void unpack_nibbles32(const uint8_t* qs, int* q) {
  for (int j = 0; j < 16; ++j) {
    q[j] = qs[j] & 0x0F;
    q[j + 16] = qs[j] >> 4;
  }
}

void pack_nibbles32(const int* q, uint8_t* qs) {
  for (int j = 0; j < 16; ++j)
    qs[j] = static_cast<uint8_t>((q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4));
}

uint32_t load_u32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

// ---- dequantize, one block ------------------------------------------------------------------

void dq_q4_0(const BlockQ4_0& b, float* y) {
  const float d = h2f(b.d);
  int q[32];
  unpack_nibbles32(b.qs, q);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(q[j] - 8);
}

void dq_q4_1(const BlockQ4_1& b, float* y) {
  const float d = h2f(b.d), m = h2f(b.m);
  int q[32];
  unpack_nibbles32(b.qs, q);
  for (int j = 0; j < 32; ++j) {
    const float dq = d * static_cast<float>(q[j]);
    y[j] = dq + m;
  }
}

void dq_q5_0(const BlockQ5_0& b, float* y) {
  const float d = h2f(b.d);
  const uint32_t qh = load_u32(b.qh);
  int q[32];
  unpack_nibbles32(b.qs, q);
  for (int j = 0; j < 32; ++j) {
    y[j] = d * static_cast<float>((q[j] | static_cast<int>(((qh >> j) & 1u) << 4)) - 16);
  }
}

void dq_q5_1(const BlockQ5_1& b, float* y) {
  const float d = h2f(b.d), m = h2f(b.m);
  const uint32_t qh = load_u32(b.qh);
  int q[32];
  unpack_nibbles32(b.qs, q);
  for (int j = 0; j < 32; ++j) {
    const float dq = d * static_cast<float>(q[j] | static_cast<int>(((qh >> j) & 1u) << 4));
    y[j] = dq + m;
  }
}

void dq_q8_0(const BlockQ8_0& b, float* y) {
  const float d = h2f(b.d);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(b.qs[j]) * d;
}

// Q4_K and Q5_K share the scale layout; qh == nullptr for Q4_K.
void dq_k45(uint16_t d16, uint16_t dmin16, const uint8_t* scales, const uint8_t* qh,
            const uint8_t* qs, float* y) {
  const float d = h2f(d16), dmin = h2f(dmin16);
  for (int s = 0; s < 8; ++s) {
    uint8_t sc, m;
    k_scale_min(scales, s, &sc, &m);
    const float ds = d * static_cast<float>(sc);
    const float dm = dmin * static_cast<float>(m);
    const uint8_t* q = qs + 32 * (s / 2);
    for (int l = 0; l < 32; ++l) {
      int v = (s % 2 == 0) ? (q[l] & 0x0F) : (q[l] >> 4);
      if (qh != nullptr) v |= ((qh[l] >> s) & 1) << 4;
      const float p = ds * static_cast<float>(v);
      y[32 * s + l] = p - dm;
    }
  }
}

void dq_q6_k(const BlockQ6_K& b, float* y) {
  const float d = h2f(b.d);
  for (int w = 0; w < 256; ++w) {
    const int h = w / 128, t = (w % 128) / 32, l = w % 32;
    const uint8_t lo = b.ql[64 * h + l + 32 * (t & 1)];
    const int low4 = t < 2 ? (lo & 0x0F) : (lo >> 4);
    const int top2 = (b.qh[32 * h + l] >> (2 * t)) & 3;
    const float ds = d * static_cast<float>(b.scales[w / 16]);
    y[w] = ds * static_cast<float>((low4 | (top2 << 4)) - 32);
  }
}

void dq_q8_k(const BlockQ8_K& b, float* y) {
  for (int j = 0; j < 256; ++j) y[j] = b.d * static_cast<float>(b.qs[j]);
}

// ---- quantize, one block --------------------------------------------------------------------

// The element of largest magnitude, with its sign (the first such on ties).
float signed_absmax(const float* x, int n) {
  float best = 0.0f, best_abs = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (std::fabs(x[j]) > best_abs) {
      best_abs = std::fabs(x[j]);
      best = x[j];
    }
  }
  return best;
}

float inverse_or_zero(float d) {
  return d == 0.0f ? 0.0f : 1.0f / d;
}

// Symmetric 4/5-bit: d = max / -half, q = trunc(x / d + half + 0.5) clamped to [0, 2 half).
void q_symmetric(const float* x, int half, uint16_t* d16, int* q) {
  const float d = signed_absmax(x, 32) / static_cast<float>(-half);
  const float id = inverse_or_zero(d);
  for (int j = 0; j < 32; ++j) {
    const float v = x[j] * id + (static_cast<float>(half) + 0.5f);
    q[j] = std::clamp(static_cast<int>(std::trunc(v)), 0, 2 * half - 1);
  }
  *d16 = f32_to_f16(d);
}

// Affine 4/5-bit: d = (max - min) / levels, m = min, q = trunc((x - min) / d + 0.5).
void q_affine(const float* x, int levels, uint16_t* d16, uint16_t* m16, int* q) {
  float mn = x[0], mx = x[0];
  for (int j = 1; j < 32; ++j) {
    mn = std::min(mn, x[j]);
    mx = std::max(mx, x[j]);
  }
  const float d = (mx - mn) / static_cast<float>(levels);
  const float id = inverse_or_zero(d);
  for (int j = 0; j < 32; ++j) {
    const float v = (x[j] - mn) * id + 0.5f;
    q[j] = std::clamp(static_cast<int>(std::trunc(v)), 0, levels);
  }
  *d16 = f32_to_f16(d);
  *m16 = f32_to_f16(mn);
}

void q_q8_0(const float* x, BlockQ8_0& b) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = inverse_or_zero(d);
  for (int j = 0; j < 32; ++j) b.qs[j] = static_cast<int8_t>(std::round(x[j] * id));
  b.d = f32_to_f16(d);
}

int round_clamp(float v, int lo, int hi) {
  return std::clamp(static_cast<int>(std::lround(v)), lo, hi);
}

// Q4_K / Q5_K (levels 15 / 31): each sub-block's scale = range / levels and
// min = -min(0, smallest); both rounded to 6 bits of the super-block's d / dmin.
void q_k45(const float* x, int levels, uint16_t* d16, uint16_t* dmin16, uint8_t* scales, int* q) {
  float sub_scale[8], sub_min[8];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int s = 0; s < 8; ++s) {
    float mn = 0.0f, mx = x[32 * s];
    for (int l = 0; l < 32; ++l) {
      mn = std::min(mn, x[32 * s + l]);
      mx = std::max(mx, x[32 * s + l]);
    }
    sub_scale[s] = std::max(0.0f, mx - mn) / static_cast<float>(levels);
    sub_min[s] = -mn;
    max_scale = std::max(max_scale, sub_scale[s]);
    max_min = std::max(max_min, sub_min[s]);
  }
  *d16 = f32_to_f16(max_scale / 63.0f);
  *dmin16 = f32_to_f16(max_min / 63.0f);
  const float d = h2f(*d16), dmin = h2f(*dmin16);
  uint8_t sc[8], m[8];
  for (int s = 0; s < 8; ++s) {
    sc[s] = static_cast<uint8_t>(d > 0.0f ? round_clamp(sub_scale[s] / d, 0, 63) : 0);
    m[s] = static_cast<uint8_t>(dmin > 0.0f ? round_clamp(sub_min[s] / dmin, 0, 63) : 0);
    const float step = d * static_cast<float>(sc[s]);
    const float offset = dmin * static_cast<float>(m[s]);
    for (int l = 0; l < 32; ++l) {
      q[32 * s + l] = step > 0.0f ? round_clamp((x[32 * s + l] + offset) / step, 0, levels) : 0;
    }
  }
  for (int s = 0; s < 4; ++s) {
    scales[s] = static_cast<uint8_t>(sc[s] | ((sc[s + 4] >> 4) << 6));
    scales[s + 4] = static_cast<uint8_t>(m[s] | ((m[s + 4] >> 4) << 6));
    scales[s + 8] = static_cast<uint8_t>((sc[s + 4] & 0x0F) | ((m[s + 4] & 0x0F) << 4));
  }
}

void pack_k_low_nibbles(const int* q, uint8_t* qs) {
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      qs[32 * c + l] =
          static_cast<uint8_t>((q[64 * c + l] & 0x0F) | ((q[64 * c + 32 + l] & 0x0F) << 4));
    }
  }
}

void q_q4_k(const float* x, BlockQ4_K& b) {
  int q[256];
  q_k45(x, 15, &b.d, &b.dmin, b.scales, q);
  pack_k_low_nibbles(q, b.qs);
}

void q_q5_k(const float* x, BlockQ5_K& b) {
  int q[256];
  q_k45(x, 31, &b.d, &b.dmin, b.scales, q);
  pack_k_low_nibbles(q, b.qs);
  std::memset(b.qh, 0, sizeof(b.qh));
  for (int w = 0; w < 256; ++w) {
    b.qh[w % 32] = static_cast<uint8_t>(b.qh[w % 32] | (((q[w] >> 4) & 1) << (w / 32)));
  }
}

// Q6_K: each sub-block of 16 maps its largest-magnitude weight to q - 32 = -32;
// the sub-block scales are rounded to int8 steps of d = max |scale| / 127.
void q_q6_k(const float* x, BlockQ6_K& b) {
  float sub_scale[16], max_abs_scale = 0.0f;
  for (int g = 0; g < 16; ++g) {
    sub_scale[g] = signed_absmax(x + 16 * g, 16) / -32.0f;
    max_abs_scale = std::max(max_abs_scale, std::fabs(sub_scale[g]));
  }
  b.d = f32_to_f16(max_abs_scale / 127.0f);
  const float d = h2f(b.d);
  int q[256];
  for (int g = 0; g < 16; ++g) {
    b.scales[g] = static_cast<int8_t>(d > 0.0f ? round_clamp(sub_scale[g] / d, -128, 127) : 0);
    const float step = d * static_cast<float>(b.scales[g]);
    for (int l = 0; l < 16; ++l) {
      q[16 * g + l] = step != 0.0f ? round_clamp(x[16 * g + l] / step, -32, 31) + 32 : 32;
    }
  }
  std::memset(b.qh, 0, sizeof(b.qh));
  for (int w = 0; w < 256; ++w) {
    const int h = w / 128, t = (w % 128) / 32, l = w % 32;
    uint8_t& lo = b.ql[64 * h + l + 32 * (t & 1)];
    if (t < 2) {
      lo = static_cast<uint8_t>(q[w] & 0x0F);
    } else {
      lo = static_cast<uint8_t>(lo | ((q[w] & 0x0F) << 4));
    }
    b.qh[32 * h + l] = static_cast<uint8_t>(b.qh[32 * h + l] | ((q[w] >> 4) << (2 * t)));
  }
}

void q_q8_k(const float* x, BlockQ8_K& b) {
  float amax = 0.0f;
  for (int j = 0; j < 256; ++j) amax = std::max(amax, std::fabs(x[j]));
  b.d = amax / 127.0f;
  const float id = inverse_or_zero(b.d);
  for (int j = 0; j < 256; ++j) {
    b.qs[j] = static_cast<int8_t>(std::clamp(static_cast<int>(std::round(x[j] * id)), -127, 127));
  }
  for (int g = 0; g < 16; ++g) {
    int sum = 0;
    for (int l = 0; l < 16; ++l) sum += b.qs[16 * g + l];
    b.bsums[g] = static_cast<int16_t>(sum);
  }
}

template <typename Block, typename Fn>
void for_blocks(const void* src, int64_t n, int64_t block_weights, float* dst, Fn fn) {
  const auto* blocks = static_cast<const Block*>(src);
  for (int64_t b = 0; b < n / block_weights; ++b) fn(blocks[b], dst + b * block_weights);
}

template <typename Block, typename Fn>
void for_blocks_out(const float* src, int64_t n, int64_t block_weights, void* dst, Fn fn) {
  auto* blocks = static_cast<Block*>(dst);
  for (int64_t b = 0; b < n / block_weights; ++b) fn(src + b * block_weights, blocks[b]);
}

}  // namespace

const QuantTypeInfo* all_types() {
  return kTypes;
}

const QuantTypeInfo& type_info(QuantType type) {
  for (const QuantTypeInfo& info : kTypes) {
    if (info.type == type) return info;
  }
  CELLM_CHECK_MSG(false, "type_info: not a QuantType");
  return kTypes[0];
}

std::optional<QuantType> type_from_ggml_id(uint32_t ggml_id) {
  for (const QuantTypeInfo& info : kTypes) {
    if (static_cast<uint32_t>(info.type) == ggml_id) return info.type;
  }
  return std::nullopt;
}

std::optional<QuantType> type_from_name(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const QuantTypeInfo& info : kTypes) {
    if (lower == info.name) return info.type;
  }
  return std::nullopt;
}

Result<int64_t> row_bytes(QuantType type, int64_t n_weights) {
  const QuantTypeInfo& info = type_info(type);
  if (n_weights < 0 || n_weights % info.block_weights != 0) {
    return InvalidArgument(std::string("a row of ") + std::to_string(n_weights) +
                           " weights is not a whole number of " + info.name + " blocks of " +
                           std::to_string(info.block_weights));
  }
  return n_weights / info.block_weights * info.block_bytes;
}

void dequantize_row(QuantType type, const void* src, int64_t n, float* dst) {
  // REQUIRES: n a whole number of blocks.
  CELLM_CHECK(n >= 0 && n % type_info(type).block_weights == 0);
  switch (type) {
    case QuantType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case QuantType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = h2f(static_cast<const uint16_t*>(src)[i]);
      return;
    case QuantType::kBF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(static_cast<const uint16_t*>(src)[i]);
      return;
    case QuantType::kQ4_0:
      return for_blocks<BlockQ4_0>(src, n, kBlock32, dst, dq_q4_0);
    case QuantType::kQ4_1:
      return for_blocks<BlockQ4_1>(src, n, kBlock32, dst, dq_q4_1);
    case QuantType::kQ5_0:
      return for_blocks<BlockQ5_0>(src, n, kBlock32, dst, dq_q5_0);
    case QuantType::kQ5_1:
      return for_blocks<BlockQ5_1>(src, n, kBlock32, dst, dq_q5_1);
    case QuantType::kQ8_0:
      return for_blocks<BlockQ8_0>(src, n, kBlock32, dst, dq_q8_0);
    case QuantType::kQ4_K:
      return for_blocks<BlockQ4_K>(src, n, kBlockK, dst, [](const BlockQ4_K& b, float* y) {
        dq_k45(b.d, b.dmin, b.scales, nullptr, b.qs, y);
      });
    case QuantType::kQ5_K:
      return for_blocks<BlockQ5_K>(src, n, kBlockK, dst, [](const BlockQ5_K& b, float* y) {
        dq_k45(b.d, b.dmin, b.scales, b.qh, b.qs, y);
      });
    case QuantType::kQ6_K:
      return for_blocks<BlockQ6_K>(src, n, kBlockK, dst, dq_q6_k);
    case QuantType::kQ8_K:
      return for_blocks<BlockQ8_K>(src, n, kBlockK, dst, dq_q8_k);
  }
}

void quantize_row(QuantType type, const float* src, int64_t n, void* dst) {
  // REQUIRES: n a whole number of blocks.
  CELLM_CHECK(n >= 0 && n % type_info(type).block_weights == 0);
  switch (type) {
    case QuantType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case QuantType::kF16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = f32_to_f16(src[i]);
      return;
    case QuantType::kBF16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = f32_to_bf16(src[i]);
      return;
    case QuantType::kQ4_0:
      return for_blocks_out<BlockQ4_0>(src, n, kBlock32, dst, [](const float* x, BlockQ4_0& b) {
        int q[32];
        q_symmetric(x, 8, &b.d, q);
        pack_nibbles32(q, b.qs);
      });
    case QuantType::kQ4_1:
      return for_blocks_out<BlockQ4_1>(src, n, kBlock32, dst, [](const float* x, BlockQ4_1& b) {
        int q[32];
        q_affine(x, 15, &b.d, &b.m, q);
        pack_nibbles32(q, b.qs);
      });
    case QuantType::kQ5_0:
      return for_blocks_out<BlockQ5_0>(src, n, kBlock32, dst, [](const float* x, BlockQ5_0& b) {
        int q[32];
        q_symmetric(x, 16, &b.d, q);
        pack_nibbles32(q, b.qs);
        uint32_t qh = 0;
        for (int j = 0; j < 32; ++j) qh |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
        for (int i = 0; i < 4; ++i) b.qh[i] = static_cast<uint8_t>(qh >> (8 * i));
      });
    case QuantType::kQ5_1:
      return for_blocks_out<BlockQ5_1>(src, n, kBlock32, dst, [](const float* x, BlockQ5_1& b) {
        int q[32];
        q_affine(x, 31, &b.d, &b.m, q);
        pack_nibbles32(q, b.qs);
        uint32_t qh = 0;
        for (int j = 0; j < 32; ++j) qh |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
        for (int i = 0; i < 4; ++i) b.qh[i] = static_cast<uint8_t>(qh >> (8 * i));
      });
    case QuantType::kQ8_0:
      return for_blocks_out<BlockQ8_0>(src, n, kBlock32, dst, q_q8_0);
    case QuantType::kQ4_K:
      return for_blocks_out<BlockQ4_K>(src, n, kBlockK, dst, q_q4_k);
    case QuantType::kQ5_K:
      return for_blocks_out<BlockQ5_K>(src, n, kBlockK, dst, q_q5_k);
    case QuantType::kQ6_K:
      return for_blocks_out<BlockQ6_K>(src, n, kBlockK, dst, q_q6_k);
    case QuantType::kQ8_K:
      return for_blocks_out<BlockQ8_K>(src, n, kBlockK, dst, q_q8_k);
  }
}

}  // namespace cellm::cpu::quant
