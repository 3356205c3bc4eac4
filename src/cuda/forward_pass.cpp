// One step of CudaForward<T> on the stream (cuda/cuda_forward_impl.h): the metadata
// copy, the layers' kernels and products, the final norm and LM head, sampling and the
// token copy; and the L2 prefetch branch a decode graph may carry beside the attention.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <type_traits>

#include "cuda/cuda_check.h"
#include "cuda/cuda_forward_impl.h"
#include "cuda/kernels/embedding.h"
#include "cuda/kernels/gemv_fp8.h"
#include "cuda/kernels/kv_e4m3.h"
#include "cuda/kernels/l2_prefetch.h"
#include "cuda/kernels/quantize_e4m3.h"
#include "cuda/kernels/rmsnorm.h"
#include "cuda/kernels/rope_kv_write.h"

namespace cellm::cuda {

template <typename T>
Status CudaForward<T>::enqueue_step(int32_t n, int32_t n_sel, int32_t fresh_positions, int slot,
                                    std::span<const AttentionRowRange> ranges, bool sample) {
  cudaStream_t s = stream_.get();
  CELLM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(meta_dev_.get(), staging(slot), meta_.bytes, cudaMemcpyHostToDevice, s),
      "copying the step metadata");
  CELLM_RETURN_IF_ERROR(enqueue_forward(n, n_sel, fresh_positions, ranges));
  if (n_sel > 0 && sample) {
    CELLM_CUDA_RETURN_IF_ERROR(
        launch_sample(buf<float>(buf_.logits), n_sel, config_.vocab_size(),
                      meta<SamplingRow>(meta_.sampling), buf<int32_t>(buf_.out_tokens),
                      buf<void>(buf_.sample_ws),
                      sample_workspace_bytes(dims_.max_rows, config_.vocab_size()), s),
        "sampling");
  }
  // The prefetch branch ends before the token copy, the graph's last node (or, in a
  // graph that stops at the logits, after the LM head).
  CELLM_RETURN_IF_ERROR(join_prefetch());
  if (n_sel > 0 && sample) {
    CELLM_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(hosts_[slot].out_tokens, buf<int32_t>(buf_.out_tokens),
                        static_cast<size_t>(n_sel) * sizeof(int32_t), cudaMemcpyDeviceToHost, s),
        "copying the sampled tokens");
  }
  return Status::Ok();
}

template <typename T>
Status CudaForward<T>::enqueue_sampling(int32_t n_sel, int slot) {
  cudaStream_t s = stream_.get();
  CELLM_CUDA_RETURN_IF_ERROR(
      launch_sample(buf<float>(buf_.logits), n_sel, config_.vocab_size(),
                    meta<SamplingRow>(meta_.sampling), buf<int32_t>(buf_.out_tokens),
                    buf<void>(buf_.sample_ws),
                    sample_workspace_bytes(dims_.max_rows, config_.vocab_size()), s),
      "sampling");
  CELLM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(hosts_[slot].out_tokens, buf<int32_t>(buf_.out_tokens),
                      static_cast<size_t>(n_sel) * sizeof(int32_t), cudaMemcpyDeviceToHost, s),
      "copying the sampled tokens");
  return Status::Ok();
}

template <typename T>
Status CudaForward<T>::enqueue_adjusted_sampling(int32_t n_sel, int slot,
                                                 std::span<const int32_t> logit_rows,
                                                 const AdjustmentSource& adjust) {
  // The raw rows first: log-probabilities are those of the unadjusted logits.
  CELLM_RETURN_IF_ERROR(enqueue_logits_copy(logit_rows));
  if (n_sel == 0) return Status::Ok();
  // The host's share (the processors' prepare) runs while the device computes the forward.
  const std::span<const RowAdjustments> rows = adjust();
  CELLM_RETURN_IF_ERROR(adjuster_.apply(rows, buf<float>(buf_.logits), n_sel, stream_.get()));
  adjusted_rows_ += adjuster_.last_adjusted_rows();
  return enqueue_sampling(n_sel, slot);
}

template <typename T>
Status CudaForward<T>::enqueue_forward(int32_t n, int32_t n_sel, int32_t fresh_positions,
                                       std::span<const AttentionRowRange> ranges) {
  cudaStream_t s = stream_.get();
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size(), hd = c.head_dim(), ff = c.intermediate_size();
  const int64_t q_dim = c.q_dim(), kv_dim = c.kv_dim(), qkv_dim = q_dim + 2 * kv_dim;
  const auto eps = static_cast<float>(c.rms_norm_eps());
  const int32_t* tokens = meta<int32_t>(meta_.tokens);
  const int32_t* positions = meta<int32_t>(meta_.positions);
  const int32_t* row_seq = meta<int32_t>(meta_.row_seq);
  const int32_t* cells = meta<int32_t>(meta_.cells);
  float* residual = buf<float>(buf_.residual);
  T* h = buf<T>(buf_.h);
  T* qkv = buf<T>(buf_.qkv);
  T* attn = buf<T>(buf_.attn);
  T* delta = buf<T>(buf_.delta);
  T* gate_up = buf<T>(buf_.gate_up);
  T* act = buf<T>(buf_.act);

  CELLM_CUDA_RETURN_IF_ERROR(
      launch_embedding<T>(model_->embed(), c.vocab_size(), d, tokens, n, residual, s,
                          buf<int32_t>(buf_.out_tokens)),  // kFedToken: the last step's token
      "embedding");
  // Every norm after the first finds the residual written by the norm before it, with
  // qkv or gate_up between them (ResidualWriter::kEarlierKernel: read before the wait).
  const ResidualWriter settled = ResidualWriter::kEarlierKernel;
  for (int64_t l = 0; l < c.num_layers(); ++l) {
    const DeviceLayer<T>& w = model_->layers()[static_cast<size_t>(l)];
    CELLM_ASSIGN_OR_RETURN(
        const bool qkv_in8,
        add_rmsnorm_for(w.qkv8, residual, l == 0 ? nullptr : delta, w.input_norm, n, d, h,
                        l == 0 ? ResidualWriter::kPreviousKernel : settled));
    CELLM_RETURN_IF_ERROR(
        linear<T>(h, n, d, GemvInput::kPlain, w.qkv, w.qkv8, qkv_dim, w.qkv_bias, qkv, qkv_in8));
    if (prefetching_) CELLM_RETURN_IF_ERROR(prefetch_gate_up(w));
    if (w.q_norm != nullptr) {
      CELLM_CUDA_RETURN_IF_ERROR(
          launch_head_rmsnorm<T>(qkv, n, qkv_dim, 0, c.num_heads(), hd, w.q_norm, eps, s),
          "q norm");
      CELLM_CUDA_RETURN_IF_ERROR(
          launch_head_rmsnorm<T>(qkv, n, qkv_dim, q_dim, c.num_kv_heads(), hd, w.k_norm, eps, s),
          "k norm");
    }
    if (dims_.kv_e4m3) {
      CELLM_RETURN_IF_ERROR(enqueue_e4m3_attention(l, n, qkv, attn));
    } else {
      RopeKvWriteParams<T> rk;
      rk.qkv = qkv;
      rk.n_rows = n;
      rk.row_stride = qkv_dim;
      rk.q_offset = 0;
      rk.n_heads = c.num_heads();
      rk.k_offset = q_dim;
      rk.v_offset = q_dim + kv_dim;
      rk.n_kv_heads = c.num_kv_heads();
      rk.head_dim = hd;
      rk.positions = positions;
      rk.inv_freq = inv_freq_.as<float>();
      rk.cells = cells;
      rk.k_pool = k_pool(l);
      rk.v_pool = v_pool(l);
      rk.table = l == 0 ? table_.as<int32_t>() : nullptr;  // one table store per step
      rk.table_stride = dims_.max_session_tokens;
      rk.row_seq = row_seq;
      CELLM_CUDA_RETURN_IF_ERROR(launch_rope_kv_write<T>(rk, s), "rope and the K/V write");
      AttentionParams<T> ap;
      ap.qkv = qkv;
      ap.row_stride = qkv_dim;
      ap.q_offset = 0;
      ap.n_rows = n;
      ap.n_heads = c.num_heads();
      ap.n_kv_heads = c.num_kv_heads();
      ap.head_dim = hd;
      ap.k_pool = k_pool(l);
      ap.v_pool = v_pool(l);
      ap.table = table_.as<int32_t>();
      ap.table_stride = dims_.max_session_tokens;
      ap.row_seq = row_seq;
      ap.positions = positions;
      ap.window = static_cast<int32_t>(c.window(l));
      ap.scale = 1.0f / std::sqrt(static_cast<float>(hd));
      ap.max_context = dims_.max_session_tokens;
      ap.workspace = buf<float>(buf_.attn_ws);
      ap.out = attn;
      ap.fresh_positions = fresh_positions;
      ap.cluster_fold = tuning().attention_cluster_fold;
      if (ranges.empty()) {
        CELLM_CUDA_RETURN_IF_ERROR(launch_attention<T>(ap, s), "attention");
      }
      for (const AttentionRowRange& range : ranges) {
        AttentionParams<T> rows = attention_rows(ap, range.begin, range.end);
        rows.row_runs = range.runs;
        CELLM_CUDA_RETURN_IF_ERROR(launch_attention<T>(rows, s), "attention");
      }
    }
    CELLM_RETURN_IF_ERROR(
        linear<T>(attn, n, q_dim, GemvInput::kPlain, w.o_proj, w.o_proj8, d, w.o_bias, delta));
    CELLM_ASSIGN_OR_RETURN(const bool gate_up_in8, add_rmsnorm_for(w.gate_up8, residual, delta,
                                                                   w.post_norm, n, d, h, settled));
    CELLM_RETURN_IF_ERROR(linear<T>(h, n, d, GemvInput::kPlain, w.gate_up, w.gate_up8, 2 * ff,
                                    nullptr, gate_up, gate_up_in8));
    CELLM_RETURN_IF_ERROR(swiglu_down(gate_up, n, w, act, delta));
  }
  if (n_sel == 0) return Status::Ok();
  // residual += the last MLP output, then the final norm into h. When the step selects
  // every row in order (a decode step) h is the LM head's input; otherwise the selected
  // rows of the residual are gathered and normalised again (the same arithmetic on the
  // same f32 sums: the same bits as h's rows) and the LM head reads only them.
  CELLM_CUDA_RETURN_IF_ERROR(
      launch_add_rmsnorm<T>(residual, delta, model_->final_norm(), n, d, eps, h, s, settled),
      "final residual");
  T* head_in = h;
  if (!selects_every_row(n, n_sel)) {
    float* sel = buf<float>(buf_.sel);
    head_in = buf<T>(buf_.sel_norm);
    CELLM_CUDA_RETURN_IF_ERROR(
        launch_gather_rows(residual, d, meta<int32_t>(meta_.selected), n_sel, sel, s),
        "gathering the selected rows");
    CELLM_CUDA_RETURN_IF_ERROR(
        launch_add_rmsnorm<T>(sel, nullptr, model_->final_norm(), n_sel, d, eps, head_in, s),
        "final rmsnorm");
  }
  CELLM_RETURN_IF_ERROR(linear<float>(head_in, n_sel, d, GemvInput::kPlain, model_->lm_head(),
                                      model_->lm_head8(), c.vocab_size(), nullptr,
                                      buf<float>(buf_.logits)));
  return Status::Ok();
}

template <typename T>
Status CudaForward<T>::enqueue_e4m3_attention(int64_t l, int32_t n, T* qkv, T* attn) {
  cudaStream_t s = stream_.get();
  const ModelConfig& c = config_;
  const int64_t q_dim = c.q_dim(), kv_dim = c.kv_dim();
  RopeKvWriteE4m3Params<T> rk;
  rk.qkv = qkv;
  rk.n_rows = n;
  rk.row_stride = q_dim + 2 * kv_dim;
  rk.q_offset = 0;
  rk.n_heads = c.num_heads();
  rk.k_offset = q_dim;
  rk.v_offset = q_dim + kv_dim;
  rk.n_kv_heads = c.num_kv_heads();
  rk.head_dim = c.head_dim();
  rk.positions = meta<int32_t>(meta_.positions);
  rk.inv_freq = inv_freq_.as<float>();
  rk.cells = meta<int32_t>(meta_.cells);
  rk.k_codes = kv_codes(2 * l);
  rk.v_codes = kv_codes(2 * l + 1);
  rk.k_scales = kv_scales(2 * l);
  rk.v_scales = kv_scales(2 * l + 1);
  rk.table = l == 0 ? table_.as<int32_t>() : nullptr;  // one table store per step
  rk.table_stride = dims_.max_session_tokens;
  rk.row_seq = meta<int32_t>(meta_.row_seq);
  CELLM_CUDA_RETURN_IF_ERROR(launch_rope_kv_write_e4m3<T>(rk, s), "rope and the e4m3 K/V write");
  AttentionE4m3Params<T> ap;
  ap.q = qkv;
  ap.q_row_stride = rk.row_stride;
  ap.out = attn;
  ap.n_rows = n;
  ap.n_heads = c.num_heads();
  ap.n_kv_heads = c.num_kv_heads();
  ap.head_dim = c.head_dim();
  ap.k_codes = rk.k_codes;
  ap.v_codes = rk.v_codes;
  ap.k_scales = rk.k_scales;
  ap.v_scales = rk.v_scales;
  ap.table = table_.as<int32_t>();
  ap.table_stride = dims_.max_session_tokens;
  ap.row_seq = rk.row_seq;
  ap.positions = rk.positions;
  ap.window = static_cast<int32_t>(c.window(l));
  CELLM_CUDA_RETURN_IF_ERROR(launch_attention_decode_e4m3<T>(ap, s), "attention over e4m3 K/V");
  return Status::Ok();
}

template <typename T>
Result<bool> CudaForward<T>::add_rmsnorm_for(const DeviceFp8& next8, float* residual,
                                             const T* delta, const T* weight, int32_t m, int64_t d,
                                             T* out, ResidualWriter writer) {
  cudaStream_t s = stream_.get();
  const auto eps = static_cast<float>(config_.rms_norm_eps());
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    auto* x8 = buf<uint8_t>(buf_.x8);
    auto* x8_scale = buf<float>(buf_.x8_scale);
    if (next8 && tuning().norm_quantizes_e4m3 && !gemv_fp8_supports(m, d, out, next8.codes) &&
        add_rmsnorm_e4m3_supports(d, residual, delta, weight, out, x8, x8_scale)) {
      CELLM_CUDA_RETURN_IF_ERROR(
          launch_add_rmsnorm_e4m3(residual, delta, weight, m, d, eps, out, x8, x8_scale, s, writer),
          "rmsnorm into e4m3 rows");
      return true;
    }
  }
  CELLM_CUDA_RETURN_IF_ERROR(
      launch_add_rmsnorm<T>(residual, delta, weight, m, d, eps, out, s, writer), "rmsnorm");
  return false;
}

template <typename T>
template <typename TOut>
Status CudaForward<T>::linear(const T* x, int32_t m, int64_t k, GemvInput input, const T* w,
                              const DeviceFp8& w8, int64_t n, const T* bias, TOut* y,
                              bool quantized) {
  cudaStream_t s = stream_.get();
  if (!w8) {
    CELLM_CHECK_MSG(input == GemvInput::kPlain, "a T weight's product takes plain rows");
    return gemm_->run<T, TOut>(x, m, k, w, n, bias, y, s);
  }
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (gemv_fp8_supports(m, k, x, w8.codes)) {
      CELLM_CUDA_RETURN_IF_ERROR(
          launch_gemv_fp8<TOut>(x, m, k, input, w8.codes, w8.scales, n, bias, y, s),
          "the FP8 GEMV");
      return Status::Ok();
    }
    auto* x8 = buf<uint8_t>(buf_.x8);
    auto* x_scale = buf<float>(buf_.x8_scale);
    if (!quantized) {
      CELLM_CUDA_RETURN_IF_ERROR(launch_quantize_rows_e4m3(x, m, k, input, x8, x_scale, s),
                                 "quantizing a product's rows to e4m3");
    }
    return fp8_gemm_->run<TOut>(x8, x_scale, m, k, w8.codes, w8.scales, n, bias, y, s);
  } else {
    return Internal("an e4m3 weight in an f32 model (DeviceModel<float> dequantizes them)");
  }
}

template <typename T>
Status CudaForward<T>::swiglu_down(const T* gate_up, int32_t m, const DeviceLayer<T>& w, T* act,
                                   T* y) {
  const int64_t ff = config_.intermediate_size(), d = config_.hidden_size();
  if (!w.down_proj8) {
    return gemm_->run_swiglu_down<T>(gate_up, m, ff, w.down_proj, d, act, y, stream_.get());
  }
  return linear<T>(gate_up, m, ff, GemvInput::kSwiGLU, nullptr, w.down_proj8, d, nullptr, y);
}

template <typename T>
template <typename TOut>
Result<bool> CudaForward<T>::warm_linear(const T* x, int32_t m, int64_t k, const T* w,
                                         const DeviceFp8& w8, int64_t n, const T* bias, TOut* y) {
  if (!w8) return gemm_->warm<T, TOut>(x, m, k, w, n, bias, y, stream_.get());
  if (gemv_fp8_supports(m, k, x, w8.codes)) return false;  // the GEMV needs no plan
  CELLM_RETURN_IF_ERROR(linear<TOut>(x, m, k, GemvInput::kPlain, w, w8, n, bias, y));
  return true;
}

template <typename T>
Result<bool> CudaForward<T>::warm_swiglu_down(const T* gate_up, int32_t m, const DeviceLayer<T>& w,
                                              T* act, T* y) {
  const int64_t ff = config_.intermediate_size(), d = config_.hidden_size();
  if (!w.down_proj8) {
    return gemm_->warm_swiglu_down<T>(gate_up, m, ff, w.down_proj, d, act, y, stream_.get());
  }
  if (gemv_fp8_supports(m, ff, gate_up, w.down_proj8.codes)) return false;
  CELLM_RETURN_IF_ERROR(swiglu_down(gate_up, m, w, act, y));
  return true;
}

template <typename T>
Status CudaForward<T>::prefetch_gate_up(const DeviceLayer<T>& w) {
  cudaStream_t s = stream_.get();
  // The rows are the e4m3 codes where the layer holds them, else T elements.
  const void* rows = w.gate_up8 ? static_cast<const void*>(w.gate_up8.codes) : w.gate_up;
  const size_t row_bytes =
      static_cast<size_t>(config_.hidden_size()) * (w.gate_up8 ? 1 : sizeof(T));
  if (row_bytes % 16 != 0) return Status::Ok();
  const size_t lead = std::max<size_t>(16, row_bytes / 16 / 16 * 16);
  CELLM_CUDA_RETURN_IF_ERROR(cudaEventRecord(fork_.get(), s), "forking the L2 prefetch");
  CELLM_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(side_.get(), fork_.get()),
                             "forking the L2 prefetch");
  CELLM_CUDA_RETURN_IF_ERROR(launch_l2_prefetch_rows(rows, 2 * config_.intermediate_size(),
                                                     row_bytes, lead, kPrefetchBlocks, side_.get()),
                             "the L2 prefetch");
  forked_ = true;
  return Status::Ok();
}

template <typename T>
Status CudaForward<T>::join_prefetch() {
  if (!forked_) return Status::Ok();
  forked_ = false;
  CELLM_CUDA_RETURN_IF_ERROR(cudaEventRecord(join_.get(), side_.get()), "joining the L2 prefetch");
  CELLM_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_.get(), join_.get()),
                             "joining the L2 prefetch");
  return Status::Ok();
}

// The members defined here, in both element types.
#define CELLM_FORWARD_MEMBERS(T)                                                                   \
  template Status CudaForward<T>::enqueue_step(int32_t, int32_t, int32_t, int,                     \
                                               std::span<const AttentionRowRange>, bool);          \
  template Status CudaForward<T>::enqueue_sampling(int32_t, int);                                  \
  template Status CudaForward<T>::enqueue_adjusted_sampling(                                       \
      int32_t, int, std::span<const int32_t>, const AdjustmentSource&);                            \
  template Status CudaForward<T>::enqueue_forward(int32_t, int32_t, int32_t,                       \
                                                  std::span<const AttentionRowRange>);             \
  template Status CudaForward<T>::prefetch_gate_up(const DeviceLayer<T>&);                         \
  template Status CudaForward<T>::join_prefetch();                                                 \
  template Status CudaForward<T>::swiglu_down(const T*, int32_t, const DeviceLayer<T>&, T*, T*);   \
  template Result<bool> CudaForward<T>::warm_swiglu_down(const T*, int32_t, const DeviceLayer<T>&, \
                                                         T*, T*);                                  \
  template Result<bool> CudaForward<T>::warm_linear<float>(                                        \
      const T*, int32_t, int64_t, const T*, const DeviceFp8&, int64_t, const T*, float*);
CELLM_FORWARD_MEMBERS(float)
CELLM_FORWARD_MEMBERS(__nv_bfloat16)
#undef CELLM_FORWARD_MEMBERS
// The products into T rows (into f32 in the f32 forward: instantiated above).
template Result<bool> CudaForward<__nv_bfloat16>::warm_linear<__nv_bfloat16>(
    const __nv_bfloat16*, int32_t, int64_t, const __nv_bfloat16*, const DeviceFp8&, int64_t,
    const __nv_bfloat16*, __nv_bfloat16*);

}  // namespace cellm::cuda
