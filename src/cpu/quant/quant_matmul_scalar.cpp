// The scalar reference kernels of the quantized matmul: the portable path, and
// the twin every vector kernel is tested against. One (weight row, activation
// row) pair at a time, integer dot products per block, scaled to f32 per block.
#include <cstring>

#include "cpu/quant/quant_kernels.h"
#include "model/half.h"

namespace cellm::cpu::quant {
namespace {

float h2f(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return f16_to_f32(h);
}

// The 32 quants of a Q4_0..Q5_1 block's nibbles (qs) and optional fifth bits (qh).
void quants32(const uint8_t* qs, const uint8_t* qh, int* q) {
  uint32_t high = 0;
  if (qh != nullptr) std::memcpy(&high, qh, sizeof(high));
  for (int l = 0; l < 16; ++l) {
    q[l] = (qs[l] & 0x0F) | static_cast<int>(((high >> l) & 1u) << 4);
    q[l + 16] = (qs[l] >> 4) | static_cast<int>(((high >> (l + 16)) & 1u) << 4);
  }
}

struct Dot32 {
  int32_t qa;  // sum of weight quant * activation quant
  int32_t a;   // sum of activation quants
};

Dot32 dot32(const int* q, const int8_t* a) {
  Dot32 r{0, 0};
  for (int l = 0; l < 32; ++l) {
    r.qa += q[l] * a[l];
    r.a += a[l];
  }
  return r;
}

// Block b of a 32-weight row against activation block x: its f32 contribution.
float block32(QuantType t, const uint8_t* blk, const ActBlock32& x) {
  int q[32];
  switch (t) {
    case QuantType::kQ8_0: {
      for (int l = 0; l < 32; ++l) q[l] = static_cast<int8_t>(blk[2 + l]);
      return h2f(blk) * x.d * static_cast<float>(dot32(q, x.qs).qa);
    }
    case QuantType::kQ4_0: {
      quants32(blk + 2, nullptr, q);
      const Dot32 s = dot32(q, x.qs);
      return h2f(blk) * x.d * static_cast<float>(s.qa - 8 * s.a);
    }
    case QuantType::kQ5_0: {
      quants32(blk + 6, blk + 2, q);
      const Dot32 s = dot32(q, x.qs);
      return h2f(blk) * x.d * static_cast<float>(s.qa - 16 * s.a);
    }
    case QuantType::kQ4_1:
    case QuantType::kQ5_1: {
      const bool five = t == QuantType::kQ5_1;
      quants32(blk + (five ? 8 : 4), five ? blk + 4 : nullptr, q);
      const Dot32 s = dot32(q, x.qs);
      return h2f(blk) * x.d * static_cast<float>(s.qa) +
             h2f(blk + 2) * x.d * static_cast<float>(s.a);
    }
    default:
      return 0.0f;
  }
}

// Super-block of a K-quant row against an activation super-block.
float block_k(QuantType t, const uint8_t* blk, const BlockQ8_K& x) {
  if (t == QuantType::kQ6_K) {
    BlockQ6_K b;
    std::memcpy(&b, blk, sizeof(b));
    int32_t total = 0;
    for (int g = 0; g < 16; ++g) {
      int32_t s = 0;
      for (int e = 16 * g; e < 16 * g + 16; ++e) {
        const int h = e / 128, c = (e % 128) / 32, l = e % 32;
        const uint8_t lo = b.ql[64 * h + l + 32 * (c & 1)];
        const int low4 = c < 2 ? (lo & 0x0F) : (lo >> 4);
        const int top2 = (b.qh[32 * h + l] >> (2 * c)) & 3;
        s += ((low4 | (top2 << 4)) - 32) * x.qs[e];
      }
      total += b.scales[g] * s;
    }
    return f16_to_f32(b.d) * x.d * static_cast<float>(total);
  }
  // Q4_K / Q5_K: d, dmin, scales[12], (qh[32],) qs[128].
  const bool five = t == QuantType::kQ5_K;
  const uint8_t* scales = blk + 4;
  const uint8_t* qh = five ? blk + 16 : nullptr;
  const uint8_t* qs = blk + (five ? 48 : 16);
  int32_t total = 0, mins = 0;
  for (int s = 0; s < 8; ++s) {
    uint8_t sc, m;
    k_scale_min(scales, s, &sc, &m);
    int32_t qa = 0, a = 0;
    for (int l = 0; l < 32; ++l) {
      const uint8_t byte = qs[32 * (s / 2) + l];
      int q = s % 2 == 0 ? (byte & 0x0F) : (byte >> 4);
      if (qh != nullptr) q |= ((qh[l] >> s) & 1) << 4;
      qa += q * x.qs[32 * s + l];
      a += x.qs[32 * s + l];
    }
    total += sc * qa;
    mins += m * a;
  }
  return h2f(blk) * x.d * static_cast<float>(total) - h2f(blk + 2) * x.d * static_cast<float>(mins);
}

template <QuantType T>
void kernel(const QuantGemmArgs& a, int64_t j0, int64_t j1) {
  const int64_t block_bytes = type_info(T).block_bytes;
  for (int64_t i = 0; i < a.m; ++i) {
    const uint8_t* xrow = a.act + i * a.act_row_bytes;
    for (int64_t j = j0; j < j1; ++j) {
      const uint8_t* wrow = a.w + j * a.w_row_bytes;
      float acc = 0.0f;
      for (int64_t b = 0; b < a.k_blocks; ++b) {
        if constexpr (T == QuantType::kQ4_K || T == QuantType::kQ5_K || T == QuantType::kQ6_K) {
          BlockQ8_K x;
          std::memcpy(&x, xrow + b * static_cast<int64_t>(sizeof(BlockQ8_K)), sizeof(x));
          acc += block_k(T, wrow + b * block_bytes, x);
        } else {
          ActBlock32 x;
          std::memcpy(&x, xrow + b * static_cast<int64_t>(sizeof(ActBlock32)), sizeof(x));
          acc += block32(T, wrow + b * block_bytes, x);
        }
      }
      a.y[i * a.ldy + j] = acc;
    }
  }
}

}  // namespace

QuantKernel scalar_kernel(QuantType t) {
  switch (t) {
    case QuantType::kQ4_0:
      return &kernel<QuantType::kQ4_0>;
    case QuantType::kQ4_1:
      return &kernel<QuantType::kQ4_1>;
    case QuantType::kQ5_0:
      return &kernel<QuantType::kQ5_0>;
    case QuantType::kQ5_1:
      return &kernel<QuantType::kQ5_1>;
    case QuantType::kQ8_0:
      return &kernel<QuantType::kQ8_0>;
    case QuantType::kQ4_K:
      return &kernel<QuantType::kQ4_K>;
    case QuantType::kQ5_K:
      return &kernel<QuantType::kQ5_K>;
    case QuantType::kQ6_K:
      return &kernel<QuantType::kQ6_K>;
    default:
      return nullptr;
  }
}

}  // namespace cellm::cpu::quant
