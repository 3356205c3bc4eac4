// Fuzzes the safetensors parser (parse_safetensors, what SafetensorsFile::open
// runs on the mapped file). Inputs whose first 8 bytes give a header length that
// fits and whose header starts with '{' are taken as a file as they are
// (mutations of the seed files); any other input builds a file from the bytes:
// a header of tensors with chosen dtypes, shapes and offsets (mostly
// consistent, sometimes off by a little or a lot) and a data section. Every
// tensor returned must lie inside the data section, hold numel * element size
// bytes, and not overlap another; its bytes are read (ASan checks the bounds).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "fuzz_json.h"
#include "model/safetensors.h"

namespace {

using nlohmann::json;

bool is_raw_file(const uint8_t* data, size_t size) {
  if (size < 9) return false;
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  return n <= size - 8 && data[8] == '{';
}

int64_t dim_value(FuzzedDataProvider& fdp) {
  switch (fdp.ConsumeIntegralInRange<int>(0, 7)) {
    case 0:
      return 0;
    case 1:
      return int64_t{1} << fdp.ConsumeIntegralInRange<int>(20, 62);
    case 2:
      return INT64_MAX - fdp.ConsumeIntegralInRange<int64_t>(0, 1);
    default:
      return fdp.ConsumeIntegralInRange<int64_t>(1, 6);
  }
}

std::vector<uint8_t> build_file(const uint8_t* data, size_t size) {
  static const char* const kDtypes[] = {"F32", "F16", "BF16", "I8", "F64", "", "f32"};
  static const size_t kSizes[] = {4, 2, 2, 1, 8, 1, 4};
  FuzzedDataProvider fdp(data, size);
  json header = json::object();
  uint64_t offset = 0;
  const int tensors = fdp.ConsumeIntegralInRange<int>(0, 6);
  for (int t = 0; t < tensors; ++t) {
    const int d = fdp.ConsumeIntegralInRange<int>(0, 6);
    json shape = json::array();
    uint64_t numel = 1;
    for (int k = fdp.ConsumeIntegralInRange<int>(0, 4); k > 0; --k) {
      const int64_t dim = dim_value(fdp);
      shape.push_back(dim);
      numel *= static_cast<uint64_t>(dim);  // wraps on purpose for huge shapes
    }
    const uint64_t nbytes = numel * kSizes[d];
    uint64_t begin = offset + (fdp.ConsumeIntegralInRange<int>(0, 7) == 0
                                   ? fdp.ConsumeIntegralInRange<uint64_t>(0, 5)
                                   : 0);
    uint64_t end = begin + (nbytes < 4096 ? nbytes : 8);
    if (fdp.ConsumeIntegralInRange<int>(0, 7) == 0)
      end = cellm::fuzz::edge_integer(fdp).get<uint64_t>();
    if (fdp.ConsumeIntegralInRange<int>(0, 9) == 0 && begin > 0) begin -= 1;  // overlap
    offset = end > offset && end - offset < 8192 ? end : offset + 8;
    json entry = {{"dtype", kDtypes[d]}, {"shape", shape}, {"data_offsets", {begin, end}}};
    if (fdp.ConsumeIntegralInRange<int>(0, 9) == 0) {
      entry[fdp.PickValueInArray({"dtype", "shape", "data_offsets"})] =
          cellm::fuzz::any_value(fdp, 2);
    }
    header[fdp.ConsumeBool() ? "t" + std::to_string(t) : cellm::fuzz::utf8_string(fdp, 12)] =
        fdp.ConsumeIntegralInRange<int>(0, 15) ? entry : cellm::fuzz::any_value(fdp, 2);
  }
  if (fdp.ConsumeBool()) header["__metadata__"] = {{"format", "pt"}};
  std::string text = header.dump();
  text.append(fdp.ConsumeIntegralInRange<size_t>(0, 8), ' ');  // padding, and misalignment
  uint64_t length = text.size();
  if (fdp.ConsumeIntegralInRange<int>(0, 15) == 0) length = fdp.ConsumeIntegral<uint64_t>();
  const size_t data_bytes =
      offset > 1 << 16 ? 0
                       : static_cast<size_t>(offset) + fdp.ConsumeIntegralInRange<size_t>(0, 4) -
                             fdp.ConsumeIntegralInRange<size_t>(0, offset > 0 ? 1 : 0);
  std::vector<uint8_t> file(8 + text.size() + data_bytes, 0xAB);
  for (int i = 0; i < 8; ++i) file[i] = static_cast<uint8_t>(length >> (8 * i));
  std::memcpy(file.data() + 8, text.data(), text.size());
  return file;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> file =
      is_raw_file(data, size) ? std::vector<uint8_t>(data, data + size) : build_file(data, size);
  const auto* bytes = reinterpret_cast<const std::byte*>(file.data());
  cellm::Result<std::vector<cellm::TensorView>> views =
      cellm::parse_safetensors(std::span<const std::byte>(bytes, file.size()), "fuzz.safetensors");
  if (!views.ok()) {
    FUZZ_CHECK(!views.status().message().empty(), "an error says what is wrong");
    return 0;
  }
  const std::byte* end_of_file = bytes + file.size();
  const std::byte* previous_end = bytes;
  volatile unsigned sum = 0;
  for (const cellm::TensorView& v : *views) {
    const auto* p = static_cast<const std::byte*>(v.data);
    FUZZ_CHECK(p >= previous_end && p <= end_of_file, "tensors in order, inside the file");
    FUZZ_CHECK(v.nbytes <= static_cast<size_t>(end_of_file - p), "tensor bytes inside the file");
    FUZZ_CHECK(static_cast<uint64_t>(v.numel()) * cellm::dtype_size_bytes(v.dtype) == v.nbytes,
               "nbytes = numel * element size");
    if (v.nbytes > 0)
      sum = sum + static_cast<unsigned>(p[0]) + static_cast<unsigned>(p[v.nbytes - 1]);
    previous_end = p + v.nbytes;
  }
  return 0;
}
