#include "cuda/kernels/rmsnorm.h"

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/e4m3.cuh"
#include "cuda/kernels/launch.cuh"

namespace cellm::cuda {
namespace {

using detail::kPack;

template <typename T>
struct AddRmsNormParams {
  float* residual;  // [m, d] f32, += delta when delta is set
  const T* delta;   // [m, d] or null
  const T* weight;  // [d]
  int64_t d;        // row width, elements
  float eps;
  T* out;                     // [m, d]
  bool residual_settled;      // launch_add_rmsnorm: the residual may be read before the wait
  uint8_t* x8 = nullptr;      // [m, d] e4m3 codes of out (launch_add_rmsnorm_e4m3)
  float* x8_scale = nullptr;  // [m]
};

// The f32 residual's N floats at p from the L2 (ld.global.cg: no L1 line that an earlier
// kernel left could answer a read made before the programmatic wait).
template <int N>
__device__ __forceinline__ void load_residual_l2(const float* p, float (&out)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(p + i));
      out[i] = v.x;
      out[i + 1] = v.y;
      out[i + 2] = v.z;
      out[i + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = __ldcg(p + i);
  }
}

// Packs of the weight row each thread holds in registers, loaded before the wait for
// the previous kernel (weights are written before any step); a wider row reads the
// rest in pass 2. 4 covers d = 8192 in packs of 4 at 512 threads.
constexpr int kHeldPacks = 4;

// One block per row. Pass 1 adds delta into the residual row and sums the squares,
// keeping the thread's first kHeldPacks packs in registers (each thread owns the same
// elements in both passes, so a wider row's later packs are re-read only where it wrote
// them); the block reduction separates it from pass 2, which writes the normalised row.
// With residual_settled the held packs of the residual are read before the wait, with the
// weights: in a decode step that read goes to the HBM (the weights streamed since have
// evicted the row from the L2), and after the wait it would queue behind the next
// product's weight stream; delta, just written, comes from the L2 after the wait.
// kE4m3 (launch_add_rmsnorm_e4m3): the written row, as T, is also quantized to e4m3 with
// launch_quantize_rows_e4m3's arithmetic: the block's maximum of |out| folded after pass 2,
// then the codes of the held packs from registers and of the rest from the row just written
// (by the same threads).
template <typename T, int N, bool kE4m3>
__global__ void add_rmsnorm_kernel(AddRmsNormParams<T> p, bool early) {
  const int64_t row = blockIdx.x;
  float* res = p.residual + row * p.d;
  const T* delta = p.delta != nullptr ? p.delta + row * p.d : nullptr;
  T* out = p.out + row * p.d;
  const int64_t begin = int64_t{threadIdx.x} * N;
  const int64_t step = int64_t{blockDim.x} * N;

  float held[kHeldPacks][N] = {};
  float kept[kHeldPacks][N] = {};
#pragma unroll
  for (int k = 0; k < kHeldPacks; ++k) {
    const int64_t c = begin + k * step;
    if (c < p.d) detail::load_floats<N>(p.weight + c, held[k]);
    if (c < p.d && p.residual_settled) load_residual_l2<N>(res + c, kept[k]);
  }
  detail::wait_and_allow(early);  // the next kernel may launch once every block is here

  // Pass 1, over the thread's packs in the order one loop would take them: the first
  // kHeldPacks stay in registers for pass 2 (no second read of the row).
  float sum_sq = 0.0f;
  const auto add_pack = [&](int64_t c, float(&r)[N], bool loaded) {
    if (!loaded) detail::load_floats<N>(res + c, r);
    if (delta != nullptr) {
      float dl[N];
      detail::load_floats<N>(delta + c, dl);
#pragma unroll
      for (int j = 0; j < N; ++j) r[j] += dl[j];
      detail::store_floats<N>(res + c, r);
    }
#pragma unroll
    for (int j = 0; j < N; ++j) sum_sq += r[j] * r[j];
  };
#pragma unroll
  for (int k = 0; k < kHeldPacks; ++k) {
    const int64_t c = begin + k * step;
    if (c < p.d) add_pack(c, kept[k], p.residual_settled);
  }
  for (int64_t c = begin + kHeldPacks * step; c < p.d; c += step) {
    float r[N];
    add_pack(c, r, false);
  }
  const float total = detail::block_sum(sum_sq);
  const float inv_rms = 1.0f / sqrtf(total / static_cast<float>(p.d) + p.eps);

  float amax = 0.0f;  // kE4m3: of the row as written (rounded to T)
  const auto track = [&](float(&o)[N]) {
    if constexpr (kE4m3) {
#pragma unroll
      for (int j = 0; j < N; ++j) {
        o[j] = detail::to_float(detail::from_float<T>(o[j]));
        amax = fmaxf(amax, fabsf(o[j]));
      }
    }
  };
#pragma unroll
  for (int k = 0; k < kHeldPacks; ++k) {
    const int64_t c = begin + k * step;
    if (c < p.d) {
      float o[N];
#pragma unroll
      for (int j = 0; j < N; ++j) o[j] = kept[k][j] * inv_rms * held[k][j];
      detail::store_floats<N>(out + c, o);
      track(o);
#pragma unroll
      for (int j = 0; j < N; ++j) kept[k][j] = o[j];  // kE4m3: the pack's codes come from here
    }
  }
  for (int64_t c = begin + kHeldPacks * step; c < p.d; c += step) {
    float r[N], w[N], o[N];
    detail::load_floats<N>(res + c, r);
    detail::load_floats<N>(p.weight + c, w);
#pragma unroll
    for (int j = 0; j < N; ++j) o[j] = r[j] * inv_rms * w[j];
    detail::store_floats<N>(out + c, o);
    track(o);
  }
  if constexpr (kE4m3) {
    static_assert(N == 4, "a pack's four codes are one 32-bit store");
    const float scale = detail::e4m3_row_scale(detail::block_amax(amax));
    if (threadIdx.x == 0) p.x8_scale[row] = scale;
    uint8_t* codes = p.x8 + row * p.d;
#pragma unroll
    for (int k = 0; k < kHeldPacks; ++k) {
      const int64_t c = begin + k * step;
      if (c < p.d) *reinterpret_cast<uint32_t*>(codes + c) = detail::e4m3x4(kept[k], scale);
    }
    for (int64_t c = begin + kHeldPacks * step; c < p.d; c += step) {
      float o[N];
      detail::load_floats<N>(out + c, o);
      *reinterpret_cast<uint32_t*>(codes + c) = detail::e4m3x4(o, scale);
    }
  }
}

template <typename T>
struct HeadRmsNormParams {
  T* x;                // rows of row_stride elements
  int64_t m;           // rows
  int64_t row_stride;  // elements between rows
  int64_t offset;      // first element of head 0 within a row
  int64_t n_heads;
  int64_t head_dim;
  const T* weight;  // [head_dim]
  float eps;
};

// Elements of the weight each lane holds in registers, loaded before the wait for the
// previous kernel; 4 covers head_dim = 128, a wider head reads the rest in the loop.
constexpr int kHeldHeadWeights = 4;

// One warp per (row, head), heads of a row adjacent; lanes stride over head_dim.
template <typename T>
__global__ void head_rmsnorm_kernel(HeadRmsNormParams<T> p, bool early) {
  const int lane = static_cast<int>(threadIdx.x & 31u);
  float held[kHeldHeadWeights] = {};
#pragma unroll
  for (int k = 0; k < kHeldHeadWeights; ++k) {
    const int64_t c = lane + 32 * k;
    if (c < p.head_dim) held[k] = detail::to_float(p.weight[c]);
  }
  detail::wait_and_allow(early);  // the next kernel may launch once every block is here

  const int64_t unit = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
  if (unit >= p.m * p.n_heads) return;  // uniform over the warp: blockDim.x % 32 == 0
  const int64_t row = unit / p.n_heads;
  const int64_t head = unit % p.n_heads;
  T* x = p.x + row * p.row_stride + p.offset + head * p.head_dim;

  float sum_sq = 0.0f;
  for (int64_t c = lane; c < p.head_dim; c += 32) {
    const float v = detail::to_float(x[c]);
    sum_sq += v * v;
  }
  const float total = detail::warp_sum(sum_sq);
  const float inv_rms = 1.0f / sqrtf(total / static_cast<float>(p.head_dim) + p.eps);
#pragma unroll
  for (int k = 0; k < kHeldHeadWeights; ++k) {
    const int64_t c = lane + 32 * k;
    if (c < p.head_dim) x[c] = detail::from_float<T>(detail::to_float(x[c]) * inv_rms * held[k]);
  }
  for (int64_t c = lane + 32 * kHeldHeadWeights; c < p.head_dim; c += 32) {
    x[c] = detail::from_float<T>(detail::to_float(x[c]) * inv_rms * detail::to_float(p.weight[c]));
  }
}

}  // namespace

template <typename T>
cudaError_t launch_add_rmsnorm(float* residual, const T* delta, const T* weight, int64_t m,
                               int64_t d, float eps, T* out, cudaStream_t stream,
                               ResidualWriter writer) {
  if (m < 0 || d <= 0 || !(eps >= 0.0f) || m > 0x7fffffff) return cudaErrorInvalidValue;
  if (writer != ResidualWriter::kPreviousKernel && writer != ResidualWriter::kEarlierKernel) {
    return cudaErrorInvalidValue;
  }
  if (m == 0) return cudaSuccess;
  if (residual == nullptr || weight == nullptr || out == nullptr) return cudaErrorInvalidValue;
  const bool early_residual = writer == ResidualWriter::kEarlierKernel;
  const AddRmsNormParams<T> p{residual, delta, weight, d, eps, out, early_residual};
  const bool packed = d % kPack == 0 && detail::aligned_to(residual, sizeof(float) * kPack) &&
                      detail::aligned_to(delta, sizeof(T) * kPack) &&
                      detail::aligned_to(weight, sizeof(T) * kPack) &&
                      detail::aligned_to(out, sizeof(T) * kPack);
  const int threads = detail::threads_for_row(packed ? d / kPack : d, 512);
  const auto blocks = static_cast<unsigned>(m);
  return packed ? detail::launch_kernel(add_rmsnorm_kernel<T, kPack, false>, blocks, threads, 0,
                                        stream, p, detail::early_triggers())
                : detail::launch_kernel(add_rmsnorm_kernel<T, 1, false>, blocks, threads, 0, stream,
                                        p, detail::early_triggers());
}

bool add_rmsnorm_e4m3_supports(int64_t d, const float* residual, const __nv_bfloat16* delta,
                               const __nv_bfloat16* weight, const __nv_bfloat16* out,
                               const uint8_t* x8, const float* x8_scale) {
  return d > 0 && d % 16 == 0 && residual != nullptr && weight != nullptr && out != nullptr &&
         x8 != nullptr && x8_scale != nullptr &&
         detail::aligned_to(residual, sizeof(float) * kPack) &&
         detail::aligned_to(delta, sizeof(__nv_bfloat16) * kPack) &&
         detail::aligned_to(weight, sizeof(__nv_bfloat16) * kPack) &&
         detail::aligned_to(out, sizeof(__nv_bfloat16) * kPack) && detail::aligned_to(x8, 16) &&
         detail::aligned_to(x8_scale, 4);
}

cudaError_t launch_add_rmsnorm_e4m3(float* residual, const __nv_bfloat16* delta,
                                    const __nv_bfloat16* weight, int64_t m, int64_t d, float eps,
                                    __nv_bfloat16* out, uint8_t* x8, float* x8_scale,
                                    cudaStream_t stream, ResidualWriter writer) {
  if (m < 0 || !(eps >= 0.0f) || m > 0x7fffffff ||
      !add_rmsnorm_e4m3_supports(d, residual, delta, weight, out, x8, x8_scale)) {
    return cudaErrorInvalidValue;
  }
  if (writer != ResidualWriter::kPreviousKernel && writer != ResidualWriter::kEarlierKernel) {
    return cudaErrorInvalidValue;
  }
  if (m == 0) return cudaSuccess;
  AddRmsNormParams<__nv_bfloat16> p{
      residual, delta, weight, d, eps, out, writer == ResidualWriter::kEarlierKernel};
  p.x8 = x8;
  p.x8_scale = x8_scale;
  const int threads = detail::threads_for_row(d / kPack, 512);
  return detail::launch_kernel(add_rmsnorm_kernel<__nv_bfloat16, kPack, true>,
                               static_cast<unsigned>(m), threads, 0, stream, p,
                               detail::early_triggers());
}

template <typename T>
cudaError_t launch_head_rmsnorm(T* x, int64_t m, int64_t row_stride, int64_t offset,
                                int64_t n_heads, int64_t head_dim, const T* weight, float eps,
                                cudaStream_t stream) {
  if (m < 0 || n_heads < 0 || head_dim <= 0 || offset < 0 || !(eps >= 0.0f) ||
      offset + n_heads * head_dim > row_stride) {
    return cudaErrorInvalidValue;
  }
  const int64_t units = m * n_heads;
  if (units == 0) return cudaSuccess;
  if (x == nullptr || weight == nullptr) return cudaErrorInvalidValue;
  constexpr int kThreads = 256;  // 8 warps, one (row, head) each
  constexpr int64_t kUnitsPerBlock = kThreads / 32;
  const int64_t blocks = (units + kUnitsPerBlock - 1) / kUnitsPerBlock;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  return detail::launch_kernel(
      head_rmsnorm_kernel<T>, static_cast<unsigned>(blocks), kThreads, 0, stream,
      HeadRmsNormParams<T>{x, m, row_stride, offset, n_heads, head_dim, weight, eps},
      detail::early_triggers());
}

template cudaError_t launch_add_rmsnorm<float>(float*, const float*, const float*, int64_t, int64_t,
                                               float, float*, cudaStream_t, ResidualWriter);
template cudaError_t launch_add_rmsnorm<__nv_bfloat16>(float*, const __nv_bfloat16*,
                                                       const __nv_bfloat16*, int64_t, int64_t,
                                                       float, __nv_bfloat16*, cudaStream_t,
                                                       ResidualWriter);
template cudaError_t launch_head_rmsnorm<float>(float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                                                const float*, float, cudaStream_t);
template cudaError_t launch_head_rmsnorm<__nv_bfloat16>(__nv_bfloat16*, int64_t, int64_t, int64_t,
                                                        int64_t, int64_t, const __nv_bfloat16*,
                                                        float, cudaStream_t);

}  // namespace cellm::cuda
