// Builds GGUF files byte by byte for the reader's tests, independently of the
// reader: little-endian fields in the format's order, so a test can also write
// what no valid file holds (wrong magic, huge counts, misaligned offsets, ...).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace cellm::testing {

class GgufBytes {
 public:
  template <typename T>
  GgufBytes& put(T value) {
    const size_t at = bytes_.size();
    bytes_.resize(at + sizeof(T));
    std::memcpy(bytes_.data() + at, &value, sizeof(T));
    return *this;
  }
  GgufBytes& str(const std::string& s) {
    put<uint64_t>(s.size());
    bytes_.insert(bytes_.end(), s.begin(), s.end());
    return *this;
  }
  GgufBytes& pad_to(size_t alignment) {
    while (bytes_.size() % alignment != 0) bytes_.push_back('\0');
    return *this;
  }
  GgufBytes& raw(const std::string& s) {
    bytes_.insert(bytes_.end(), s.begin(), s.end());
    return *this;
  }
  size_t size() const { return bytes_.size(); }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

// A tensor for GgufWriter: dims as stored (fastest first), a ggml type id, and
// the data bytes (written at the next aligned offset unless `offset` is set).
struct GgufTestTensor {
  std::string name;
  std::vector<uint64_t> dims;
  uint32_t type = 0;
  std::string data;
  int64_t offset = -1;  // explicit offset into the data section (for bad files)
};

// A whole file: header, metadata written by `kv` callbacks, tensor infos, data.
class GgufWriter {
 public:
  uint32_t magic = 0x46554747;
  uint32_t version = 3;
  uint64_t alignment = 32;
  std::vector<GgufBytes> kvs;  // each: key, type, value
  std::vector<GgufTestTensor> tensors;

  GgufBytes& kv(const std::string& key, uint32_t type) {
    kvs.emplace_back();
    kvs.back().str(key).put<uint32_t>(type);
    return kvs.back();
  }
  void kv_u32(const std::string& key, uint32_t v) { kv(key, 4).put<uint32_t>(v); }
  void kv_f32(const std::string& key, float v) { kv(key, 6).put<float>(v); }
  void kv_str(const std::string& key, const std::string& v) { kv(key, 8).str(v); }
  void kv_bool(const std::string& key, bool v) { kv(key, 7).put<uint8_t>(v ? 1 : 0); }

  std::string build() const {
    GgufBytes b;
    b.put<uint32_t>(magic).put<uint32_t>(version);
    b.put<uint64_t>(tensors.size()).put<uint64_t>(kvs.size());
    for (const GgufBytes& kv : kvs) b.raw(kv.bytes());
    std::vector<uint64_t> offsets;
    uint64_t next = 0;
    for (const GgufTestTensor& t : tensors) {
      const uint64_t at = t.offset >= 0 ? static_cast<uint64_t>(t.offset) : next;
      offsets.push_back(at);
      next = (std::max(next, at + t.data.size()) + alignment - 1) / alignment * alignment;
    }
    for (size_t i = 0; i < tensors.size(); ++i) {
      const GgufTestTensor& t = tensors[i];
      b.str(t.name).put<uint32_t>(static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) b.put<uint64_t>(d);
      b.put<uint32_t>(t.type).put<uint64_t>(offsets[i]);
    }
    b.pad_to(alignment);
    std::string data(next, '\0');
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (offsets[i] + tensors[i].data.size() <= data.size()) {
        data.replace(offsets[i], tensors[i].data.size(), tensors[i].data);
      }
    }
    b.raw(data);
    return b.bytes();
  }
};

}  // namespace cellm::testing
