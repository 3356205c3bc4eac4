// FP8 checkpoints as published: a Hugging Face folder whose config.json has a
// `quantization_config` that stores the linear layers' weights as float8_e4m3fn
// (safetensors dtype F8_E4M3) with f32/bf16 scales beside them. Two schemes load:
//   quant_method "compressed-tensors" (format "float-quantized" or
//     "naive-quantized"): every config group's `weights` is type "float",
//     num_bits 8, symmetric, strategy "tensor" (one weight_scale) or "channel"
//     (weight_scale [out, 1]); input_activations absent, dynamic, or static (an
//     input_scale per layer, read and unused: activations stay unquantized);
//     `ignore` lists the modules kept unquantized (e.g. lm_head).
//   quant_method "fp8": activation_scheme "static" or "dynamic", fmt "e4m3",
//     a per-tensor weight_scale (block scales, weight_block_size with
//     weight_scale_inv, are NotSupported).
// Anything else in a quantization_config (int weights, other num_bits, group or
// block strategies, asymmetric scales, a kv-cache scheme, another quant_method) is
// NotSupported naming the field and its value. Private to src/model.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "cellm/dtype.h"
#include "cellm/status.h"

namespace cellm {

class SafetensorsCheckpoint;

// What config.json's quantization_config says about the weights.
struct QuantizationConfig {
  bool present = false;  // config.json has a quantization_config
  std::string method;    // "compressed-tensors" or "fp8" when present
};

// Reads and checks `config_path`'s quantization_config (see above).
Result<QuantizationConfig> load_quantization_config(const std::filesystem::path& config_path);

// The per-row f32 scales of the F8_E4M3 weight `weight` (named "<module>.weight")
// of `checkpoint`: its "<module>.weight_scale", one value (per tensor) or one per
// row ([rows] or [rows, 1]), in F32, BF16 or F16, finite and positive. Errors name
// `source`, the tensor and the problem; weight_scale_inv (block scales) is
// NotSupported.
Result<std::vector<float>> fp8_row_scales(const SafetensorsCheckpoint& checkpoint,
                                          const TensorView& weight, const std::string& source);

}  // namespace cellm
