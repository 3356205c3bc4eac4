// DeviceModel<T>: a model's weights on the GPU in the compute type T (bf16 or
// f32), in one slab, laid out for the CUDA forward:
//   qkv      [q_dim + 2 kv_dim, hidden]  q_proj, k_proj, v_proj rows stacked
//   qkv_bias [q_dim + 2 kv_dim]          when the model has q/k/v biases
//   gate_up  [2 intermediate, hidden]    gate_proj rows, then up_proj rows
// so one matrix product computes q, k and v, and one computes gate and up.
// Every other weight keeps its checkpoint shape (see model_weights.h).
//
// Thread-safety: immutable after upload.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "cellm/model_weights.h"
#include "cellm/status.h"
#include "cuda/device_memory.h"

namespace cellm::cuda {

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
};

template <typename T>
class DeviceModel {
 public:
  // Converts every weight to T on the host (bf16 weights into a bf16 model are
  // copied as they are) and copies it into one device slab.
  static Result<std::unique_ptr<DeviceModel>> upload(const ModelWeights& weights);
  // Bytes upload() will allocate for `config`.
  static size_t slab_bytes(const ModelConfig& config);

  const T* embed() const { return embed_; }            // [vocab, hidden]
  const T* final_norm() const { return final_norm_; }  // [hidden]
  const T* lm_head() const { return lm_head_; }        // [vocab, hidden] (embed when tied)
  const std::vector<DeviceLayer<T>>& layers() const { return layers_; }
  size_t bytes() const { return slab_.bytes(); }

 private:
  DeviceModel() = default;
  DeviceBuffer slab_;
  const T* embed_ = nullptr;
  const T* final_norm_ = nullptr;
  const T* lm_head_ = nullptr;
  std::vector<DeviceLayer<T>> layers_;
};

}  // namespace cellm::cuda
