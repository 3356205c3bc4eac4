// Safetensors checkpoints, memory-mapped.
//
// A safetensors file is an 8-byte little-endian header length N, N bytes of JSON
// ({"<name>": {"dtype", "shape", "data_offsets": [begin, end)}, "__metadata__": {...}}),
// then the data section; offsets are relative to the data section.
//
// SafetensorsFile maps one file read-only and validates every header entry:
// dtype BF16/F16/F32 (others: NotSupported naming the tensor and dtype), shape,
// offsets inside the file, byte size = numel * dtype size, no two tensors
// overlapping, data aligned to its element size. SafetensorsCheckpoint is every
// tensor of a model folder: `model.safetensors`, or the shards listed by
// `model.safetensors.index.json` (weight_map: tensor name -> shard file).
//
// TensorViews are non-owning: they point into the mappings and stay valid while
// the file/checkpoint that produced them lives (moving it keeps them valid).
// Thread-safety: immutable after open; share freely.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cellm/dtype.h"
#include "cellm/status.h"

namespace cellm {

// "[2048, 128256]".
std::string shape_to_string(const std::vector<int64_t>& shape);

class MappedFile;

// Validates a whole safetensors file held in `bytes` (`file` names it in errors)
// and returns its tensors in ascending data offset, viewing into `bytes`: what
// SafetensorsFile::open checks once the file is mapped. Errors as open's.
Result<std::vector<TensorView>> parse_safetensors(std::span<const std::byte> bytes,
                                                  const std::string& file);

class SafetensorsFile {
 public:
  // Maps and validates `path`. Errors: NotFound (missing), IoError (unreadable),
  // InvalidProgram (truncated, bad header, bad offsets), NotSupported (dtype).
  static Result<SafetensorsFile> open(const std::filesystem::path& path);

  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

  const std::filesystem::path& path() const { return path_; }
  // Every tensor of the file, in ascending data offset.
  const std::vector<TensorView>& tensors() const { return tensors_; }
  // The tensor called `name`, or nullptr.
  const TensorView* find(std::string_view name) const;

 private:
  SafetensorsFile() = default;

  std::filesystem::path path_;
  std::unique_ptr<MappedFile> mapping_;
  std::vector<TensorView> tensors_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> tensors_ position
};

class SafetensorsCheckpoint {
 public:
  static constexpr const char* kSingleFileName = "model.safetensors";
  static constexpr const char* kIndexFileName = "model.safetensors.index.json";

  // Opens `dir`/model.safetensors, else the shards named by
  // `dir`/model.safetensors.index.json. Every tensor in the weight_map must be in
  // its shard; shard names must be plain file names inside `dir`.
  static Result<SafetensorsCheckpoint> open_dir(const std::filesystem::path& dir);

  SafetensorsCheckpoint(SafetensorsCheckpoint&&) noexcept = default;
  SafetensorsCheckpoint& operator=(SafetensorsCheckpoint&&) noexcept = default;

  // The tensor called `name`, or nullptr.
  const TensorView* find(std::string_view name) const;
  // Every tensor name, sorted.
  std::vector<std::string> names() const;
  size_t num_tensors() const { return index_.size(); }
  const std::vector<SafetensorsFile>& files() const { return files_; }

 private:
  SafetensorsCheckpoint() = default;

  std::vector<SafetensorsFile> files_;
  std::map<std::string, const TensorView*, std::less<>> index_;  // into files_[*].tensors_
};

}  // namespace cellm
