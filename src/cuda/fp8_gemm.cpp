#include "cuda/fp8_gemm.h"

#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "cuda/cublaslt_attributes.h"
#include "cuda/cuda_check.h"
#include "cuda/kernels/quantize_e4m3.h"

namespace cellm::cuda {
namespace {

// The largest power of two up to 256 that divides the address; 0 for null.
uint32_t alignment_of(const void* p) {
  if (p == nullptr) return 0;
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && address % align != 0) align >>= 1;
  return align;
}

std::string describe(const Fp8Gemm::Key& key) {
  return std::string("fp8 gemm e4m3->") + (key.f32_out ? "f32" : "bf16") +
         " m=" + std::to_string(key.m) + " n=" + std::to_string(key.n) +
         " k=" + std::to_string(key.k) + (key.has_bias ? " +bias" : "");
}

// True when [a, a + a_bytes) and [b, b + b_bytes) share a byte (null never overlaps).
bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  if (a == nullptr || b == nullptr || a_bytes == 0 || b_bytes == 0) return false;
  const auto pa = reinterpret_cast<uintptr_t>(a);
  const auto pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

bool aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Columns of the fallback's f32 scratch: n rounded up to 16 bytes.
int64_t scratch_ld(int64_t n) {
  return (n + 3) / 4 * 4;
}

}  // namespace

Status check_fp8_gemm_call(const uint8_t* x8, const float* x_scale, int64_t m, int64_t k,
                           const uint8_t* w8, const float* w_scale, int64_t n,
                           const __nv_bfloat16* bias, const void* y, size_t out_bytes) {
  const std::string shape =
      " (m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) + ")";
  constexpr int64_t kLimit = int64_t{1} << 31;
  if (m < 0 || n <= 0 || k <= 0 || m >= kLimit || n >= kLimit || k >= kLimit) {
    return InvalidArgument("Fp8Gemm::run: bad shape" + shape);
  }
  if (k % 16 != 0) {
    return InvalidArgument("Fp8Gemm::run: k must be a multiple of 16 for FP8 products" + shape);
  }
  // cuBLASLt offers no FP8 algorithm for other n (measured: n = 77 has none on either
  // scaling path, 8, 264 and 1000 have), so refuse them here rather than at the first call.
  if (n % 8 != 0) {
    return InvalidArgument("Fp8Gemm::run: n must be a multiple of 8 for FP8 products" + shape);
  }
  if (out_bytes != 2 && out_bytes != 4) {
    return InvalidArgument("Fp8Gemm::run: output type must be bf16 or f32");
  }
  if (m == 0) return Status::Ok();
  if (x8 == nullptr || x_scale == nullptr || w8 == nullptr || w_scale == nullptr || y == nullptr) {
    return InvalidArgument(std::string("Fp8Gemm::run: null ") +
                           (x8 == nullptr        ? "x8"
                            : x_scale == nullptr ? "x_scale"
                            : w8 == nullptr      ? "w8"
                            : w_scale == nullptr ? "w_scale"
                                                 : "y") +
                           shape);
  }
  if (!aligned(x8, 16) || !aligned(w8, 16)) {
    return InvalidArgument(std::string("Fp8Gemm::run: ") + (aligned(x8, 16) ? "w8" : "x8") +
                           " is not 16-byte aligned" + shape);
  }
  if (!aligned(x_scale, 4) || !aligned(w_scale, 4) || !aligned(bias, 2) || !aligned(y, out_bytes)) {
    return InvalidArgument("Fp8Gemm::run: a scale, the bias or y is misaligned" + shape);
  }
  const auto um = static_cast<size_t>(m);
  const auto un = static_cast<size_t>(n);
  const auto uk = static_cast<size_t>(k);
  const size_t y_bytes = um * un * out_bytes;
  if (overlaps(y, y_bytes, x8, um * uk) || overlaps(y, y_bytes, x_scale, um * 4) ||
      overlaps(y, y_bytes, w8, un * uk) || overlaps(y, y_bytes, w_scale, un * 4) ||
      overlaps(y, y_bytes, bias, un * 2)) {
    return InvalidArgument("Fp8Gemm::run: y overlaps an input" + shape);
  }
  return Status::Ok();
}

// Descriptors of one call shape and the algorithm chosen for it.
struct Fp8Gemm::Plan {
  Key key;
  Fp8PlanKind kind = Fp8PlanKind::kOuterVector;
  bool bias_in_epilogue = false;
  bool proven = false;                           // an enqueue of this plan has succeeded
  SkinnyRing skinny_ring = SkinnyRing::kShared;  // kSkinny
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr;  // w8 as [k, n], ld k
  cublasLtMatrixLayout_t b = nullptr;  // x8 as [k, m], ld k
  cublasLtMatrixLayout_t d = nullptr;  // y as [n, m], ld n; or the scratch, ld scratch_ld(n)
  cublasLtMatmulPreference_t preference = nullptr;
  cublasLtMatmulAlgo_t algo{};
  DeviceBuffer scratch;  // kEpilogueKernel: f32 [m, scratch_ld(n)]

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

  // The descriptor, the operand layouts (D of type d_type with leading dimension ld_d) and
  // a preference for the key's alignments (D's is align_d).
  Status init(const Key& k, cudaDataType_t d_type, int64_t ld_d, uint32_t align_d,
              uint64_t workspace_bytes) {
    key = k;
    CELLM_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                                 "cublasLtMatmulDescCreate");
    CELLM_CUBLAS_RETURN_IF_ERROR(set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T),
                                 "cublasLt TRANSA");
    CELLM_CUBLAS_RETURN_IF_ERROR(set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N),
                                 "cublasLt TRANSB");
    const int8_t fast_accum = 0;  // see fp8_gemm.h
    CELLM_CUBLAS_RETURN_IF_ERROR(set_desc(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast_accum),
                                 "cublasLt FAST_ACCUM");
    CELLM_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatrixLayoutCreate(&a, CUDA_R_8F_E4M3, static_cast<uint64_t>(k.k),
                                   static_cast<uint64_t>(k.n), k.k),
        "cublasLtMatrixLayoutCreate(w8)");
    CELLM_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatrixLayoutCreate(&b, CUDA_R_8F_E4M3, static_cast<uint64_t>(k.k),
                                   static_cast<uint64_t>(k.m), k.k),
        "cublasLtMatrixLayoutCreate(x8)");
    CELLM_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&d, d_type, static_cast<uint64_t>(k.n),
                                                            static_cast<uint64_t>(k.m), ld_d),
                                 "cublasLtMatrixLayoutCreate(y)");
    CELLM_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&preference),
                                 "cublasLtMatmulPreferenceCreate");
    CELLM_CUBLAS_RETURN_IF_ERROR(
        set_pref(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace_bytes),
        "cublasLt MAX_WORKSPACE_BYTES");
    CELLM_CUBLAS_RETURN_IF_ERROR(
        set_pref(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, k.align_w),
        "cublasLt MIN_ALIGNMENT_A");
    CELLM_CUBLAS_RETURN_IF_ERROR(
        set_pref(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, k.align_x),
        "cublasLt MIN_ALIGNMENT_B");
    CELLM_CUBLAS_RETURN_IF_ERROR(
        set_pref(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d),
        "cublasLt MIN_ALIGNMENT_C");
    CELLM_CUBLAS_RETURN_IF_ERROR(
        set_pref(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d),
        "cublasLt MIN_ALIGNMENT_D");
    return Status::Ok();
  }

  // The heuristic's first algorithm for the descriptor as it stands; false when none.
  bool find_algo(cublasLtHandle_t handle) {
    cublasLtMatmulHeuristicResult_t result{};
    int count = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, d, d, preference, 1, &result, &count);
    if (st != CUBLAS_STATUS_SUCCESS || count < 1 || result.state != CUBLAS_STATUS_SUCCESS) {
      return false;
    }
    algo = result.algo;
    return true;
  }
};

Fp8Gemm::Fp8Gemm(Fp8Scaling scaling, bool tune) : scaling_(scaling), tune_(tune) {}

void Fp8Gemm::set_tuning(bool on) {
  tuning_ = on;
  if (!on) timer_.reset();
}

Result<Fp8Gemm> Fp8Gemm::create(size_t workspace_bytes, Fp8Scaling scaling, bool tune) {
  if (scaling != Fp8Scaling::kAuto && scaling != Fp8Scaling::kEpilogueKernel &&
      scaling != Fp8Scaling::kSkinny) {
    return InvalidArgument("Fp8Gemm::create: unknown scaling");
  }
  Fp8Gemm gemm(scaling, tune);
  CELLM_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&gemm.handle_), "cublasLtCreate");
  CELLM_ASSIGN_OR_RETURN(gemm.workspace_, DeviceBuffer::allocate(workspace_bytes));
  return gemm;
}

Fp8Gemm::Fp8Gemm(Fp8Gemm&& other) noexcept
    : scaling_(other.scaling_),
      tune_(other.tune_),
      tuning_(other.tuning_),
      handle_(std::exchange(other.handle_, nullptr)),
      timer_(std::move(other.timer_)),
      workspace_(std::move(other.workspace_)),
      plans_(std::move(other.plans_)) {}

Fp8Gemm& Fp8Gemm::operator=(Fp8Gemm&& other) noexcept {
  if (this != &other) {
    plans_.clear();
    if (handle_ != nullptr) cublasLtDestroy(handle_);
    scaling_ = other.scaling_;
    tune_ = other.tune_;
    tuning_ = other.tuning_;
    handle_ = std::exchange(other.handle_, nullptr);
    timer_ = std::move(other.timer_);
    workspace_ = std::move(other.workspace_);
    plans_ = std::move(other.plans_);
  }
  return *this;
}

Fp8Gemm::~Fp8Gemm() {
  plans_.clear();
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

std::vector<Fp8Gemm::PlanInfo> Fp8Gemm::describe_plans() const {
  std::vector<PlanInfo> infos;
  infos.reserve(plans_.size());
  for (const auto& [key, plan] : plans_) {
    infos.push_back(PlanInfo{key, plan->kind, plan->bias_in_epilogue, plan->skinny_ring});
  }
  return infos;
}

Result<std::unique_ptr<Fp8Gemm::Plan>> Fp8Gemm::outer_vector_plan(const Key& key,
                                                                  const void* x_scale,
                                                                  const void* w_scale,
                                                                  const void* bias) {
  auto plan = std::make_unique<Plan>();
  plan->kind = Fp8PlanKind::kOuterVector;
  CELLM_RETURN_IF_ERROR(plan->init(key, key.f32_out ? CUDA_R_32F : CUDA_R_16BF, key.n, key.align_y,
                                   workspace_.bytes()));
  // A library that does not know an attribute refuses it: no outer-vector plan then.
  const int32_t outer = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  if (set_desc(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, outer) != CUBLAS_STATUS_SUCCESS ||
      set_desc(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, outer) != CUBLAS_STATUS_SUCCESS) {
    return std::unique_ptr<Plan>();
  }
  // A scales cuBLASLt's M (= n, the weights' channels), B its N (= m, the rows).
  CELLM_CUBLAS_RETURN_IF_ERROR(set_desc(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, w_scale),
                               "cublasLt A_SCALE_POINTER");
  CELLM_CUBLAS_RETURN_IF_ERROR(set_desc(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, x_scale),
                               "cublasLt B_SCALE_POINTER");
  if (key.has_bias) {
    const int32_t bias_type = CUDA_R_16BF;
    if (set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS) !=
            CUBLAS_STATUS_SUCCESS ||
        set_desc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type) !=
            CUBLAS_STATUS_SUCCESS ||
        set_desc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias) != CUBLAS_STATUS_SUCCESS) {
      return std::unique_ptr<Plan>();
    }
    plan->bias_in_epilogue = true;
  }
  if (!plan->find_algo(handle_)) return std::unique_ptr<Plan>();
  return plan;
}

Result<std::unique_ptr<Fp8Gemm::Plan>> Fp8Gemm::epilogue_kernel_plan(const Key& key) {
  auto plan = std::make_unique<Plan>();
  plan->kind = Fp8PlanKind::kEpilogueKernel;
  const int64_t ld = scratch_ld(key.n);
  // The scratch comes from cudaMalloc: 256-byte aligned.
  CELLM_RETURN_IF_ERROR(plan->init(key, CUDA_R_32F, ld, 256, workspace_.bytes()));
  if (!plan->find_algo(handle_)) {
    return Internal("cuBLASLt offers no FP8 algorithm for " + describe(key));
  }
  CELLM_ASSIGN_OR_RETURN(
      plan->scratch,
      DeviceBuffer::allocate(static_cast<size_t>(key.m) * static_cast<size_t>(ld) * sizeof(float)));
  return plan;
}

template <typename TOut>
Status Fp8Gemm::enqueue(Plan& plan, const uint8_t* x8, const float* x_scale, int64_t m, int64_t k,
                        const uint8_t* w8, const float* w_scale, int64_t n,
                        const __nv_bfloat16* bias, TOut* y, cudaStream_t stream) {
  const float alpha = 1.0f;
  const float beta = 0.0f;
  if (plan.kind == Fp8PlanKind::kSkinny) {
    CELLM_CUDA_RETURN_IF_ERROR(launch_skinny_gemm_e4m3<TOut>(x8, x_scale, m, k, w8, w_scale, n,
                                                             bias, y, plan.skinny_ring, stream),
                               ("launch_skinny_gemm_e4m3 " + describe(plan.key)).c_str());
    return Status::Ok();
  }
  if (plan.kind == Fp8PlanKind::kOuterVector) {
    CELLM_CUBLAS_RETURN_IF_ERROR(set_desc(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, w_scale),
                                 "cublasLt A_SCALE_POINTER");
    CELLM_CUBLAS_RETURN_IF_ERROR(set_desc(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, x_scale),
                                 "cublasLt B_SCALE_POINTER");
    if (plan.bias_in_epilogue) {
      const void* bias_pointer = bias;
      CELLM_CUBLAS_RETURN_IF_ERROR(
          set_desc(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias_pointer),
          "cublasLt BIAS_POINTER");
    }
    const cublasStatus_t st =
        cublasLtMatmul(handle_, plan.desc, &alpha, w8, plan.a, x8, plan.b, &beta, y, plan.d, y,
                       plan.d, &plan.algo, workspace_.get(), workspace_.bytes(), stream);
    if (st != CUBLAS_STATUS_SUCCESS) {
      return cublas_status(st, ("cublasLtMatmul " + describe(plan.key)).c_str());
    }
    return Status::Ok();
  }
  auto* acc = plan.scratch.as<float>();
  const cublasStatus_t st =
      cublasLtMatmul(handle_, plan.desc, &alpha, w8, plan.a, x8, plan.b, &beta, acc, plan.d, acc,
                     plan.d, &plan.algo, workspace_.get(), workspace_.bytes(), stream);
  if (st != CUBLAS_STATUS_SUCCESS) {
    return cublas_status(st, ("cublasLtMatmul " + describe(plan.key)).c_str());
  }
  CELLM_CUDA_RETURN_IF_ERROR(
      launch_scale_outer_e4m3<TOut>(acc, scratch_ld(n), m, n, x_scale, w_scale, bias, y, stream),
      ("launch_scale_outer_e4m3 " + describe(plan.key)).c_str());
  return Status::Ok();
}

template <typename TOut>
Status Fp8Gemm::run(const uint8_t* x8, const float* x_scale, int64_t m, int64_t k,
                    const uint8_t* w8, const float* w_scale, int64_t n, const __nv_bfloat16* bias,
                    TOut* y, cudaStream_t stream) {
  static_assert(std::is_same_v<TOut, __nv_bfloat16> || std::is_same_v<TOut, float>,
                "Fp8Gemm::run writes bf16 or f32");
  CELLM_RETURN_IF_ERROR(
      check_fp8_gemm_call(x8, x_scale, m, k, w8, w_scale, n, bias, y, sizeof(TOut)));
  if (m == 0) return Status::Ok();
  if (handle_ == nullptr) return InvalidState("Fp8Gemm::run on a moved-from Fp8Gemm");
  const Key key{.m = m,
                .n = n,
                .k = k,
                .f32_out = std::is_same_v<TOut, float>,
                .has_bias = bias != nullptr,
                .align_x = alignment_of(x8),
                .align_w = alignment_of(w8),
                .align_y = alignment_of(y),
                .align_bias = alignment_of(bias),
                .align_x_scale = alignment_of(x_scale),
                .align_w_scale = alignment_of(w_scale)};
  auto it = plans_.find(key);
  if (it == plans_.end()) {
    // Building a plan allocates (the fallback's scratch): never inside capture.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    CELLM_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
    if (capture != cudaStreamCaptureStatusNone) {
      return InvalidState("Fp8Gemm::run: first call of " + describe(key) +
                          " inside CUDA graph capture; run it once before capturing");
    }
    const bool skinny = skinny_gemm_e4m3_supports(m, n, k, x8, w8);
    std::unique_ptr<Plan> plan;
    if (skinny && scaling_ == Fp8Scaling::kSkinny) {
      plan = std::make_unique<Plan>();
      plan->key = key;
      plan->kind = Fp8PlanKind::kSkinny;
    } else if (scaling_ != Fp8Scaling::kEpilogueKernel) {
      CELLM_ASSIGN_OR_RETURN(plan, outer_vector_plan(key, x_scale, w_scale, bias));
    }
    if (plan == nullptr) {
      CELLM_ASSIGN_OR_RETURN(plan, epilogue_kernel_plan(key));
    }
    it = plans_.emplace(key, std::move(plan)).first;
    if (skinny && scaling_ == Fp8Scaling::kAuto) {
      const bool may_time = tune_ && tuning_;
      // Timing needs the cuBLASLt plan proven on this call first (falling back as below).
      if (may_time) {
        CELLM_RETURN_IF_ERROR(run<TOut>(x8, x_scale, m, k, w8, w_scale, n, bias, y, stream));
      }
      CELLM_ASSIGN_OR_RETURN(it->second, tune<TOut>(std::move(it->second), may_time, x8, x_scale, m,
                                                    k, w8, w_scale, n, bias, y, stream));
    }
  }
  Plan& plan = *it->second;
  Status st = enqueue<TOut>(plan, x8, x_scale, m, k, w8, w_scale, n, bias, y, stream);
  if (!st.ok() && !plan.proven && plan.kind == Fp8PlanKind::kOuterVector) {
    // The heuristic offered an outer-vector algorithm that cublasLtMatmul then refused
    // (its checks run before anything is enqueued): this key takes the fallback.
    CELLM_ASSIGN_OR_RETURN(std::unique_ptr<Plan> fallback, epilogue_kernel_plan(key));
    it->second = std::move(fallback);
    st = enqueue<TOut>(*it->second, x8, x_scale, m, k, w8, w_scale, n, bias, y, stream);
  }
  if (st.ok()) it->second->proven = true;
  return st;
}

template <typename TOut>
Result<std::unique_ptr<Fp8Gemm::Plan>> Fp8Gemm::tune(std::unique_ptr<Plan> plan, bool may_time,
                                                     const uint8_t* x8, const float* x_scale,
                                                     int64_t m, int64_t k, const uint8_t* w8,
                                                     const float* w_scale, int64_t n,
                                                     const __nv_bfloat16* bias, TOut* y,
                                                     cudaStream_t stream) {
  int device = 0;
  CELLM_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device), "cudaGetDevice");
  const Key& key = plan->key;
  const GemmKey gemm_key{.op = GemmOp::kProduct,
                         .a_type = CUDA_R_8F_E4M3,
                         .out_type = key.f32_out ? CUDA_R_32F : CUDA_R_16BF,
                         .m = key.m,
                         .n = key.n,
                         .k = key.k,
                         .has_bias = key.has_bias,
                         .align_x = key.align_x,
                         .align_w = key.align_w,
                         .align_y = key.align_y,
                         .align_bias = key.align_bias};
  const auto skinny_plan = [&](SkinnyRing ring) {
    auto skinny = std::make_unique<Plan>();
    skinny->key = key;
    skinny->kind = Fp8PlanKind::kSkinny;
    skinny->skinny_ring = ring;
    return skinny;
  };
  std::optional<GemmChoice> choice = find_tuned_choice(device, workspace_.bytes(), gemm_key);
  if (!choice && !may_time) return plan;
  if (!choice) {
    if (timer_ == nullptr) {
      CELLM_ASSIGN_OR_RETURN(GemmTimer timer, GemmTimer::create(device));
      timer_ = std::make_unique<GemmTimer>(std::move(timer));
    }
    const auto time = [&](Plan& candidate, float give_up_us) {
      return timer_->time(
          [&](cudaStream_t on) {
            return enqueue<TOut>(candidate, x8, x_scale, m, k, w8, w_scale, n, bias, y, on);
          },
          stream, give_up_us);
    };
    // A candidate whose first runs are this much slower than the best so far stops there.
    constexpr float kGiveUpFactor = 1.25f;
    CELLM_ASSIGN_OR_RETURN(const float cublas_us,
                           time(*plan, std::numeric_limits<float>::infinity()));
    GemmChoice best{.kernel = GemmKernel::kCublasLt,
                    .bias_in_epilogue = plan->bias_in_epilogue,
                    .name = plan->kind == Fp8PlanKind::kOuterVector ? "cublasLt outer-vector"
                                                                    : "cublasLt + scale kernel",
                    .us = cublas_us};
    for (const SkinnyRing ring : {SkinnyRing::kShared, SkinnyRing::kWholeSm}) {
      const std::unique_ptr<Plan> candidate = skinny_plan(ring);
      // A kernel the device cannot run (no TMA encoder) is not a candidate.
      const Result<float> us = time(*candidate, kGiveUpFactor * best.us);
      if (us.ok() && *us < best.us) {
        best = GemmChoice{
            .kernel = GemmKernel::kSkinny,
            .skinny_ring = ring,
            .name = ring == SkinnyRing::kShared ? "skinny e4m3" : "skinny e4m3 whole-SM ring",
            .us = *us,
            .heuristic_us = cublas_us};
      }
    }
    choice = remember_tuned_choice(device, workspace_.bytes(), gemm_key, best);
  }
  if (choice->kernel != GemmKernel::kSkinny) return plan;
  std::unique_ptr<Plan> skinny = skinny_plan(choice->skinny_ring);
  skinny->proven = true;
  return skinny;
}

template Status Fp8Gemm::run<__nv_bfloat16>(const uint8_t*, const float*, int64_t, int64_t,
                                            const uint8_t*, const float*, int64_t,
                                            const __nv_bfloat16*, __nv_bfloat16*, cudaStream_t);
template Status Fp8Gemm::run<float>(const uint8_t*, const float*, int64_t, int64_t, const uint8_t*,
                                    const float*, int64_t, const __nv_bfloat16*, float*,
                                    cudaStream_t);

}  // namespace cellm::cuda
