// Attention of a step's query rows over their sequences' KV cells, gathered
// through the cell table (DESIGN.md §4, §9.1): one launcher for decode (one query
// per sequence, many sequences) and prefill (many queries of one sequence).
//
// Semantics (CPU twin: cpu::attention in src/cpu/kernels/attention.h). Query row r
// sits at position q = positions[r] of sequence s = row_seq[r] and attends the cells
// of s at positions [lo, q], lo = max(0, q - window + 1) for window > 0, else 0.
// Head h reads kv head h / (n_heads / n_kv_heads) (grouped-query):
//   out[r, h] = softmax_j(scale * q[r, h] · k[j]) · v[j],  all math in f32.
// The row's own K/V (and table entry) must already be written (launch_kv_write).
//
// Layouts:
//   qkv      [n_rows, row_stride] of T: query head h of row r is the head_dim values at
//            qkv + r * row_stride + q_offset + h * head_dim.
//   k_pool, v_pool  [max_cells, n_kv_heads, head_dim] of T (one layer).
//   table    int32 [n_table_rows, table_stride], shared by all layers:
//            table[s * table_stride + p] = the cell of position p of sequence s.
//   row_seq, positions  int32 [n_rows].
//   out      [n_rows, n_heads * head_dim] of T; must not overlap the inputs.
//   workspace  f32, attention_workspace_bytes() bytes (may be 0 bytes, then nullptr is
//            fine): partial results of the context splits, overwritten by every launch.
//
// Flash-decoding split: positions [0, max_context) are cut into
// attention_num_splits(n_rows, max_context) chunks of equal length; one block per
// (row, split, kv head, tile of up to 8 query heads of that kv head) folds its
// chunk's part of [lo, q] with an online softmax, and a combine kernel merges the
// partial (max, sum, acc) of the non-empty chunks. With one split the block writes
// `out` directly. The split count depends only on n_rows and max_context, never on
// the data, so a captured CUDA graph stays valid while tables and positions change.
//
// The launcher enqueues its kernels on `stream`; it never allocates or synchronizes
// and may be captured in a CUDA graph (a replay reads the current contents of every
// buffer). Returns cudaErrorInvalidValue for a malformed call, else the launch's
// error. Thread-safety: reentrant; concurrent launches need distinct workspaces.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace cellm::cuda {

inline constexpr int64_t kMaxAttentionHeadDimCuda = 256;

template <typename T>
struct AttentionParams {
  const T* qkv = nullptr;  // [n_rows, row_stride]; queries at columns [q_offset, +n_heads*head_dim)
  int64_t row_stride = 0;  // elements between consecutive rows of qkv
  int64_t q_offset = 0;    // column of query head 0
  int64_t n_rows = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;          // divides n_heads
  int64_t head_dim = 0;            // in [1, kMaxAttentionHeadDimCuda]
  const T* k_pool = nullptr;       // [max_cells, n_kv_heads, head_dim]
  const T* v_pool = nullptr;       // [max_cells, n_kv_heads, head_dim]
  const int32_t* table = nullptr;  // [n_table_rows, table_stride] cell of (sequence, position)
  int64_t table_stride = 0;
  const int32_t* row_seq = nullptr;    // [n_rows] table row of each query row
  const int32_t* positions = nullptr;  // [n_rows] absolute position of each query row
  int32_t window = 0;                  // sliding window in tokens; 0 = full history
  float scale = 0.f;                   // score scale, usually 1/sqrt(head_dim)
  int32_t max_context = 0;             // > every positions[r]: the session budget; sizes the split
  float* workspace = nullptr;  // attention_workspace_bytes(n_rows, n_heads, head_dim, max_context)
  T* out = nullptr;            // [n_rows, n_heads * head_dim]
};

// Context chunks per row: a function of n_rows and max_context only (>= 1).
int32_t attention_num_splits(int64_t n_rows, int32_t max_context);

// Bytes of f32 workspace launch_attention needs; 0 when there is a single split.
// Layout: acc [n_rows, n_heads, n_splits, head_dim], then max and sum, each
// [n_rows, n_heads, n_splits] (max in log2 units).
size_t attention_workspace_bytes(int64_t n_rows, int64_t n_heads, int64_t head_dim,
                                 int32_t max_context);

// REQUIRES: the shapes above; 0 <= positions[r] < table_stride; table rows hold a cell
// in [0, max_cells) for every position the row attends. positions[r] < max_context is
// the budget the split is sized for: a position past it stays correct (the last chunk
// takes the rest) but that chunk's block then does the extra work alone.
template <typename T>
cudaError_t launch_attention(const AttentionParams<T>& p, cudaStream_t stream);

}  // namespace cellm::cuda
