// MappedFile: one file mapped read-only into memory (RAII: unmapped on destruction).
// The mapping's address never changes, so pointers into it stay valid for its
// whole life. Private to src/model. Thread-safety: immutable; share freely.
#pragma once

#include <cstddef>
#include <filesystem>
#include <memory>

#include "cellm/status.h"

namespace cellm {

class MappedFile {
 public:
  // NotFound when `path` does not exist; IoError when it cannot be opened, is not
  // a regular file or cannot be mapped. An empty file maps to size() == 0.
  static Result<std::unique_ptr<MappedFile>> open(const std::filesystem::path& path);

  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  MappedFile(const std::byte* data, size_t size) : data_(data), size_(size) {}

  const std::byte* data_;
  size_t size_;
};

// The whole file as text: NotFound when missing, IoError when unreadable.
Result<std::string> read_text_file(const std::filesystem::path& path, const char* what);

}  // namespace cellm
