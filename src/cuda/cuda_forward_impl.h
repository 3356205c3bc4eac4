// CudaForward<T>: the ForwardEngine (cuda/cuda_forward.h) in one element type, float or
// __nv_bfloat16, declared for the three files that define it:
//   cuda_forward.cpp   setup, the step API (eager runs, graph replays, the queued steps),
//                      host staging and logits, device-time marks
//   forward_pass.cpp   one step's stream work: metadata in, the layers, sampling, tokens out
//   decode_graphs.cpp  capturing each decode bucket's graph and timing its candidates
// Each file instantiates its members for both types. Internal to cellm_cuda.
//
// Thread-safety: none; one step at a time (the executor's engine thread).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "cellm/cuda_executor.h"
#include "cellm/model_config.h"
#include "cellm/model_weights.h"
#include "cellm/status.h"
#include "cuda/cuda_forward.h"
#include "cuda/device_memory.h"
#include "cuda/device_model.h"
#include "cuda/fp8_gemm.h"
#include "cuda/gemm.h"
#include "cuda/kernels/attention.h"
#include "cuda/kernels/gemv.h"
#include "cuda/kernels/rmsnorm.h"
#include "cuda/kernels/sampling.h"
#include "cuda/logit_adjuster.h"

namespace cellm::cuda {

inline constexpr size_t kAlign = 256;
inline size_t align_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

// Where each piece of the step metadata sits, identically in the pinned host
// block and the device block (one copy moves it all).
struct MetaLayout {
  size_t tokens = 0, positions = 0, row_seq = 0, cells = 0, selected = 0, sampling = 0;
  size_t bytes = 0;
  explicit MetaLayout(size_t rows) {
    const size_t ints = align_up(rows * sizeof(int32_t));
    tokens = 0;
    positions = tokens + ints;
    row_seq = positions + ints;
    cells = row_seq + ints;
    selected = cells + ints;
    sampling = selected + ints;
    bytes = sampling + align_up(rows * sizeof(SamplingRow));
  }
};

// Bytes of every activation buffer for `rows` rows, in the order they are carved.
struct BufferLayout {
  size_t residual, h, qkv, attn, delta, gate_up, act, sel, sel_norm, logits, out_tokens;
  size_t attn_ws, attn_ws_bytes, sample_ws;
  // With FP8 weights: a product's input rows quantized to e4m3 ([rows, widest k] bytes)
  // and their scales ([rows] f32), for Fp8Gemm; 0 bytes without.
  size_t x8, x8_scale;
  size_t bytes;
  template <typename T>
  static BufferLayout of(const ModelConfig& c, const ForwardDims& dims, bool fp8) {
    BufferLayout b{};
    const auto rows = static_cast<size_t>(dims.max_rows);
    const auto d = static_cast<size_t>(c.hidden_size());
    const auto ff = static_cast<size_t>(c.intermediate_size());
    const auto qkv_dim = static_cast<size_t>(c.q_dim() + 2 * c.kv_dim());
    size_t at = 0;
    auto carve = [&](size_t bytes) {
      const size_t here = at;
      at += align_up(bytes);
      return here;
    };
    b.residual = carve(rows * d * sizeof(float));
    b.h = carve(rows * d * sizeof(T));
    b.qkv = carve(rows * qkv_dim * sizeof(T));
    b.attn = carve(rows * static_cast<size_t>(c.q_dim()) * sizeof(T));
    b.delta = carve(rows * d * sizeof(T));
    b.gate_up = carve(rows * 2 * ff * sizeof(T));
    b.act = carve(rows * ff * sizeof(T));
    b.sel = carve(rows * d * sizeof(float));
    b.sel_norm = carve(rows * d * sizeof(T));
    b.logits = carve(rows * static_cast<size_t>(c.vocab_size()) * sizeof(float));
    b.out_tokens = carve(rows * sizeof(int32_t));
    b.attn_ws_bytes = attention_workspace_bytes(dims.max_rows, c.num_heads(), c.num_kv_heads(),
                                                c.head_dim(), dims.max_session_tokens);
    b.attn_ws = carve(b.attn_ws_bytes);
    b.sample_ws = carve(sample_workspace_bytes(dims.max_rows, c.vocab_size()));
    const size_t widest_k = std::max({d, ff, static_cast<size_t>(c.q_dim())});
    b.x8 = carve(fp8 ? rows * widest_k : 0);
    b.x8_scale = carve(fp8 ? rows * sizeof(float) : 0);
    b.bytes = at;
    return b;
  }
};

// Bytes of one layer's K (or V) in the pool: [max_cells, kv_dim] of T, or with e4m3 K/V
// the codes [max_cells, kv_dim] then the scales [max_cells, n_kv_heads] f32, each
// 256-byte aligned.
template <typename T>
size_t kv_part_bytes(const ModelConfig& c, const ForwardDims& dims) {
  const auto cells = static_cast<size_t>(dims.max_cells);
  if (!dims.kv_e4m3) return cells * static_cast<size_t>(c.kv_dim()) * sizeof(T);
  return align_up(cells * static_cast<size_t>(c.kv_dim())) +
         align_up(cells * static_cast<size_t>(c.num_kv_heads()) * sizeof(float));
}

// One cell's K and V over every layer, without the pool's alignment padding.
template <typename T>
int64_t kv_bytes_per_cell(const ModelConfig& c, bool e4m3) {
  const int64_t per_head_row =
      e4m3 ? c.head_dim() + int64_t{sizeof(float)} : c.head_dim() * int64_t{sizeof(T)};
  return 2 * c.num_layers() * c.num_kv_heads() * per_head_row;
}

template <typename T>
size_t kv_pool_bytes(const ModelConfig& c, const ForwardDims& dims) {
  return 2 * static_cast<size_t>(c.num_layers()) * kv_part_bytes<T>(c, dims);
}

inline size_t table_bytes(const ForwardDims& dims) {
  return static_cast<size_t>(dims.max_seqs + 1) * static_cast<size_t>(dims.max_session_tokens) *
         sizeof(int32_t);
}

template <typename T>
class CudaForward final : public ForwardEngine {
 public:
  CudaForward(const ModelWeights& weights, const ForwardDims& dims,
              const CudaExecutorOptions& options)
      : config_(weights.config()),
        dims_(dims),
        options_(options),
        meta_(static_cast<size_t>(dims.max_rows)),
        buf_(BufferLayout::of<T>(weights.config(), dims, DeviceModel<T>::keeps_fp8(weights))),
        adjuster_(weights.config().vocab_size()) {}

  Status init(const ModelWeights& weights);

  // Queued steps read the staging and the buffers they name until they end.
  ~CudaForward() override {
    if (stream_.get() != nullptr) cudaStreamSynchronize(stream_.get());
  }

  StepHost& host() override { return hosts_[slot_]; }
  const ForwardDims& dims() const override { return dims_; }

  Status run_eager(int32_t n, int32_t n_sel, std::span<const int32_t> logit_rows,
                   const AdjustmentSource* adjust) override;
  Status run_decode_graph(int32_t bucket, std::span<const int32_t> logit_rows,
                          const AdjustmentSource* adjust) override;
  bool has_decode_graph(int32_t bucket) const override { return graphs_.count(bucket) > 0; }

  Status queue_decode_graph(int32_t bucket) override;
  Result<std::span<const int32_t>> wait_queued() override;
  std::span<const float> host_logits(size_t k) const override;
  Result<int64_t> warm_products() override;
  Status copy_table_prefix(int32_t dst, int32_t src, int32_t upto) override;
  Status write_table_row(int32_t seq, std::span<const int32_t> cells) override;
  Status set_timing(bool on) override;
  double last_device_ms() const override { return last_device_ms_; }

  int64_t kv_bytes_per_cell() const override {
    return cuda::kv_bytes_per_cell<T>(config_, dims_.kv_e4m3);
  }
  int64_t kv_allocated_bytes() const override { return static_cast<int64_t>(kv_.bytes()); }
  int64_t graph_captures() const override { return static_cast<int64_t>(graphs_.size()); }
  const std::vector<std::string>& graph_notes() const override { return graph_notes_; }
  int64_t graph_replays() const override { return replays_; }
  int64_t logits_graph_captures() const override { return logits_graph_captures_; }
  int64_t adjusted_rows() const override { return adjusted_rows_; }

 private:
  const CudaTuning& tuning() const { return options_.tuning; }
  // Staging slot `slot` in the pinned block: the step metadata, then the sampled tokens.
  unsigned char* staging(int slot) const {
    return static_cast<unsigned char*>(meta_host_.get()) + static_cast<size_t>(slot) * slot_bytes_;
  }
  template <typename U>
  U* buf(size_t offset) const {
    return reinterpret_cast<U*>(buffers_.as<unsigned char>() + offset);
  }
  template <typename U>
  U* meta(size_t offset) const {
    return reinterpret_cast<U*>(meta_dev_.as<unsigned char>() + offset);
  }
  // Layer l's K (part 2l) and V (part 2l + 1) in the pool (kv_part_bytes).
  unsigned char* kv_part(int64_t part) const {
    return kv_.as<unsigned char>() + static_cast<size_t>(part) * kv_part_bytes<T>(config_, dims_);
  }
  T* k_pool(int64_t l) const { return reinterpret_cast<T*>(kv_part(2 * l)); }
  T* v_pool(int64_t l) const { return reinterpret_cast<T*>(kv_part(2 * l + 1)); }
  // With e4m3 K/V: a part's codes, then its scales.
  uint8_t* kv_codes(int64_t part) const { return kv_part(part); }
  float* kv_scales(int64_t part) const {
    return reinterpret_cast<float*>(
        kv_part(part) +
        align_up(static_cast<size_t>(dims_.max_cells) * static_cast<size_t>(config_.kv_dim())));
  }

  // Checks the logit rows against the selection and grows the pinned logits
  // copy to hold them (at least doubling; never shrinks). Called before any
  // stream work of a run, never inside a capture.
  Status reserve_host_logits(std::span<const int32_t> logit_rows, int32_t n_sel);

  // One D2H copy per logit row, from the device logits [n_sel, vocab] into the
  // pinned copy [logit_rows.size(), vocab]; enqueued after the step.
  Status enqueue_logits_copy(std::span<const int32_t> logit_rows);

  // Records `event` on the stream when timing is on.
  Status mark(const Event& event);
  Status sync();

  // Waits for a run and reads its device time when timing is on.
  Status finish_run();

  // The bucket's decode graph: its triggers placed as tuning().early_triggers says, its
  // edges after cuBLASLt kernels as tuning().early_after_cublas says; where either is
  // kTimed, each candidate graph is instantiated and the fastest of them kept.
  Status capture(int32_t bucket);

  // One capture of the decode step of `bucket` rows, with the L2 prefetch beside each
  // layer's attention when `prefetch`; without `sample`, the step stops at the logits (no
  // sampling, no token copy). The caller destroys the graph.
  Result<cudaGraph_t> capture_graph(int32_t bucket, bool early_triggers, int slot, bool prefetch,
                                    bool sample = true);

  // The bucket's decode graph for `slot` that stops at the logits, built the way the
  // bucket's kept graph was (ways_); captured on first use.
  Result<cudaGraphExec_t> logits_graph(int32_t bucket, int slot);

  // After a step queued without its sampling: the raw logits' copies (logit_rows), then
  // adjust()'s rows adjusted on the device, then the sampling and the token copy into
  // staging slot `slot`.
  Status enqueue_adjusted_sampling(int32_t n_sel, int slot, std::span<const int32_t> logit_rows,
                                   const AdjustmentSource& adjust);

  // The sampling of the step's n_sel selected rows and the copy of their tokens into
  // staging slot `slot`.
  Status enqueue_sampling(int32_t n_sel, int slot);

  // An executable of `graph`; with `early_edges`, of a copy whose edges after cuBLASLt
  // kernels fire at launch completion (last_rewritten_edges_ counts them).
  Result<GraphExec> instantiate(cudaGraph_t graph, bool early_edges);

  // The graph replayed as a step replays it, on an idle stream (time_replays queues its
  // replays back to back, so a launch's cost on the host is hidden there): the median of
  // kRounds of the device time from an event recorded before cudaGraphLaunch to one after
  // the replay, and of the host time the cudaGraphLaunch call takes. "idle launch 3.930
  // ms (cudaGraphLaunch 61 µs)".
  Result<std::string> idle_launch_note(const GraphExec& graph);

  // The median device time of kRounds replays of each graph, in turns after a warm-up
  // replay of each. A replay recomputes the staged step: the same K/V, logits and tokens.
  Status time_replays(const std::vector<GraphExec>& graphs, std::vector<double>* ms);

  // Everything of one step on the stream: metadata in (from staging slot `slot`),
  // forward, sampling, tokens out (into that slot). `fresh_positions`: how many of each
  // row's newest positions the step writes (AttentionParams::fresh_positions).
  // `ranges`: the attention's launches (attention_row_ranges); none: one over every row.
  // Without `sample` the step stops at the logits.
  Status enqueue_step(int32_t n, int32_t n_sel, int32_t fresh_positions, int slot,
                      std::span<const AttentionRowRange> ranges = {}, bool sample = true);
  Status enqueue_forward(int32_t n, int32_t n_sel, int32_t fresh_positions,
                         std::span<const AttentionRowRange> ranges);

  // The L2 prefetch of a layer's gate_up rows (each row's first sixteenth) on a side
  // branch of the graph being captured, forked after the q/k/v product: it runs beside
  // RoPE and the attention, whose few blocks leave the HBM idle, and the gate_up product
  // then reads those bytes from the L2. A sixteenth of each row: a larger share gains less.
  Status prefetch_gate_up(const DeviceLayer<T>& w);

  // Joins the prefetch branch back into the captured stream (a capture must end joined).
  Status join_prefetch();

  // Layer l's RoPE, K/V write and attention over an e4m3 pool (ForwardDims::kv_e4m3):
  // launch_rope_kv_write_e4m3 (the table stored on layer 0), then
  // launch_attention_decode_e4m3 over every row, reading q from the fused qkv rows.
  Status enqueue_e4m3_attention(int64_t l, int32_t n, T* qkv, T* attn);

  // y = x · wᵀ (+ bias), m rows, k in, n out, on the stream, for a product whose weight is
  // `w` (T) or `w8` (e4m3, DeviceModel): the e4m3 weight through launch_gemv_fp8 up to
  // kGemvMaxRows rows, else the rows quantized to e4m3 (buf_.x8, buf_.x8_scale) and
  // Fp8Gemm; the T weight through gemm_. `input` kSwiGLU (e4m3 weights only): x is
  // [m, 2k], gate | up, and the product's input is silu(gate) * up.
  // `quantized`: buf_.x8 and buf_.x8_scale already hold x's e4m3 rows (add_rmsnorm_for
  // wrote them), so the product skips its own quantization.
  template <typename TOut>
  Status linear(const T* x, int32_t m, int64_t k, GemvInput input, const T* w, const DeviceFp8& w8,
                int64_t n, const T* bias, TOut* y, bool quantized = false);
  // launch_add_rmsnorm into `out` (m rows of d), for the product of weight `next8` that
  // reads it next: where that product takes the e4m3 rows of Fp8Gemm, the norm writes
  // them too (launch_add_rmsnorm_e4m3 into buf_.x8, buf_.x8_scale) and the result is
  // true, for linear's `quantized`.
  Result<bool> add_rmsnorm_for(const DeviceFp8& next8, float* residual, const T* delta,
                               const T* weight, int32_t m, int64_t d, T* out,
                               ResidualWriter writer);
  // The down projection of layer `w` over gate_up [m, 2 ff]: with a T weight
  // gemm_->run_swiglu_down (which writes the activation into `act`), with an e4m3 one
  // linear(kSwiGLU).
  Status swiglu_down(const T* gate_up, int32_t m, const DeviceLayer<T>& w, T* act, T* y);
  // The warm-ups of the two (Gemm::warm): builds what a later run inside a capture needs,
  // true when it ran the product to do so.
  template <typename TOut>
  Result<bool> warm_linear(const T* x, int32_t m, int64_t k, const T* w, const DeviceFp8& w8,
                           int64_t n, const T* bias, TOut* y);
  Result<bool> warm_swiglu_down(const T* gate_up, int32_t m, const DeviceLayer<T>& w, T* act, T* y);

  // Whether the step's selection (host().selected, [0, n_sel)) is every row in order.
  bool selects_every_row(int32_t n, int32_t n_sel) const {
    if (n_sel != n) return false;
    for (int32_t r = 0; r < n; ++r) {
      if (hosts_[slot_].selected[r] != r) return false;
    }
    return true;
  }

  ModelConfig config_;
  ForwardDims dims_;
  CudaExecutorOptions options_;  // precision, tune_gemm and tuning choose the kernels
  // Buckets that may take the prefetch (the products are GEMVs up to 8 rows; at 16 the
  // 8B loses 3%), and the prefetch kernel's blocks.
  static constexpr int32_t kPrefetchMaxRows = 8;
  static constexpr int kPrefetchBlocks = 16;
  int last_rewritten_edges_ = 0;          // by the last instantiate with early edges, for the notes
  std::vector<std::string> graph_notes_;  // one per captured decode graph
  MetaLayout meta_;
  BufferLayout buf_;
  std::unique_ptr<DeviceModel<T>> model_;
  std::optional<Gemm> gemm_;         // set by init()
  std::optional<Fp8Gemm> fp8_gemm_;  // set by init() when the model holds e4m3 weights
  Stream stream_;
  Stream side_;               // the L2 prefetch branch of a graph being captured
  Event fork_, join_;         // its fork and join
  bool prefetching_ = false;  // the capture in progress takes the prefetch
  bool forked_ = false;       // a prefetch branch is not joined yet
  static constexpr int kSlots = 2;
  size_t slot_bytes_ = 0;
  PinnedBuffer meta_host_;  // kSlots x ([meta_.bytes] staging + [max_rows] sampled tokens)
  DeviceBuffer meta_dev_;   // [meta_.bytes]
  DeviceBuffer buffers_;    // activations and workspaces, carved by buf_
  DeviceBuffer kv_;         // [layers][K, V][max_cells, kv_dim] of T
  DeviceBuffer table_;      // [max_seqs + 1, max_session_tokens] int32
  DeviceBuffer inv_freq_;   // [head_dim / 2] f32
  StepHost hosts_[kSlots];
  int slot_ = 0;              // the slot host() fills
  std::deque<int> queued_;    // slots of the steps queue_decode_graph queued, oldest first
  Event done_[kSlots];        // recorded after each slot's queued step
  Event slot_start_[kSlots];  // device time of each slot's queued step, when timing
  Event slot_end_[kSlots];
  PinnedBuffer logits_host_;  // [rows asked for, vocab] f32: raw logits after a run
  PinnedBuffer row_host_;     // [max_session_tokens] int32: write_table_row's staging
  size_t n_host_logit_rows_ = 0;
  bool timing_ = false;
  Event timing_start_, timing_end_;
  double last_device_ms_ = 0;
  std::map<int32_t, std::array<GraphExec, kSlots>> graphs_;  // one per staging slot
  // How each bucket's kept graph was built, for its variant that stops at the logits.
  struct GraphWay {
    bool early_triggers = false;
    bool early_edges = false;
    bool prefetch = false;
  };
  std::map<int32_t, GraphWay> ways_;
  std::map<int32_t, std::array<GraphExec, kSlots>> logits_graphs_;  // captured on first use
  int64_t logits_graph_captures_ = 0;
  LogitAdjuster adjuster_;
  int64_t adjusted_rows_ = 0;
  std::set<int32_t> warmed_;
  int64_t replays_ = 0;
};

}  // namespace cellm::cuda
