#include "model/safetensors.h"

#include <algorithm>
#include <limits>
#include <set>
#include <span>
#include <utility>

#include <nlohmann/json.hpp>

#include "json_fields.h"
#include "mapped_file.h"

namespace cellm {
namespace {

using nlohmann::json;

constexpr uint64_t kHeaderLengthBytes = 8;
// The safetensors format caps the JSON header at 100 MB.
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;

Result<DType> parse_dtype(const std::string& text, const std::string& file,
                          const std::string& tensor) {
  if (text == "BF16") return DType::kBF16;
  if (text == "F16") return DType::kF16;
  if (text == "F32") return DType::kF32;
  if (text == "F8_E4M3") return DType::kF8E4M3;
  return NotSupported(file + ": tensor '" + tensor + "': dtype " + text +
                      " is not supported (supported: BF16, F16, F32, F8_E4M3)");
}

Result<int64_t> non_negative_int(const json& v, const std::string& file, const std::string& tensor,
                                 const char* field) {
  if (!v.is_number_integer() ||
      (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX}) || v.get<int64_t>() < 0) {
    return InvalidProgram(file + ": tensor '" + tensor + "': " + field +
                          " must hold non-negative integers, got " + v.dump());
  }
  return v.get<int64_t>();
}

struct Entry {
  TensorView view;
  uint64_t begin = 0;  // within the data section
  uint64_t end = 0;
};

Result<Entry> parse_entry(const std::string& name, const json& value, const std::string& file,
                          const std::byte* data_section, uint64_t data_bytes) {
  const std::string where = file + ": tensor '" + name + "'";
  if (!value.is_object()) return InvalidProgram(where + ": expected an object");
  auto dtype_it = value.find("dtype");
  if (dtype_it == value.end() || !dtype_it->is_string()) {
    return InvalidProgram(where + ": dtype: missing or not a string");
  }
  Entry entry;
  entry.view.name = name;
  CELLM_ASSIGN_OR_RETURN(entry.view.dtype, parse_dtype(dtype_it->get<std::string>(), file, name));

  auto shape_it = value.find("shape");
  if (shape_it == value.end() || !shape_it->is_array()) {
    return InvalidProgram(where + ": shape: missing or not an array");
  }
  // numel * element size, refusing anything larger than the data section (no overflow).
  const uint64_t element_bytes = dtype_size_bytes(entry.view.dtype);
  uint64_t expected_bytes = element_bytes;
  bool too_large = false;
  // The product of the non-zero dimensions must fit int64 even when a zero
  // dimension makes the tensor empty: TensorView::numel() multiplies them all.
  uint64_t nonzero_numel = 1;
  bool numel_overflows = false;
  for (const json& d : *shape_it) {
    CELLM_ASSIGN_OR_RETURN(int64_t dim, non_negative_int(d, file, name, "shape"));
    entry.view.shape.push_back(dim);
    const uint64_t udim = static_cast<uint64_t>(dim);
    if (udim != 0 && expected_bytes > std::numeric_limits<uint64_t>::max() / udim) {
      too_large = true;
    } else {
      expected_bytes *= udim;
    }
    if (udim != 0 && nonzero_numel > uint64_t{INT64_MAX} / udim) {
      numel_overflows = true;
    } else if (udim != 0) {
      nonzero_numel *= udim;
    }
  }
  if (numel_overflows) {
    return InvalidProgram(where + ": shape " + shape_to_string(entry.view.shape) +
                          ": its dimensions multiply past 2^63");
  }
  if (std::find(entry.view.shape.begin(), entry.view.shape.end(), 0) != entry.view.shape.end()) {
    expected_bytes = 0;
    too_large = false;
  }

  auto offsets_it = value.find("data_offsets");
  if (offsets_it == value.end() || !offsets_it->is_array() || offsets_it->size() != 2) {
    return InvalidProgram(where + ": data_offsets: missing or not a [begin, end] pair");
  }
  CELLM_ASSIGN_OR_RETURN(int64_t begin,
                         non_negative_int((*offsets_it)[0], file, name, "data_offsets"));
  CELLM_ASSIGN_OR_RETURN(int64_t end,
                         non_negative_int((*offsets_it)[1], file, name, "data_offsets"));
  entry.begin = static_cast<uint64_t>(begin);
  entry.end = static_cast<uint64_t>(end);
  const std::string range = "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
  if (entry.begin > entry.end) {
    return InvalidProgram(where + ": data_offsets " + range + " end before they begin");
  }
  if (entry.end > data_bytes) {
    return InvalidProgram(where + ": data_offsets " + range + " run past the data section of " +
                          std::to_string(data_bytes) + " bytes (truncated file?)");
  }
  if (too_large || entry.end - entry.begin != expected_bytes) {
    return InvalidProgram(
        where + ": data_offsets " + range + " hold " + std::to_string(entry.end - entry.begin) +
        " bytes but shape " + shape_to_string(entry.view.shape) + " of " +
        to_string(entry.view.dtype) + " needs " +
        (too_large ? std::string("more than that") : std::to_string(expected_bytes)));
  }
  entry.view.data = data_section + entry.begin;
  entry.view.nbytes = static_cast<size_t>(expected_bytes);
  if (reinterpret_cast<uintptr_t>(entry.view.data) % element_bytes != 0) {
    return InvalidProgram(where + ": data at offset " + std::to_string(begin) +
                          " is not aligned to its " + std::to_string(element_bytes) +
                          "-byte elements");
  }
  return entry;
}

// A shard name from the index must be a plain file name inside the model folder.
bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos;
}

}  // namespace

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

Result<std::vector<TensorView>> parse_safetensors(std::span<const std::byte> bytes,
                                                  const std::string& file) {
  const uint64_t file_bytes = bytes.size();
  if (file_bytes < kHeaderLengthBytes) {
    return InvalidProgram(file + ": truncated: " + std::to_string(file_bytes) +
                          " bytes, shorter than the 8-byte header length");
  }
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) {
    header_bytes = (header_bytes << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  }
  if (header_bytes > kMaxHeaderBytes) {
    return InvalidProgram(file + ": header length " + std::to_string(header_bytes) +
                          " exceeds the 100 MB limit (not a safetensors file?)");
  }
  if (header_bytes > file_bytes - kHeaderLengthBytes) {
    return InvalidProgram(file + ": header length " + std::to_string(header_bytes) +
                          " runs past the end of the file (" + std::to_string(file_bytes) +
                          " bytes; truncated?)");
  }
  const char* header_text = reinterpret_cast<const char*>(bytes.data() + kHeaderLengthBytes);
  CELLM_ASSIGN_OR_RETURN(json header, parse_json_text(std::string_view(header_text, header_bytes),
                                                      file + " (safetensors header)"));
  if (!header.is_object()) {
    return InvalidProgram(file + ": the safetensors header is not a JSON object");
  }
  const std::byte* data_section = bytes.data() + kHeaderLengthBytes + header_bytes;
  const uint64_t data_bytes = file_bytes - kHeaderLengthBytes - header_bytes;

  std::vector<Entry> entries;
  entries.reserve(header.size());
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") continue;
    CELLM_ASSIGN_OR_RETURN(Entry entry, parse_entry(name, value, file, data_section, data_bytes));
    entries.push_back(std::move(entry));
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < entries.size(); ++i) {
    const Entry& previous = entries[i - 1];
    if (entries[i].begin < previous.end) {
      return InvalidProgram(file + ": tensors '" + previous.view.name + "' and '" +
                            entries[i].view.name + "' overlap in the data section");
    }
  }
  std::vector<TensorView> views;
  views.reserve(entries.size());
  for (Entry& entry : entries) views.push_back(std::move(entry.view));
  return views;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;
SafetensorsFile::~SafetensorsFile() = default;

Result<SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path) {
  CELLM_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> mapping, MappedFile::open(path));
  CELLM_ASSIGN_OR_RETURN(
      std::vector<TensorView> views,
      parse_safetensors(std::span<const std::byte>(mapping->data(), mapping->size()),
                        path.string()));
  SafetensorsFile result;
  result.path_ = path;
  result.mapping_ = std::move(mapping);
  result.tensors_ = std::move(views);
  for (size_t i = 0; i < result.tensors_.size(); ++i) {
    result.index_.emplace(result.tensors_[i].name, i);
  }
  return result;
}

const TensorView* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Result<SafetensorsCheckpoint> SafetensorsCheckpoint::open_dir(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return NotFound(dir.string() + ": the model folder does not exist");
  }
  SafetensorsCheckpoint checkpoint;
  const std::filesystem::path single = dir / kSingleFileName;
  if (std::filesystem::exists(single, ec)) {
    CELLM_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(single));
    checkpoint.files_.push_back(std::move(file));
    for (const TensorView& view : checkpoint.files_.back().tensors()) {
      checkpoint.index_.emplace(view.name, &view);
    }
    return checkpoint;
  }

  const std::filesystem::path index_path = dir / kIndexFileName;
  if (!std::filesystem::exists(index_path, ec)) {
    return NotFound(dir.string() + ": neither " + kSingleFileName + " nor " + kIndexFileName +
                    " exists");
  }
  const std::string index_name = index_path.string();
  CELLM_ASSIGN_OR_RETURN(std::string text, read_text_file(index_path, "safetensors index"));
  CELLM_ASSIGN_OR_RETURN(json index, parse_json_text(text, index_name));
  if (!index.is_object()) return InvalidProgram(index_name + ": expected a JSON object");
  auto map_it = index.find("weight_map");
  if (map_it == index.end() || !map_it->is_object()) {
    return InvalidProgram(index_name + ": weight_map: missing or not an object");
  }
  if (map_it->empty()) return InvalidProgram(index_name + ": weight_map: lists no tensors");
  std::map<std::string, std::vector<std::string>> tensors_by_shard;
  for (const auto& [tensor, shard] : map_it->items()) {
    if (!shard.is_string() || !is_plain_file_name(shard.get<std::string>())) {
      return InvalidProgram(index_name + ": weight_map: tensor '" + tensor +
                            "': expected a shard file name in the model folder, got " +
                            shard.dump());
    }
    tensors_by_shard[shard.get<std::string>()].push_back(tensor);
  }
  checkpoint.files_.reserve(tensors_by_shard.size());
  for (const auto& [shard, tensors] : tensors_by_shard) {
    CELLM_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(dir / shard));
    checkpoint.files_.push_back(std::move(file));
    const SafetensorsFile& opened = checkpoint.files_.back();
    for (const std::string& tensor : tensors) {
      const TensorView* view = opened.find(tensor);
      if (view == nullptr) {
        return InvalidProgram(index_name + ": weight_map: tensor '" + tensor +
                              "' is not in its shard " + opened.path().string());
      }
      checkpoint.index_.emplace(tensor, view);
    }
  }
  return checkpoint;
}

const TensorView* SafetensorsCheckpoint::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> names;
  names.reserve(index_.size());
  for (const auto& [name, view] : index_) names.push_back(name);
  return names;
}

}  // namespace cellm
