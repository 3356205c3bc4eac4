#include "cuda/cuda_forward.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/device_memory.h"
#include "cuda/device_model.h"
#include "cuda/gemm.h"
#include "cuda/graph_edges.h"
#include "cuda/kernels/attention.h"
#include "cuda/kernels/embedding.h"
#include "cuda/kernels/l2_prefetch.h"
#include "cuda/kernels/rmsnorm.h"
#include "cuda/kernels/rope_kv_write.h"
#include "cuda/launch_control.h"
#include "model/rope.h"

namespace cellm::cuda {
namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t n) {
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
  size_t bytes;
  template <typename T>
  static BufferLayout of(const ModelConfig& c, const ForwardDims& dims) {
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
    b.bytes = at;
    return b;
  }
};

template <typename T>
size_t kv_pool_bytes(const ModelConfig& c, const ForwardDims& dims) {
  return 2 * static_cast<size_t>(c.num_layers()) * static_cast<size_t>(dims.max_cells) *
         static_cast<size_t>(c.kv_dim()) * sizeof(T);
}

size_t table_bytes(const ForwardDims& dims) {
  return static_cast<size_t>(dims.max_seqs + 1) * static_cast<size_t>(dims.max_session_tokens) *
         sizeof(int32_t);
}

template <typename T>
class CudaForward final : public ForwardEngine {
 public:
  CudaForward(const ModelConfig& config, const ForwardDims& dims,
              const CudaExecutorOptions& options)
      : config_(config),
        dims_(dims),
        options_(options),
        meta_(static_cast<size_t>(dims.max_rows)),
        buf_(BufferLayout::of<T>(config, dims)) {}

  Status init(const ModelWeights& weights) {
    CELLM_ASSIGN_OR_RETURN(model_, DeviceModel<T>::upload(weights));
    // With tune_gemm, each decode bucket's products take the fastest of cuBLASLt's
    // candidates and the two GEMVs, timed while the bucket warms (run_decode_graph);
    // other shapes take the tuned choice of the same key if there is one, else
    // cuBLASLt's heuristic.
    CELLM_ASSIGN_OR_RETURN(
        gemm_, Gemm::create(size_t{32} << 20,
                            options_.tune_gemm ? GemmPath::kTuned : GemmPath::kCublasLtOnly));
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

  // Queued steps read the staging and the buffers they name until they end.
  ~CudaForward() override {
    if (stream_.get() != nullptr) cudaStreamSynchronize(stream_.get());
  }

  StepHost& host() override { return hosts_[slot_]; }
  const ForwardDims& dims() const override { return dims_; }

  Status run_eager(int32_t n, int32_t n_sel, std::span<const int32_t> logit_rows) override {
    CELLM_CHECK(n > 0 && n <= dims_.max_rows && n_sel >= 0 && n_sel <= n);
    CELLM_RETURN_IF_ERROR(reserve_host_logits(logit_rows, n_sel));
    CELLM_RETURN_IF_ERROR(mark(timing_start_));
    // A sequence's rows of an eager step are its newest consecutive positions. Its
    // prefill chunks' rows go to the prefill attention, the others to the split one.
    std::vector<AttentionRowRange> ranges;
    if (tuning().prefill_attention) {
      ranges =
          attention_row_ranges(std::span<const int32_t>(host().row_seq, static_cast<size_t>(n)));
    }
    CELLM_RETURN_IF_ERROR(enqueue_step(n, n_sel, n, slot_, ranges));
    CELLM_RETURN_IF_ERROR(enqueue_logits_copy(logit_rows));
    CELLM_RETURN_IF_ERROR(mark(timing_end_));
    return finish_run();
  }

  Status run_decode_graph(int32_t bucket, std::span<const int32_t> logit_rows) override {
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
        const Status warmed = run_eager(bucket, bucket, logit_rows);
        gemm_->set_tuning(false);
        return warmed;
      }
      CELLM_RETURN_IF_ERROR(capture(bucket));
      it = graphs_.find(bucket);
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

  bool has_decode_graph(int32_t bucket) const override { return graphs_.count(bucket) > 0; }

  Status queue_decode_graph(int32_t bucket) override {
    CELLM_CHECK_MSG(queued_.size() < kSlots &&
                        std::find(queued_.begin(), queued_.end(), slot_) == queued_.end(),
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

  Result<std::span<const int32_t>> wait_queued() override {
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

  std::span<const float> host_logits(size_t k) const override {
    // REQUIRES: k indexes the last run's logit rows.
    CELLM_CHECK_MSG(k < n_host_logit_rows_, "host_logits(" + std::to_string(k) +
                                                ") after a run of " +
                                                std::to_string(n_host_logit_rows_) + " logit rows");
    const auto vocab = static_cast<size_t>(config_.vocab_size());
    return {static_cast<float*>(logits_host_.get()) + k * vocab, vocab};
  }

  Result<int64_t> warm_products() override {
    cudaStream_t s = stream_.get();
    const ModelConfig& c = config_;
    const int64_t d = c.hidden_size(), ff = c.intermediate_size(), q_dim = c.q_dim();
    const int64_t qkv_dim = q_dim + 2 * c.kv_dim();
    // Every layer's weights have the alignment of the first's (DeviceModel pads each
    // piece), so its calls have the same keys.
    const DeviceLayer<T>& w = model_->layers().front();
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
    for (int64_t m = 1; m <= dims_.max_rows; ++m) {
      CELLM_RETURN_IF_ERROR(
          count(gemm_->warm<T, T>(h, m, d, w.qkv, qkv_dim, w.qkv_bias, buf<T>(buf_.qkv), s)));
      CELLM_RETURN_IF_ERROR(
          count(gemm_->warm<T, T>(buf<T>(buf_.attn), m, q_dim, w.o_proj, d, w.o_bias, delta, s)));
      CELLM_RETURN_IF_ERROR(
          count(gemm_->warm<T, T>(h, m, d, w.gate_up, 2 * ff, nullptr, gate_up, s)));
      CELLM_RETURN_IF_ERROR(count(
          gemm_->warm_swiglu_down<T>(gate_up, m, ff, w.down_proj, d, buf<T>(buf_.act), delta, s)));
      for (T* head_in : {h, buf<T>(buf_.sel_norm)}) {
        CELLM_RETURN_IF_ERROR(
            count(gemm_->warm<T, float>(head_in, m, d, model_->lm_head(), c.vocab_size(), nullptr,
                                        buf<float>(buf_.logits), s)));
      }
    }
    CELLM_RETURN_IF_ERROR(sync());
    return ran;
  }

  Status copy_table_prefix(int32_t dst, int32_t src, int32_t upto) override {
    if (upto <= 0) return Status::Ok();
    int32_t* t = table_.as<int32_t>();
    const size_t stride = static_cast<size_t>(dims_.max_session_tokens);
    CELLM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(t + static_cast<size_t>(dst) * stride,
                                               t + static_cast<size_t>(src) * stride,
                                               static_cast<size_t>(upto) * sizeof(int32_t),
                                               cudaMemcpyDeviceToDevice, stream_.get()),
                               "copying a cell-table prefix");
    return sync();
  }

  Status set_timing(bool on) override {
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
  double last_device_ms() const override { return last_device_ms_; }

  int64_t kv_bytes_per_cell() const override {
    return 2 * config_.num_layers() * config_.kv_dim() * static_cast<int64_t>(sizeof(T));
  }
  int64_t kv_allocated_bytes() const override { return static_cast<int64_t>(kv_.bytes()); }
  int64_t graph_captures() const override { return static_cast<int64_t>(graphs_.size()); }
  const std::vector<std::string>& graph_notes() const override { return graph_notes_; }
  int64_t graph_replays() const override { return replays_; }

 private:
  template <typename U>
  U* buf(size_t offset) const {
    return reinterpret_cast<U*>(buffers_.as<unsigned char>() + offset);
  }
  template <typename U>
  U* meta(size_t offset) const {
    return reinterpret_cast<U*>(meta_dev_.as<unsigned char>() + offset);
  }
  T* k_pool(int64_t l) const {
    return kv_.as<T>() + static_cast<size_t>(2 * l) * static_cast<size_t>(dims_.max_cells) *
                             static_cast<size_t>(config_.kv_dim());
  }
  T* v_pool(int64_t l) const {
    return kv_.as<T>() + static_cast<size_t>(2 * l + 1) * static_cast<size_t>(dims_.max_cells) *
                             static_cast<size_t>(config_.kv_dim());
  }

  // Checks the logit rows against the selection and grows the pinned logits
  // copy to hold them (at least doubling; never shrinks). Called before any
  // stream work of a run, never inside a capture.
  Status reserve_host_logits(std::span<const int32_t> logit_rows, int32_t n_sel) {
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

  // One D2H copy per logit row, from the device logits [n_sel, vocab] into the
  // pinned copy [logit_rows.size(), vocab]; enqueued after the step.
  Status enqueue_logits_copy(std::span<const int32_t> logit_rows) {
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

  // Records `event` on the stream when timing is on.
  Status mark(const Event& event) {
    if (!timing_) return Status::Ok();
    CELLM_CUDA_RETURN_IF_ERROR(cudaEventRecord(event.get(), stream_.get()), "timing a step");
    return Status::Ok();
  }

  Status sync() {
    CELLM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()), "running a step");
    return Status::Ok();
  }

  // Waits for a run and reads its device time when timing is on.
  Status finish_run() {
    CELLM_RETURN_IF_ERROR(sync());
    if (timing_) {
      float ms = 0;
      CELLM_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, timing_start_.get(), timing_end_.get()),
                                 "reading a step's device time");
      last_device_ms_ = ms;
    }
    return Status::Ok();
  }

  // The bucket's decode graph: its triggers placed as tuning().early_triggers says, its
  // edges after cuBLASLt kernels as tuning().early_after_cublas says; where either is kTimed, each
  // candidate graph is instantiated and the fastest of them kept.
  Status capture(int32_t bucket) {
    // Without programmatic launch the triggers and edges are no-ops: nothing to choose.
    const bool pdl = programmatic_launch_enabled();
    const CudaTuning& t = tuning();
    std::vector<bool> placements = {t.early_triggers == TimedChoice::kOn};
    if (pdl && t.early_triggers == TimedChoice::kTimed) placements = {false, true};
    std::vector<bool> edge_choices = {pdl && t.early_after_cublas == TimedChoice::kOn};
    if (pdl && t.early_after_cublas == TimedChoice::kTimed) edge_choices = {false, true};
    std::vector<GraphExec> graphs;
    std::vector<std::pair<bool, bool>> ways;  // (early triggers, early edges) of each
    std::vector<std::string> labels;
    int edges = 0;
    // The ways are timed (and the idle launch noted) from the current slot, which holds
    // the step being run: each replay recomputes that step, writing the K/V it writes.
    // A replay from another slot would recompute whatever step that slot last held.
    const int current = slot_;
    for (const bool early : placements) {
      CELLM_ASSIGN_OR_RETURN(cudaGraph_t graph, capture_graph(bucket, early, current, false));
      for (const bool rewrite : edge_choices) {
        Result<GraphExec> exec = instantiate(graph, rewrite);
        if (!exec.ok()) {
          cudaGraphDestroy(graph);
          return exec.status();
        }
        if (rewrite) edges = last_rewritten_edges_;
        graphs.push_back(std::move(*exec));
        ways.emplace_back(early, rewrite);
        labels.push_back(std::string(early ? "early" : "late") + (rewrite ? "+edges" : ""));
      }
      cudaGraphDestroy(graph);
    }
    std::string note = "B=" + std::to_string(bucket) + ": ";
    const std::string edges_note = std::to_string(edges) + " edges early after cuBLASLt";
    size_t kept = 0;
    if (graphs.size() == 1) {
      note += std::string(placements[0] ? "early" : "late") + " triggers";
      if (edge_choices[0]) note += ", " + edges_note;
    } else {
      std::vector<double> ms;
      CELLM_RETURN_IF_ERROR(time_replays(graphs, &ms));
      for (size_t i = 0; i < graphs.size(); ++i) {
        if (ms[i] < ms[kept]) kept = i;
        char time[64];
        std::snprintf(time, sizeof time, "%s%s %.3f ms", i == 0 ? "" : ", ", labels[i].c_str(),
                      ms[i]);
        note += time;
      }
      if (edge_choices.back()) note += "; " + edges_note;
      note += ": kept " + labels[kept];
    }
    // Then the L2 prefetch beside the attention, for the kept way.
    bool prefetch = false;
    if (t.l2_prefetch != TimedChoice::kOff && bucket <= kPrefetchMaxRows) {
      CELLM_ASSIGN_OR_RETURN(cudaGraph_t graph,
                             capture_graph(bucket, ways[kept].first, current, true));
      Result<GraphExec> exec = instantiate(graph, ways[kept].second);
      cudaGraphDestroy(graph);
      CELLM_RETURN_IF_ERROR(exec.status());
      std::vector<GraphExec> pair;
      pair.push_back(std::move(graphs[kept]));
      pair.push_back(std::move(*exec));
      if (t.l2_prefetch == TimedChoice::kOn) {
        prefetch = true;
        note += "; L2 prefetch";
      } else {
        std::vector<double> ms;
        CELLM_RETURN_IF_ERROR(time_replays(pair, &ms));
        prefetch = ms[1] < ms[0];
        char time[96];
        std::snprintf(time, sizeof time, "; L2 prefetch off %.3f ms, on %.3f ms: kept %s", ms[0],
                      ms[1], prefetch ? "on" : "off");
        note += time;
      }
      graphs[kept] = std::move(pair[prefetch ? 1 : 0]);
    }
    CELLM_ASSIGN_OR_RETURN(const std::string idle, idle_launch_note(graphs[kept]));
    note += "; " + idle;
    // The kept way again for each other staging slot (its copies name that slot).
    std::array<GraphExec, kSlots> execs;
    execs[static_cast<size_t>(current)] = std::move(graphs[kept]);
    for (int slot = 0; slot < kSlots; ++slot) {
      if (slot == current) continue;
      CELLM_ASSIGN_OR_RETURN(cudaGraph_t graph,
                             capture_graph(bucket, ways[kept].first, slot, prefetch));
      Result<GraphExec> exec = instantiate(graph, ways[kept].second);
      cudaGraphDestroy(graph);
      CELLM_RETURN_IF_ERROR(exec.status());
      execs[static_cast<size_t>(slot)] = std::move(*exec);
    }
    graphs_.emplace(bucket, std::move(execs));
    graph_notes_.push_back(note);
    return Status::Ok();
  }

  // One capture of the decode step of `bucket` rows, with the L2 prefetch beside each
  // layer's attention when `prefetch`; the caller destroys the graph.
  Result<cudaGraph_t> capture_graph(int32_t bucket, bool early_triggers, int slot, bool prefetch) {
    CELLM_CUDA_RETURN_IF_ERROR(
        cudaStreamBeginCapture(stream_.get(), cudaStreamCaptureModeThreadLocal),
        "beginning a decode graph capture");
    // A decode step holds one row per sequence (padded rows attend position 0 only).
    set_early_triggers(early_triggers);
    prefetching_ = prefetch;
    forked_ = false;
    Status enqueued = enqueue_step(bucket, bucket, 1, slot);
    if (enqueued.ok()) enqueued = join_prefetch();
    prefetching_ = false;
    set_early_triggers(false);
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream_.get(), &graph);
    if (!enqueued.ok() || ended != cudaSuccess) {
      if (graph != nullptr) cudaGraphDestroy(graph);
      CELLM_RETURN_IF_ERROR(enqueued);
      CELLM_CUDA_RETURN_IF_ERROR(ended, "ending a decode graph capture");
    }
    return graph;
  }

  // An executable of `graph`; with `early_edges`, of a copy whose edges after cuBLASLt
  // kernels fire at launch completion (last_rewritten_edges_ counts them).
  Result<GraphExec> instantiate(cudaGraph_t graph, bool early_edges) {
    cudaGraph_t copy = nullptr;
    if (early_edges) {
      CELLM_CUDA_RETURN_IF_ERROR(cudaGraphClone(&copy, graph), "copying a decode graph");
      Result<int> rewritten = launch_after_foreign_start(copy);
      if (!rewritten.ok()) {
        cudaGraphDestroy(copy);
        return rewritten.status();
      }
      last_rewritten_edges_ = *rewritten;
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t inst = cudaGraphInstantiate(&exec, early_edges ? copy : graph, 0);
    if (copy != nullptr) cudaGraphDestroy(copy);
    CELLM_CUDA_RETURN_IF_ERROR(inst, "instantiating a decode graph");
    return GraphExec(exec);
  }

  // The graph replayed as a step replays it, on an idle stream (time_replays queues its
  // replays back to back, so a launch's cost on the host is hidden there): the median of
  // kRounds of the device time from an event recorded before cudaGraphLaunch to one after
  // the replay, and of the host time the cudaGraphLaunch call takes. "idle launch 3.930
  // ms (cudaGraphLaunch 61 µs)".
  Result<std::string> idle_launch_note(const GraphExec& graph) {
    constexpr int kRounds = 3;
    CELLM_ASSIGN_OR_RETURN(Event start, Event::create());
    CELLM_ASSIGN_OR_RETURN(Event end, Event::create());
    cudaStream_t s = stream_.get();
    std::vector<float> device_ms(kRounds);
    std::vector<double> host_us(kRounds);
    for (int r = 0; r < kRounds; ++r) {
      CELLM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s), "idling before a launch");
      CELLM_CUDA_RETURN_IF_ERROR(cudaEventRecord(start.get(), s), "timing an idle launch");
      const auto t0 = std::chrono::steady_clock::now();
      CELLM_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(graph.get(), s), "replaying a decode graph");
      const auto t1 = std::chrono::steady_clock::now();
      CELLM_CUDA_RETURN_IF_ERROR(cudaEventRecord(end.get(), s), "timing an idle launch");
      CELLM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s), "timing an idle launch");
      CELLM_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&device_ms[r], start.get(), end.get()),
                                 "reading an idle launch's time");
      host_us[r] = std::chrono::duration<double, std::micro>(t1 - t0).count();
    }
    std::sort(device_ms.begin(), device_ms.end());
    std::sort(host_us.begin(), host_us.end());
    char text[96];
    std::snprintf(text, sizeof text, "idle launch %.3f ms (cudaGraphLaunch %.0f us)",
                  device_ms[kRounds / 2], host_us[kRounds / 2]);
    return std::string(text);
  }

  // The median device time of kRounds replays of each graph, in turns after a warm-up
  // replay of each. A replay recomputes the staged step: the same K/V, logits and tokens.
  Status time_replays(const std::vector<GraphExec>& graphs, std::vector<double>* ms) {
    constexpr int kRounds = 7;
    const size_t n = graphs.size();
    std::vector<Event> marks;
    for (size_t i = 0; i < 2 * n * kRounds; ++i) {
      CELLM_ASSIGN_OR_RETURN(Event e, Event::create());
      marks.push_back(std::move(e));
    }
    cudaStream_t s = stream_.get();
    for (const GraphExec& g : graphs) {
      CELLM_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(g.get(), s), "replaying a decode graph");
    }
    for (size_t r = 0; r < kRounds; ++r) {
      for (size_t g = 0; g < n; ++g) {
        const size_t at = 2 * (r * n + g);
        CELLM_CUDA_RETURN_IF_ERROR(cudaEventRecord(marks[at].get(), s), "timing a decode graph");
        CELLM_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(graphs[g].get(), s), "replaying a decode graph");
        CELLM_CUDA_RETURN_IF_ERROR(cudaEventRecord(marks[at + 1].get(), s),
                                   "timing a decode graph");
      }
    }
    CELLM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s), "timing the decode graphs");
    ms->assign(n, 0.0);
    for (size_t g = 0; g < n; ++g) {
      std::vector<float> times(kRounds);
      for (size_t r = 0; r < kRounds; ++r) {
        const size_t at = 2 * (r * n + g);
        CELLM_CUDA_RETURN_IF_ERROR(
            cudaEventElapsedTime(&times[r], marks[at].get(), marks[at + 1].get()),
            "reading a decode graph's time");
      }
      std::nth_element(times.begin(), times.begin() + kRounds / 2, times.end());
      (*ms)[g] = times[kRounds / 2];
    }
    return Status::Ok();
  }

  // Everything of one step on the stream: metadata in (from staging slot `slot`),
  // forward, sampling, tokens out (into that slot). `fresh_positions`: how many of each
  // row's newest positions the step writes (AttentionParams::fresh_positions).
  // `ranges`: the attention's launches (attention_row_ranges); none: one over every row.
  Status enqueue_step(int32_t n, int32_t n_sel, int32_t fresh_positions, int slot,
                      std::span<const AttentionRowRange> ranges = {}) {
    cudaStream_t s = stream_.get();
    CELLM_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(meta_dev_.get(), staging(slot), meta_.bytes, cudaMemcpyHostToDevice, s),
        "copying the step metadata");
    CELLM_RETURN_IF_ERROR(enqueue_forward(n, n_sel, fresh_positions, ranges));
    if (n_sel > 0) {
      CELLM_CUDA_RETURN_IF_ERROR(
          launch_sample(buf<float>(buf_.logits), n_sel, config_.vocab_size(),
                        meta<SamplingRow>(meta_.sampling), buf<int32_t>(buf_.out_tokens),
                        buf<void>(buf_.sample_ws),
                        sample_workspace_bytes(dims_.max_rows, config_.vocab_size()), s),
          "sampling");
      // The prefetch branch ends before the token copy, the graph's last node.
      CELLM_RETURN_IF_ERROR(join_prefetch());
      CELLM_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(hosts_[slot].out_tokens, buf<int32_t>(buf_.out_tokens),
                          static_cast<size_t>(n_sel) * sizeof(int32_t), cudaMemcpyDeviceToHost, s),
          "copying the sampled tokens");
    }
    return Status::Ok();
  }

  Status enqueue_forward(int32_t n, int32_t n_sel, int32_t fresh_positions,
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
      CELLM_CUDA_RETURN_IF_ERROR(
          launch_add_rmsnorm<T>(residual, l == 0 ? nullptr : delta, w.input_norm, n, d, eps, h, s,
                                l == 0 ? ResidualWriter::kPreviousKernel : settled),
          "input rmsnorm");
      CELLM_RETURN_IF_ERROR((gemm_->run<T, T>(h, n, d, w.qkv, qkv_dim, w.qkv_bias, qkv, s)));
      if (prefetching_) CELLM_RETURN_IF_ERROR(prefetch_gate_up(w));
      if (w.q_norm != nullptr) {
        CELLM_CUDA_RETURN_IF_ERROR(
            launch_head_rmsnorm<T>(qkv, n, qkv_dim, 0, c.num_heads(), hd, w.q_norm, eps, s),
            "q norm");
        CELLM_CUDA_RETURN_IF_ERROR(
            launch_head_rmsnorm<T>(qkv, n, qkv_dim, q_dim, c.num_kv_heads(), hd, w.k_norm, eps, s),
            "k norm");
      }
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
      CELLM_RETURN_IF_ERROR((gemm_->run<T, T>(attn, n, q_dim, w.o_proj, d, w.o_bias, delta, s)));
      CELLM_CUDA_RETURN_IF_ERROR(
          launch_add_rmsnorm<T>(residual, delta, w.post_norm, n, d, eps, h, s, settled),
          "post rmsnorm");
      CELLM_RETURN_IF_ERROR((gemm_->run<T, T>(h, n, d, w.gate_up, 2 * ff, nullptr, gate_up, s)));
      CELLM_RETURN_IF_ERROR(
          gemm_->run_swiglu_down<T>(gate_up, n, ff, w.down_proj, d, act, delta, s));
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
    CELLM_RETURN_IF_ERROR(
        (gemm_->run<T, float>(head_in, n_sel, d, model_->lm_head(), c.vocab_size(), nullptr,
                              buf<float>(buf_.logits), s)));
    return Status::Ok();
  }

  // The L2 prefetch of a layer's gate_up rows (each row's first sixteenth) on a side
  // branch of the graph being captured, forked after the q/k/v product: it runs beside
  // RoPE and the attention, whose few blocks leave the HBM idle, and the gate_up product
  // then reads those bytes from the L2. A sixteenth of each row: a larger share gains less.
  Status prefetch_gate_up(const DeviceLayer<T>& w) {
    cudaStream_t s = stream_.get();
    const size_t row_bytes = static_cast<size_t>(config_.hidden_size()) * sizeof(T);
    if (row_bytes % 16 != 0) return Status::Ok();
    const size_t lead = std::max<size_t>(16, row_bytes / 16 / 16 * 16);
    CELLM_CUDA_RETURN_IF_ERROR(cudaEventRecord(fork_.get(), s), "forking the L2 prefetch");
    CELLM_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(side_.get(), fork_.get()),
                               "forking the L2 prefetch");
    CELLM_CUDA_RETURN_IF_ERROR(
        launch_l2_prefetch_rows(w.gate_up, 2 * config_.intermediate_size(), row_bytes, lead,
                                kPrefetchBlocks, side_.get()),
        "the L2 prefetch");
    forked_ = true;
    return Status::Ok();
  }

  // Joins the prefetch branch back into the captured stream (a capture must end joined).
  Status join_prefetch() {
    if (!forked_) return Status::Ok();
    forked_ = false;
    CELLM_CUDA_RETURN_IF_ERROR(cudaEventRecord(join_.get(), side_.get()),
                               "joining the L2 prefetch");
    CELLM_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_.get(), join_.get()),
                               "joining the L2 prefetch");
    return Status::Ok();
  }

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
  const CudaTuning& tuning() const { return options_.tuning; }
  // Buckets that may take the prefetch (the products are GEMVs up to 8 rows; at 16 the
  // 8B loses 3%), and the prefetch kernel's blocks.
  static constexpr int32_t kPrefetchMaxRows = 8;
  static constexpr int kPrefetchBlocks = 16;
  int last_rewritten_edges_ = 0;          // by the last instantiate with early edges, for the notes
  std::vector<std::string> graph_notes_;  // one per captured decode graph
  MetaLayout meta_;
  BufferLayout buf_;
  std::unique_ptr<DeviceModel<T>> model_;
  std::optional<Gemm> gemm_;  // set by init()
  Stream stream_;
  Stream side_;               // the L2 prefetch branch of a graph being captured
  Event fork_, join_;         // its fork and join
  bool prefetching_ = false;  // the capture in progress takes the prefetch
  bool forked_ = false;       // a prefetch branch is not joined yet
  static constexpr int kSlots = 2;
  unsigned char* staging(int slot) const {
    return static_cast<unsigned char*>(meta_host_.get()) + static_cast<size_t>(slot) * slot_bytes_;
  }
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
  size_t n_host_logit_rows_ = 0;
  bool timing_ = false;
  Event timing_start_, timing_end_;
  double last_device_ms_ = 0;
  std::map<int32_t, std::array<GraphExec, kSlots>> graphs_;  // one per staging slot
  std::set<int32_t> warmed_;
  int64_t replays_ = 0;
};

template <typename T>
Result<std::unique_ptr<ForwardEngine>> make(const ModelWeights& weights, const ForwardDims& dims,
                                            const CudaExecutorOptions& options) {
  auto engine = std::make_unique<CudaForward<T>>(weights.config(), dims, options);
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

size_t ForwardEngine::device_bytes(const ModelConfig& config, const ForwardDims& dims,
                                   CudaPrecision precision) {
  if (precision == CudaPrecision::kF32) {
    return DeviceModel<float>::slab_bytes(config) + kv_pool_bytes<float>(config, dims) +
           BufferLayout::of<float>(config, dims).bytes + table_bytes(dims);
  }
  return DeviceModel<__nv_bfloat16>::slab_bytes(config) +
         kv_pool_bytes<__nv_bfloat16>(config, dims) +
         BufferLayout::of<__nv_bfloat16>(config, dims).bytes + table_bytes(dims);
}

}  // namespace cellm::cuda
