#include "cuda/kernels/logit_adjust.h"

#include "cuda/kernels/launch.cuh"

namespace cellm::cuda {
namespace {

constexpr int kThreads = 256;

struct LogitAdjustParams {
  float* logits;  // [n_rows, vocab]
  int64_t n_rows;
  int64_t vocab;
  const LogitAdjustRow* rows;
  const uint64_t* masks;
  const DeviceLogitEdit* edits;
};

__device__ __forceinline__ bool allowed(const uint64_t* mask, int32_t words, int64_t t) {
  const int64_t w = t / 64;
  return w < words && ((mask[w] >> (t % 64)) & 1u) != 0;
}

// The host's edit, each operation rounded on its own (no contraction into an FMA).
__device__ __forceinline__ float edited(float x, float scale, float bias) {
  const float scaled = x > 0.0f ? __fdiv_rn(x, scale) : __fmul_rn(x, scale);
  return __fadd_rn(scaled, bias);
}

__global__ void logit_adjust_kernel(LogitAdjustParams p) {
  detail::wait_for_prior_grids();
  detail::allow_dependent_grids();
  const LogitAdjustRow row = p.rows[blockIdx.y];
  if (row.logits_row < 0 || row.logits_row >= p.n_rows) return;
  float* x = p.logits + row.logits_row * p.vocab;
  const uint64_t* mask = p.masks + row.first_word;
  const bool masked = row.mask_words > 0;
  if (masked) {
    const int64_t begin = int64_t{blockIdx.x} * kAdjustChunkTokens;
    const int64_t end = begin + kAdjustChunkTokens < p.vocab ? begin + kAdjustChunkTokens : p.vocab;
    for (int64_t t = begin + threadIdx.x; t < end; t += blockDim.x) {
      if (!allowed(mask, row.mask_words, t)) x[t] = -__int_as_float(0x7f800000);
    }
  }
  if (blockIdx.x != 0 || row.n_edits == 0) return;
  const DeviceLogitEdit* e = p.edits + row.first_edit;
  const auto apply = [&](const DeviceLogitEdit& edit) {
    if (edit.token < 0 || edit.token >= p.vocab) return;
    if (masked && !allowed(mask, row.mask_words, edit.token)) return;
    x[edit.token] = edited(x[edit.token], edit.scale, edit.bias);
  };
  if (row.in_order != 0) {
    if (threadIdx.x == 0) {
      for (int32_t i = 0; i < row.n_edits; ++i) apply(e[i]);
    }
    return;
  }
  for (int32_t i = static_cast<int32_t>(threadIdx.x); i < row.n_edits;
       i += static_cast<int32_t>(blockDim.x)) {
    apply(e[i]);
  }
}

}  // namespace

cudaError_t launch_logit_adjust(float* logits, int64_t n_rows, int64_t vocab,
                                const LogitAdjustRow* rows, int32_t n_adjusted,
                                const uint64_t* masks, const DeviceLogitEdit* edits,
                                cudaStream_t stream) {
  if (vocab < 1 || n_rows < 0 || n_adjusted < 0) return cudaErrorInvalidValue;
  if (n_adjusted == 0) return cudaSuccess;
  if (logits == nullptr || rows == nullptr) return cudaErrorInvalidValue;
  if (n_adjusted > 65535) return cudaErrorInvalidValue;  // grid.y
  const auto chunks = static_cast<unsigned>((vocab + kAdjustChunkTokens - 1) / kAdjustChunkTokens);
  return detail::launch_kernel(logit_adjust_kernel, dim3(chunks, static_cast<unsigned>(n_adjusted)),
                               kThreads, 0, stream,
                               LogitAdjustParams{logits, n_rows, vocab, rows, masks, edits});
}

}  // namespace cellm::cuda
