// Timing of device calls as decode runs them, shared by the device micro benchmarks:
// the calls recorded in one CUDA graph and replayed. A failure of the runtime aborts
// with what failed (a benchmark has no one to hand an error to).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <string>

#include "cellm/status.h"
#include "cuda/device_memory.h"

namespace cellm::bench {

inline void check(cudaError_t err, const char* what) {
  CELLM_CHECK_MSG(err == cudaSuccess, std::string(what) + ": " + cudaGetErrorString(err));
}
inline void check(const Status& s) {
  CELLM_CHECK_MSG(s.ok(), s.to_string());
}

// Microseconds per call of enqueue(i, stream) for i in [0, iters), recorded in one graph;
// the best of 5 replays after a warm one.
inline double time_per_call(int iters, const std::function<void(int, cudaStream_t)>& enqueue) {
  Result<cuda::Stream> stream = cuda::Stream::create();
  check(stream.status());
  const cudaStream_t s = stream->get();
  check(cudaDeviceSynchronize(), "sync");
  check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "begin capture");
  for (int i = 0; i < iters; ++i) enqueue(i, s);
  cudaGraph_t graph = nullptr;
  check(cudaStreamEndCapture(s, &graph), "end capture");
  cudaGraphExec_t exec_handle = nullptr;
  check(cudaGraphInstantiate(&exec_handle, graph, 0), "instantiate");
  cudaGraphDestroy(graph);
  const cuda::GraphExec exec(exec_handle);
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  check(cudaGraphLaunch(exec.get(), s), "warm replay");
  float best_ms = 1e30f;
  for (int r = 0; r < 5; ++r) {
    check(cudaEventRecord(start, s), "record");
    check(cudaGraphLaunch(exec.get(), s), "replay");
    check(cudaEventRecord(stop, s), "record");
    check(cudaEventSynchronize(stop), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    best_ms = std::min(best_ms, ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return 1e3 * best_ms / iters;
}

}  // namespace cellm::bench
