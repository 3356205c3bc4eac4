// Writes a step's K/V rows into their KV cells, and (once per step) the cells
// into the sequences' cell table.
//
// Layouts (DESIGN.md §4):
//   qkv      [n, row_stride] of T: the fused projection output; row r's K is at
//            columns [k_offset, k_offset + kv_dim), its V at [v_offset, v_offset + kv_dim),
//            kv_dim = n_kv_heads * head_dim.
//   k_pool, v_pool  [max_cells, kv_dim] of T: one layer's KV storage; cell c's row is
//            k_pool + c * kv_dim.
//   cells, row_seq, positions  [n] int32: row r's cell, sequence (table row) and
//            absolute position.
//   table    int32 [n_table_rows, table_stride], shared by all layers:
//            table[s * table_stride + p] = the cell of position p of sequence s.
//
// For r in [0, n): k_pool[cells[r]] = K of row r and v_pool[cells[r]] = V of row r;
// when table != nullptr also table[row_seq[r] * table_stride + positions[r]] = cells[r]
// (the executor passes the table on layer 0 only; row_seq and positions may then be
// nullptr when table is nullptr). CPU twin: cpu::write_kv plus the table store.
//
// The launcher enqueues one kernel on `stream`; it never allocates or synchronizes
// and may be captured in a CUDA graph (all inputs are read on the device, so a
// replay sees their current contents). Rows must name distinct cells.
// Returns cudaErrorInvalidValue for a malformed call, else the launch's error.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cellm::cuda {

// REQUIRES: n >= 0; kv_dim > 0; k/v column ranges inside row_stride; every cell in
// [0, max_cells); table row and position inside the table when table != nullptr.
template <typename T>
cudaError_t launch_kv_write(const T* qkv, int64_t n, int64_t row_stride, int64_t k_offset,
                            int64_t v_offset, int64_t kv_dim, const int32_t* cells,
                            const int32_t* row_seq, const int32_t* positions, T* k_pool, T* v_pool,
                            int32_t* table, int64_t table_stride, cudaStream_t stream);

}  // namespace cellm::cuda
