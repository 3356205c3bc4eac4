// CpuForward: one transformer forward of a Llama-family model over a slice of a
// packed batch, on the CPU. It reads the model's weights in place, writes each
// token's K/V into its cell of the KvStore, lets each query attend its own
// sequence's cells, and returns logits only for the selected rows.
//
// Per layer (HF Llama/Mistral/Qwen2/Qwen3 semantics):
//   h = rmsnorm(x); q,k,v = h·Wqᵀ(+b), h·Wkᵀ(+b), h·Wvᵀ(+b)
//   [Qwen3] q,k = rmsnorm per head over head_dim
//   q,k = rope(q,k, position); K/V of each token -> its cell
//   x += attention(q over the row's sequence cells, window) · Woᵀ
//   x += down(silu(rmsnorm(x)·Wgᵀ) * (rmsnorm(x)·Wuᵀ))
// then logits = rmsnorm(x[selected]) · lm_headᵀ.
//
// Products with bf16 weights: by default exact (W widened to f32, activations
// kept f32: logits match an f32 reference to ~1e-5). With bf16_activations, and a
// CPU with AVX-512 BF16, each product's activations are rounded to bf16 once and
// multiplied by vdpbf16ps (quant::bf16_dot_matmul: llama.cpp's numerics for bf16
// weights, up to twice the multiply-adds per cycle; each product carries x's
// rounding, at most 2^-8 relative). Without the instructions the flag does nothing.
//
// Thread-safety: none; one forward at a time (the executor's engine thread).
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "cellm/model_weights.h"
#include "cellm/types.h"
#include "core/cell_pool.h"
#include "cpu/kernels/convert.h"
#include "cpu/kernels/thread_pool.h"
#include "cpu/kv_store.h"

namespace cellm::cpu {

// One forward's tokens, planned once by the executor.
struct ForwardSlice {
  std::span<const Token> tokens;        // [n]
  std::span<const Position> positions;  // [n] absolute positions
  std::span<const CellId> cells;        // [n] the cell each token's K/V goes to
  // [n] the full cell list of each row's sequence (covers every position <= the row's).
  std::span<const std::span<const CellId>> seq_cells;
  std::span<const int32_t> selected_rows;  // rows that need logits, ascending
};

class CpuForward {
 public:
  // REQUIRES: max_rows > 0. `weights` must outlive this object.
  CpuForward(std::shared_ptr<const ModelWeights> weights, ThreadPool& pool, int64_t max_rows,
             bool bf16_activations = false);

  // Runs the forward and writes logits [selected_rows.size(), vocab] into `logits`
  // (a tensor-parallel shard's: [selected_rows.size(), its lm_head rows]).
  // REQUIRES: slice sizes agree, n <= max_rows, cells < kv.rows(), tokens in vocab.
  void run(const ForwardSlice& slice, KvStore& kv, std::span<float> logits);

  // Makes this the forward of one rank of a tensor-parallel group (its weights a
  // ModelWeights::shard): each layer's o_proj and down_proj outputs are partial sums,
  // which `sum` (an all-reduce over the ranks: count values at data become the sum of
  // every rank's) completes before they join the residual. The host reference of a
  // tensor-parallel step (tests/cpu/tensor_parallel_forward_test.cpp).
  void set_partial_sums(std::function<void(float* data, int64_t count)> sum) {
    partial_sums_ = std::move(sum);
  }

 private:
  void layer(int64_t l, const ForwardSlice& slice, int64_t n, KvStore& kv);
  // y = x · Wᵀ (+ bias) for a linear weight in any layout this forward reads.
  void linear(const float* x, int64_t m, int64_t k, const TensorView& w, int64_t n, TypedPtr bias,
              float* y);
  // One product of linear_shared.
  struct Linear {
    const TensorView* w;
    int64_t n;
    TypedPtr bias;
    float* y;
  };
  // Several linear products of one x (q, k and v; gate and up), each as linear gives it:
  // block-format weights in one quant_matmul_shared call (x quantized once), bf16
  // weights under bf16 activations in one bf16_dot_matmul_shared call (x rounded once).
  void linear_shared(const float* x, int64_t m, int64_t k, std::initializer_list<Linear> products);

  std::shared_ptr<const ModelWeights> weights_;
  ThreadPool& pool_;
  int64_t max_rows_;
  bool bf16_dot_;                // bf16 weights go through quant::bf16_dot_matmul
  std::vector<float> inv_freq_;  // [rotary_dim / 2]
  std::function<void(float*, int64_t)> partial_sums_;  // set: a tensor-parallel rank
  // Workspace, sized for max_rows once.
  std::vector<float> x_;     // [n, hidden] the residual stream
  std::vector<float> h_;     // [n, hidden] normed input of a sublayer
  std::vector<float> q_;     // [n, q_dim]
  std::vector<float> k_;     // [n, kv_dim]
  std::vector<float> v_;     // [n, kv_dim]
  std::vector<float> attn_;  // [n, q_dim]
  std::vector<float> o_;     // [n, hidden]
  std::vector<float> gate_;  // [n, intermediate]
  std::vector<float> up_;    // [n, intermediate]
};

}  // namespace cellm::cpu
