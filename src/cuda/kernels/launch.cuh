// How cellm's kernels are launched: programmatic dependent launch (PDL, sm_90+).
//
// A kernel launched with launch_kernel may start while the kernel before it on the
// stream is still finishing: its blocks are scheduled once every block of the previous
// kernel has called allow_dependent_grids() or exited, so its launch latency and
// prologue overlap the previous kernel's tail. The contract that keeps this correct:
//
//   * every kernel launched through launch_kernel calls wait_for_prior_grids() before
//     its first access to memory that an earlier kernel of the stream writes or reads
//     (activations, K/V, the cell table, step metadata, workspaces). Reading weights
//     (written once, before any step) before the wait is allowed. The wait returns
//     when the previous kernel has completed and its writes are visible; since that
//     kernel waited for its own predecessor, the whole prefix of the stream is done.
//   * allow_dependent_grids() only lets the next kernel be scheduled early; it never
//     publishes data, so a kernel may call it anywhere. The next kernel launches once
//     every block of this one has called it or exited (blocks not yet running have not),
//     so its waiting blocks never take the slots of this kernel's unlaunched blocks.
//     The small kernels between the decode GEMMs call it right after their wait, so a
//     GEMV behind them is resident and streaming weights while they run; the GEMV and
//     attention kernels call it once their main loop is issued.
//
// Early triggers (set_early_triggers, launch_control.h): the small kernels and the
// attention then call allow_dependent_grids() before their wait instead of after it (or
// after the main loop), so the kernel behind them becomes resident, and streams its
// weights, while the kernel before them is still running. Whether that wins depends on
// the model and the batch: the decode graphs are captured both ways and timed.
//
// Kernels that are not ours (cuBLASLt) are launched normally and wait for everything
// before them; a kernel of ours after them still overlaps their tail with its launch.
// Both instructions are no-ops for a kernel launched without the attribute, so the same
// kernels serve eager launches, captured CUDA graphs (the programmatic edges are
// captured) and devices older than sm_90 (the attribute is then not set).
//
// set_programmatic_launch(false) turns the attribute off process-wide (for measuring
// what PDL buys; `cellm bench --no-pdl`).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "cuda/launch_control.h"

namespace cellm::cuda {
namespace detail {

// True when the current device is sm_90 or newer (PDL, thread block clusters; cached per
// device).
bool device_is_sm90();

// True when the current device supports PDL and it is enabled.
bool use_programmatic_launch();

// *sms = the current device's SM count (cached per device).
cudaError_t sm_count(int* sms);

__device__ __forceinline__ void wait_for_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_dependent_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The wait of a small kernel, with its trigger before (`early`) or right after it.
__device__ __forceinline__ void wait_and_allow(bool early) {
  if (early) allow_dependent_grids();
  wait_for_prior_grids();
  if (!early) allow_dependent_grids();
}

// Whether the kernels launched now by this thread trigger early (launch_control.h).
bool early_triggers();

// kernel<<<grid, block, smem, stream>>>(args...), with the PDL attribute when
// use_programmatic_launch(). Returns the launch's error.
// With `cluster` other than 1 x 1 x 1, the blocks are launched in thread block clusters
// of that shape (sm_90; the grid a multiple of it).
template <typename... Params, typename... Args>
cudaError_t launch_kernel_in_clusters(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                      cudaStream_t stream, dim3 cluster, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attributes[2];
  unsigned count = 0;
  if (use_programmatic_launch()) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  if (cluster.x * cluster.y * cluster.z > 1) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count].val.clusterDim.x = cluster.x;
    attributes[count].val.clusterDim.y = cluster.y;
    attributes[count].val.clusterDim.z = cluster.z;
    ++count;
  }
  config.attrs = count > 0 ? attributes : nullptr;
  config.numAttrs = count;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                          cudaStream_t stream, Args&&... args) {
  return launch_kernel_in_clusters(kernel, grid, block, smem, stream, dim3(1, 1, 1),
                                   std::forward<Args>(args)...);
}

}  // namespace detail
}  // namespace cellm::cuda
