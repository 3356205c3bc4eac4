#include "model/fp8_checkpoint.h"

#include <cmath>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/half.h"
#include "model/json_fields.h"
#include "model/safetensors.h"

namespace cellm {
namespace {

using nlohmann::json;

std::string text_of(const json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump();
}

Status unsupported(const std::string& source, const std::string& field, const json& value,
                   const std::string& supported) {
  return NotSupported(source + ": quantization_config." + field + " is " + text_of(value) +
                      "; this build loads " + supported);
}

// A quantization args object (a group's `weights` or `input_activations`) at `path`.
// Weights must be 8-bit float, symmetric, per tensor or per channel; activations
// may be absent, dynamic or static, 8-bit float, per tensor or per token.
Status check_args(const json& args, const std::string& path, bool weights,
                  const std::string& source) {
  if (args.is_null()) {
    if (weights) return InvalidProgram(source + ": quantization_config." + path + " is null");
    return Status::Ok();
  }
  if (!args.is_object()) {
    return InvalidProgram(source + ": quantization_config." + path + " is not an object");
  }
  const json type = args.value("type", json("float"));
  if (type != "float") return unsupported(source, path + ".type", type, "float (FP8) weights");
  const json bits = args.value("num_bits", json(8));
  if (bits != 8) return unsupported(source, path + ".num_bits", bits, "8-bit floats (e4m3)");
  const json symmetric = args.value("symmetric", json(true));
  if (symmetric != true) {
    return unsupported(source, path + ".symmetric", symmetric, "symmetric scales");
  }
  const json strategy = args.value("strategy", json("tensor"));
  const bool ok = weights ? (strategy == "tensor" || strategy == "channel")
                          : (strategy == "tensor" || strategy == "token");
  if (!ok) {
    return unsupported(source, path + ".strategy", strategy,
                       weights ? "\"tensor\" or \"channel\" weight scales"
                               : "\"tensor\" or \"token\" activation scales");
  }
  if (weights) {
    const json dynamic = args.value("dynamic", json(false));
    if (dynamic != false) {
      return unsupported(source, path + ".dynamic", dynamic, "weights with stored scales");
    }
  }
  return Status::Ok();
}

Status check_compressed_tensors(const json& q, const std::string& source) {
  const json format = q.value("format", json("float-quantized"));
  if (format != "float-quantized" && format != "naive-quantized") {
    return unsupported(source, "format", format, "\"float-quantized\" or \"naive-quantized\"");
  }
  const json kv = q.value("kv_cache_scheme", json());
  if (!kv.is_null()) {
    return unsupported(source, "kv_cache_scheme", kv, "no kv-cache quantization (null)");
  }
  const auto groups = q.find("config_groups");
  if (groups == q.end() || !groups->is_object() || groups->empty()) {
    return InvalidProgram(source + ": quantization_config.config_groups is missing or empty");
  }
  for (const auto& [name, group] : groups->items()) {
    const std::string path = "config_groups." + name;
    if (!group.is_object()) {
      return InvalidProgram(source + ": quantization_config." + path + " is not an object");
    }
    CELLM_RETURN_IF_ERROR(
        check_args(group.value("weights", json()), path + ".weights", true, source));
    CELLM_RETURN_IF_ERROR(check_args(group.value("input_activations", json()),
                                     path + ".input_activations", false, source));
    const json out = group.value("output_activations", json());
    if (!out.is_null()) {
      return unsupported(source, path + ".output_activations", out, "no output quantization");
    }
  }
  return Status::Ok();
}

Status check_fp8(const json& q, const std::string& source) {
  const json block = q.value("weight_block_size", json());
  if (!block.is_null()) {
    return unsupported(source, "weight_block_size", block,
                       "per-tensor FP8 scales (block scales, weight_scale_inv, are not supported)");
  }
  const json fmt = q.value("fmt", json("e4m3"));
  if (fmt != "e4m3") return unsupported(source, "fmt", fmt, "\"e4m3\"");
  const json scheme = q.value("activation_scheme", json("dynamic"));
  if (scheme != "dynamic" && scheme != "static") {
    return unsupported(source, "activation_scheme", scheme, "\"dynamic\" or \"static\"");
  }
  return Status::Ok();
}

}  // namespace

Result<QuantizationConfig> load_quantization_config(const std::filesystem::path& config_path) {
  const std::string source = config_path.string();
  std::ifstream in(config_path, std::ios::binary);
  if (!in) return NotFound(source + ": cannot open");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CELLM_ASSIGN_OR_RETURN(json document, parse_json_text(text, source));
  QuantizationConfig config;
  if (!document.is_object()) return config;  // ModelConfig::load reports it
  const auto it = document.find("quantization_config");
  if (it == document.end() || it->is_null()) return config;
  if (!it->is_object()) {
    return InvalidProgram(source + ": quantization_config is not an object");
  }
  const json method = it->value("quant_method", json());
  if (method == "compressed-tensors") {
    CELLM_RETURN_IF_ERROR(check_compressed_tensors(*it, source));
  } else if (method == "fp8") {
    CELLM_RETURN_IF_ERROR(check_fp8(*it, source));
  } else {
    return unsupported(source, "quant_method", method,
                       "FP8 checkpoints (\"compressed-tensors\" float-quantized, or \"fp8\")");
  }
  config.present = true;
  config.method = method.get<std::string>();
  return config;
}

Result<std::vector<float>> fp8_row_scales(const SafetensorsCheckpoint& checkpoint,
                                          const TensorView& weight, const std::string& source) {
  const std::string module = weight.name.ends_with(".weight")
                                 ? weight.name.substr(0, weight.name.size() - 7)
                                 : weight.name;
  const int64_t rows = weight.shape.empty() ? 1 : weight.shape[0];
  const TensorView* scale = checkpoint.find(module + ".weight_scale");
  if (scale == nullptr) {
    if (checkpoint.find(module + ".weight_scale_inv") != nullptr) {
      return NotSupported(source + ": tensor '" + module +
                          ".weight_scale_inv' holds block scales (weight_block_size), which "
                          "this build does not load; per-tensor or per-channel weight_scale only");
    }
    return InvalidProgram(source + ": F8_E4M3 tensor '" + weight.name + "' has no '" + module +
                          ".weight_scale'");
  }
  const int64_t n = scale->numel();
  const bool per_tensor = n == 1;
  const bool per_row =
      n == rows && !scale->shape.empty() && scale->shape[0] == rows &&
      (scale->shape.size() == 1 || (scale->shape.size() == 2 && scale->shape[1] == 1));
  if (!per_tensor && !per_row) {
    return NotSupported(source + ": tensor '" + scale->name + "' has shape " +
                        shape_to_string(scale->shape) + "; expected one scale or one per row (" +
                        std::to_string(rows) + " or [" + std::to_string(rows) +
                        ", 1]): group and block scales are not supported");
  }
  if (scale->dtype == DType::kF8E4M3) {
    return InvalidProgram(source + ": tensor '" + scale->name + "' is F8_E4M3; scales are floats");
  }
  std::vector<float> scales(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = per_tensor ? 0 : r;
    float s = 0.0f;
    switch (scale->dtype) {
      case DType::kF32:
        s = static_cast<const float*>(scale->data)[i];
        break;
      case DType::kBF16:
        s = bf16_to_f32(static_cast<const uint16_t*>(scale->data)[i]);
        break;
      case DType::kF16:
        s = f16_to_f32(static_cast<const uint16_t*>(scale->data)[i]);
        break;
      case DType::kF8E4M3:
        break;
    }
    if (!std::isfinite(s) || s < 0.0f) {
      return InvalidProgram(source + ": tensor '" + scale->name + "' holds " + std::to_string(s) +
                            " at " + std::to_string(i) + "; scales are finite and non-negative");
    }
    scales[static_cast<size_t>(r)] = s;
  }
  return scales;
}

}  // namespace cellm
