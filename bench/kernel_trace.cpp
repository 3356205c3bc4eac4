// A CUDA injection library that writes every kernel's start and end on the GPU to a CSV
// file, kernels inside CUDA graphs included, without serialising them (CUPTI's concurrent
// kernel activity): what Nsight Systems' graph node tracing shows, for machines without it.
//   CUDA_INJECTION64_PATH=/path/libkernel_trace.so CELLM_KERNEL_TRACE=out.csv PROGRAM...
// The driver loads the library at the process's first CUDA call and calls
// InitializeInjection(); the records are flushed at exit. Columns: start_ns, end_ns,
// stream, graph_node, name. bench/timeline_summary.py reads the file.
#include <cupti.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace {

std::FILE* g_out = nullptr;
std::mutex g_mutex;
constexpr size_t kBufferBytes = 8 << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = kBufferBytes;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lock(g_mutex);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || g_out == nullptr) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    std::fprintf(g_out, "%llu,%llu,%u,%llu,%s\n", static_cast<unsigned long long>(k->start),
                 static_cast<unsigned long long>(k->end), k->streamId,
                 static_cast<unsigned long long>(k->graphNodeId),
                 k->name != nullptr ? k->name : "?");
  }
  std::free(buffer);
}

void flush_at_exit() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_out != nullptr) std::fclose(g_out);
  g_out = nullptr;
}

}  // namespace

extern "C" int InitializeInjection() {
  const char* path = std::getenv("CELLM_KERNEL_TRACE");
  g_out = std::fopen(path != nullptr ? path : "kernel_trace.csv", "w");
  if (g_out == nullptr) return 0;
  std::fprintf(g_out, "start_ns,end_ns,stream,graph_node,name\n");
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "kernel_trace: CUPTI activity tracing unavailable\n");
    return 0;
  }
  std::atexit(flush_at_exit);
  return 1;
}
