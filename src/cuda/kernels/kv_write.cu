#include "cuda/kernels/kv_write.h"

#include <cuda_bf16.h>

#include "cuda/kernels/launch.cuh"

namespace cellm::cuda {
namespace {

constexpr int kThreads = 128;

// One block per row. Unit is the copied word: T itself, or uint4 (16 bytes) when
// every row start is 16-byte aligned; units_per_row = kv_dim * sizeof(T) / sizeof(Unit).
// The copy is bitwise, so both paths write exactly the source values.
template <typename Unit>
__global__ void __launch_bounds__(kThreads)
    kv_write_kernel(const Unit* __restrict__ qkv, int64_t row_stride_units, int64_t k_offset_units,
                    int64_t v_offset_units, int64_t units_per_row,
                    const int32_t* __restrict__ cells, const int32_t* __restrict__ row_seq,
                    const int32_t* __restrict__ positions, Unit* __restrict__ k_pool,
                    Unit* __restrict__ v_pool, int32_t* __restrict__ table, int64_t table_stride) {
  detail::wait_for_prior_grids();
  const int64_t r = blockIdx.x;
  const int32_t cell = cells[r];
  const Unit* src = qkv + r * row_stride_units;
  Unit* k_dst = k_pool + int64_t{cell} * units_per_row;
  Unit* v_dst = v_pool + int64_t{cell} * units_per_row;
  for (int64_t i = threadIdx.x; i < units_per_row; i += kThreads) {
    k_dst[i] = src[k_offset_units + i];
    v_dst[i] = src[v_offset_units + i];
  }
  detail::allow_dependent_grids();
  if (table != nullptr && threadIdx.x == 0) {
    table[int64_t{row_seq[r]} * table_stride + positions[r]] = cell;
  }
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

template <typename T>
cudaError_t launch_kv_write(const T* qkv, int64_t n, int64_t row_stride, int64_t k_offset,
                            int64_t v_offset, int64_t kv_dim, const int32_t* cells,
                            const int32_t* row_seq, const int32_t* positions, T* k_pool, T* v_pool,
                            int32_t* table, int64_t table_stride, cudaStream_t stream) {
  if (n < 0 || kv_dim <= 0 || k_offset < 0 || v_offset < 0 || k_offset + kv_dim > row_stride ||
      v_offset + kv_dim > row_stride) {
    return cudaErrorInvalidValue;
  }
  if (n == 0) return cudaSuccess;
  if (n > 0x7fffffff || qkv == nullptr || cells == nullptr || k_pool == nullptr ||
      v_pool == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (table != nullptr && (row_seq == nullptr || positions == nullptr || table_stride <= 0)) {
    return cudaErrorInvalidValue;
  }
  constexpr int64_t kVec = 16 / sizeof(T);
  const bool vec = kv_dim % kVec == 0 && row_stride % kVec == 0 && k_offset % kVec == 0 &&
                   v_offset % kVec == 0 && aligned16(qkv) && aligned16(k_pool) && aligned16(v_pool);
  const dim3 grid(static_cast<unsigned>(n));
  if (vec) {
    return detail::launch_kernel(kv_write_kernel<uint4>, grid, kThreads, 0, stream,
                                 reinterpret_cast<const uint4*>(qkv), row_stride / kVec,
                                 k_offset / kVec, v_offset / kVec, kv_dim / kVec, cells, row_seq,
                                 positions, reinterpret_cast<uint4*>(k_pool),
                                 reinterpret_cast<uint4*>(v_pool), table, table_stride);
  }
  return detail::launch_kernel(kv_write_kernel<T>, grid, kThreads, 0, stream, qkv, row_stride,
                               k_offset, v_offset, kv_dim, cells, row_seq, positions, k_pool,
                               v_pool, table, table_stride);
}

#define CELLM_INSTANTIATE_KV_WRITE(T)                                                             \
  template cudaError_t launch_kv_write<T>(const T*, int64_t, int64_t, int64_t, int64_t, int64_t,  \
                                          const int32_t*, const int32_t*, const int32_t*, T*, T*, \
                                          int32_t*, int64_t, cudaStream_t);
CELLM_INSTANTIATE_KV_WRITE(float)
CELLM_INSTANTIATE_KV_WRITE(__nv_bfloat16)
#undef CELLM_INSTANTIATE_KV_WRITE

}  // namespace cellm::cuda
