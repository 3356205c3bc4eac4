#include "cuda/gemm.h"

#include <string>
#include <type_traits>
#include <utility>

#include "cuda/cuda_check.h"
#include "cuda/kernels/bias.h"
#include "cuda/kernels/gemv.h"
#include "cuda/kernels/swiglu.h"

namespace cellm::cuda {
namespace {

template <typename T>
inline constexpr cudaDataType_t kCudaType = CUDA_R_32F;
template <>
inline constexpr cudaDataType_t kCudaType<__nv_bfloat16> = CUDA_R_16BF;

// The largest power of two up to 256 that divides the address; 0 for null.
uint32_t alignment_of(const void* p) {
  if (p == nullptr) return 0;
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && address % align != 0) align >>= 1;
  return align;
}

const char* type_name(int t) {
  return static_cast<cudaDataType_t>(t) == CUDA_R_16BF ? "bf16" : "f32";
}

}  // namespace

// Descriptors of one call shape and the algorithm cuBLASLt's heuristic chose for it.
struct Gemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr;  // wc [k, n], ld k
  cublasLtMatrixLayout_t b = nullptr;  // xc [k, m], ld k
  cublasLtMatrixLayout_t d = nullptr;  // yc [n, m], ld n (also C, with beta = 0)
  cublasLtMatmulPreference_t preference = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool bias_in_epilogue = false;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (preference != nullptr) cublasLtMatmulPreferenceDestroy(preference);
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
};

namespace {

std::string describe(int a_type, int out_type, int64_t m, int64_t n, int64_t k, bool bias) {
  return std::string("gemm ") + type_name(a_type) + "->" + type_name(out_type) +
         " m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
         (bias ? " +bias" : "");
}

template <typename V>
cublasStatus_t set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                        const V& value) {
  return cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value));
}

template <typename V>
cublasStatus_t set_pref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
                        const V& value) {
  return cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value));
}

}  // namespace

Gemm::Gemm(GemmPath path) : path_(path) {}

Result<Gemm> Gemm::create(size_t workspace_bytes, GemmPath path) {
  Gemm gemm(path);
  CELLM_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&gemm.handle_), "cublasLtCreate");
  CELLM_ASSIGN_OR_RETURN(gemm.workspace_, DeviceBuffer::allocate(workspace_bytes));
  return gemm;
}

Gemm::Gemm(Gemm&& other) noexcept
    : path_(other.path_),
      handle_(std::exchange(other.handle_, nullptr)),
      workspace_(std::move(other.workspace_)),
      plans_(std::move(other.plans_)) {}

Gemm& Gemm::operator=(Gemm&& other) noexcept {
  if (this != &other) {
    plans_.clear();
    if (handle_ != nullptr) cublasLtDestroy(handle_);
    path_ = other.path_;
    handle_ = std::exchange(other.handle_, nullptr);
    workspace_ = std::move(other.workspace_);
    plans_ = std::move(other.plans_);
  }
  return *this;
}

Gemm::~Gemm() {
  plans_.clear();
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

Result<Gemm::Plan*> Gemm::plan_for(const PlanKey& key, const void* bias) {
  if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();

  const std::string what = describe(key.a_type, key.out_type, key.m, key.n, key.k, key.has_bias);
  const auto a_type = static_cast<cudaDataType_t>(key.a_type);
  const auto out_type = static_cast<cudaDataType_t>(key.out_type);
  auto plan = std::make_unique<Plan>();
  // f32 accumulation and f32 alpha/beta for every combination; CUBLAS_COMPUTE_32F (not
  // _FAST_TF32) keeps f32 inputs true f32.
  CELLM_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
      "cublasLtMatmulDescCreate");
  CELLM_CUBLAS_RETURN_IF_ERROR(set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T),
                               "cublasLt TRANSA");
  CELLM_CUBLAS_RETURN_IF_ERROR(set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N),
                               "cublasLt TRANSB");
  // The column-major views of the row-major operands (see gemm.h).
  CELLM_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(&plan->a, a_type, static_cast<uint64_t>(key.k),
                                 static_cast<uint64_t>(key.n), key.k),
      "cublasLtMatrixLayoutCreate(w)");
  CELLM_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(&plan->b, a_type, static_cast<uint64_t>(key.k),
                                 static_cast<uint64_t>(key.m), key.k),
      "cublasLtMatrixLayoutCreate(x)");
  CELLM_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(&plan->d, out_type, static_cast<uint64_t>(key.n),
                                 static_cast<uint64_t>(key.m), key.n),
      "cublasLtMatrixLayoutCreate(y)");

  CELLM_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&plan->preference),
                               "cublasLtMatmulPreferenceCreate");
  const uint64_t workspace_bytes = workspace_.bytes();
  CELLM_CUBLAS_RETURN_IF_ERROR(
      set_pref(plan->preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace_bytes),
      "cublasLt MAX_WORKSPACE_BYTES");
  // The alignments this key guarantees (the default assumes 256 bytes everywhere).
  CELLM_CUBLAS_RETURN_IF_ERROR(
      set_pref(plan->preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_w),
      "cublasLt MIN_ALIGNMENT_A");
  CELLM_CUBLAS_RETURN_IF_ERROR(
      set_pref(plan->preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_x),
      "cublasLt MIN_ALIGNMENT_B");
  CELLM_CUBLAS_RETURN_IF_ERROR(
      set_pref(plan->preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_y),
      "cublasLt MIN_ALIGNMENT_C");
  CELLM_CUBLAS_RETURN_IF_ERROR(
      set_pref(plan->preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_y),
      "cublasLt MIN_ALIGNMENT_D");

  const auto find_algo = [&](cublasLtMatmulAlgo_t* algo) {
    cublasLtMatmulHeuristicResult_t result{};
    int count = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(handle_, plan->desc, plan->a, plan->b, plan->d, plan->d,
                                       plan->preference, 1, &result, &count);
    if (st != CUBLAS_STATUS_SUCCESS || count < 1 || result.state != CUBLAS_STATUS_SUCCESS) {
      return false;
    }
    *algo = result.algo;
    return true;
  };

  // The BIAS epilogue adds a bias of D's type; a bf16 bias on an f32 output is added by
  // launch_add_bias instead, as is any bias the epilogue has no algorithm for.
  if (key.has_bias && key.a_type == key.out_type) {
    CELLM_CUBLAS_RETURN_IF_ERROR(
        set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS),
        "cublasLt EPILOGUE");
    // The heuristic reads the bias pointer for its alignment (the key holds it).
    CELLM_CUBLAS_RETURN_IF_ERROR(set_desc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias),
                                 "cublasLt BIAS_POINTER");
    plan->bias_in_epilogue = find_algo(&plan->algo);
    if (!plan->bias_in_epilogue) {
      CELLM_CUBLAS_RETURN_IF_ERROR(
          set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_DEFAULT),
          "cublasLt EPILOGUE");
      const void* no_bias = nullptr;
      CELLM_CUBLAS_RETURN_IF_ERROR(set_desc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, no_bias),
                                   "cublasLt BIAS_POINTER");
    }
  }
  if (!plan->bias_in_epilogue && !find_algo(&plan->algo)) {
    return Internal("cuBLASLt offers no algorithm for " + what);
  }
  return plans_.emplace(key, std::move(plan)).first->second.get();
}

template <typename T, typename TOut>
Status Gemm::run(const T* x, int64_t m, int64_t k, const T* w, int64_t n, const T* bias, TOut* y,
                 cudaStream_t stream) {
  static_assert((std::is_same_v<T, __nv_bfloat16> &&
                 (std::is_same_v<TOut, __nv_bfloat16> || std::is_same_v<TOut, float>)) ||
                    (std::is_same_v<T, float> && std::is_same_v<TOut, float>),
                "Gemm::run serves bf16 -> bf16, bf16 -> f32 and f32 -> f32");
  // REQUIRES: a well-formed shape and device operands.
  if (m < 0 || n <= 0 || k <= 0) {
    return InvalidArgument("Gemm::run: bad shape m=" + std::to_string(m) +
                           " n=" + std::to_string(n) + " k=" + std::to_string(k));
  }
  if (m == 0) return Status::Ok();
  if (x == nullptr || w == nullptr || y == nullptr) {
    return InvalidArgument("Gemm::run: null operand");
  }
  if (handle_ == nullptr) return InvalidState("Gemm::run on a moved-from Gemm");
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (path_ == GemmPath::kAuto && gemv_supports(m, k, x, w)) {
      const cudaError_t err = launch_gemv<TOut>(x, m, k, GemvInput::kPlain, w, n, bias, y, stream);
      if (err != cudaSuccess) {
        return cuda_status(err, ("launch_gemv " +
                                 describe(kCudaType<T>, kCudaType<TOut>, m, n, k, bias != nullptr))
                                    .c_str());
      }
      return Status::Ok();
    }
  }

  const PlanKey key{.a_type = kCudaType<T>,
                    .out_type = kCudaType<TOut>,
                    .m = m,
                    .n = n,
                    .k = k,
                    .has_bias = bias != nullptr,
                    .align_x = alignment_of(x),
                    .align_w = alignment_of(w),
                    .align_y = alignment_of(y),
                    .align_bias = alignment_of(bias)};
  CELLM_ASSIGN_OR_RETURN(Plan * plan, plan_for(key, bias));
  if (plan->bias_in_epilogue) {
    const void* bias_pointer = bias;
    CELLM_CUBLAS_RETURN_IF_ERROR(
        set_desc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias_pointer),
        "cublasLt BIAS_POINTER");
  }
  const float alpha = 1.0f;
  const float beta = 0.0f;
  // yc = wcᵀ · xc (see gemm.h): A = w, B = x, C = D = y.
  const cublasStatus_t st =
      cublasLtMatmul(handle_, plan->desc, &alpha, w, plan->a, x, plan->b, &beta, y, plan->d, y,
                     plan->d, &plan->algo, workspace_.get(), workspace_.bytes(), stream);
  if (st != CUBLAS_STATUS_SUCCESS) {
    return cublas_status(
        st,
        ("cublasLtMatmul " + describe(key.a_type, key.out_type, m, n, k, key.has_bias)).c_str());
  }
  if (bias != nullptr && !plan->bias_in_epilogue) {
    CELLM_CUDA_RETURN_IF_ERROR((launch_add_bias<TOut, T>(y, m, n, bias, stream)),
                               "launch_add_bias");
  }
  return Status::Ok();
}

template <typename T>
Status Gemm::run_swiglu_down(const T* gate_up, int64_t m, int64_t ff, const T* w_down, int64_t n,
                             T* act, T* y, cudaStream_t stream) {
  // REQUIRES: a well-formed shape and device operands.
  if (m < 0 || ff <= 0 || n <= 0) {
    return InvalidArgument("Gemm::run_swiglu_down: bad shape m=" + std::to_string(m) +
                           " ff=" + std::to_string(ff) + " n=" + std::to_string(n));
  }
  if (m == 0) return Status::Ok();
  if (gate_up == nullptr || w_down == nullptr || act == nullptr || y == nullptr) {
    return InvalidArgument("Gemm::run_swiglu_down: null operand");
  }
  if (handle_ == nullptr) return InvalidState("Gemm::run_swiglu_down on a moved-from Gemm");
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (path_ == GemmPath::kAuto && gemv_supports(m, ff, gate_up, w_down)) {
      const cudaError_t err =
          launch_gemv<T>(gate_up, m, ff, GemvInput::kSwiGLU, w_down, n, nullptr, y, stream);
      if (err != cudaSuccess) {
        return cuda_status(
            err, ("launch_gemv swiglu " + describe(kCudaType<T>, kCudaType<T>, m, n, ff, false))
                     .c_str());
      }
      return Status::Ok();
    }
  }
  CELLM_CUDA_RETURN_IF_ERROR(launch_swiglu<T>(gate_up, m, ff, act, stream), "launch_swiglu");
  return run<T, T>(act, m, ff, w_down, n, nullptr, y, stream);
}

template Status Gemm::run<__nv_bfloat16, __nv_bfloat16>(const __nv_bfloat16*, int64_t, int64_t,
                                                        const __nv_bfloat16*, int64_t,
                                                        const __nv_bfloat16*, __nv_bfloat16*,
                                                        cudaStream_t);
template Status Gemm::run<__nv_bfloat16, float>(const __nv_bfloat16*, int64_t, int64_t,
                                                const __nv_bfloat16*, int64_t, const __nv_bfloat16*,
                                                float*, cudaStream_t);
template Status Gemm::run<float, float>(const float*, int64_t, int64_t, const float*, int64_t,
                                        const float*, float*, cudaStream_t);

template Status Gemm::run_swiglu_down<__nv_bfloat16>(const __nv_bfloat16*, int64_t, int64_t,
                                                     const __nv_bfloat16*, int64_t, __nv_bfloat16*,
                                                     __nv_bfloat16*, cudaStream_t);
template Status Gemm::run_swiglu_down<float>(const float*, int64_t, int64_t, const float*, int64_t,
                                             float*, float*, cudaStream_t);

}  // namespace cellm::cuda
