// The embedding gather (token ids -> f32 residual rows) and the row gather of the f32
// hidden states (selected rows before the LM head).
//
// Launchers enqueue on `stream`, never allocate or synchronise (safe inside CUDA graph
// capture), and return the launch error (cudaErrorInvalidValue for bad arguments).
// n = 0 launches nothing and returns cudaSuccess. Rows are moved with 16-byte accesses
// when d is a multiple of 4 and the pointers are aligned, else element by element.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace cellm::cuda {

// A token id that stands for the row's token in `fed` (launch_embedding).
inline constexpr int32_t kFedToken = -1;

// out[i, :] = float(table[tokens[i], :]) for i in [0, n); a token outside [0, vocab)
// writes a row of zeros. With `fed` ([n] int32, device), a token equal to kFedToken
// is replaced by fed[i] first: a decode step queued before the host knows its tokens
// takes them from the tokens the step before it sampled (CudaForward's step ahead).
// table: [vocab, d] T (float or __nv_bfloat16); tokens: [n] int32; out: [n, d] f32.
// REQUIRES: vocab > 0, d > 0, n >= 0; out does not overlap table.
template <typename T>
cudaError_t launch_embedding(const T* table, int64_t vocab, int64_t d, const int32_t* tokens,
                             int64_t n, float* out, cudaStream_t stream,
                             const int32_t* fed = nullptr);

// out[i, :] = x[rows[i], :] for i in [0, n_rows); a negative row writes a row of zeros.
// x: [*, d] f32; rows: [n_rows] int32; out: [n_rows, d] f32.
// REQUIRES: d > 0, n_rows >= 0, every non-negative row within x; out does not overlap x.
cudaError_t launch_gather_rows(const float* x, int64_t d, const int32_t* rows, int64_t n_rows,
                               float* out, cudaStream_t stream);

}  // namespace cellm::cuda
