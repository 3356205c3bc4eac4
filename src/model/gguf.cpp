#include "gguf.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <unordered_set>

#include "mapped_file.h"

namespace cellm {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint32_t kMaxDims = 4;
constexpr int kMaxArrayDepth = 8;  // arrays of arrays, nested at most this deep

bool is_integer_type(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
      return true;
    default:
      return false;
  }
}

// The fewest bytes one value of `t` takes (its size for fixed-size types).
size_t min_value_bytes(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kString:  // the length
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
      return 8;
    case GgufValueType::kArray:  // element type and count
      return 12;
  }
  return 1;
}

// A bounds-checked little-endian cursor over the file's bytes.
class Reader {
 public:
  Reader(std::span<const std::byte> bytes, std::string_view source)
      : bytes_(bytes), source_(source) {}

  size_t position() const { return pos_; }
  size_t remaining() const { return bytes_.size() - pos_; }

  Status error(const std::string& what) const {
    return InvalidProgram(source_ + ": " + what + " (at byte " + std::to_string(pos_) + ")");
  }
  Status truncated(const std::string& what) const {
    return error("truncated file: " + what + " runs past the end (the file has " +
                 std::to_string(bytes_.size()) + " bytes)");
  }

  template <typename T>
  Result<T> read(const char* what) {
    if (remaining() < sizeof(T)) return truncated(what);
    T value;
    std::memcpy(&value, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }

  Result<std::string> read_string(const std::string& what) {
    CELLM_ASSIGN_OR_RETURN(uint64_t length, read<uint64_t>(what.c_str()));
    if (length > remaining()) {
      return truncated(what + " (a string of " + std::to_string(length) + " bytes)");
    }
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), length);
    pos_ += length;
    return s;
  }

  // A count of items of at least `min_item_bytes` each that must fit in the rest.
  Result<uint64_t> read_count(const std::string& what, size_t min_item_bytes) {
    CELLM_ASSIGN_OR_RETURN(uint64_t count, read<uint64_t>(what.c_str()));
    if (count > remaining() / std::max<size_t>(min_item_bytes, 1)) {
      return error(what + " " + std::to_string(count) + " is larger than the " +
                   std::to_string(remaining()) + " bytes left can hold");
    }
    return count;
  }

 private:
  std::span<const std::byte> bytes_;
  std::string source_;
  size_t pos_ = 0;
};

Result<GgufValueType> read_value_type(Reader& r, const std::string& key) {
  CELLM_ASSIGN_OR_RETURN(uint32_t id, r.read<uint32_t>("a value type"));
  if (id > static_cast<uint32_t>(GgufValueType::kFloat64)) {
    return r.error("metadata '" + key + "': unknown value type " + std::to_string(id));
  }
  return static_cast<GgufValueType>(id);
}

Status read_scalar(Reader& r, GgufValueType type, const std::string& key, GgufValue& out) {
  const std::string what = "the value of '" + key + "'";
  switch (type) {
    case GgufValueType::kUint8: {
      CELLM_ASSIGN_OR_RETURN(uint8_t v, r.read<uint8_t>(what.c_str()));
      out.integer = v;
      break;
    }
    case GgufValueType::kInt8: {
      CELLM_ASSIGN_OR_RETURN(int8_t v, r.read<int8_t>(what.c_str()));
      out.integer = v;
      break;
    }
    case GgufValueType::kUint16: {
      CELLM_ASSIGN_OR_RETURN(uint16_t v, r.read<uint16_t>(what.c_str()));
      out.integer = v;
      break;
    }
    case GgufValueType::kInt16: {
      CELLM_ASSIGN_OR_RETURN(int16_t v, r.read<int16_t>(what.c_str()));
      out.integer = v;
      break;
    }
    case GgufValueType::kUint32: {
      CELLM_ASSIGN_OR_RETURN(uint32_t v, r.read<uint32_t>(what.c_str()));
      out.integer = v;
      break;
    }
    case GgufValueType::kInt32: {
      CELLM_ASSIGN_OR_RETURN(int32_t v, r.read<int32_t>(what.c_str()));
      out.integer = v;
      break;
    }
    case GgufValueType::kUint64: {
      CELLM_ASSIGN_OR_RETURN(uint64_t v, r.read<uint64_t>(what.c_str()));
      out.integer = static_cast<int64_t>(v);
      break;
    }
    case GgufValueType::kInt64: {
      CELLM_ASSIGN_OR_RETURN(int64_t v, r.read<int64_t>(what.c_str()));
      out.integer = v;
      break;
    }
    case GgufValueType::kFloat32: {
      CELLM_ASSIGN_OR_RETURN(float v, r.read<float>(what.c_str()));
      out.real = v;
      break;
    }
    case GgufValueType::kFloat64: {
      CELLM_ASSIGN_OR_RETURN(double v, r.read<double>(what.c_str()));
      out.real = v;
      break;
    }
    case GgufValueType::kBool: {
      CELLM_ASSIGN_OR_RETURN(uint8_t v, r.read<uint8_t>(what.c_str()));
      if (v > 1) return r.error(what + ": a bool must be 0 or 1, got " + std::to_string(v));
      out.integer = v;
      break;
    }
    case GgufValueType::kString: {
      CELLM_ASSIGN_OR_RETURN(out.string, r.read_string(what));
      break;
    }
    case GgufValueType::kArray:
      return r.error(what + ": not a scalar");
  }
  return Status::Ok();
}

Status read_value(Reader& r, GgufValueType type, const std::string& key, int depth,
                  GgufValue& out) {
  out.type = type;
  if (type != GgufValueType::kArray) return read_scalar(r, type, key, out);
  if (depth >= kMaxArrayDepth) {
    return r.error("metadata '" + key + "': arrays nested more than " +
                   std::to_string(kMaxArrayDepth) + " deep");
  }
  CELLM_ASSIGN_OR_RETURN(out.element_type, read_value_type(r, key));
  CELLM_ASSIGN_OR_RETURN(uint64_t count, r.read_count("metadata '" + key + "': array length",
                                                      min_value_bytes(out.element_type)));
  const auto n = static_cast<size_t>(count);
  GgufValue element;
  if (out.element_type == GgufValueType::kArray) {
    out.arrays.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      GgufValue nested;
      CELLM_RETURN_IF_ERROR(read_value(r, GgufValueType::kArray, key, depth + 1, nested));
      out.arrays.push_back(std::move(nested));
    }
  } else if (out.element_type == GgufValueType::kString) {
    out.strings.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      CELLM_ASSIGN_OR_RETURN(std::string s,
                             r.read_string("metadata '" + key + "'[" + std::to_string(i) + "]"));
      out.strings.push_back(std::move(s));
    }
  } else if (out.element_type == GgufValueType::kFloat32 ||
             out.element_type == GgufValueType::kFloat64) {
    out.reals.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      CELLM_RETURN_IF_ERROR(read_scalar(r, out.element_type, key, element));
      out.reals.push_back(element.real);
    }
  } else {
    out.integers.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      CELLM_RETURN_IF_ERROR(read_scalar(r, out.element_type, key, element));
      out.integers.push_back(element.integer);
    }
  }
  return Status::Ok();
}

Status read_tensor_info(Reader& r, size_t index, GgufTensorInfo& t) {
  const std::string which = "tensor info " + std::to_string(index);
  CELLM_ASSIGN_OR_RETURN(t.name, r.read_string(which + ": its name"));
  const std::string named = "tensor '" + t.name + "'";
  CELLM_ASSIGN_OR_RETURN(uint32_t n_dims, r.read<uint32_t>("a dimension count"));
  if (n_dims == 0 || n_dims > kMaxDims) {
    return r.error(named + ": " + std::to_string(n_dims) + " dimensions (expected 1 to " +
                   std::to_string(kMaxDims) + ")");
  }
  int64_t numel = 1;
  for (uint32_t d = 0; d < n_dims; ++d) {
    CELLM_ASSIGN_OR_RETURN(uint64_t dim, r.read<uint64_t>("a dimension"));
    if (dim == 0 || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return r.error(named + ": dimension " + std::to_string(d) + " is " + std::to_string(dim));
    }
    if (__builtin_mul_overflow(numel, static_cast<int64_t>(dim), &numel)) {
      return r.error(named + ": the element count overflows 64 bits");
    }
    t.dims.push_back(static_cast<int64_t>(dim));
  }
  CELLM_ASSIGN_OR_RETURN(uint32_t type_id, r.read<uint32_t>("a tensor type"));
  const std::optional<GgmlTypeInfo> info = ggml_type_info(type_id);
  if (!info) return r.error(named + ": unknown tensor type " + std::to_string(type_id));
  t.type = *info;
  if (t.dims[0] % info->block_elements != 0) {
    return r.error(named + ": its first dimension " + std::to_string(t.dims[0]) +
                   " is not a multiple of the " + info->name + " block (" +
                   std::to_string(info->block_elements) + " elements)");
  }
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(numel / info->block_elements),
                             static_cast<uint64_t>(info->block_bytes), &nbytes) ||
      nbytes > std::numeric_limits<size_t>::max()) {
    return r.error(named + ": its byte size overflows 64 bits");
  }
  t.nbytes = static_cast<size_t>(nbytes);
  CELLM_ASSIGN_OR_RETURN(t.offset, r.read<uint64_t>("a tensor offset"));
  return Status::Ok();
}

}  // namespace

const char* to_string(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
      return "uint8";
    case GgufValueType::kInt8:
      return "int8";
    case GgufValueType::kUint16:
      return "uint16";
    case GgufValueType::kInt16:
      return "int16";
    case GgufValueType::kUint32:
      return "uint32";
    case GgufValueType::kInt32:
      return "int32";
    case GgufValueType::kFloat32:
      return "float32";
    case GgufValueType::kBool:
      return "bool";
    case GgufValueType::kString:
      return "string";
    case GgufValueType::kArray:
      return "array";
    case GgufValueType::kUint64:
      return "uint64";
    case GgufValueType::kInt64:
      return "int64";
    case GgufValueType::kFloat64:
      return "float64";
  }
  return "unknown";
}

bool GgufValue::is_integer() const {
  return is_integer_type(type);
}

size_t GgufValue::array_size() const {
  return integers.size() + reals.size() + strings.size() + arrays.size();
}

int64_t GgufTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

const GgufTensorInfo* GgufParsed::find(std::string_view name) const {
  for (const GgufTensorInfo& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

Result<GgufParsed> parse_gguf(std::span<const std::byte> bytes, std::string_view source) {
  Reader r(bytes, source);
  GgufParsed out;
  out.metadata.source = std::string(source);
  CELLM_ASSIGN_OR_RETURN(uint32_t magic, r.read<uint32_t>("the magic"));
  if (magic != kMagic) return r.error("not a GGUF file (wrong magic; expected \"GGUF\")");
  CELLM_ASSIGN_OR_RETURN(out.version, r.read<uint32_t>("the version"));
  if (out.version != 2 && out.version != 3) {
    return r.error("unsupported GGUF version " + std::to_string(out.version) +
                   " (supported: 2, 3)");
  }
  // A tensor info takes at least 8 (name) + 4 + 8 (one dimension) + 4 + 8 bytes; a
  // metadata pair 8 (key) + 4 + 1.
  CELLM_ASSIGN_OR_RETURN(uint64_t n_tensors, r.read<uint64_t>("the tensor count"));
  CELLM_ASSIGN_OR_RETURN(uint64_t n_kv, r.read_count("the metadata count", 13));
  if (n_tensors > r.remaining() / 32) {
    return r.error("the tensor count " + std::to_string(n_tensors) + " is larger than the " +
                   std::to_string(r.remaining()) + " bytes left can hold");
  }

  std::unordered_set<std::string> keys;
  for (uint64_t i = 0; i < n_kv; ++i) {
    CELLM_ASSIGN_OR_RETURN(std::string key, r.read_string("metadata key " + std::to_string(i)));
    if (!keys.insert(key).second) return r.error("duplicate metadata key '" + key + "'");
    CELLM_ASSIGN_OR_RETURN(GgufValueType type, read_value_type(r, key));
    GgufValue value;
    CELLM_RETURN_IF_ERROR(read_value(r, type, key, 0, value));
    out.metadata.add(std::move(key), std::move(value));
  }
  if (const GgufValue* a = out.metadata.find("general.alignment")) {
    if (!a->is_integer() || a->integer <= 0 || (a->as_uint64() & (a->as_uint64() - 1)) != 0) {
      return InvalidProgram(std::string(source) +
                            ": general.alignment must be a positive power of two");
    }
    out.alignment = a->as_uint64();
  }

  std::unordered_set<std::string> names;
  out.tensors.resize(static_cast<size_t>(n_tensors));
  for (size_t i = 0; i < out.tensors.size(); ++i) {
    CELLM_RETURN_IF_ERROR(read_tensor_info(r, i, out.tensors[i]));
    if (!names.insert(out.tensors[i].name).second) {
      return r.error("duplicate tensor name '" + out.tensors[i].name + "'");
    }
  }

  // The data section starts at the next multiple of the alignment.
  const uint64_t end_of_infos = r.position();
  if (end_of_infos > std::numeric_limits<uint64_t>::max() - out.alignment) {
    return r.error("the data section's offset overflows");
  }
  const uint64_t data_offset = (end_of_infos + out.alignment - 1) / out.alignment * out.alignment;
  if (!out.tensors.empty() && data_offset > bytes.size()) {
    return InvalidProgram(std::string(source) + ": truncated file: the data section starts at " +
                          std::to_string(data_offset) + " but the file has " +
                          std::to_string(bytes.size()) + " bytes");
  }
  out.data_offset = static_cast<size_t>(data_offset);
  const uint64_t data_bytes = bytes.size() > data_offset ? bytes.size() - data_offset : 0;
  for (const GgufTensorInfo& t : out.tensors) {
    if (t.offset % out.alignment != 0) {
      return InvalidProgram(std::string(source) + ": tensor '" + t.name + "': offset " +
                            std::to_string(t.offset) + " is not a multiple of the alignment " +
                            std::to_string(out.alignment));
    }
    if (t.offset > data_bytes || t.nbytes > data_bytes - t.offset) {
      return InvalidProgram(std::string(source) + ": tensor '" + t.name + "' (" +
                            std::to_string(t.nbytes) + " bytes at data offset " +
                            std::to_string(t.offset) + ") runs past the end of the file (" +
                            std::to_string(data_bytes) + " data bytes)");
    }
  }
  return out;
}

GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;
GgufFile::~GgufFile() = default;

Result<GgufFile> GgufFile::open(const std::filesystem::path& path) {
  GgufFile file;
  file.path_ = path;
  CELLM_ASSIGN_OR_RETURN(file.mapping_, MappedFile::open(path));
  CELLM_ASSIGN_OR_RETURN(file.parsed_, parse_gguf(std::span<const std::byte>(file.mapping_->data(),
                                                                             file.mapping_->size()),
                                                  path.string()));
  return file;
}

const std::byte* GgufFile::data(const GgufTensorInfo& tensor) const {
  return mapping_->data() + parsed_.data_offset + tensor.offset;
}

const GgufValue* GgufMetadata::find(std::string_view key) const {
  for (const auto& [k, v] : entries_) {
    if (k == key) return &v;
  }
  return nullptr;
}

namespace {

Status wrong_type(const GgufMetadata& m, std::string_view key, const GgufValue& v,
                  const char* expected) {
  std::string got = to_string(v.type);
  if (v.is_array()) got += std::string(" of ") + to_string(v.element_type);
  return InvalidProgram(m.source + ": metadata '" + std::string(key) + "' is " + got +
                        ", expected " + expected);
}

}  // namespace

Result<std::optional<int64_t>> GgufMetadata::get_int(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::optional<int64_t>();
  if (!v->is_integer()) return wrong_type(*this, key, *v, "an integer");
  return std::optional<int64_t>(v->integer);
}

Result<std::optional<double>> GgufMetadata::get_real(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::optional<double>();
  if (v->is_real()) return std::optional<double>(v->real);
  if (v->is_integer()) return std::optional<double>(static_cast<double>(v->integer));
  return wrong_type(*this, key, *v, "a number");
}

Result<std::optional<bool>> GgufMetadata::get_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::optional<bool>();
  if (v->type != GgufValueType::kBool) return wrong_type(*this, key, *v, "a bool");
  return std::optional<bool>(v->integer != 0);
}

Result<std::optional<std::string>> GgufMetadata::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::optional<std::string>();
  if (v->type != GgufValueType::kString) return wrong_type(*this, key, *v, "a string");
  return std::optional<std::string>(v->string);
}

Result<const std::vector<std::string>*> GgufMetadata::get_strings(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return static_cast<const std::vector<std::string>*>(nullptr);
  if (!v->is_array() || v->element_type != GgufValueType::kString) {
    return wrong_type(*this, key, *v, "an array of strings");
  }
  return &v->strings;
}

Result<const std::vector<double>*> GgufMetadata::get_reals(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return static_cast<const std::vector<double>*>(nullptr);
  if (!v->is_array() ||
      (v->element_type != GgufValueType::kFloat32 && v->element_type != GgufValueType::kFloat64)) {
    return wrong_type(*this, key, *v, "an array of reals");
  }
  return &v->reals;
}

Result<const std::vector<int64_t>*> GgufMetadata::get_ints(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return static_cast<const std::vector<int64_t>*>(nullptr);
  if (!v->is_array() || !is_integer_type(v->element_type)) {
    return wrong_type(*this, key, *v, "an array of integers");
  }
  return &v->integers;
}

Result<GgufMetadata> read_gguf_metadata(const std::filesystem::path& path) {
  CELLM_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(path));
  return file.parsed().metadata;
}

bool is_gguf_path(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (ext == ".gguf") return true;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

}  // namespace cellm
