// The GGUF reader: a pure parser over a byte span (parse_gguf, what a fuzz target
// calls) and GgufFile, the parse of a memory-mapped file.
//
// Layout (little-endian, format versions 2 and 3): magic "GGUF", u32 version,
// u64 tensor count, u64 metadata count, the metadata pairs (a string key, a u32
// value type, the value), the tensor infos (a string name, u32 dimension count
// n <= 4, n u64 dimensions with the fastest-varying first, u32 ggml type, u64
// offset into the data section), then padding to the alignment
// (general.alignment, default 32) and the data section. Strings are a u64 byte
// length and the bytes. Every tensor's offset is a multiple of the alignment.
//
// Every error is InvalidProgram naming the source and what is wrong: a wrong
// magic, a version other than 2 or 3, a count too large for the bytes left, a
// string or array past the end, an unknown value or tensor type, dimensions
// whose product overflows or whose first is not a multiple of the type's block,
// a misaligned offset, a tensor past the end of the file, a duplicate key or
// tensor name.
// Thread-safety: immutable after parsing; share freely.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cellm/dtype.h"
#include "cellm/gguf.h"
#include "cellm/status.h"

namespace cellm {

class MappedFile;

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // as stored: dims[0] varies fastest
  GgmlTypeInfo type;
  uint64_t offset = 0;  // from the start of the data section
  size_t nbytes = 0;    // numel / block_elements * block_bytes

  // Row-major shape (dims reversed): [rows..., dims[0]].
  std::vector<int64_t> shape() const { return {dims.rbegin(), dims.rend()}; }
  int64_t numel() const;
};

struct GgufParsed {
  uint32_t version = 0;
  uint64_t alignment = 32;
  GgufMetadata metadata;
  std::vector<GgufTensorInfo> tensors;  // in file order
  size_t data_offset = 0;               // where the data section starts in the file

  // The tensor called `name`, or nullptr.
  const GgufTensorInfo* find(std::string_view name) const;
};

// The default alignment of the data section and of every tensor in it.
constexpr uint64_t kGgufDefaultAlignment = 32;

// Parses and validates `bytes` (a whole file); `source` names it in errors.
Result<GgufParsed> parse_gguf(std::span<const std::byte> bytes, std::string_view source = "gguf");

// A mapped GGUF file and its parse. Move-only; the data pointers stay valid while
// it lives (moving keeps them valid).
class GgufFile {
 public:
  static Result<GgufFile> open(const std::filesystem::path& path);

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  ~GgufFile();

  const std::filesystem::path& path() const { return path_; }
  const GgufParsed& parsed() const { return parsed_; }
  const GgufMetadata& metadata() const { return parsed_.metadata; }
  // The first byte of `tensor`'s data (one of parsed().tensors).
  const std::byte* data(const GgufTensorInfo& tensor) const;

 private:
  GgufFile() = default;

  std::filesystem::path path_;
  std::unique_ptr<MappedFile> mapping_;
  GgufParsed parsed_;
};

}  // namespace cellm
