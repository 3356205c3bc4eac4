// Typed views of weights and tables, and the scalar conversions between bf16,
// f16 and f32 (from model/half.h). Kernels keep 16-bit weights 16-bit in memory and widen
// them to f32 as they load them (simd.h has the vector forms); these scalar forms are the reference
// for those and serve tails and tests.
//
// bf16 -> f32 is exact (the bf16 bits are the f32's upper half); f32 -> bf16 and
// f32 -> f16 round to nearest even, as torch's `.to(torch.bfloat16/float16)`.
// Thread-safety: pure functions.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

#include "cellm/dtype.h"
#include "model/fp8.h"
#include "model/half.h"

namespace cellm::cpu {

// The element type of a weight matrix, bias, norm weight or embedding table:
// the model's own (include/cellm/dtype.h).
using cellm::DType;
using cellm::to_string;

inline int64_t dtype_bytes(DType t) {
  return static_cast<int64_t>(dtype_size_bytes(t));
}

// A non-owning pointer to a row-major tensor whose element type is known only at
// run time. `data == nullptr` means "absent" where a kernel says a tensor is optional.
struct TypedPtr {
  const void* data = nullptr;
  DType dtype = DType::kF32;
};

// The scalar conversions are the model layer's (model/half.h).
using cellm::bf16_to_f32;
using cellm::f16_to_f32;
using cellm::f32_to_bf16;
using cellm::f32_to_f16;

// Element i of a typed array, widened to f32.
inline float load_as_f32(const void* data, DType t, int64_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(data)[i];
    case DType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::kF8E4M3:  // the code's value, before its row scale
      return e4m3_to_f32(static_cast<const uint8_t*>(data)[i]);
  }
  return 0.0f;
}

// Widens n elements of a typed array to f32 (scalar; simd.h has the fast form).
inline void convert_to_f32_scalar(const void* src, DType t, int64_t n, float* dst) {
  if (t == DType::kF32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < n; ++i) dst[i] = load_as_f32(src, t, i);
}

}  // namespace cellm::cpu
