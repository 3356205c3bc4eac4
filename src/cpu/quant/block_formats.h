// The block formats of GGUF's weight types: what one block of each type holds,
// the type table (name, ggml type id, weights per block, bytes per block), and
// the scalar conversions between a row of blocks and floats.
//
// A quantized row of n weights is n / block_weights blocks laid end to end; the
// block layouts below are the file format's (llama.cpp's ggml), so a tensor
// memory-mapped from a GGUF file is used in place. Every 16-bit scale is an IEEE
// binary16 held as its raw bits; every block size is even, so a row whose base is
// 2-byte aligned (GGUF aligns tensor data to 32) has every scale aligned.
//
// Dequantization computes exactly what the format defines, in the same float
// operations as the `gguf` Python package's reference dequantizer (products
// rounded to f32 one at a time, no fused multiply-add), so the results match it
// bit for bit.
//
// Quantization is round-to-nearest with each format's own scale rule (Q4_0's
// d = max / -8, Q8_0's d = amax / 127, ...); for the 32-weight formats it is the
// rule of ggml's reference quantizer and gives the same bytes as
// gguf.quants.quantize. For the K-quants it differs from llama.cpp's quantizer,
// which searches each sub-block's scale and min to minimise a weighted squared
// error (and may use an importance matrix): here each sub-block's scale and min
// come straight from its range, and the sub-block scales are then rounded to the
// 6-bit (Q4_K, Q5_K) or 8-bit (Q6_K) grid of the super-block scale. The files are
// valid K-quant blocks; their error is a little larger than llama-quantize's.
//
// Thread-safety: pure functions over caller-owned memory.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "cellm/status.h"

namespace cellm::cpu::quant {

// The weight types, valued by their ggml type id (the id a GGUF tensor records).
enum class QuantType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,  // not a weight format in files: the activations of the K-quant matmuls
  kBF16 = 30,
};

struct QuantTypeInfo {
  QuantType type;
  const char* name;       // ggml's spelling: "q4_k", "bf16", ...
  int64_t block_weights;  // weights per block (1 for the float types)
  int64_t block_bytes;    // bytes per block
};

// Every type above, in ggml id order.
inline constexpr int kNumQuantTypes = 12;
const QuantTypeInfo& type_info(QuantType type);
const QuantTypeInfo* all_types();  // [kNumQuantTypes]

// The type a GGUF tensor's ggml id names; nullopt for ids this table lacks.
std::optional<QuantType> type_from_ggml_id(uint32_t ggml_id);
// The type spelled `name` (case-insensitive: "Q4_K", "q8_0", "bf16").
std::optional<QuantType> type_from_name(std::string_view name);

// Bytes of one row of n_weights weights, or an error naming the type and the
// block size when n_weights is not a whole number of blocks (or negative).
Result<int64_t> row_bytes(QuantType type, int64_t n_weights);

constexpr int64_t kBlock32 = 32;  // weights per block of Q4_0 .. Q8_0
constexpr int64_t kBlockK = 256;  // weights per super-block of the K-quants
constexpr int64_t kKScaleBytes = 12;

// One block of each quantized type (the file's layout, little-endian).
struct BlockQ4_0 {
  uint16_t d;      // y = d * (q - 8)
  uint8_t qs[16];  // weight j in the low nibble of qs[j], weight j + 16 in the high
};
struct BlockQ4_1 {
  uint16_t d, m;   // y = d * q + m
  uint8_t qs[16];  // as Q4_0
};
struct BlockQ5_0 {
  uint16_t d;      // y = d * (q - 16)
  uint8_t qh[4];   // bit j of the little-endian u32: bit 4 of weight j
  uint8_t qs[16];  // low 4 bits, as Q4_0
};
struct BlockQ5_1 {
  uint16_t d, m;  // y = d * q + m
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ8_0 {
  uint16_t d;  // y = d * q
  int8_t qs[32];
};
// K-quants: a super-block of 256 weights in sub-blocks. Q4_K and Q5_K: 8
// sub-blocks of 32, each with a 6-bit scale sc and 6-bit min m packed in
// `scales`, y = d * sc * q - dmin * m. Weights [64c, 64c + 32) are the low
// nibbles of qs[32c, 32c + 32), weights [64c + 32, 64c + 64) the high nibbles.
struct BlockQ4_K {
  uint16_t d, dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qs[128];
};
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qh[32];  // bit s of qh[l]: bit 4 of weight 32 s + l (sub-block s)
  uint8_t qs[128];
};
// Q6_K: 16 sub-blocks of 16, y = d * scales[w / 16] * (q - 32), q 6-bit. In each
// half h (128 weights, ql + 64 h, qh + 32 h) weight 128 h + 32 t + l (t < 4,
// l < 32) has its low 4 bits in ql[l + 32 (t & 1)] (low nibble for t < 2, high
// for t >= 2) and its top 2 bits at bit 2 t of qh[l].
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
// Q8_K: y = d * q; bsums[g] = sum of qs[16 g, 16 g + 16).
struct BlockQ8_K {
  float d;
  int8_t qs[256];
  int16_t bsums[16];
};

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_K) == 144 &&
              sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210 && sizeof(BlockQ8_K) == 292);

// Sub-block s (< 8) of a Q4_K/Q5_K `scales` field: its 6-bit scale and min.
inline void k_scale_min(const uint8_t* scales, int s, uint8_t* sc, uint8_t* m) {
  if (s < 4) {
    *sc = scales[s] & 63;
    *m = scales[s + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((scales[s + 4] & 0x0F) | ((scales[s - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((scales[s + 4] >> 4) | ((scales[s] >> 6) << 4));
  }
}

// dst[0, n) = the weights of the row at src.
// REQUIRES: n a whole number of blocks of `type` (row_bytes succeeds).
void dequantize_row(QuantType type, const void* src, int64_t n, float* dst);

// dst = src[0, n) in `type`'s blocks (row_bytes(type, n) bytes), rounded to
// nearest under the format's scale rule (see the header comment).
// REQUIRES: n a whole number of blocks of `type`; src finite.
void quantize_row(QuantType type, const float* src, int64_t n, void* dst);

}  // namespace cellm::cpu::quant
