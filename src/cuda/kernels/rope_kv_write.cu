#include "cuda/kernels/rope_kv_write.h"

#include <cstdint>
#include <limits>

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/launch.cuh"

namespace cellm::cuda {
namespace {

// 512 threads: a row of Llama's 32 + 8 heads of 128 is 320 (head, pack) units, one per
// thread, so each thread's load, rotate and store happen once, not twice in a row.
constexpr int kThreads = 512;
constexpr int kMaxHalf = static_cast<int>(kMaxRopeKvWriteHeadDim / 2);

// One block per row. The row's angles are computed first, one (cos, sin) per j in
// [0, half), into shared memory: the precise cosf/sinf (their slow path at large
// positions) are most of a decode row's work, and every head shares them. The
// first `half` threads compute them (each loads its inv_freq before the wait for
// the previous kernel: inv_freq is written before any step) while the others copy
// V and store the table entry, which need no angle. Then each unit of work is N
// consecutive j of one head: the packs x[j, j + N) and x[j + half, + N) are rotated
// with rope.cu's arithmetic and stored back into qkv, and for a k head into its
// pool row too. N = 1 when the shapes or pointers allow no wider pack
// (launch_rope_kv_write).
template <typename T, int N>
__global__ void __launch_bounds__(kThreads)
    rope_kv_write_kernel(const RopeKvWriteParams<T> p, bool early) {
  static_assert(kMaxHalf <= kThreads, "each thread computes at most one angle");
  __shared__ float cos_j[kMaxHalf];
  __shared__ float sin_j[kMaxHalf];
  const int64_t r = blockIdx.x;
  const int tid = static_cast<int>(threadIdx.x);
  const int half = static_cast<int>(p.head_dim / 2);
  // Before the wait for the previous kernel: the step's positions and cells (uploaded
  // before the step's first kernel) and the frequencies (written at load) give the angles
  // while that kernel finishes.
  if (tid < half) {
    const float angle = static_cast<float>(p.positions[r]) * p.inv_freq[tid];  // as rope.cu
    cos_j[tid] = cosf(angle);
    sin_j[tid] = sinf(angle);
  }
  const int32_t cell = p.cells[r];
  detail::wait_and_allow(early);  // the next kernel may launch once every block is here

  const int64_t kv_dim = p.n_kv_heads * p.head_dim;
  T* row = p.qkv + r * p.row_stride;
  T* k_row = p.k_pool + int64_t{cell} * kv_dim;
  using Pack = detail::Pack<T, N>;
  const Pack* v_src = reinterpret_cast<const Pack*>(row + p.v_offset);
  Pack* v_dst = reinterpret_cast<Pack*>(p.v_pool + int64_t{cell} * kv_dim);
  for (int64_t i = tid; i < kv_dim / N; i += kThreads) v_dst[i] = v_src[i];  // bitwise
  if (p.table != nullptr && tid == 0) {
    p.table[int64_t{p.row_seq[r]} * p.table_stride + p.positions[r]] = cell;
  }
  __syncthreads();

  const int packs_per_half = half / N;
  const int units = static_cast<int>(p.n_heads + p.n_kv_heads) * packs_per_half;
  for (int u = tid; u < units; u += kThreads) {
    const int head = u / packs_per_half;
    const int j = (u - head * packs_per_half) * N;
    const bool is_k = head >= p.n_heads;
    const int64_t start = is_k ? p.k_offset + (head - p.n_heads) * p.head_dim
                               : p.q_offset + int64_t{head} * p.head_dim;
    T* x = row + start;
    float a[N];
    float b[N];
    detail::load_floats<N>(x + j, a);
    detail::load_floats<N>(x + j + half, b);
    float lo[N];
    float hi[N];
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const float c = cos_j[j + e];
      const float s = sin_j[j + e];
      // __fmul_rn / __fadd_rn are never contracted into an FMA (rope.cu's order).
      lo[e] = __fsub_rn(__fmul_rn(a[e], c), __fmul_rn(b[e], s));
      hi[e] = __fadd_rn(__fmul_rn(b[e], c), __fmul_rn(a[e], s));
    }
    detail::store_floats<N>(x + j, lo);
    detail::store_floats<N>(x + j + half, hi);
    if (is_k) {
      // The same rounding to T as the store above: the pool gets qkv's bits.
      T* k = k_row + (head - p.n_heads) * p.head_dim;
      detail::store_floats<N>(k + j, lo);
      detail::store_floats<N>(k + j + half, hi);
    }
  }
}

// True when packs of n elements tile every head half, row start and column range,
// and every base pointer is aligned to a pack (pool rows start at cell * kv_dim,
// a multiple of n when half is).
template <typename T>
bool packable(const RopeKvWriteParams<T>& p, int64_t n) {
  const size_t bytes = static_cast<size_t>(n) * sizeof(T);
  return (p.head_dim / 2) % n == 0 && p.row_stride % n == 0 && p.q_offset % n == 0 &&
         p.k_offset % n == 0 && p.v_offset % n == 0 && detail::aligned_to(p.qkv, bytes) &&
         detail::aligned_to(p.k_pool, bytes) && detail::aligned_to(p.v_pool, bytes);
}

template <typename T, int N>
cudaError_t launch_packed(const RopeKvWriteParams<T>& p, cudaStream_t stream) {
  return detail::launch_kernel(rope_kv_write_kernel<T, N>, static_cast<unsigned>(p.n_rows),
                               kThreads, 0, stream, p, detail::early_triggers());
}

// [a, a + a_len) and [b, b + b_len) share a column.
bool overlap(int64_t a, int64_t a_len, int64_t b, int64_t b_len) {
  return a_len > 0 && b_len > 0 && a < b + b_len && b < a + a_len;
}

}  // namespace

template <typename T>
cudaError_t launch_rope_kv_write(const RopeKvWriteParams<T>& p, cudaStream_t stream) {
  // REQUIRES: a well-formed shape (checked even for an empty step), then pointers.
  const int64_t hd = p.head_dim;
  if (p.n_rows < 0 || p.n_heads < 0 || p.n_kv_heads < 1 || hd < 2 || hd % 2 != 0 ||
      hd > kMaxRopeKvWriteHeadDim || p.row_stride < 0 || p.q_offset < 0 || p.k_offset < 0 ||
      p.v_offset < 0) {
    return cudaErrorInvalidValue;
  }
  // The kernel counts a row's (head, pack) units in int32.
  if (p.n_heads + p.n_kv_heads > std::numeric_limits<int32_t>::max() / hd) {
    return cudaErrorInvalidValue;
  }
  const int64_t q_len = p.n_heads * hd;
  const int64_t kv_len = p.n_kv_heads * hd;
  if (p.q_offset + q_len > p.row_stride || p.k_offset + kv_len > p.row_stride ||
      p.v_offset + kv_len > p.row_stride) {
    return cudaErrorInvalidValue;
  }
  // Overlapping ranges would rotate twice, or copy a V that is being rotated.
  if (overlap(p.q_offset, q_len, p.k_offset, kv_len) ||
      overlap(p.q_offset, q_len, p.v_offset, kv_len) ||
      overlap(p.k_offset, kv_len, p.v_offset, kv_len)) {
    return cudaErrorInvalidValue;
  }
  if (p.n_rows == 0) return cudaSuccess;
  if (p.n_rows > std::numeric_limits<int32_t>::max() || p.qkv == nullptr ||
      p.positions == nullptr || p.inv_freq == nullptr || p.cells == nullptr ||
      p.k_pool == nullptr || p.v_pool == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (p.table != nullptr && (p.row_seq == nullptr || p.table_stride <= 0)) {
    return cudaErrorInvalidValue;
  }
  // 16-byte packs when everything allows, else 8-byte ones, else single elements.
  constexpr int kWide = static_cast<int>(16 / sizeof(T));
  if (packable(p, kWide)) return launch_packed<T, kWide>(p, stream);
  if (packable(p, kWide / 2)) return launch_packed<T, kWide / 2>(p, stream);
  return launch_packed<T, 1>(p, stream);
}

template cudaError_t launch_rope_kv_write<float>(const RopeKvWriteParams<float>&, cudaStream_t);
template cudaError_t launch_rope_kv_write<__nv_bfloat16>(const RopeKvWriteParams<__nv_bfloat16>&,
                                                         cudaStream_t);

}  // namespace cellm::cuda
