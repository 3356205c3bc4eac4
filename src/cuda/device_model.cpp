#include "cuda/device_model.h"

#include <cuda_bf16.h>

#include <cstring>
#include <functional>

#include "cellm/dtype.h"
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
  const void** slot;  // where the device pointer goes
};

size_t piece_elems(const Piece& p) {
  size_t n = 0;
  for (const TensorView* t : p.parts) n += static_cast<size_t>(t->numel());
  return n;
}

}  // namespace

template <typename T>
size_t DeviceModel<T>::slab_bytes(const ModelConfig& c) {
  // Upper bound of upload()'s layout: every tensor rounded up to kAlign.
  const auto e = [](int64_t n) { return align_up(static_cast<size_t>(n) * sizeof(T)); };
  const int64_t d = c.hidden_size(), qkv = c.q_dim() + 2 * c.kv_dim();
  size_t layer = e(d) * 2 + e(qkv * d) + e(qkv) + e(d * c.q_dim()) + e(d) + e(c.head_dim()) * 2 +
                 e(2 * c.intermediate_size() * d) + e(d * c.intermediate_size());
  size_t total = e(c.vocab_size() * d) * (c.tie_word_embeddings() ? 1 : 2) + e(d);
  return total + layer * static_cast<size_t>(c.num_layers());
}

template <typename T>
Result<std::unique_ptr<DeviceModel<T>>> DeviceModel<T>::upload(const ModelWeights& w) {
  const ModelConfig& c = w.config();
  std::unique_ptr<DeviceModel<T>> m(new DeviceModel<T>());
  m->layers_.resize(static_cast<size_t>(c.num_layers()));

  std::vector<Piece> pieces;
  auto add = [&](std::vector<const TensorView*> parts, const T** slot) {
    pieces.push_back({std::move(parts), reinterpret_cast<const void**>(slot)});
  };
  add({&w.embed_tokens()}, &m->embed_);
  add({&w.final_norm()}, &m->final_norm_);
  if (!c.tie_word_embeddings()) add({&w.lm_head()}, &m->lm_head_);
  for (int64_t l = 0; l < c.num_layers(); ++l) {
    const LayerWeights& lw = w.layer(l);
    DeviceLayer<T>& dl = m->layers_[static_cast<size_t>(l)];
    add({&lw.input_norm}, &dl.input_norm);
    add({&lw.q_proj, &lw.k_proj, &lw.v_proj}, &dl.qkv);
    if (lw.q_bias) add({&*lw.q_bias, &*lw.k_bias, &*lw.v_bias}, &dl.qkv_bias);
    add({&lw.o_proj}, &dl.o_proj);
    if (lw.o_bias) add({&*lw.o_bias}, &dl.o_bias);
    if (lw.q_norm) add({&*lw.q_norm}, &dl.q_norm);
    if (lw.k_norm) add({&*lw.k_norm}, &dl.k_norm);
    add({&lw.post_attention_norm}, &dl.post_norm);
    add({&lw.gate_proj, &lw.up_proj}, &dl.gate_up);
    add({&lw.down_proj}, &dl.down_proj);
  }

  size_t total = 0;
  for (const Piece& p : pieces) total += align_up(piece_elems(p) * sizeof(T));
  CELLM_ASSIGN_OR_RETURN(m->slab_, DeviceBuffer::allocate(total));

  auto* base = m->slab_.template as<unsigned char>();
  size_t offset = 0;
  std::vector<unsigned char> host;
  for (const Piece& p : pieces) {
    host.clear();
    for (const TensorView* t : p.parts) append<T>(*t, host);
    CELLM_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(base + offset, host.data(), host.size(), cudaMemcpyHostToDevice),
        "copying weights to the GPU");
    *p.slot = base + offset;
    offset += align_up(host.size());
  }
  if (c.tie_word_embeddings()) m->lm_head_ = m->embed_;
  return m;
}

template class DeviceModel<float>;
template class DeviceModel<__nv_bfloat16>;

}  // namespace cellm::cuda
