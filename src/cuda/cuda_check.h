// CUDA and cuBLASLt errors as cellm Status values (DESIGN.md §10: CUDA errors
// become a Status at the executor boundary).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>

#include "cellm/status.h"

namespace cellm::cuda {

// Ok for cudaSuccess, else Internal "<what>: <cuda error name>: <description>".
inline Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return Internal(std::string(what) + ": " + cudaGetErrorName(err) + ": " +
                  cudaGetErrorString(err));
}

inline Status cublas_status(cublasStatus_t err, const char* what) {
  if (err == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return Internal(std::string(what) + ": cuBLASLt status " + std::to_string(static_cast<int>(err)));
}

// True when a CUDA device can be used by this process.
inline bool gpu_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

}  // namespace cellm::cuda

#define CELLM_CUDA_RETURN_IF_ERROR(expr, what) \
  CELLM_RETURN_IF_ERROR(::cellm::cuda::cuda_status((expr), (what)))
#define CELLM_CUBLAS_RETURN_IF_ERROR(expr, what) \
  CELLM_RETURN_IF_ERROR(::cellm::cuda::cublas_status((expr), (what)))
