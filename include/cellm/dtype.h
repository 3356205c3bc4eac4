// DType and TensorView: the element types of model tensors that cellm reads and
// computes with, and a non-owning view of one tensor's bytes. Plain value
// vocabulary shared by the model loader and every executor; public because
// ModelWeights hands out TensorViews and ModelWeights::random takes a DType.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cellm {

enum class DType {
  kBF16,  // bfloat16: 1 sign, 8 exponent, 7 mantissa bits
  kF16,   // IEEE binary16: 1 sign, 5 exponent, 10 mantissa bits
  kF32,   // IEEE binary32
};

// Bytes per element: 2, 2, 4.
constexpr size_t dtype_size_bytes(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return 2;
    case DType::kF16:
      return 2;
    case DType::kF32:
      return 4;
  }
  return 0;
}

// The safetensors spelling: "BF16", "F16", "F32".
constexpr const char* to_string(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kF32:
      return "F32";
  }
  return "unknown";
}

// One tensor's bytes, row-major, non-owning.
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;  // numel() * dtype_size_bytes(dtype)

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

}  // namespace cellm
