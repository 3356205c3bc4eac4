// Element types of weights and tables, and scalar conversions between bf16, f16
// and f32. Kernels keep 16-bit weights 16-bit in memory and widen them to f32
// as they load them (simd.h has the vector forms); these scalar forms are the
// reference for those and serve tails and tests.
//
// bf16 -> f32 is exact (the bf16 bits are the f32's upper half); f32 -> bf16 and
// f32 -> f16 round to nearest even, as torch's `.to(torch.bfloat16/float16)`.
// Thread-safety: pure functions.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

namespace cellm::cpu {

// The element type of a weight matrix, bias, norm weight or embedding table.
enum class DType : uint8_t { kF32, kF16, kBF16 };

inline const char* to_string(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
  }
  return "?";
}

inline int64_t dtype_bytes(DType t) {
  return t == DType::kF32 ? 4 : 2;
}

// A non-owning pointer to a row-major tensor whose element type is known only at
// run time. `data == nullptr` means "absent" where a kernel says a tensor is optional.
struct TypedPtr {
  const void* data = nullptr;
  DType dtype = DType::kF32;
};

inline float bf16_to_f32(uint16_t h) {
  return std::bit_cast<float>(uint32_t{h} << 16);
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));  // inf/NaN
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
  // Zero or subnormal: mant * 2^-24, exact in f32.
  const float mag = static_cast<float>(mant) * 0x1p-24f;
  return sign ? -mag : mag;
}

inline uint16_t f32_to_f16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {
    // Result is subnormal or zero: round abs / 2^-24 to an integer, ties to even.
    const float scaled = std::bit_cast<float>(abs) * 0x1p24f;
    // Adding 2^23 makes the FPU round to an integer (nearest even).
    const float rounded = (scaled + 0x1p23f) - 0x1p23f;
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(rounded));
  }
  // Normal: rebias the exponent and round the mantissa from 23 to 10 bits.
  uint32_t v = abs - ((127u - 15u) << 23);
  v += 0xfffu + ((v >> 13) & 1u);
  return static_cast<uint16_t>(sign | static_cast<uint16_t>(v >> 13));
}

// Element i of a typed array, widened to f32.
inline float load_as_f32(const void* data, DType t, int64_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(data)[i];
    case DType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
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
