// Writers for the model tests: temporary folders, config.json text, and
// safetensors files built byte by byte (independently of the reader under test).
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/half.h"
#include "support/temp_dir.h"

namespace cellm::testing {

// A tensor to write: dtype as safetensors spells it, and its raw little-endian bytes.
struct TestTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

inline int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Element i is `base + i` in the given dtype (exact for small counts).
inline TestTensor counting_tensor(const std::string& name, const std::string& dtype,
                                  std::vector<int64_t> shape, float base = 0.0f) {
  TestTensor t{name, dtype, std::move(shape), {}};
  const int64_t n = numel_of(t.shape);
  for (int64_t i = 0; i < n; ++i) {
    const float value = base + static_cast<float>(i);
    if (dtype == "F32") {
      t.bytes.append(reinterpret_cast<const char*>(&value), 4);
    } else {
      const uint16_t h = dtype == "BF16" ? f32_to_bf16(value) : f32_to_f16(value);
      t.bytes.append(reinterpret_cast<const char*>(&h), 2);
    }
  }
  return t;
}

inline std::string json_shape(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ',';
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

inline std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

// The header JSON for tensors laid out back to back in order (put wider dtypes
// first, as the reference writer does, to keep every tensor aligned), padded with spaces
// to a multiple of 8 bytes as the reference writer does.
inline std::string safetensors_header(const std::vector<TestTensor>& tensors) {
  std::string header = "{\"__metadata__\":{\"format\":\"pt\"}";
  size_t offset = 0;
  for (const TestTensor& t : tensors) {
    header += ",\"" + t.name + "\":{\"dtype\":\"" + t.dtype +
              "\",\"shape\":" + json_shape(t.shape) + ",\"data_offsets\":[" +
              std::to_string(offset) + "," + std::to_string(offset + t.bytes.size()) + "]}";
    offset += t.bytes.size();
  }
  header += "}";
  while (header.size() % 8 != 0) header += ' ';
  return header;
}

// A whole file: length, header, data.
inline std::string safetensors_bytes(const std::vector<TestTensor>& tensors) {
  const std::string header = safetensors_header(tensors);
  std::string bytes = le64(header.size()) + header;
  for (const TestTensor& t : tensors) bytes += t.bytes;
  return bytes;
}

// A file from a hand-written header (data: `data_bytes` zero bytes).
inline std::string safetensors_with_header(std::string header, size_t data_bytes) {
  while (header.size() % 8 != 0) header += ' ';
  return le64(header.size()) + header + std::string(data_bytes, '\0');
}

}  // namespace cellm::testing
