#include "cpu/kernels/rmsnorm.h"

#include <cmath>

#include "cellm/status.h"
#include "cpu/kernels/simd.h"

namespace cellm::cpu {
namespace {

using simd::kLanes;
using simd::Vf;

constexpr int64_t kSerialElements = 1 << 15;  // below this, one thread does all rows

template <DType T>
void norm_row(const float* x, int64_t d, const simd::Storage<T>* w, float eps, float* out) {
  Vf ss = simd::zero();
  int64_t i = 0;
  for (; i + kLanes <= d; i += kLanes) {
    const Vf v = simd::load<DType::kF32>(x + i);
    ss = simd::fma(v, v, ss);
  }
  if (i < d) {
    const Vf v = simd::load_partial<DType::kF32>(x + i, static_cast<int>(d - i));
    ss = simd::fma(v, v, ss);
  }
  const float mean = simd::reduce_add(ss) / static_cast<float>(d);
  const Vf r = simd::set1(1.0f / std::sqrt(mean + eps));
  for (i = 0; i + kLanes <= d; i += kLanes) {
    simd::store(out + i,
                simd::mul(simd::mul(simd::load<DType::kF32>(x + i), r), simd::load<T>(w + i)));
  }
  if (i < d) {
    const int n = static_cast<int>(d - i);
    simd::store_partial(out + i,
                        simd::mul(simd::mul(simd::load_partial<DType::kF32>(x + i, n), r),
                                  simd::load_partial<T>(w + i, n)),
                        n);
  }
}

void add_row(float* h, const float* x, int64_t d) {
  int64_t i = 0;
  for (; i + kLanes <= d; i += kLanes) {
    simd::store(h + i, simd::add(simd::load<DType::kF32>(h + i), simd::load<DType::kF32>(x + i)));
  }
  for (; i < d; ++i) h[i] += x[i];
}

template <DType T>
void norm_rows(ThreadPool& pool, float* h, const float* x, int64_t m, int64_t d, TypedPtr weight,
               float eps, float* out) {
  const auto* w = static_cast<const simd::Storage<T>*>(weight.data);
  const auto rows = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (h != nullptr) {
        add_row(h + i * d, x + i * d, d);
        norm_row<T>(h + i * d, d, w, eps, out + i * d);
      } else {
        norm_row<T>(x + i * d, d, w, eps, out + i * d);
      }
    }
  };
  if (m * d < kSerialElements) {
    rows(0, m);
  } else {
    pool.parallel_for(m, rows);
  }
}

void dispatch(ThreadPool& pool, float* h, const float* x, int64_t m, int64_t d, TypedPtr weight,
              float eps, float* out) {
  CELLM_CHECK(m >= 0 && d > 0 && eps >= 0.0f);
  if (m == 0) return;
  CELLM_CHECK(x != nullptr && out != nullptr && weight.data != nullptr);
  switch (weight.dtype) {
    case DType::kF32:
      return norm_rows<DType::kF32>(pool, h, x, m, d, weight, eps, out);
    case DType::kF16:
      return norm_rows<DType::kF16>(pool, h, x, m, d, weight, eps, out);
    case DType::kBF16:
      return norm_rows<DType::kBF16>(pool, h, x, m, d, weight, eps, out);
    case DType::kF8E4M3:
      CELLM_CHECK_MSG(false, "rmsnorm: F8_E4M3 norm weights are not supported");
  }
}

}  // namespace

void rmsnorm(ThreadPool& pool, const float* x, int64_t m, int64_t d, TypedPtr weight, float eps,
             float* out) {
  dispatch(pool, nullptr, x, m, d, weight, eps, out);
}

void add_rmsnorm(ThreadPool& pool, float* h, const float* x, int64_t m, int64_t d, TypedPtr weight,
                 float eps, float* out) {
  CELLM_CHECK(h != nullptr);
  dispatch(pool, h, x, m, d, weight, eps, out);
}

}  // namespace cellm::cpu
