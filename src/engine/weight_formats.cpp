#include "engine/weight_formats.h"

#include <cctype>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cpu/quant/block_formats.h"
#include "cpu/quant/weight_quant.h"

namespace cellm {
namespace {

using cpu::quant::QuantType;

struct FormatName {
  WeightFormat format;
  const char* name;
  QuantType type;  // what the linear weights become (kAuto: unused)
};

constexpr FormatName kFormats[] = {
    {WeightFormat::kAuto, "auto", QuantType::kBF16},
    {WeightFormat::kBF16, "bf16", QuantType::kBF16},
    {WeightFormat::kF32, "f32", QuantType::kF32},
    {WeightFormat::kQ8_0, "q8_0", QuantType::kQ8_0},
    {WeightFormat::kQ4_0, "q4_0", QuantType::kQ4_0},
    {WeightFormat::kQ4_1, "q4_1", QuantType::kQ4_1},
    {WeightFormat::kQ5_0, "q5_0", QuantType::kQ5_0},
    {WeightFormat::kQ5_1, "q5_1", QuantType::kQ5_1},
    {WeightFormat::kQ4_K, "q4_k", QuantType::kQ4_K},
    {WeightFormat::kQ5_K, "q5_k", QuantType::kQ5_K},
    {WeightFormat::kQ6_K, "q6_k", QuantType::kQ6_K},
};

const FormatName& entry(WeightFormat format) {
  for (const FormatName& f : kFormats) {
    if (f.format == format) return f;
  }
  return kFormats[0];
}

// The 32-weight format of about a K-quant's size, for rows that are not whole
// 256-weight blocks.
std::optional<QuantType> small_block_fallback(QuantType type) {
  switch (type) {
    case QuantType::kQ4_K:
      return QuantType::kQ5_0;
    case QuantType::kQ5_K:
      return QuantType::kQ5_1;
    case QuantType::kQ6_K:
      return QuantType::kQ8_0;
    default:
      return std::nullopt;
  }
}

// How `t`'s elements are stored, as the quant layer names it.
QuantType stored_type(const TensorView& t) {
  if (t.block_type) return static_cast<QuantType>(static_cast<uint32_t>(*t.block_type));
  switch (t.dtype) {
    case DType::kBF16:
      return QuantType::kBF16;
    case DType::kF16:
      return QuantType::kF16;
    case DType::kF32:
      return QuantType::kF32;
  }
  return QuantType::kF32;
}

bool is_float(QuantType t) {
  return t == QuantType::kF32 || t == QuantType::kF16 || t == QuantType::kBF16;
}

// `t` [rows, cols] re-encoded as `type`.
Result<ConvertedWeight> encode(const TensorView& t, QuantType type) {
  const int64_t cols = t.shape.back();
  const int64_t rows = t.numel() / cols;
  CELLM_ASSIGN_OR_RETURN(const int64_t row, cpu::quant::row_bytes(type, cols));
  ConvertedWeight c;
  c.bytes.resize(static_cast<size_t>(rows * row));
  if (is_float(type)) {
    c.dtype = type == QuantType::kF32   ? DType::kF32
              : type == QuantType::kF16 ? DType::kF16
                                        : DType::kBF16;
  } else {
    c.block_type = static_cast<GgmlType>(static_cast<uint32_t>(type));
  }
  CELLM_RETURN_IF_ERROR(
      cpu::quant::quantize_weight_matrix(stored_type(t), t.data, rows, cols, type, c.bytes.data()));
  return c;
}

}  // namespace

const char* to_string(WeightFormat format) {
  return entry(format).name;
}

std::string weight_format_names() {
  std::string names;
  for (const FormatName& f : kFormats) names += (names.empty() ? "" : ", ") + std::string(f.name);
  return names;
}

Result<WeightFormat> parse_weight_format(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const FormatName& f : kFormats) {
    if (lower == f.name) return f.format;
  }
  return InvalidArgument("--weights must be one of " + weight_format_names() + ", got '" +
                         std::string(name) + "'");
}

bool cuda_runs_weight_format(WeightFormat format) {
  return format == WeightFormat::kAuto || format == WeightFormat::kBF16;
}

Result<ModelWeights> apply_weight_format(const ModelWeights& weights, WeightFormat format,
                                         std::string& summary) {
  summary.clear();
  if (format == WeightFormat::kAuto) return weights;
  const QuantType want = entry(format).type;
  std::map<std::string, int> counts;  // format name -> weights held in it
  std::string notes;
  const auto note = [&](const std::string& text) {
    if (notes.find(text) == std::string::npos) notes += (notes.empty() ? "" : "; ") + text;
  };
  const WeightConverter convert = [&](const TensorView& t,
                                      WeightRole role) -> Result<std::optional<ConvertedWeight>> {
    if (role != WeightRole::kLinear) return std::optional<ConvertedWeight>();
    const QuantType have = stored_type(t);
    if (!is_float(have)) {
      if (have == want) {
        ++counts[cpu::quant::type_info(want).name];
        return std::optional<ConvertedWeight>();
      }
      return NotSupported("--weights " + std::string(to_string(format)) + ": tensor " + t.name +
                          " is already quantized (" + cpu::quant::type_info(have).name +
                          "); only float weights are quantized on load (give --weights auto)");
    }
    const int64_t cols = t.shape.back();
    QuantType type = want;
    if (!cpu::quant::row_bytes(type, cols).ok()) {
      const std::optional<QuantType> fallback = small_block_fallback(type);
      if (fallback && cpu::quant::row_bytes(*fallback, cols).ok()) {
        note(std::string("rows not whole ") + cpu::quant::type_info(want).name + " blocks");
        type = *fallback;
      } else {
        note(std::string("rows not whole ") + cpu::quant::type_info(type).name +
             " blocks: kept as stored");
        ++counts[std::string(cpu::quant::type_info(have).name) + " (as stored)"];
        return std::optional<ConvertedWeight>();
      }
    }
    if (type == have) {
      ++counts[cpu::quant::type_info(type).name];
      return std::optional<ConvertedWeight>();
    }
    CELLM_ASSIGN_OR_RETURN(ConvertedWeight c, encode(t, type));
    ++counts[cpu::quant::type_info(type).name];
    return std::optional<ConvertedWeight>(std::move(c));
  };
  CELLM_ASSIGN_OR_RETURN(ModelWeights out, weights.converted(convert));
  summary = std::string(to_string(format)) + ": linear weights";
  bool first = true;
  // The requested format first, then the others.
  if (counts.contains(cpu::quant::type_info(want).name)) {
    summary += " " + std::to_string(counts[cpu::quant::type_info(want).name]) + " as " +
               cpu::quant::type_info(want).name;
    counts.erase(cpu::quant::type_info(want).name);
    first = false;
  }
  for (const auto& [name, n] : counts) {
    summary += (first ? " " : ", ") + std::to_string(n) + " as " + name;
    first = false;
  }
  if (!notes.empty()) summary += " (" + notes + ")";
  return out;
}

Result<std::shared_ptr<const ModelWeights>> dequantize_blocks_to_bf16(
    std::shared_ptr<const ModelWeights> weights) {
  bool any = false;
  for (const TensorView* t : weights->tensors()) any = any || t->block_type.has_value();
  if (!any) return weights;
  const WeightConverter convert = [](const TensorView& t,
                                     WeightRole) -> Result<std::optional<ConvertedWeight>> {
    if (!t.block_type) return std::optional<ConvertedWeight>();
    if (!cpu::quant::type_from_ggml_id(static_cast<uint32_t>(*t.block_type))) {
      return NotSupported("tensor " + t.name + " is in a block format this build cannot read");
    }
    CELLM_ASSIGN_OR_RETURN(ConvertedWeight c, encode(t, QuantType::kBF16));
    return std::optional<ConvertedWeight>(std::move(c));
  };
  CELLM_ASSIGN_OR_RETURN(ModelWeights out, weights->converted(convert));
  return std::shared_ptr<const ModelWeights>(std::make_shared<ModelWeights>(std::move(out)));
}

}  // namespace cellm
