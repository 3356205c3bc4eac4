#include "engine/weight_formats.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cellm/weight_quant.h"

namespace cellm {
namespace {

// The ggml type names in lower case ("q4_k", "bf16"), as --weights spells them.
std::string type_name(GgmlType type) {
  const std::optional<GgmlTypeInfo> info = ggml_type_info(static_cast<uint32_t>(type));
  std::string name = info ? info->name : "?";
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

bool whole_blocks(GgmlType type, int64_t cols) {
  return weight_bytes(type, 1, cols).ok();
}

struct FormatName {
  WeightFormat format;
  const char* name;
  GgmlType type;  // what the linear weights become (kAuto: unused)
};

constexpr FormatName kFormats[] = {
    {WeightFormat::kAuto, "auto", GgmlType::kBF16},
    {WeightFormat::kBF16, "bf16", GgmlType::kBF16},
    {WeightFormat::kF32, "f32", GgmlType::kF32},
    {WeightFormat::kQ8_0, "q8_0", GgmlType::kQ8_0},
    {WeightFormat::kQ4_0, "q4_0", GgmlType::kQ4_0},
    {WeightFormat::kQ4_1, "q4_1", GgmlType::kQ4_1},
    {WeightFormat::kQ5_0, "q5_0", GgmlType::kQ5_0},
    {WeightFormat::kQ5_1, "q5_1", GgmlType::kQ5_1},
    {WeightFormat::kQ4_K, "q4_k", GgmlType::kQ4_K},
    {WeightFormat::kQ5_K, "q5_k", GgmlType::kQ5_K},
    {WeightFormat::kQ6_K, "q6_k", GgmlType::kQ6_K},
    // The FP8 formats are not ggml types; apply_weight_format handles them first.
    {WeightFormat::kFp8, "fp8", GgmlType::kBF16},
    {WeightFormat::kFp8Head, "fp8_head", GgmlType::kBF16},
};

bool is_fp8(WeightFormat format) {
  return format == WeightFormat::kFp8 || format == WeightFormat::kFp8Head;
}

const FormatName& entry(WeightFormat format) {
  for (const FormatName& f : kFormats) {
    if (f.format == format) return f;
  }
  return kFormats[0];
}

// The 32-weight format of about a K-quant's size, for rows that are not whole
// 256-weight blocks.
std::optional<GgmlType> small_block_fallback(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_K:
      return GgmlType::kQ5_0;
    case GgmlType::kQ5_K:
      return GgmlType::kQ5_1;
    case GgmlType::kQ6_K:
      return GgmlType::kQ8_0;
    default:
      return std::nullopt;
  }
}

// How `t`'s elements are stored.
GgmlType stored_type(const TensorView& t) {
  if (t.block_type) return *t.block_type;
  switch (t.dtype) {
    case DType::kBF16:
      return GgmlType::kBF16;
    case DType::kF16:
      return GgmlType::kF16;
    case DType::kF32:
    case DType::kF8E4M3:  // callers handle FP8 weights before asking
      return GgmlType::kF32;
  }
  return GgmlType::kF32;
}

// apply_weight_format for --weights fp8 / fp8_head, and for FP8 checkpoints under the
// float formats (which dequantize them) and the block formats (refused).
Result<ModelWeights> apply_fp8(const ModelWeights& weights, WeightFormat format,
                               std::string& summary) {
  int quantized = 0, kept = 0, dequantized = 0, kept_last = 0;
  // Quantizing on load keeps the last decoder layer's projections as stored in a model
  // of 8 layers or more: they feed the final norm and LM head directly, and e4m3 there
  // costs SmolLM2-135M about a third of its perplexity loss for 1/30 of the linear
  // bytes (docs/PERFORMANCE.md, Quality). The small test models stay fully quantized.
  std::vector<const void*> last_layer;
  if (weights.config().num_layers() >= 8) {
    const LayerWeights& l = weights.layer(weights.config().num_layers() - 1);
    for (const TensorView* p :
         {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj}) {
      last_layer.push_back(p->data);
    }
  }
  const WeightConverter convert = [&](const TensorView& t,
                                      WeightRole role) -> Result<std::optional<ConvertedWeight>> {
    const bool head = role == WeightRole::kLmHead;
    if (t.dtype == DType::kF8E4M3 && !t.block_type) {
      if (is_fp8(format) || format == WeightFormat::kAuto) {
        ++kept;
        return std::optional<ConvertedWeight>();
      }
      if (format == WeightFormat::kBF16 || format == WeightFormat::kF32) {
        ++dequantized;
        return std::optional<ConvertedWeight>(
            dequantize_fp8(t, format == WeightFormat::kF32 ? DType::kF32 : DType::kBF16));
      }
      return NotSupported("--weights " + std::string(to_string(format)) + ": tensor " + t.name +
                          " is already FP8; give --weights auto, fp8, bf16 or f32");
    }
    if (!is_fp8(format)) return std::optional<ConvertedWeight>();
    if (role != WeightRole::kLinear && !(head && format == WeightFormat::kFp8Head)) {
      return std::optional<ConvertedWeight>();
    }
    if (role == WeightRole::kLinear &&
        std::find(last_layer.begin(), last_layer.end(), t.data) != last_layer.end()) {
      ++kept_last;
      return std::optional<ConvertedWeight>();
    }
    if (t.block_type) {
      return NotSupported("--weights " + std::string(to_string(format)) + ": tensor " + t.name +
                          " is already quantized (" + type_name(*t.block_type) +
                          "); only float weights are quantized on load (give --weights auto)");
    }
    CELLM_ASSIGN_OR_RETURN(ConvertedWeight c, quantize_to_fp8(t));
    ++quantized;
    return std::optional<ConvertedWeight>(std::move(c));
  };
  CELLM_ASSIGN_OR_RETURN(ModelWeights out, weights.converted(convert));
  summary = std::string(to_string(format)) + ":";
  if (quantized > 0) summary += " " + std::to_string(quantized) + " weights quantized to fp8 e4m3";
  if (kept > 0) summary += " " + std::to_string(kept) + " fp8 weights as stored";
  if (dequantized > 0) {
    summary +=
        " " + std::to_string(dequantized) + " fp8 weights dequantized to " + to_string(format);
  }
  if (kept_last > 0) summary += ", the last layer's " + std::to_string(kept_last) + " as stored";
  if (format == WeightFormat::kFp8 && quantized > 0) summary += " (lm_head as stored)";
  return out;
}

bool has_fp8(const ModelWeights& weights) {
  for (const TensorView* t : weights.tensors()) {
    if (t->dtype == DType::kF8E4M3 && !t->block_type) return true;
  }
  return false;
}

bool is_float(GgmlType t) {
  return t == GgmlType::kF32 || t == GgmlType::kF16 || t == GgmlType::kBF16;
}

// `t` [rows, cols] re-encoded as `type`.
Result<ConvertedWeight> encode(const TensorView& t, GgmlType type) {
  const int64_t cols = t.shape.back();
  const int64_t rows = t.numel() / cols;
  CELLM_ASSIGN_OR_RETURN(const size_t bytes, weight_bytes(type, rows, cols));
  ConvertedWeight c;
  c.bytes.resize(bytes);
  if (is_float(type)) {
    c.dtype = type == GgmlType::kF32   ? DType::kF32
              : type == GgmlType::kF16 ? DType::kF16
                                       : DType::kBF16;
  } else {
    c.block_type = type;
  }
  CELLM_RETURN_IF_ERROR(reencode_weight(stored_type(t), t.data, rows, cols, type, c.bytes.data()));
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
  return format == WeightFormat::kAuto || format == WeightFormat::kBF16 || is_fp8(format);
}

Result<ModelWeights> apply_weight_format(const ModelWeights& weights, WeightFormat format,
                                         std::string& summary) {
  summary.clear();
  if (is_fp8(format) || (format != WeightFormat::kAuto && has_fp8(weights))) {
    return apply_fp8(weights, format, summary);
  }
  if (format == WeightFormat::kAuto) return weights;
  const GgmlType want = entry(format).type;
  std::map<std::string, int> counts;  // format name -> weights held in it
  std::string notes;
  const auto note = [&](const std::string& text) {
    if (notes.find(text) == std::string::npos) notes += (notes.empty() ? "" : "; ") + text;
  };
  const WeightConverter convert = [&](const TensorView& t,
                                      WeightRole role) -> Result<std::optional<ConvertedWeight>> {
    if (role != WeightRole::kLinear) return std::optional<ConvertedWeight>();
    const GgmlType have = stored_type(t);
    if (!is_float(have)) {
      if (have == want) {
        ++counts[type_name(want)];
        return std::optional<ConvertedWeight>();
      }
      return NotSupported("--weights " + std::string(to_string(format)) + ": tensor " + t.name +
                          " is already quantized (" + type_name(have) +
                          "); only float weights are quantized on load (give --weights auto)");
    }
    const int64_t cols = t.shape.back();
    GgmlType type = want;
    if (!whole_blocks(type, cols)) {
      const std::optional<GgmlType> fallback = small_block_fallback(type);
      if (fallback && whole_blocks(*fallback, cols)) {
        note(std::string("rows not whole ") + type_name(want) + " blocks");
        type = *fallback;
      } else {
        note(std::string("rows not whole ") + type_name(type) + " blocks: kept as stored");
        ++counts[type_name(have) + " (as stored)"];
        return std::optional<ConvertedWeight>();
      }
    }
    if (type == have) {
      ++counts[type_name(type)];
      return std::optional<ConvertedWeight>();
    }
    CELLM_ASSIGN_OR_RETURN(ConvertedWeight c, encode(t, type));
    ++counts[type_name(type)];
    return std::optional<ConvertedWeight>(std::move(c));
  };
  CELLM_ASSIGN_OR_RETURN(ModelWeights out, weights.converted(convert));
  summary = std::string(to_string(format)) + ": linear weights";
  bool first = true;
  // The requested format first, then the others.
  if (counts.contains(type_name(want))) {
    summary += " " + std::to_string(counts[type_name(want)]) + " as " + type_name(want);
    counts.erase(type_name(want));
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
    std::shared_ptr<const ModelWeights> weights, bool keep_fp8) {
  bool any = false;
  for (const TensorView* t : weights->tensors()) {
    any = any || t->block_type.has_value() || (t->dtype == DType::kF8E4M3 && !keep_fp8);
  }
  if (!any) return weights;
  const WeightConverter convert = [keep_fp8](const TensorView& t,
                                             WeightRole) -> Result<std::optional<ConvertedWeight>> {
    if (!t.block_type && t.dtype == DType::kF8E4M3) {
      if (keep_fp8) return std::optional<ConvertedWeight>();
      return std::optional<ConvertedWeight>(dequantize_fp8(t, DType::kBF16));
    }
    if (!t.block_type) return std::optional<ConvertedWeight>();
    if (!cpu_weight_type_supported(*t.block_type)) {
      return NotSupported("tensor " + t.name + " is in a block format this build cannot read");
    }
    CELLM_ASSIGN_OR_RETURN(ConvertedWeight c, encode(t, GgmlType::kBF16));
    return std::optional<ConvertedWeight>(std::move(c));
  };
  CELLM_ASSIGN_OR_RETURN(ModelWeights out, weights->converted(convert));
  return std::shared_ptr<const ModelWeights>(std::make_shared<ModelWeights>(std::move(out)));
}

}  // namespace cellm
