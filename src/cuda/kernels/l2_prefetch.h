// A kernel that asks the L2 for the leading bytes of every row of a matrix, so that a
// product launched later finds them there instead of in HBM. Each thread issues one bulk
// prefetch (cp.async.bulk.prefetch.L2, sm_90) a row and moves on; the fetches complete
// without the kernel. A hint only: it writes nothing, and no result depends on it.
// A decode graph runs it beside the attention, whose few blocks leave the HBM idle
// (CudaTuning::l2_prefetch).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace cellm::cuda {

// Prefetches bytes [0, lead) of each of `rows` rows of `row_bytes` starting at `base`,
// from `blocks` blocks of 128 threads. cudaErrorInvalidValue unless base, row_bytes and
// lead are multiples of 16 bytes, lead <= row_bytes, rows >= 0 and blocks > 0. A no-op
// before sm_90.
cudaError_t launch_l2_prefetch_rows(const void* base, int64_t rows, size_t row_bytes, size_t lead,
                                    int blocks, cudaStream_t stream);

}  // namespace cellm::cuda
