// A kernel that reads a buffer end to end: run between the timed calls of GEMM tuning
// (gemm_tuning.h), it leaves the L2 holding the buffer's lines, so the next call reads
// its weights from HBM as a decode step does (each layer's weights evict the last's).
// It only reads (no dirty lines to write back while the next call runs); it writes the
// fold of what it read to `sink` (a scratch word) only when the fold equals one
// constant, so the loads are not optimised away. Launched with programmatic dependent
// launch, it lets the next kernel launch right after its wait, as the small kernels
// between a step's GEMMs do: a GEMV timed after it puts its first round of weight loads in
// flight early, as it does in a step.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace cellm::cuda {

// REQUIRES: buffer 16-byte aligned, bytes a multiple of 16; sink one writable uint32.
cudaError_t launch_l2_flush(const void* buffer, size_t bytes, uint32_t* sink, cudaStream_t stream);

}  // namespace cellm::cuda
