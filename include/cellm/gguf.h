// GGUF metadata: the key/value pairs of a GGUF file (llama.cpp's single-file model
// format), parsed into plain values, and the reader's entry point for callers
// outside the model layer (the engine hands the tokenizer's keys to the text
// layer, which does not read files of the model layer itself).
//
// Value types are the format's (ids 0..12): unsigned and signed integers of 8 to
// 64 bits, f32, f64, bool, string, and arrays of any of them (arrays nest).
// Integers and bools are held as int64 (a u64 above INT64_MAX keeps its bits:
// read it with as_uint64), reals as double.
// Thread-safety: immutable after construction; share freely.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cellm/status.h"

namespace cellm {

enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// "uint32", "string", "array", ...
const char* to_string(GgufValueType type);

struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  GgufValueType element_type = GgufValueType::kUint8;  // arrays: their elements' type

  int64_t integer = 0;  // integer types and bool
  double real = 0.0;    // float32, float64
  std::string string;   // string
  // Arrays: exactly one of these holds the elements, by element_type.
  std::vector<int64_t> integers;
  std::vector<double> reals;
  std::vector<std::string> strings;
  std::vector<GgufValue> arrays;  // an array of arrays

  bool is_integer() const;  // any integer type (not bool)
  bool is_real() const {
    return type == GgufValueType::kFloat32 || type == GgufValueType::kFloat64;
  }
  bool is_array() const { return type == GgufValueType::kArray; }
  uint64_t as_uint64() const { return static_cast<uint64_t>(integer); }
  size_t array_size() const;
};

class GgufMetadata {
 public:
  // Appends a pair; the reader refuses duplicate keys before calling this.
  void add(std::string key, GgufValue value) {
    entries_.emplace_back(std::move(key), std::move(value));
  }
  const std::vector<std::pair<std::string, GgufValue>>& entries() const { return entries_; }
  // The value of `key`, or nullptr.
  const GgufValue* find(std::string_view key) const;

  // Typed reads: nullopt when the key is absent; InvalidProgram naming the key
  // when it has another type. Integers accept any integer type (and reals
  // that hold an integer are refused); reals accept f32, f64 and integers.
  Result<std::optional<int64_t>> get_int(std::string_view key) const;
  Result<std::optional<double>> get_real(std::string_view key) const;
  Result<std::optional<bool>> get_bool(std::string_view key) const;
  Result<std::optional<std::string>> get_string(std::string_view key) const;
  // Arrays of the element kind; nullptr when absent.
  Result<const std::vector<std::string>*> get_strings(std::string_view key) const;
  Result<const std::vector<double>*> get_reals(std::string_view key) const;
  Result<const std::vector<int64_t>*> get_ints(std::string_view key) const;

  // Errors name this (usually the file's path).
  std::string source;

 private:
  std::vector<std::pair<std::string, GgufValue>> entries_;
};

// Reads and validates the GGUF file at `path` (header, metadata and tensor infos,
// as ModelWeights::load does) and returns its metadata.
Result<GgufMetadata> read_gguf_metadata(const std::filesystem::path& path);

// Whether `path` names a GGUF file: a regular file whose name ends in ".gguf"
// (any case), or whose first four bytes are the GGUF magic.
bool is_gguf_path(const std::filesystem::path& path);

}  // namespace cellm
