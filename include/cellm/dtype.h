// DType and TensorView: the element types of model tensors that cellm reads and
// computes with, and a non-owning view of one tensor's bytes. Plain value
// vocabulary shared by the model loader and every executor; public because
// ModelWeights hands out TensorViews and ModelWeights::random takes a DType.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cellm {

enum class DType {
  kBF16,  // bfloat16: 1 sign, 8 exponent, 7 mantissa bits
  kF16,   // IEEE binary16: 1 sign, 5 exponent, 10 mantissa bits
  kF32,   // IEEE binary32
  // float8_e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities,
  // S.1111.111 is NaN, largest finite 448, subnormals down to 2^-9. Linear weights
  // only, each row scaled by TensorView::scales (model/fp8.h has the codec).
  kF8E4M3,
};

// Bytes per element: 2, 2, 4, 1.
constexpr size_t dtype_size_bytes(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return 2;
    case DType::kF16:
      return 2;
    case DType::kF32:
      return 4;
    case DType::kF8E4M3:
      return 1;
  }
  return 0;
}

// The safetensors spelling: "BF16", "F16", "F32", "F8_E4M3".
constexpr const char* to_string(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kF32:
      return "F32";
    case DType::kF8E4M3:
      return "F8_E4M3";
  }
  return "unknown";
}

// The tensor type ids of the GGUF format (ggml's type numbering, as stored in a
// file's tensor infos). Ids 4, 5, 31-33 and 36-38 are retired and not listed.
// Block sizes are those of the gguf Python package (GGML_QUANT_SIZES).
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
  kNVFP4 = 40,
  kQ1_0 = 41,
};

// How a ggml type stores its elements: blocks of `block_elements` values in
// `block_bytes` bytes (1 element per block for the plain types).
struct GgmlTypeInfo {
  GgmlType type;
  const char* name;  // "Q4_K", as the format's tools spell it
  int64_t block_elements;
  size_t block_bytes;
};

// The layout of ggml type `id`, or nullopt for an id the format does not define.
constexpr std::optional<GgmlTypeInfo> ggml_type_info(uint32_t id) {
  switch (static_cast<GgmlType>(id)) {
    case GgmlType::kF32:
      return GgmlTypeInfo{GgmlType::kF32, "F32", 1, 4};
    case GgmlType::kF16:
      return GgmlTypeInfo{GgmlType::kF16, "F16", 1, 2};
    case GgmlType::kQ4_0:
      return GgmlTypeInfo{GgmlType::kQ4_0, "Q4_0", 32, 18};
    case GgmlType::kQ4_1:
      return GgmlTypeInfo{GgmlType::kQ4_1, "Q4_1", 32, 20};
    case GgmlType::kQ5_0:
      return GgmlTypeInfo{GgmlType::kQ5_0, "Q5_0", 32, 22};
    case GgmlType::kQ5_1:
      return GgmlTypeInfo{GgmlType::kQ5_1, "Q5_1", 32, 24};
    case GgmlType::kQ8_0:
      return GgmlTypeInfo{GgmlType::kQ8_0, "Q8_0", 32, 34};
    case GgmlType::kQ8_1:
      return GgmlTypeInfo{GgmlType::kQ8_1, "Q8_1", 32, 40};
    case GgmlType::kQ2_K:
      return GgmlTypeInfo{GgmlType::kQ2_K, "Q2_K", 256, 84};
    case GgmlType::kQ3_K:
      return GgmlTypeInfo{GgmlType::kQ3_K, "Q3_K", 256, 110};
    case GgmlType::kQ4_K:
      return GgmlTypeInfo{GgmlType::kQ4_K, "Q4_K", 256, 144};
    case GgmlType::kQ5_K:
      return GgmlTypeInfo{GgmlType::kQ5_K, "Q5_K", 256, 176};
    case GgmlType::kQ6_K:
      return GgmlTypeInfo{GgmlType::kQ6_K, "Q6_K", 256, 210};
    case GgmlType::kQ8_K:
      return GgmlTypeInfo{GgmlType::kQ8_K, "Q8_K", 256, 292};
    case GgmlType::kIQ2_XXS:
      return GgmlTypeInfo{GgmlType::kIQ2_XXS, "IQ2_XXS", 256, 66};
    case GgmlType::kIQ2_XS:
      return GgmlTypeInfo{GgmlType::kIQ2_XS, "IQ2_XS", 256, 74};
    case GgmlType::kIQ3_XXS:
      return GgmlTypeInfo{GgmlType::kIQ3_XXS, "IQ3_XXS", 256, 98};
    case GgmlType::kIQ1_S:
      return GgmlTypeInfo{GgmlType::kIQ1_S, "IQ1_S", 256, 50};
    case GgmlType::kIQ4_NL:
      return GgmlTypeInfo{GgmlType::kIQ4_NL, "IQ4_NL", 32, 18};
    case GgmlType::kIQ3_S:
      return GgmlTypeInfo{GgmlType::kIQ3_S, "IQ3_S", 256, 110};
    case GgmlType::kIQ2_S:
      return GgmlTypeInfo{GgmlType::kIQ2_S, "IQ2_S", 256, 82};
    case GgmlType::kIQ4_XS:
      return GgmlTypeInfo{GgmlType::kIQ4_XS, "IQ4_XS", 256, 136};
    case GgmlType::kI8:
      return GgmlTypeInfo{GgmlType::kI8, "I8", 1, 1};
    case GgmlType::kI16:
      return GgmlTypeInfo{GgmlType::kI16, "I16", 1, 2};
    case GgmlType::kI32:
      return GgmlTypeInfo{GgmlType::kI32, "I32", 1, 4};
    case GgmlType::kI64:
      return GgmlTypeInfo{GgmlType::kI64, "I64", 1, 8};
    case GgmlType::kF64:
      return GgmlTypeInfo{GgmlType::kF64, "F64", 1, 8};
    case GgmlType::kIQ1_M:
      return GgmlTypeInfo{GgmlType::kIQ1_M, "IQ1_M", 256, 56};
    case GgmlType::kBF16:
      return GgmlTypeInfo{GgmlType::kBF16, "BF16", 1, 2};
    case GgmlType::kTQ1_0:
      return GgmlTypeInfo{GgmlType::kTQ1_0, "TQ1_0", 256, 54};
    case GgmlType::kTQ2_0:
      return GgmlTypeInfo{GgmlType::kTQ2_0, "TQ2_0", 256, 66};
    case GgmlType::kMXFP4:
      return GgmlTypeInfo{GgmlType::kMXFP4, "MXFP4", 32, 17};
    case GgmlType::kNVFP4:
      return GgmlTypeInfo{GgmlType::kNVFP4, "NVFP4", 64, 36};
    case GgmlType::kQ1_0:
      return GgmlTypeInfo{GgmlType::kQ1_0, "Q1_0", 128, 18};
  }
  return std::nullopt;
}

// One tensor's bytes, row-major, non-owning.
//
// Block formats (the extension point for quantized weights): when `block_type`
// is set, the tensor is stored in that ggml block format, not as `dtype`
// elements: each row of shape.back() elements is shape.back() / block_elements
// consecutive blocks of block_bytes, and nbytes counts the blocks; `dtype` is
// then meaningless. Code that reads elements by `dtype` must first check that
// `block_type` is unset (ModelWeights binds the block types that the CPU
// executor's quantized matmul runs; the CUDA executor refuses them at create()).
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;                   // numel() * dtype_size_bytes(dtype), or the blocks' bytes
  std::optional<GgmlType> block_type;  // set: stored in this ggml block format
  // dtype kF8E4M3 only: shape[0] f32 scales, one per row (output feature): element
  // [r, c] is decode(byte [r, c]) * scales[r]. A per-tensor scale is stored as the
  // same value for every row. Owned by the same storage as `data`.
  const float* scales = nullptr;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

}  // namespace cellm
