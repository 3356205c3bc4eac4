// Every layer of a one-row decode step in one persistent kernel (sm_90): what the
// forward's per-layer chain of launches computes (cuda_forward.h) for a single row,
// without the kernel boundaries between its products.
//
// Why: at one row a step is the weights streamed once (the 1B: 2.5 GB) plus a chain of
// small dependent pieces (norms, RoPE, the attention, SwiGLU). As separate launches,
// the memory idles during each small piece: ~10 µs a layer of the 1B's ~41
// (docs/PERFORMANCE.md). Here one block per SM streams its share of every weight matrix,
// layer after layer, into a ring of shared-memory stages (a producer warp issuing bulk
// copies, cp.async.bulk), and never waits for activations to do so; the 15 consumer
// warps wait only where the math needs the whole previous result. So the weights of the
// next product are already arriving while the norm or the attention runs.
//
// Per layer, five stages, each ended by a grid-wide count (every block counts itself in
// on one counter; a stage starts when the count says the one before is done):
//   1. h = rmsnorm(residual + delta) in every block (block 0 stores the new residual);
//      its rows of qkv = h Wqkvᵀ (+ bias).
//   2. one block per query head: [q/k head norms,] RoPE of its q head and of its kv
//      head's k (rope_kv_write.h's arithmetic, rounded to T as that kernel stores them),
//      the attention of the row over positions [lo, pos] (the older positions' K/V read
//      through the cell table, their first rounds into registers before the stage's
//      wait; the row's own from shared memory); the first block of each kv head writes
//      k and v into the pools, block 0 on layer 0 the table entry.
//   3. its rows of delta = attn Woᵀ (+ bias).
//   4. h = rmsnorm(residual + delta); its pairs of gate/up rows, and act = silu(g) * u
//      from the two products rounded to T (swiglu.h's arithmetic).
//   5. its rows of delta = act Wdownᵀ.
// The residual alternates between two f32 rows (`residual` holds the embedding on entry;
// each norm that adds a delta reads one and block 0 writes the other), so no block reads
// a row that another is rewriting: after 2 * n_layers - 1 adds it ends in
// `residual_out`; the caller's final norm adds the last delta to it.
//
// Numerics: every product sums in f32 and rounds to T where the separate kernels round
// (qkv, delta, gate/up, act, h, attn); the sums run in another order than cuBLASLt's or
// the GEMVs', and the attention's softmax is folded per warp then merged, so the result
// equals the chained kernels' within f32 rounding of the sums, not bit for bit.
//
// Limits (decode_layers_supported): T = bf16, the hidden, q/kv and intermediate widths
// multiples of 8, the hidden width at most 7,680 (a norm holds its row in registers),
// head_dim even and at most kMaxDecodeLayersHeadDim, n_heads a multiple of n_kv_heads,
// and the device able to hold one block per SM (cooperative launch).
//
// The launcher enqueues one cooperative kernel (every block resident at once, so the
// grid-wide counts cannot deadlock) on `stream`, launched normally (it waits for the
// stream's earlier work); it never allocates or synchronizes and may be captured in a
// CUDA graph. `sync` is two uint32 counters, zeroed once when allocated: a launch that
// runs to completion leaves them zero. A wait that outlasts seconds traps (a launch
// error), never hangs. Thread-safety: reentrant; concurrent launches need distinct
// `sync` words and scratch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace cellm::cuda {

inline constexpr int64_t kMaxDecodeLayersHeadDim = 128;

// One layer's weights and KV pools, in device memory (an array of n_layers).
template <typename T>
struct DecodeLayer {
  const T* input_norm;  // [d]
  const T* qkv;         // [q_dim + 2 kv_dim, d]
  const T* qkv_bias;    // [q_dim + 2 kv_dim] or null
  const T* q_norm;      // [head_dim] or null (then k_norm is null too)
  const T* k_norm;      // [head_dim] or null
  const T* o_proj;      // [d, q_dim]
  const T* o_bias;      // [d] or null
  const T* post_norm;   // [d]
  const T* gate_up;     // [2 ff, d]: gate rows, then up rows
  const T* down;        // [d, ff]
  T* k_pool;            // [max_cells, kv_dim]
  T* v_pool;            // [max_cells, kv_dim]
  int32_t window;       // sliding window in tokens; 0 = full history
};

template <typename T>
struct DecodeLayersParams {
  const DecodeLayer<T>* layers = nullptr;  // device [n_layers]
  int32_t n_layers = 0;
  int32_t d = 0;           // hidden size
  int32_t ff = 0;          // intermediate size
  int32_t n_heads = 0;     // query heads
  int32_t n_kv_heads = 0;  // divides n_heads
  int32_t head_dim = 0;
  float eps = 0.f;    // rms norms
  float scale = 0.f;  // attention score scale
  // The row: its position, cell and cell-table row (device, [1] each), and the table.
  const int32_t* positions = nullptr;
  const int32_t* cells = nullptr;
  const int32_t* row_seq = nullptr;
  int32_t* table = nullptr;
  int64_t table_stride = 0;
  const float* inv_freq = nullptr;  // [head_dim / 2]
  float* residual = nullptr;        // [d] f32: the embedding on entry
  float* residual_out = nullptr;    // [d] f32: the residual before the last delta, on exit
  T* qkv = nullptr;                 // [q_dim + 2 kv_dim] scratch
  T* attn = nullptr;                // [q_dim] scratch
  T* act = nullptr;                 // [ff] scratch
  T* delta = nullptr;               // [d]: the last layer's MLP output, on exit
  uint32_t* sync = nullptr;         // [2] counters, zero between launches
};

// Whether launch_decode_layers takes these shapes on the current device.
bool decode_layers_supported(int64_t d, int64_t ff, int64_t n_heads, int64_t n_kv_heads,
                             int64_t head_dim);

template <typename T>
cudaError_t launch_decode_layers(const DecodeLayersParams<T>& p, cudaStream_t stream);

}  // namespace cellm::cuda
