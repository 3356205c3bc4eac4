// Rotary position embedding and the K/V write of one layer in one launch: what
// launch_rope (rope.h) followed by launch_kv_write (kv_write.h) do, bit for bit,
// for a step's rows of the fused q/k/v projection.
//
// For each row r, at position positions[r] and cell cells[r]:
//   - the q heads and the k heads of qkv row r are rotated in place with rope.h's
//     exact arithmetic (angle = float(position) * inv_freq[j], precise cosf/sinf,
//     each product rounded before the sum, rounded to T once);
//   - k_pool[cell] = the rotated k heads, v_pool[cell] = the v heads (a bitwise copy);
//   - when table != nullptr, table[row_seq[r] * table_stride + positions[r]] = cell.
// So qkv, the pools and the table end exactly as rope-then-kv_write leaves them. The
// rotated k is written back into qkv although attention reads K only from the pool:
// it costs n_kv_heads * head_dim stores a row (a quarter of the q heads' at 32/8) and
// keeps this a drop-in replacement whose effect on every buffer is the unfused one.
// Per-head q/k norms (Qwen3) run before this, as before rope.
//
// Layouts (DESIGN.md §4):
//   qkv      [n_rows, row_stride] of T; row r holds n_heads q heads of head_dim values
//            at columns [q_offset, + n_heads * head_dim), n_kv_heads k heads at
//            [k_offset, + kv_dim) and v heads at [v_offset, + kv_dim),
//            kv_dim = n_kv_heads * head_dim.
//   k_pool, v_pool  [max_cells, n_kv_heads, head_dim] of T: one layer's KV storage.
//   positions, cells, row_seq  [n_rows] int32; inv_freq [head_dim / 2] f32
//            (rope_inv_freq, model/rope.h).
//   table    int32 [n_table_rows, table_stride], shared by all layers (the executor
//            passes it on layer 0 only).
//
// The launcher enqueues one kernel on `stream`; it never allocates or synchronizes
// and may be captured in a CUDA graph (a replay reads every input's current
// contents). The kernel is launched with programmatic dependent launch
// (kernels/launch.cuh) and reads inv_freq, positions and cells before waiting for the
// previous kernel: no kernel of the stream may write them (the executor uploads a step's
// positions and cells before its first kernel). Returns cudaErrorInvalidValue for a
// malformed call, else the launch's error. Thread-safety: reentrant.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace cellm::cuda {

inline constexpr int64_t kMaxRopeKvWriteHeadDim = 256;

template <typename T>
struct RopeKvWriteParams {
  T* qkv = nullptr;                    // [n_rows, row_stride]; q and k rotated in place, v read
  int64_t n_rows = 0;                  // >= 0; 0 launches nothing
  int64_t row_stride = 0;              // elements between consecutive rows of qkv
  int64_t q_offset = 0;                // column of q head 0
  int64_t n_heads = 0;                 // q heads, >= 0
  int64_t k_offset = 0;                // column of k head 0
  int64_t v_offset = 0;                // column of v head 0
  int64_t n_kv_heads = 0;              // >= 1
  int64_t head_dim = 0;                // even, in [2, kMaxRopeKvWriteHeadDim]
  const int32_t* positions = nullptr;  // [n_rows] absolute position of each row
  const float* inv_freq = nullptr;     // [head_dim / 2]
  const int32_t* cells = nullptr;      // [n_rows] distinct cells in [0, max_cells)
  T* k_pool = nullptr;                 // [max_cells, n_kv_heads, head_dim]
  T* v_pool = nullptr;                 // [max_cells, n_kv_heads, head_dim]
  int32_t* table = nullptr;            // nullptr: leave the table alone
  int64_t table_stride = 0;            // > 0 with a table
  const int32_t* row_seq = nullptr;    // [n_rows] table row of each row; read only with a table
};

// REQUIRES: the shapes above; the q, k and v column ranges inside row_stride and
// pairwise disjoint; qkv and the pools do not overlap; with a table, every
// (row_seq[r], positions[r]) inside it.
template <typename T>
cudaError_t launch_rope_kv_write(const RopeKvWriteParams<T>& params, cudaStream_t stream);

}  // namespace cellm::cuda
