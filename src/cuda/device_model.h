// DeviceModel<T>: a model's weights on the GPU in the compute type T (bf16 or
// f32), in one slab, laid out for the CUDA forward:
//   qkv      [q_dim + 2 kv_dim, hidden]  q_proj, k_proj, v_proj rows stacked
//   qkv_bias [q_dim + 2 kv_dim]          when the model has q/k/v biases
//   gate_up  [2 intermediate, hidden]    gate_proj rows, then up_proj rows
// so one matrix product computes q, k and v, and one computes gate and up.
// Every other weight keeps its checkpoint shape (see model_weights.h).
//
// FP8 weights (DType::kF8E4M3, one f32 scale per row: an FP8 checkpoint, or --weights
// fp8 quantized on load) stay e4m3 in a bf16 model: a stacked piece (qkv, gate_up) or a
// single projection (o, down, the untied LM head) whose parts are all e4m3 goes up as its
// codes [n, k] and its row scales [n] (DeviceFp8), for launch_gemv_fp8 and Fp8Gemm, when
// k is a multiple of 16 and n of 8 (the FP8 products' shapes); its T pointer stays null.
// Any other e4m3 tensor, and every one in an f32 model, is dequantized to T (code value
// times row scale). A NaN code (0x7f, 0xff) in a weight kept e4m3 fails the upload
// naming the tensor: the products would read it as a number.
//
// Thread-safety: immutable after upload.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "cellm/model_weights.h"
#include "cellm/status.h"
#include "cuda/device_memory.h"

namespace cellm::cuda {

// An e4m3 weight on the device: codes [n, k] (16-byte aligned rows of k bytes) and one
// f32 scale per row. Null codes: the weight is held in T instead.
struct DeviceFp8 {
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
  explicit operator bool() const { return codes != nullptr; }
};

template <typename T>
struct DeviceLayer {
  const T* input_norm = nullptr;  // [hidden]
  const T* qkv = nullptr;         // [q_dim + 2 kv_dim, hidden]
  const T* qkv_bias = nullptr;    // [q_dim + 2 kv_dim] or null
  const T* o_proj = nullptr;      // [hidden, q_dim]
  const T* o_bias = nullptr;      // [hidden] or null
  const T* q_norm = nullptr;      // [head_dim] or null (Qwen3)
  const T* k_norm = nullptr;      // [head_dim] or null (Qwen3)
  const T* post_norm = nullptr;   // [hidden]
  const T* gate_up = nullptr;     // [2 intermediate, hidden]
  const T* down_proj = nullptr;   // [hidden, intermediate]
  // The same four products held e4m3 (each set where its T pointer is null).
  DeviceFp8 qkv8, o_proj8, gate_up8, down_proj8;
};

template <typename T>
class DeviceModel {
 public:
  // Converts every weight to T on the host (bf16 weights into a bf16 model are
  // copied as they are) and copies it into one device slab.
  static Result<std::unique_ptr<DeviceModel>> upload(const ModelWeights& weights);
  // Bytes upload() will allocate for `weights`.
  static size_t slab_bytes(const ModelWeights& weights);
  // Whether upload() keeps any weight of `weights` e4m3 (has_fp8() of the upload).
  static bool keeps_fp8(const ModelWeights& weights);

  const T* embed() const { return embed_; }                // [vocab, hidden]
  const T* final_norm() const { return final_norm_; }      // [hidden]
  const T* lm_head() const { return lm_head_; }            // [vocab, hidden] (embed when tied)
  const DeviceFp8& lm_head8() const { return lm_head8_; }  // set where lm_head() is null
  // Whether any weight is held e4m3 (the forward then needs its FP8 buffers).
  bool has_fp8() const { return has_fp8_; }
  const std::vector<DeviceLayer<T>>& layers() const { return layers_; }
  size_t bytes() const { return slab_.bytes(); }

 private:
  DeviceModel() = default;
  DeviceBuffer slab_;
  const T* embed_ = nullptr;
  const T* final_norm_ = nullptr;
  const T* lm_head_ = nullptr;
  DeviceFp8 lm_head8_;
  bool has_fp8_ = false;
  std::vector<DeviceLayer<T>> layers_;
};

}  // namespace cellm::cuda
