// Edges of a captured decode graph after kernels that are not cellm's (cuBLASLt's).
//
// A cellm kernel launched with programmatic dependent launch waits for its predecessor
// (griddepcontrol.wait) before it touches the step's data, so it may start as early as
// any kernel before it has begun. Behind one of cellm's kernels it starts when that
// kernel's blocks trigger (kernels/launch.cuh); behind a cuBLASLt kernel, which triggers
// nothing, only when every block of it has finished. launch_after_foreign_start rewrites
// those edges to fire once every block of the cuBLASLt kernel has started
// (cudaGraphKernelNodePortLaunchCompletion), so the cellm kernel behind it is resident,
// and streams its weights, during the GEMM's tail.
#pragma once

#include <cuda_runtime.h>

#include "cellm/status.h"

namespace cellm::cuda {

// Rewrites every programmatic edge of `graph` (its downstream kernel was launched with
// cudaLaunchAttributeProgrammaticStreamSerialization, so it waits for its predecessors)
// whose upstream kernel was launched without programmatic launch (it entered the graph
// behind ordinary edges only; a root is left alone) into one from the upstream's
// launch-completion port. Returns how many edges it rewrote. In a decode graph those
// upstream kernels are cuBLASLt's and the embedding (behind the step's metadata copy,
// a memcpy node): the rewrite is correct for any upstream, since the downstream kernel
// waits for it to complete either way.
Result<int> launch_after_foreign_start(cudaGraph_t graph);

}  // namespace cellm::cuda
