#include "cuda/device_model.h"

#include <cuda_bf16.h>

#include <cstring>
#include <functional>
#include <string>
#include <type_traits>

#include "cellm/dtype.h"
#include "cuda/cuda_check.h"
#include "cuda/kernels/gemv_fp8.h"
#include "model/fp8.h"
#include "model/half.h"

namespace cellm::cuda {
namespace {

constexpr size_t kAlign = 256;

size_t align_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

// Element i of `t`, widened to f32 (exact for every stored type).
float element(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::kF32:
      return static_cast<const float*>(t.data)[i];
    case DType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(t.data)[i]);
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(t.data)[i]);
    case DType::kF8E4M3:  // the code's value times its row's scale
      return e4m3_to_f32(static_cast<const uint8_t*>(t.data)[i]) * t.scales[i / t.shape.back()];
  }
  return 0.0f;
}

// Appends `t` converted to T at the end of `host` (raw bytes of T).
template <typename T>
void append(const TensorView& t, std::vector<unsigned char>& host) {
  const size_t at = host.size();
  host.resize(at + static_cast<size_t>(t.numel()) * sizeof(T));
  unsigned char* dst = host.data() + at;
  if constexpr (std::is_same_v<T, float>) {
    if (t.dtype == DType::kF32) {
      std::memcpy(dst, t.data, t.nbytes);
      return;
    }
    auto* out = reinterpret_cast<float*>(dst);
    for (int64_t i = 0; i < t.numel(); ++i) out[i] = element(t, i);
  } else {
    if (t.dtype == DType::kBF16) {
      std::memcpy(dst, t.data, t.nbytes);
      return;
    }
    auto* out = reinterpret_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < t.numel(); ++i) out[i] = f32_to_bf16(element(t, i));
  }
}

// The slab in upload order; each entry is one or more tensors stacked.
struct Piece {
  std::vector<const TensorView*> parts;
  const void** slot;         // where the device pointer goes when held in T
  DeviceFp8* fp8 = nullptr;  // where it goes when it may stay e4m3 (a product's weight)
};

size_t piece_elems(const Piece& p) {
  size_t n = 0;
  for (const TensorView* t : p.parts) n += static_cast<size_t>(t->numel());
  return n;
}

size_t piece_rows(const Piece& p) {
  size_t n = 0;
  for (const TensorView* t : p.parts) n += static_cast<size_t>(t->shape.front());
  return n;
}

// Whether `p` goes up as e4m3 codes and row scales in a model of T (device_model.h).
template <typename T>
bool stays_fp8(const Piece& p) {
  if (!std::is_same_v<T, __nv_bfloat16> || p.fp8 == nullptr) return false;
  const int64_t k = p.parts.front()->shape.back();
  for (const TensorView* t : p.parts) {
    if (t->dtype != DType::kF8E4M3 || t->block_type || t->shape.size() != 2 || t->shape[1] != k ||
        t->scales == nullptr) {
      return false;
    }
  }
  return k % 16 == 0 && piece_rows(p) % 8 == 0;
}

template <typename T>
size_t piece_bytes(const Piece& p) {
  if (stays_fp8<T>(p)) return align_up(piece_elems(p)) + align_up(piece_rows(p) * sizeof(float));
  return align_up(piece_elems(p) * sizeof(T));
}

// The pieces of `w`, each pointing at the member of the model that receives it.
template <typename T>
std::vector<Piece> plan_pieces(const ModelWeights& w, const T** embed, const T** final_norm,
                               const T** lm_head, DeviceFp8* lm_head8,
                               std::vector<DeviceLayer<T>>& layers) {
  const ModelConfig& c = w.config();
  layers.assign(static_cast<size_t>(c.num_layers()), DeviceLayer<T>{});
  std::vector<Piece> pieces;
  auto add = [&](std::vector<const TensorView*> parts, const T** slot, DeviceFp8* fp8 = nullptr) {
    pieces.push_back({std::move(parts), reinterpret_cast<const void**>(slot), fp8});
  };
  add({&w.embed_tokens()}, embed);
  add({&w.final_norm()}, final_norm);
  if (!c.tie_word_embeddings()) add({&w.lm_head()}, lm_head, lm_head8);
  for (int64_t l = 0; l < c.num_layers(); ++l) {
    const LayerWeights& lw = w.layer(l);
    DeviceLayer<T>& dl = layers[static_cast<size_t>(l)];
    add({&lw.input_norm}, &dl.input_norm);
    add({&lw.q_proj, &lw.k_proj, &lw.v_proj}, &dl.qkv, &dl.qkv8);
    if (lw.q_bias) add({&*lw.q_bias, &*lw.k_bias, &*lw.v_bias}, &dl.qkv_bias);
    add({&lw.o_proj}, &dl.o_proj, &dl.o_proj8);
    if (lw.o_bias) add({&*lw.o_bias}, &dl.o_bias);
    if (lw.q_norm) add({&*lw.q_norm}, &dl.q_norm);
    if (lw.k_norm) add({&*lw.k_norm}, &dl.k_norm);
    add({&lw.post_attention_norm}, &dl.post_norm);
    add({&lw.gate_proj, &lw.up_proj}, &dl.gate_up, &dl.gate_up8);
    add({&lw.down_proj}, &dl.down_proj, &dl.down_proj8);
  }
  return pieces;
}

// The first NaN code of an e4m3 tensor as an error naming it, else Ok.
Status check_no_nan_codes(const TensorView& t) {
  const auto* codes = static_cast<const uint8_t*>(t.data);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (e4m3_is_nan(codes[i])) {
      const int64_t cols = t.shape.back();
      return InvalidArgument("FP8 weight " + t.name + " holds a NaN code at [" +
                             std::to_string(i / cols) + ", " + std::to_string(i % cols) +
                             "]; an e4m3 weight must be finite");
    }
  }
  return Status::Ok();
}

}  // namespace

template <typename T>
size_t DeviceModel<T>::slab_bytes(const ModelWeights& weights) {
  DeviceModel<T> m;
  size_t total = 0;
  for (const Piece& p :
       plan_pieces<T>(weights, &m.embed_, &m.final_norm_, &m.lm_head_, &m.lm_head8_, m.layers_)) {
    total += piece_bytes<T>(p);
  }
  return total;
}

template <typename T>
bool DeviceModel<T>::keeps_fp8(const ModelWeights& weights) {
  DeviceModel<T> m;
  for (const Piece& p :
       plan_pieces<T>(weights, &m.embed_, &m.final_norm_, &m.lm_head_, &m.lm_head8_, m.layers_)) {
    if (stays_fp8<T>(p)) return true;
  }
  return false;
}

template <typename T>
Result<std::unique_ptr<DeviceModel<T>>> DeviceModel<T>::upload(const ModelWeights& w) {
  std::unique_ptr<DeviceModel<T>> m(new DeviceModel<T>());
  const std::vector<Piece> pieces =
      plan_pieces<T>(w, &m->embed_, &m->final_norm_, &m->lm_head_, &m->lm_head8_, m->layers_);
  size_t total = 0;
  for (const Piece& p : pieces) total += piece_bytes<T>(p);
  CELLM_ASSIGN_OR_RETURN(m->slab_, DeviceBuffer::allocate(total));

  auto* base = m->slab_.template as<unsigned char>();
  size_t offset = 0;
  std::vector<unsigned char> host;
  // Copies `host` to the slab's next aligned place and returns where it went.
  const auto put = [&](const char* what) -> Result<unsigned char*> {
    unsigned char* at = base + offset;
    CELLM_CUDA_RETURN_IF_ERROR(cudaMemcpy(at, host.data(), host.size(), cudaMemcpyHostToDevice),
                               what);
    offset += align_up(host.size());
    return at;
  };
  for (const Piece& p : pieces) {
    host.clear();
    if (stays_fp8<T>(p)) {
      for (const TensorView* t : p.parts) {
        CELLM_RETURN_IF_ERROR(check_no_nan_codes(*t));
        const auto* codes = static_cast<const unsigned char*>(t->data);
        host.insert(host.end(), codes, codes + t->numel());
      }
      CELLM_ASSIGN_OR_RETURN(unsigned char* codes, put("copying FP8 weights to the GPU"));
      host.clear();
      for (const TensorView* t : p.parts) {
        const auto* scales = reinterpret_cast<const unsigned char*>(t->scales);
        host.insert(host.end(), scales, scales + t->shape.front() * sizeof(float));
      }
      CELLM_ASSIGN_OR_RETURN(unsigned char* scales, put("copying FP8 weight scales to the GPU"));
      p.fp8->codes = codes;
      p.fp8->scales = reinterpret_cast<const float*>(scales);
      m->has_fp8_ = true;
      continue;
    }
    for (const TensorView* t : p.parts) append<T>(*t, host);
    CELLM_ASSIGN_OR_RETURN(unsigned char* at, put("copying weights to the GPU"));
    *p.slot = at;
  }
  if (w.config().tie_word_embeddings()) m->lm_head_ = m->embed_;
  return m;
}

template class DeviceModel<float>;
template class DeviceModel<__nv_bfloat16>;

}  // namespace cellm::cuda
