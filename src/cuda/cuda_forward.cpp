// CudaForward<T>'s setup and step API (cuda/cuda_forward_impl.h), and the engine's
// factory.
#include "cuda/cuda_forward.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/cuda_forward_impl.h"
#include "model/rope.h"

namespace cellm::cuda {

template <typename T>
Status CudaForward<T>::init(const ModelWeights& weights) {
  CELLM_ASSIGN_OR_RETURN(model_, DeviceModel<T>::upload(weights));
  // With tune_gemm, each decode bucket's products take the fastest of cuBLASLt's
  // candidates and the two GEMVs, timed while the bucket warms (run_decode_graph);
  // other shapes take the tuned choice of the same key if there is one, else
  // cuBLASLt's heuristic.
  CELLM_ASSIGN_OR_RETURN(
      gemm_, Gemm::create(size_t{32} << 20,
                          options_.tune_gemm ? GemmPath::kTuned : GemmPath::kCublasLtOnly));
  if (model_->has_fp8()) {
    CELLM_ASSIGN_OR_RETURN(
        fp8_gemm_, Fp8Gemm::create(size_t{32} << 20, Fp8Scaling::kAuto, options_.tune_gemm));
  }
  CELLM_ASSIGN_OR_RETURN(stream_, Stream::create());
  CELLM_ASSIGN_OR_RETURN(side_, Stream::create());
  CELLM_ASSIGN_OR_RETURN(fork_, Event::create());
  CELLM_ASSIGN_OR_RETURN(join_, Event::create());
  // Two staging slots (StepHost): a queued step reads one while the host fills the other.
  slot_bytes_ = align_up(meta_.bytes + static_cast<size_t>(dims_.max_rows) * sizeof(int32_t));
  CELLM_ASSIGN_OR_RETURN(meta_host_, PinnedBuffer::allocate(kSlots * slot_bytes_));
  for (Event& done : done_) {
    CELLM_ASSIGN_OR_RETURN(done, Event::create());
  }
  CELLM_ASSIGN_OR_RETURN(meta_dev_, DeviceBuffer::allocate(meta_.bytes));
  CELLM_ASSIGN_OR_RETURN(buffers_, DeviceBuffer::allocate(buf_.bytes));
  // Attention's split counters start at zero (every launch leaves them so); on
  // stream_, ordered before every step.
  CELLM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(buffers_.as<unsigned char>() + buf_.attn_ws, 0,
                                             buf_.attn_ws_bytes, stream_.get()),
                             "clearing the attention workspace");
  CELLM_ASSIGN_OR_RETURN(kv_, DeviceBuffer::allocate(kv_pool_bytes<T>(config_, dims_)));
  CELLM_ASSIGN_OR_RETURN(table_, DeviceBuffer::allocate(table_bytes(dims_)));
  const std::vector<float> inv_freq = rope_inv_freq_for(config_);
  CELLM_ASSIGN_OR_RETURN(inv_freq_, DeviceBuffer::allocate(inv_freq.size() * sizeof(float)));
  CELLM_CUDA_RETURN_IF_ERROR(cudaMemcpy(inv_freq_.get(), inv_freq.data(),
                                        inv_freq.size() * sizeof(float), cudaMemcpyHostToDevice),
                             "copying inv_freq");
  // Zeroed cell table and KV: a padded slot's reads stay finite.
  CELLM_CUDA_RETURN_IF_ERROR(cudaMemset(table_.get(), 0, table_.bytes()), "clearing the table");
  CELLM_CUDA_RETURN_IF_ERROR(cudaMemset(kv_.get(), 0, kv_.bytes()), "clearing the KV pool");
  CELLM_CUDA_RETURN_IF_ERROR(cudaMemset(meta_host_.get(), 0, meta_host_.bytes()),
                             "clearing the step staging");

  for (int slot = 0; slot < kSlots; ++slot) {
    unsigned char* h = staging(slot);
    StepHost& host = hosts_[slot];
    host.tokens = reinterpret_cast<int32_t*>(h + meta_.tokens);
    host.positions = reinterpret_cast<int32_t*>(h + meta_.positions);
    host.row_seq = reinterpret_cast<int32_t*>(h + meta_.row_seq);
    host.cells = reinterpret_cast<int32_t*>(h + meta_.cells);
    host.selected = reinterpret_cast<int32_t*>(h + meta_.selected);
    host.sampling = reinterpret_cast<SamplingRow*>(h + meta_.sampling);
    host.out_tokens = reinterpret_cast<int32_t*>(h + meta_.bytes);
  }
  return Status::Ok();
}

template <typename T>
Status CudaForward<T>::run_eager(int32_t n, int32_t n_sel, std::span<const int32_t> logit_rows,
                                 const AdjustmentSource* adjust) {
  CELLM_CHECK(n > 0 && n <= dims_.max_rows && n_sel >= 0 && n_sel <= n);
  CELLM_RETURN_IF_ERROR(reserve_host_logits(logit_rows, n_sel));
  CELLM_RETURN_IF_ERROR(mark(timing_start_));
  // A sequence's rows of an eager step are its newest consecutive positions. Its
  // prefill chunks' rows go to the prefill attention, the others to the split one.
  std::vector<AttentionRowRange> ranges;
  if (tuning().prefill_attention) {
    ranges = attention_row_ranges(std::span<const int32_t>(host().row_seq, static_cast<size_t>(n)));
  }
  if (adjust != nullptr) {
    CELLM_RETURN_IF_ERROR(enqueue_step(n, n_sel, n, slot_, ranges, false));
    CELLM_RETURN_IF_ERROR(enqueue_adjusted_sampling(n_sel, slot_, logit_rows, *adjust));
  } else {
    CELLM_RETURN_IF_ERROR(enqueue_step(n, n_sel, n, slot_, ranges));
    CELLM_RETURN_IF_ERROR(enqueue_logits_copy(logit_rows));
  }
  CELLM_RETURN_IF_ERROR(mark(timing_end_));
  return finish_run();
}

template <typename T>
Status CudaForward<T>::run_decode_graph(int32_t bucket, std::span<const int32_t> logit_rows,
                                        const AdjustmentSource* adjust) {
  CELLM_CHECK(bucket > 0 && bucket <= dims_.max_rows);
  // The graphs feed the final norm of every row to the LM head (enqueue_forward).
  if (!selects_every_row(bucket, bucket)) {
    return InvalidArgument(
        "a decode graph step selects every row in order (host().selected[r] == r)");
  }
  auto it = graphs_.find(bucket);
  if (it == graphs_.end()) {
    if (!warmed_.count(bucket)) {
      warmed_.insert(bucket);
      // The warm-up builds the bucket's GEMM plans; the decode shapes, and only they,
      // are tuned (timed) as they are built.
      gemm_->set_tuning(true);
      if (fp8_gemm_) fp8_gemm_->set_tuning(true);
      const Status warmed = run_eager(bucket, bucket, logit_rows, adjust);
      gemm_->set_tuning(false);
      if (fp8_gemm_) fp8_gemm_->set_tuning(false);
      return warmed;
    }
    CELLM_RETURN_IF_ERROR(capture(bucket));
    it = graphs_.find(bucket);
  }
  if (adjust != nullptr) {
    // Captured before any stream work of this run (a capture must not see it).
    CELLM_ASSIGN_OR_RETURN(cudaGraphExec_t logits, logits_graph(bucket, slot_));
    CELLM_RETURN_IF_ERROR(reserve_host_logits(logit_rows, bucket));
    CELLM_RETURN_IF_ERROR(mark(timing_start_));
    CELLM_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(logits, stream_.get()),
                               "replaying the decode graph");
    ++replays_;
    CELLM_RETURN_IF_ERROR(enqueue_adjusted_sampling(bucket, slot_, logit_rows, *adjust));
    CELLM_RETURN_IF_ERROR(mark(timing_end_));
    return finish_run();
  }
  CELLM_RETURN_IF_ERROR(reserve_host_logits(logit_rows, bucket));
  CELLM_RETURN_IF_ERROR(mark(timing_start_));
  CELLM_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(it->second[slot_].get(), stream_.get()),
                             "replaying the decode graph");
  ++replays_;
  CELLM_RETURN_IF_ERROR(enqueue_logits_copy(logit_rows));
  CELLM_RETURN_IF_ERROR(mark(timing_end_));
  return finish_run();
}

template <typename T>
Status CudaForward<T>::queue_decode_graph(int32_t bucket) {
  CELLM_CHECK_MSG(
      queued_.size() < kSlots && std::find(queued_.begin(), queued_.end(), slot_) == queued_.end(),
      "queue_decode_graph with both staging slots in flight");
  auto it = graphs_.find(bucket);
  if (it == graphs_.end()) {
    return InvalidArgument("queue_decode_graph: bucket " + std::to_string(bucket) +
                           " has no captured decode graph");
  }
  if (!selects_every_row(bucket, bucket)) {
    return InvalidArgument(
        "a decode graph step selects every row in order (host().selected[r] == r)");
  }
  const int slot = slot_;
  cudaStream_t s = stream_.get();
  if (timing_) {
    CELLM_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot_start_[slot].get(), s), "timing a step");
  }
  CELLM_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(it->second[slot].get(), s),
                             "replaying the decode graph");
  ++replays_;
  if (timing_) {
    CELLM_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot_end_[slot].get(), s), "timing a step");
  }
  CELLM_CUDA_RETURN_IF_ERROR(cudaEventRecord(done_[slot].get(), s), "queueing a step");
  queued_.push_back(slot);
  slot_ = (slot + 1) % kSlots;
  n_host_logit_rows_ = 0;
  return Status::Ok();
}

template <typename T>
Result<std::span<const int32_t>> CudaForward<T>::wait_queued() {
  CELLM_CHECK_MSG(!queued_.empty(), "wait_queued with no step queued");
  const int slot = queued_.front();
  queued_.pop_front();
  CELLM_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(done_[slot].get()), "running a step");
  if (timing_) {
    float ms = 0;
    CELLM_CUDA_RETURN_IF_ERROR(
        cudaEventElapsedTime(&ms, slot_start_[slot].get(), slot_end_[slot].get()),
        "reading a step's device time");
    last_device_ms_ = ms;
  }
  return std::span<const int32_t>(hosts_[slot].out_tokens, static_cast<size_t>(dims_.max_rows));
}

template <typename T>
std::span<const float> CudaForward<T>::host_logits(size_t k) const {
  // REQUIRES: k indexes the last run's logit rows.
  CELLM_CHECK_MSG(k < n_host_logit_rows_, "host_logits(" + std::to_string(k) + ") after a run of " +
                                              std::to_string(n_host_logit_rows_) + " logit rows");
  const auto vocab = static_cast<size_t>(config_.vocab_size());
  return {static_cast<float*>(logits_host_.get()) + k * vocab, vocab};
}

template <typename T>
Result<int64_t> CudaForward<T>::warm_products() {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size(), ff = c.intermediate_size(), q_dim = c.q_dim();
  const int64_t qkv_dim = q_dim + 2 * c.kv_dim();
  // Every layer's weights have the alignment of the first's (DeviceModel pads each
  // piece), so its calls have the same keys; the last layer is warmed too where it holds
  // its weights otherwise (FP8 models keep the last layer as stored).
  std::vector<const DeviceLayer<T>*> kinds = {&model_->layers().front()};
  if (static_cast<bool>(model_->layers().back().qkv8) != static_cast<bool>(kinds[0]->qkv8)) {
    kinds.push_back(&model_->layers().back());
  }
  T* h = buf<T>(buf_.h);
  T* gate_up = buf<T>(buf_.gate_up);
  T* delta = buf<T>(buf_.delta);
  int64_t ran = 0;
  const auto count = [&](Result<bool> warmed) -> Status {
    if (!warmed.ok()) return warmed.status();
    ran += *warmed ? 1 : 0;
    return Status::Ok();
  };
  // The calls of enqueue_forward, at every width.
  for (int32_t m = 1; m <= dims_.max_rows; ++m) {
    for (const DeviceLayer<T>* w : kinds) {
      CELLM_RETURN_IF_ERROR(
          count(warm_linear<T>(h, m, d, w->qkv, w->qkv8, qkv_dim, w->qkv_bias, buf<T>(buf_.qkv))));
      CELLM_RETURN_IF_ERROR(count(
          warm_linear<T>(buf<T>(buf_.attn), m, q_dim, w->o_proj, w->o_proj8, d, w->o_bias, delta)));
      CELLM_RETURN_IF_ERROR(
          count(warm_linear<T>(h, m, d, w->gate_up, w->gate_up8, 2 * ff, nullptr, gate_up)));
      CELLM_RETURN_IF_ERROR(count(warm_swiglu_down(gate_up, m, *w, buf<T>(buf_.act), delta)));
    }
    for (T* head_in : {h, buf<T>(buf_.sel_norm)}) {
      CELLM_RETURN_IF_ERROR(
          count(warm_linear<float>(head_in, m, d, model_->lm_head(), model_->lm_head8(),
                                   c.vocab_size(), nullptr, buf<float>(buf_.logits))));
    }
  }
  CELLM_RETURN_IF_ERROR(sync());
  return ran;
}

template <typename T>
Status CudaForward<T>::copy_table_prefix(int32_t dst, int32_t src, int32_t upto) {
  if (upto <= 0) return Status::Ok();
  int32_t* t = table_.as<int32_t>();
  const size_t stride = static_cast<size_t>(dims_.max_session_tokens);
  CELLM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(t + static_cast<size_t>(dst) * stride, t + static_cast<size_t>(src) * stride,
                      static_cast<size_t>(upto) * sizeof(int32_t), cudaMemcpyDeviceToDevice,
                      stream_.get()),
      "copying a cell-table prefix");
  return sync();
}

template <typename T>
Status CudaForward<T>::write_table_row(int32_t seq, std::span<const int32_t> cells) {
  if (cells.empty()) return Status::Ok();
  const size_t width = static_cast<size_t>(dims_.max_session_tokens);
  CELLM_CHECK_MSG(cells.size() <= width, "a cell-table row of " + std::to_string(cells.size()) +
                                             " cells is wider than the table");
  if (row_host_.get() == nullptr) {
    CELLM_ASSIGN_OR_RETURN(row_host_, PinnedBuffer::allocate(width * sizeof(int32_t)));
  }
  // The staging is free: every earlier write ended in sync().
  auto* staged = static_cast<int32_t*>(row_host_.get());
  std::copy(cells.begin(), cells.end(), staged);
  int32_t* t = table_.as<int32_t>();
  CELLM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(t + static_cast<size_t>(seq) * width, staged, cells.size() * sizeof(int32_t),
                      cudaMemcpyHostToDevice, stream_.get()),
      "writing a cell-table row");
  return sync();
}

template <typename T>
Status CudaForward<T>::set_timing(bool on) {
  if (on && timing_start_.get() == nullptr) {
    CELLM_ASSIGN_OR_RETURN(timing_start_, Event::create());
    CELLM_ASSIGN_OR_RETURN(timing_end_, Event::create());
    for (int slot = 0; slot < kSlots; ++slot) {
      CELLM_ASSIGN_OR_RETURN(slot_start_[slot], Event::create());
      CELLM_ASSIGN_OR_RETURN(slot_end_[slot], Event::create());
    }
  }
  timing_ = on;
  last_device_ms_ = 0;
  return Status::Ok();
}

template <typename T>
Status CudaForward<T>::reserve_host_logits(std::span<const int32_t> logit_rows, int32_t n_sel) {
  for (int32_t row : logit_rows) {
    CELLM_CHECK_MSG(
        row >= 0 && row < n_sel,
        "logit row " + std::to_string(row) + " outside a selection of " + std::to_string(n_sel));
  }
  n_host_logit_rows_ = 0;
  const size_t bytes =
      logit_rows.size() * static_cast<size_t>(config_.vocab_size()) * sizeof(float);
  if (bytes > logits_host_.bytes()) {
    const size_t grown = std::max(bytes, 2 * logits_host_.bytes());
    logits_host_.reset();
    CELLM_ASSIGN_OR_RETURN(logits_host_, PinnedBuffer::allocate(grown));
  }
  return Status::Ok();
}

template <typename T>
Status CudaForward<T>::enqueue_logits_copy(std::span<const int32_t> logit_rows) {
  const auto vocab = static_cast<size_t>(config_.vocab_size());
  for (size_t k = 0; k < logit_rows.size(); ++k) {
    CELLM_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(static_cast<float*>(logits_host_.get()) + k * vocab,
                        buf<float>(buf_.logits) + static_cast<size_t>(logit_rows[k]) * vocab,
                        vocab * sizeof(float), cudaMemcpyDeviceToHost, stream_.get()),
        "copying a row of logits");
  }
  n_host_logit_rows_ = logit_rows.size();
  return Status::Ok();
}

template <typename T>
Status CudaForward<T>::mark(const Event& event) {
  if (!timing_) return Status::Ok();
  CELLM_CUDA_RETURN_IF_ERROR(cudaEventRecord(event.get(), stream_.get()), "timing a step");
  return Status::Ok();
}

template <typename T>
Status CudaForward<T>::sync() {
  CELLM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()), "running a step");
  return Status::Ok();
}

template <typename T>
Status CudaForward<T>::finish_run() {
  CELLM_RETURN_IF_ERROR(sync());
  if (timing_) {
    float ms = 0;
    CELLM_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, timing_start_.get(), timing_end_.get()),
                               "reading a step's device time");
    last_device_ms_ = ms;
  }
  return Status::Ok();
}

// The members defined here, in both element types.
#define CELLM_FORWARD_MEMBERS(T)                                                          \
  template Status CudaForward<T>::init(const ModelWeights&);                              \
  template Status CudaForward<T>::run_eager(int32_t, int32_t, std::span<const int32_t>,   \
                                            const AdjustmentSource*);                     \
  template Status CudaForward<T>::run_decode_graph(int32_t, std::span<const int32_t>,     \
                                                   const AdjustmentSource*);              \
  template Status CudaForward<T>::queue_decode_graph(int32_t);                            \
  template Result<std::span<const int32_t>> CudaForward<T>::wait_queued();                \
  template std::span<const float> CudaForward<T>::host_logits(size_t) const;              \
  template Result<int64_t> CudaForward<T>::warm_products();                               \
  template Status CudaForward<T>::copy_table_prefix(int32_t, int32_t, int32_t);           \
  template Status CudaForward<T>::write_table_row(int32_t, std::span<const int32_t>);     \
  template Status CudaForward<T>::set_timing(bool);                                       \
  template Status CudaForward<T>::reserve_host_logits(std::span<const int32_t>, int32_t); \
  template Status CudaForward<T>::enqueue_logits_copy(std::span<const int32_t>);          \
  template Status CudaForward<T>::mark(const Event&);                                     \
  template Status CudaForward<T>::sync();                                                 \
  template Status CudaForward<T>::finish_run();
CELLM_FORWARD_MEMBERS(float)
CELLM_FORWARD_MEMBERS(__nv_bfloat16)
#undef CELLM_FORWARD_MEMBERS

namespace {

template <typename T>
Result<std::unique_ptr<ForwardEngine>> make(const ModelWeights& weights, const ForwardDims& dims,
                                            const CudaExecutorOptions& options) {
  auto engine = std::make_unique<CudaForward<T>>(weights, dims, options);
  CELLM_RETURN_IF_ERROR(engine->init(weights));
  return std::unique_ptr<ForwardEngine>(std::move(engine));
}

}  // namespace

Result<std::unique_ptr<ForwardEngine>> ForwardEngine::create(const ModelWeights& weights,
                                                             const ForwardDims& dims,
                                                             const CudaExecutorOptions& options) {
  if (options.precision == CudaPrecision::kF32) return make<float>(weights, dims, options);
  return make<__nv_bfloat16>(weights, dims, options);
}

namespace {

template <typename T>
ForwardEngine::DeviceBytes device_bytes_of(const ModelWeights& weights, const ForwardDims& dims) {
  const ModelConfig& config = weights.config();
  ForwardEngine::DeviceBytes b;
  b.weights = DeviceModel<T>::slab_bytes(weights);
  b.buffers = BufferLayout::of<T>(config, dims, DeviceModel<T>::keeps_fp8(weights)).bytes;
  b.table = table_bytes(dims);
  b.kv_per_cell = static_cast<size_t>(kv_bytes_per_cell<T>(config, dims.kv_e4m3));
  b.kv = kv_pool_bytes<T>(config, dims);
  return b;
}

}  // namespace

ForwardEngine::DeviceBytes ForwardEngine::device_bytes(const ModelWeights& weights,
                                                       const ForwardDims& dims,
                                                       CudaPrecision precision) {
  if (precision == CudaPrecision::kF32) return device_bytes_of<float>(weights, dims);
  return device_bytes_of<__nv_bfloat16>(weights, dims);
}

}  // namespace cellm::cuda
