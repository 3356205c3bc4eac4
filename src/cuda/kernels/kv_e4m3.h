// The e4m3 KV cache's device kernels (--kv-dtype fp8; the CUDA forward calls them in
// place of launch_rope_kv_write and launch_attention when ForwardDims::kv_e4m3):
//
// launch_rope_kv_write_e4m3: what launch_rope_kv_write (rope_kv_write.h) does for a
// step's rows of the fused q/k/v projection, with the pools holding e4m3 codes and one
// f32 scale per (cell, kv head) instead of T values. q and k are rotated in place in qkv
// (rope.h's arithmetic, rounded to T); then each k head row (the rotated values as qkv
// holds them) and each v head row of cell cells[r] is quantized as
// cpu::quantize_kv_head_e4m3 does: scale = the smallest power of two >= amax / 448 (1 for
// an all-zero row), code[i] = e4m3(x[i] / scale) rounded to nearest even and saturated;
// with a table, table[row_seq[r] * table_stride + positions[r]] = cells[r] (as
// launch_rope_kv_write stores it).
// CPU twin: cpu::rope then cpu::write_kv_e4m3 (cpu/kernels/attention.h).
//
// launch_attention_decode_e4m3: softmax(q · K / sqrt(head_dim)) · V for query rows at
// positions[r] of sequence row_seq[r], over the cells table[row_seq[r] * table_stride
// + p] for p in [lo, positions[r]] (lo from the sliding window as cpu::attention), K and V
// read as e4m3(code) * scale. One warp per (row, head) taking four keys at a time (eight
// lanes a key), an online softmax in f32 per key group, merged at the end. Rows
// of one sequence may be consecutive positions of a prefill chunk: each reads the cells
// up to its own position, so the chunk's K/V must be written (and the table stored)
// before the launch.
// CPU twin: cpu::attention with AttentionArgs::k_codes.
//
// Layouts: qkv [n_rows, row_stride] of T as RopeKvWriteParams; codes [max_cells,
// n_kv_heads, head_dim] uint8; scales [max_cells, n_kv_heads] f32; q rows of n_heads *
// head_dim elements, q_row_stride apart (the q columns of the fused qkv rows); out
// [n_rows, n_heads, head_dim] of T; table int32 [n_table_rows, table_stride].
// The launchers enqueue one kernel on `stream`, never allocate or synchronize, and return
// cudaErrorInvalidValue for a malformed call, else the launch's error. Thread-safety:
// reentrant.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace cellm::cuda {

inline constexpr int64_t kMaxKvE4m3HeadDim = 256;

template <typename T>
struct RopeKvWriteE4m3Params {
  T* qkv = nullptr;                    // [n_rows, row_stride]; q and k rotated in place
  int64_t n_rows = 0;                  // >= 0; 0 launches nothing
  int64_t row_stride = 0;              // elements between consecutive rows of qkv
  int64_t q_offset = 0;                // column of q head 0
  int64_t n_heads = 0;                 // q heads, >= 0
  int64_t k_offset = 0;                // column of k head 0
  int64_t v_offset = 0;                // column of v head 0
  int64_t n_kv_heads = 0;              // >= 1
  int64_t head_dim = 0;                // even, in [2, kMaxKvE4m3HeadDim]
  const int32_t* positions = nullptr;  // [n_rows]
  const float* inv_freq = nullptr;     // [head_dim / 2]
  const int32_t* cells = nullptr;      // [n_rows] distinct cells
  uint8_t* k_codes = nullptr;          // [max_cells, n_kv_heads, head_dim]
  uint8_t* v_codes = nullptr;
  float* k_scales = nullptr;  // [max_cells, n_kv_heads]
  float* v_scales = nullptr;
  int32_t* table = nullptr;          // nullptr: leave the table alone
  int64_t table_stride = 0;          // > 0 with a table
  const int32_t* row_seq = nullptr;  // [n_rows] table row of each row; read only with a table
};

// REQUIRES: the shapes above; the q, k and v column ranges inside row_stride and disjoint.
template <typename T>
cudaError_t launch_rope_kv_write_e4m3(const RopeKvWriteE4m3Params<T>& params, cudaStream_t stream);

template <typename T>
struct AttentionE4m3Params {
  const T* q = nullptr;      // [n_rows, q_row_stride], q heads first
  int64_t q_row_stride = 0;  // elements between rows of q; 0: n_heads * head_dim
  T* out = nullptr;          // [n_rows, n_heads, head_dim]
  int64_t n_rows = 0;        // >= 0; 0 launches nothing
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;  // divides n_heads
  int64_t head_dim = 0;    // in [1, kMaxKvE4m3HeadDim]
  const uint8_t* k_codes = nullptr;
  const uint8_t* v_codes = nullptr;
  const float* k_scales = nullptr;
  const float* v_scales = nullptr;
  const int32_t* table = nullptr;      // [n_table_rows, table_stride] cells
  int64_t table_stride = 0;            // > positions[r] for every row
  const int32_t* row_seq = nullptr;    // [n_rows] table row of each query row
  const int32_t* positions = nullptr;  // [n_rows] absolute position of each query row
  int32_t window = 0;                  // sliding window in tokens; 0 = full history
};

// REQUIRES: the shapes above; every cell the table names for a row's positions is valid.
template <typename T>
cudaError_t launch_attention_decode_e4m3(const AttentionE4m3Params<T>& params, cudaStream_t stream);

}  // namespace cellm::cuda
