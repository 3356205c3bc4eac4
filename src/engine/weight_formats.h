// --weights: re-encoding a loaded model's weights (quantize on load for the CPU executor)
// and dequantizing block-format (GGUF) weights to bf16 for the CUDA executor, whose kernels
// read elements only. Internal to the engine; both go through ModelWeights::converted with
// the CPU layer's quantizers (cellm/weight_quant.h).
#pragma once

#include <memory>
#include <string>

#include "cellm/engine.h"
#include "cellm/model_weights.h"
#include "cellm/status.h"

namespace cellm {

// `weights` with its linear layers' weights held as `format` (see WeightFormat): a copy
// sharing the source's storage, or the source itself for kAuto. `summary` gets what was
// done ("q4_k: 8 linear weights as q4_k, 48 as q5_0 (rows not whole q4_k blocks)").
// NotSupported naming the tensor when a weight already in a block format would have to be
// re-quantized.
Result<ModelWeights> apply_weight_format(const ModelWeights& weights, WeightFormat format,
                                         std::string& summary);

// `weights` with every tensor held in a block format dequantized to bf16 on the host (the
// CPU layer's dequantizers) and, unless `keep_fp8`, every FP8 weight dequantized (code
// value * row scale, rounded to bf16), or `weights` itself when none is. The CUDA
// executor keeps FP8 weights (cuda/device_model.h says how it holds them).
Result<std::shared_ptr<const ModelWeights>> dequantize_blocks_to_bf16(
    std::shared_ptr<const ModelWeights> weights, bool keep_fp8 = false);

}  // namespace cellm
