#include "cuda/gemm.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "cuda/cublaslt_attributes.h"
#include "cuda/cuda_check.h"
#include "cuda/kernels/bias.h"
#include "cuda/kernels/gemv.h"
#include "cuda/kernels/skinny_gemm.h"
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

// Descriptors of one call shape and the kernel chosen for it.
struct Gemm::Plan {
  GemmKey key;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr;  // wc [k, n], ld k
  cublasLtMatrixLayout_t b = nullptr;  // xc [k, m], ld k
  cublasLtMatrixLayout_t d = nullptr;  // yc [n, m], ld n (also C, with beta = 0)
  cublasLtMatmulPreference_t preference = nullptr;
  GemmChoice choice;
  PlanSource source = PlanSource::kHeuristic;

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

// Rows from which Gemm's tuner also times the heuristic's first cuBLASLt kernel with
// smaller tiles (cublaslt_candidates).
constexpr int64_t kTileVariantsFromRows = 64;

namespace {

// The GEMV kernel a GEMV choice names.
GemvKernel gemv_kernel_of(GemmKernel kernel) {
  return kernel == GemmKernel::kGemvRows ? GemvKernel::kRows : GemvKernel::kTensorCores;
}

std::string describe(int a_type, int out_type, int64_t m, int64_t n, int64_t k, bool bias,
                     const char* op = "gemm") {
  return std::string(op) + " " + type_name(a_type) + "->" + type_name(out_type) +
         " m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
         (bias ? " +bias" : "");
}

std::string describe(const GemmKey& key) {
  return describe(key.a_type, key.out_type, key.m, key.n, key.k, key.has_bias,
                  key.op == GemmOp::kSwiGLUDown ? "swiglu+down" : "gemm");
}

struct PreferenceDeleter {
  void operator()(cublasLtMatmulPreference_t p) const { cublasLtMatmulPreferenceDestroy(p); }
};
using UniquePreference =
    std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, PreferenceDeleter>;

// A heuristic preference for `key`: the workspace, the alignments the key guarantees (the
// default assumes 256 bytes everywhere) and, unless it is CUBLASLT_REDUCTION_SCHEME_MASK
// (all), the split-K reduction schemes allowed.
Result<UniquePreference> make_preference(const GemmKey& key, uint64_t workspace_bytes,
                                         uint32_t reduction_mask) {
  cublasLtMatmulPreference_t raw = nullptr;
  CELLM_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&raw),
                               "cublasLtMatmulPreferenceCreate");
  UniquePreference pref(raw);
  CELLM_CUBLAS_RETURN_IF_ERROR(
      set_pref(raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace_bytes),
      "cublasLt MAX_WORKSPACE_BYTES");
  CELLM_CUBLAS_RETURN_IF_ERROR(
      set_pref(raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_w),
      "cublasLt MIN_ALIGNMENT_A");
  CELLM_CUBLAS_RETURN_IF_ERROR(
      set_pref(raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_x),
      "cublasLt MIN_ALIGNMENT_B");
  CELLM_CUBLAS_RETURN_IF_ERROR(
      set_pref(raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_y),
      "cublasLt MIN_ALIGNMENT_C");
  CELLM_CUBLAS_RETURN_IF_ERROR(
      set_pref(raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_y),
      "cublasLt MIN_ALIGNMENT_D");
  if (reduction_mask != CUBLASLT_REDUCTION_SCHEME_MASK) {
    CELLM_CUBLAS_RETURN_IF_ERROR(
        set_pref(raw, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, reduction_mask),
        "cublasLt REDUCTION_SCHEME_MASK");
  }
  return pref;
}

bool same_algo(const cublasLtMatmulAlgo_t& a, const cublasLtMatmulAlgo_t& b) {
  return std::memcmp(&a, &b, sizeof(a)) == 0;
}

// The key of Gemm::run's call.
template <typename T, typename TOut>
GemmKey product_key(const T* x, int64_t m, int64_t k, const T* w, int64_t n, const T* bias,
                    const TOut* y) {
  return GemmKey{.op = GemmOp::kProduct,
                 .a_type = kCudaType<T>,
                 .out_type = kCudaType<TOut>,
                 .m = m,
                 .n = n,
                 .k = k,
                 .has_bias = bias != nullptr,
                 .align_x = alignment_of(x),
                 .align_w = alignment_of(w),
                 .align_y = alignment_of(y),
                 .align_bias = alignment_of(bias),
                 .align_gate_up = 0};
}

// The key of Gemm::run_swiglu_down's call (under kTuned).
template <typename T>
GemmKey swiglu_down_key(const T* gate_up, int64_t m, int64_t ff, const T* w_down, int64_t n,
                        const T* act, const T* y) {
  return GemmKey{.op = GemmOp::kSwiGLUDown,
                 .a_type = kCudaType<T>,
                 .out_type = kCudaType<T>,
                 .m = m,
                 .n = n,
                 .k = ff,
                 .has_bias = false,
                 .align_x = alignment_of(act),
                 .align_w = alignment_of(w_down),
                 .align_y = alignment_of(y),
                 .align_bias = 0,
                 .align_gate_up = alignment_of(gate_up)};
}

// The REQUIRES of run (what = "run") and run_swiglu_down (k named "ff"): an error for a
// bad shape or a null operand.
Status check_call(const char* what, int64_t m, int64_t k, int64_t n, bool null_operand) {
  const bool swiglu = std::strcmp(what, "run_swiglu_down") == 0;
  if (m < 0 || n <= 0 || k <= 0) {
    const std::string shape = swiglu ? " ff=" + std::to_string(k) + " n=" + std::to_string(n)
                                     : " n=" + std::to_string(n) + " k=" + std::to_string(k);
    return InvalidArgument(std::string("Gemm::") + what + ": bad shape m=" + std::to_string(m) +
                           shape);
  }
  if (m > 0 && null_operand) {
    return InvalidArgument(std::string("Gemm::") + what + ": null operand");
  }
  return Status::Ok();
}

}  // namespace

Gemm::Gemm(GemmPath path) : path_(path) {}

Result<Gemm> Gemm::create(size_t workspace_bytes, GemmPath path) {
  Gemm gemm(path);
  CELLM_CUDA_RETURN_IF_ERROR(cudaGetDevice(&gemm.device_), "cudaGetDevice");
  CELLM_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&gemm.handle_), "cublasLtCreate");
  CELLM_ASSIGN_OR_RETURN(gemm.workspace_, DeviceBuffer::allocate(workspace_bytes));
  return gemm;
}

Gemm::Gemm(Gemm&& other) noexcept
    : path_(other.path_),
      device_(other.device_),
      tuning_(other.tuning_),
      handle_(std::exchange(other.handle_, nullptr)),
      workspace_(std::move(other.workspace_)),
      timer_(std::move(other.timer_)),
      plans_(std::move(other.plans_)),
      warmed_(std::move(other.warmed_)) {}

Gemm& Gemm::operator=(Gemm&& other) noexcept {
  if (this != &other) {
    plans_.clear();
    if (handle_ != nullptr) cublasLtDestroy(handle_);
    path_ = other.path_;
    device_ = other.device_;
    tuning_ = other.tuning_;
    handle_ = std::exchange(other.handle_, nullptr);
    workspace_ = std::move(other.workspace_);
    timer_ = std::move(other.timer_);
    plans_ = std::move(other.plans_);
    warmed_ = std::move(other.warmed_);
  }
  return *this;
}

Gemm::~Gemm() {
  plans_.clear();
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

void Gemm::set_tuning(bool on) {
  tuning_ = on;
  if (!on) timer_.reset();
}

std::vector<Gemm::PlanInfo> Gemm::describe_plans() const {
  std::vector<PlanInfo> infos;
  infos.reserve(plans_.size());
  for (const auto& [key, plan] : plans_) infos.push_back(PlanInfo{key, plan->choice, plan->source});
  return infos;
}

Result<Gemm::Plan*> Gemm::plan_for(const GemmKey& key, const void* bias) {
  if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();

  const auto a_type = static_cast<cudaDataType_t>(key.a_type);
  const auto out_type = static_cast<cudaDataType_t>(key.out_type);
  auto plan = std::make_unique<Plan>();
  plan->key = key;
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
  CELLM_ASSIGN_OR_RETURN(UniquePreference preference,
                         make_preference(key, workspace_.bytes(), CUBLASLT_REDUCTION_SCHEME_MASK));
  plan->preference = preference.release();

  if (path_ == GemmPath::kTuned) {
    if (std::optional<GemmChoice> stored = find_tuned_choice(device_, workspace_.bytes(), key)) {
      CELLM_RETURN_IF_ERROR(adopt(*plan, *stored, bias, PlanSource::kAdopted));
      return plans_.emplace(key, std::move(plan)).first->second.get();
    }
  }

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
  GemmChoice& choice = plan->choice;
  if (key.has_bias && key.a_type == key.out_type) {
    CELLM_CUBLAS_RETURN_IF_ERROR(
        set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS),
        "cublasLt EPILOGUE");
    // The heuristic reads the bias pointer for its alignment (the key holds it).
    CELLM_CUBLAS_RETURN_IF_ERROR(set_desc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias),
                                 "cublasLt BIAS_POINTER");
    choice.bias_in_epilogue = find_algo(&choice.algo);
    if (!choice.bias_in_epilogue) {
      CELLM_CUBLAS_RETURN_IF_ERROR(
          set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_DEFAULT),
          "cublasLt EPILOGUE");
      const void* no_bias = nullptr;
      CELLM_CUBLAS_RETURN_IF_ERROR(set_desc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, no_bias),
                                   "cublasLt BIAS_POINTER");
    }
  }
  if (!choice.bias_in_epilogue && !find_algo(&choice.algo)) {
    return Internal("cuBLASLt offers no algorithm for " + describe(key));
  }
  choice.kernel = GemmKernel::kCublasLt;
  choice.name = describe_algo(choice.algo, "h0");
  return plans_.emplace(key, std::move(plan)).first->second.get();
}

Status Gemm::adopt(Plan& plan, const GemmChoice& choice, const void* bias, PlanSource source) {
  const cublasLtEpilogue_t epilogue =
      choice.bias_in_epilogue ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  CELLM_CUBLAS_RETURN_IF_ERROR(set_desc(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue),
                               "cublasLt EPILOGUE");
  const void* bias_pointer = choice.bias_in_epilogue ? bias : nullptr;
  CELLM_CUBLAS_RETURN_IF_ERROR(set_desc(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias_pointer),
                               "cublasLt BIAS_POINTER");
  plan.choice = choice;
  plan.source = source;
  return Status::Ok();
}

Result<bool> Gemm::wants_timing(const Plan& plan, cudaStream_t stream) const {
  if (path_ != GemmPath::kTuned || !tuning_ || plan.source != PlanSource::kHeuristic) {
    return false;
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CELLM_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
  return capture == cudaStreamCaptureStatusNone;
}

Result<std::vector<GemmChoice>> Gemm::cublaslt_candidates(const Plan& plan) {
  constexpr int kPerQuery = 8;
  // A bf16 output would carry the partial sums of these schemes rounded to bf16.
  const bool narrow_output = static_cast<cudaDataType_t>(plan.key.out_type) != CUDA_R_32F;
  std::vector<GemmChoice> candidates;
  // Appends `algo` unless it is a candidate already.
  const auto add_algo = [&](const cublasLtMatmulAlgo_t& algo, const std::string& origin) {
    if (std::any_of(candidates.begin(), candidates.end(),
                    [&](const GemmChoice& c) { return same_algo(c.algo, algo); })) {
      return;
    }
    GemmChoice c;
    c.kernel = GemmKernel::kCublasLt;
    c.algo = algo;
    c.bias_in_epilogue = plan.choice.bias_in_epilogue;
    c.name = describe_algo(algo, origin);
    candidates.push_back(std::move(c));
  };
  cublasLtMatmulHeuristicResult_t results[kPerQuery];
  const auto query = [&](cublasLtMatmulPreference_t preference, const char* origin) {
    int count = 0;
    if (cublasLtMatmulAlgoGetHeuristic(handle_, plan.desc, plan.a, plan.b, plan.d, plan.d,
                                       preference, kPerQuery, results,
                                       &count) != CUBLAS_STATUS_SUCCESS) {
      return;
    }
    for (int i = 0; i < count; ++i) {
      const cublasLtMatmulHeuristicResult_t& r = results[i];
      if (r.state != CUBLAS_STATUS_SUCCESS) continue;
      const AlgoSplit split = algo_split(r.algo);
      if (narrow_output && split.splits > 1 &&
          (split.reduction == CUBLASLT_REDUCTION_SCHEME_INPLACE ||
           split.reduction == CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE)) {
        continue;
      }
      add_algo(r.algo, origin + std::to_string(i));
    }
  };
  query(plan.preference, "h");
  // NONE | INPLACE: no separate reduction kernel.
  CELLM_ASSIGN_OR_RETURN(
      UniquePreference no_reduce_kernel,
      make_preference(plan.key, workspace_.bytes(),
                      CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_INPLACE));
  query(no_reduce_kernel.get(), "r");
  // At many rows, the heuristic's first kernel with smaller tiles and no split: a skinny
  // product's 64x64 tiles fill about one wave by themselves, which beats the heuristic's
  // best for the 8B's o and down at 64-128 rows.
  if (plan.key.m >= kTileVariantsFromRows && !candidates.empty()) {
    const cublasLtMatmulAlgo_t base = candidates.front().algo;
    const uint32_t tiles[] = {CUBLASLT_MATMUL_TILE_64x64, CUBLASLT_MATMUL_TILE_64x128,
                              CUBLASLT_MATMUL_TILE_128x64};
    const uint16_t clusters[] = {CUBLASLT_CLUSTER_SHAPE_1x1x1, CUBLASLT_CLUSTER_SHAPE_1x2x1};
    const uint32_t one = 1;
    const uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
    for (const uint32_t tile : tiles) {
      for (const uint16_t cluster : clusters) {
        cublasLtMatmulAlgo_t algo = base;
        if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile,
                                                 sizeof tile) != CUBLAS_STATUS_SUCCESS ||
            cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one,
                                                 sizeof one) != CUBLAS_STATUS_SUCCESS ||
            cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                                 &none, sizeof none) != CUBLAS_STATUS_SUCCESS ||
            cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID,
                                                 &cluster,
                                                 sizeof cluster) != CUBLAS_STATUS_SUCCESS) {
          continue;
        }
        cublasLtMatmulHeuristicResult_t checked{};
        if (cublasLtMatmulAlgoCheck(handle_, plan.desc, plan.a, plan.b, plan.d, plan.d, &algo,
                                    &checked) != CUBLAS_STATUS_SUCCESS ||
            checked.state != CUBLAS_STATUS_SUCCESS || checked.workspaceSize > workspace_.bytes()) {
          continue;
        }
        add_algo(algo, "t" + std::to_string(tile) + "c" + std::to_string(cluster));
      }
    }
  }
  return candidates;
}

Status Gemm::tune(Plan& plan, bool gemv_candidate, bool skinny_candidate, const void* bias,
                  const Enqueue& enqueue, cudaStream_t stream) {
  if (std::optional<GemmChoice> stored = find_tuned_choice(device_, workspace_.bytes(), plan.key)) {
    return adopt(plan, *stored, bias, PlanSource::kAdopted);
  }
  CELLM_ASSIGN_OR_RETURN(std::vector<GemmChoice> candidates, cublaslt_candidates(plan));
  const auto add = [&](GemmKernel kernel, std::string name, SkinnyRing ring = SkinnyRing::kShared,
                       int rows_split = kGemvRowsAutoSplit) {
    GemmChoice c;
    c.kernel = kernel;
    c.skinny_ring = ring;
    c.gemv_rows_split = rows_split;
    c.name = std::move(name);
    candidates.push_back(std::move(c));
  };
  if (gemv_candidate) {
    // At one row the kRows kernel takes the product: timed alone the two GEMVs tie, but in
    // the step's graph the tensor-core one is slower (likely its 8 weight loads a lane before
    // its wait, against the kRows kernel's 4, queued ahead of the norm it is launched
    // beside). From 2 rows the tensor cores' arithmetic pays.
    if (plan.key.m > 1) add(GemmKernel::kGemv, "gemv");
    // Every split of the kRows kernel: the best one varies by shape (at one row, 8 for the
    // 8B's gate_up, down and LM head; 1 for the 1B's gate_up).
    for (int split = 1; split <= kGemvRowsMaxSplit; split *= 2) {
      add(GemmKernel::kGemvRows, "gemv rows split " + std::to_string(split), SkinnyRing::kShared,
          split);
    }
  }
  if (skinny_candidate) {
    add(GemmKernel::kSkinny, "skinny");
    add(GemmKernel::kSkinny, "skinny whole-SM ring", SkinnyRing::kWholeSm);
  }
  if (timer_ == nullptr) {
    CELLM_ASSIGN_OR_RETURN(GemmTimer timer, GemmTimer::create(device_));
    timer_ = std::make_unique<GemmTimer>(std::move(timer));
  }
  // A candidate whose first runs are this much slower than the best so far stops there.
  constexpr float kGiveUpFactor = 1.25f;
  float best_us = std::numeric_limits<float>::infinity();
  std::optional<size_t> best;
  Status last_failure;
  for (size_t i = 0; i < candidates.size(); ++i) {
    Result<float> us = timer_->time([&](cudaStream_t on) { return enqueue(candidates[i], on); },
                                    stream, kGiveUpFactor * best_us);
    if (!us.ok()) {
      last_failure = us.status();
      continue;
    }
    candidates[i].us = *us;
    if (*us < best_us) {
      best_us = *us;
      best = i;
    }
  }
  if (!best) {
    return Internal("no candidate kernel ran for " + describe(plan.key) +
                    (last_failure.ok() ? "" : ": " + last_failure.to_string()));
  }
  GemmChoice choice = candidates[*best];
  for (const GemmChoice& c : candidates) {
    if (c.kernel == GemmKernel::kCublasLt && same_algo(c.algo, plan.choice.algo)) {
      choice.heuristic_us = c.us;
    }
  }
  const GemmChoice stored = remember_tuned_choice(device_, workspace_.bytes(), plan.key, choice);
  return adopt(plan, stored, bias, PlanSource::kTimed);
}

template <typename T, typename TOut>
Status Gemm::enqueue_product(const Plan& plan, const GemmChoice& choice, const T* x, int64_t m,
                             int64_t k, const T* w, int64_t n, const T* bias, TOut* y,
                             cudaStream_t stream) {
  if (choice.kernel == GemmKernel::kSkinny) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      const cudaError_t err =
          launch_skinny_gemm<TOut>(x, m, k, w, n, bias, y, choice.skinny_ring, stream);
      if (err != cudaSuccess) {
        return cuda_status(err, ("launch_skinny_gemm " + describe(plan.key)).c_str());
      }
      return Status::Ok();
    } else {
      return Internal("the skinny GEMM serves bf16 products only: " + describe(plan.key));
    }
  }
  if (choice.kernel == GemmKernel::kGemv || choice.kernel == GemmKernel::kGemvRows) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      const int split =
          choice.kernel == GemmKernel::kGemvRows ? choice.gemv_rows_split : kGemvRowsAutoSplit;
      const cudaError_t err = launch_gemv<TOut>(x, m, k, GemvInput::kPlain, w, n, bias, y, stream,
                                                gemv_kernel_of(choice.kernel), split);
      if (err != cudaSuccess) {
        return cuda_status(err, ("launch_gemv " + describe(plan.key)).c_str());
      }
      return Status::Ok();
    } else {
      return Internal("the GEMV serves bf16 products only: " + describe(plan.key));
    }
  }
  if (choice.bias_in_epilogue) {
    const void* bias_pointer = bias;
    CELLM_CUBLAS_RETURN_IF_ERROR(
        set_desc(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias_pointer),
        "cublasLt BIAS_POINTER");
  }
  const float alpha = 1.0f;
  const float beta = 0.0f;
  // yc = wcᵀ · xc (see gemm.h): A = w, B = x, C = D = y.
  const cublasStatus_t st =
      cublasLtMatmul(handle_, plan.desc, &alpha, w, plan.a, x, plan.b, &beta, y, plan.d, y, plan.d,
                     &choice.algo, workspace_.get(), workspace_.bytes(), stream);
  if (st != CUBLAS_STATUS_SUCCESS) {
    return cublas_status(st, ("cublasLtMatmul " + describe(plan.key)).c_str());
  }
  if (bias != nullptr && !choice.bias_in_epilogue) {
    CELLM_CUDA_RETURN_IF_ERROR((launch_add_bias<TOut, T>(y, m, n, bias, stream)),
                               "launch_add_bias");
  }
  return Status::Ok();
}

template <typename T>
Status Gemm::enqueue_swiglu_down(const Plan& plan, const GemmChoice& choice, const T* gate_up,
                                 int64_t m, int64_t ff, const T* w_down, int64_t n, T* act, T* y,
                                 cudaStream_t stream) {
  // kGemv fuses the activation into the tensor-core GEMV; kGemvRows runs launch_swiglu
  // then the kRows GEMV (whose warps would each recompute the activation of every column).
  if (choice.kernel == GemmKernel::kGemv) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      const cudaError_t err = launch_gemv<T>(gate_up, m, ff, GemvInput::kSwiGLU, w_down, n, nullptr,
                                             y, stream, GemvKernel::kTensorCores);
      if (err != cudaSuccess) {
        return cuda_status(err, ("launch_gemv swiglu " + describe(plan.key)).c_str());
      }
      return Status::Ok();
    } else {
      return Internal("the GEMV serves bf16 products only: " + describe(plan.key));
    }
  }
  CELLM_CUDA_RETURN_IF_ERROR(launch_swiglu<T>(gate_up, m, ff, act, stream), "launch_swiglu");
  return enqueue_product<T, T>(plan, choice, act, m, ff, w_down, n, nullptr, y, stream);
}

template <typename T, typename TOut>
Status Gemm::run(const T* x, int64_t m, int64_t k, const T* w, int64_t n, const T* bias, TOut* y,
                 cudaStream_t stream) {
  static_assert((std::is_same_v<T, __nv_bfloat16> &&
                 (std::is_same_v<TOut, __nv_bfloat16> || std::is_same_v<TOut, float>)) ||
                    (std::is_same_v<T, float> && std::is_same_v<TOut, float>),
                "Gemm::run serves bf16 -> bf16, bf16 -> f32 and f32 -> f32");
  CELLM_RETURN_IF_ERROR(check_call("run", m, k, n, x == nullptr || w == nullptr || y == nullptr));
  if (m == 0) return Status::Ok();
  if (handle_ == nullptr) return InvalidState("Gemm::run on a moved-from Gemm");
  bool gemv_serves = false;
  bool skinny_serves = false;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    gemv_serves = gemv_supports(m, k, x, w);
    skinny_serves = skinny_gemm_supports(m, n, k, x, w);
  }
  if (path_ == GemmPath::kAuto && gemv_serves) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      const cudaError_t err = launch_gemv<TOut>(x, m, k, GemvInput::kPlain, w, n, bias, y, stream);
      if (err != cudaSuccess) {
        return cuda_status(err, ("launch_gemv " +
                                 describe(kCudaType<T>, kCudaType<TOut>, m, n, k, bias != nullptr))
                                    .c_str());
      }
    }
    return Status::Ok();
  }

  CELLM_ASSIGN_OR_RETURN(Plan * plan, plan_for(product_key(x, m, k, w, n, bias, y), bias));
  CELLM_ASSIGN_OR_RETURN(const bool time_now, wants_timing(*plan, stream));
  if (time_now) {
    const Enqueue enqueue = [&](const GemmChoice& choice, cudaStream_t on) {
      return enqueue_product<T, TOut>(*plan, choice, x, m, k, w, n, bias, y, on);
    };
    CELLM_RETURN_IF_ERROR(tune(*plan, gemv_serves, skinny_serves, bias, enqueue, stream));
  }
  return enqueue_product<T, TOut>(*plan, plan->choice, x, m, k, w, n, bias, y, stream);
}

template <typename T>
Status Gemm::run_swiglu_down(const T* gate_up, int64_t m, int64_t ff, const T* w_down, int64_t n,
                             T* act, T* y, cudaStream_t stream) {
  CELLM_RETURN_IF_ERROR(
      check_call("run_swiglu_down", m, ff, n,
                 gate_up == nullptr || w_down == nullptr || act == nullptr || y == nullptr));
  if (m == 0) return Status::Ok();
  if (handle_ == nullptr) return InvalidState("Gemm::run_swiglu_down on a moved-from Gemm");
  bool gemv_serves = false;
  bool skinny_serves = false;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    gemv_serves = gemv_supports(m, ff, gate_up, w_down);
    skinny_serves = skinny_gemm_supports(m, n, ff, act, w_down);
  }
  if (path_ == GemmPath::kTuned) {
    CELLM_ASSIGN_OR_RETURN(Plan * plan,
                           plan_for(swiglu_down_key(gate_up, m, ff, w_down, n, act, y), nullptr));
    CELLM_ASSIGN_OR_RETURN(const bool time_now, wants_timing(*plan, stream));
    if (time_now) {
      const Enqueue enqueue = [&](const GemmChoice& choice, cudaStream_t on) {
        return enqueue_swiglu_down<T>(*plan, choice, gate_up, m, ff, w_down, n, act, y, on);
      };
      CELLM_RETURN_IF_ERROR(tune(*plan, gemv_serves, skinny_serves, nullptr, enqueue, stream));
    }
    return enqueue_swiglu_down<T>(*plan, plan->choice, gate_up, m, ff, w_down, n, act, y, stream);
  }
  if (path_ == GemmPath::kAuto && gemv_serves) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      const cudaError_t err =
          launch_gemv<T>(gate_up, m, ff, GemvInput::kSwiGLU, w_down, n, nullptr, y, stream);
      if (err != cudaSuccess) {
        return cuda_status(
            err, ("launch_gemv swiglu " + describe(kCudaType<T>, kCudaType<T>, m, n, ff, false))
                     .c_str());
      }
    }
    return Status::Ok();
  }
  CELLM_CUDA_RETURN_IF_ERROR(launch_swiglu<T>(gate_up, m, ff, act, stream), "launch_swiglu");
  return run<T, T>(act, m, ff, w_down, n, nullptr, y, stream);
}

bool Gemm::first_warm_of(const GemmChoice& choice) {
  if (choice.kernel != GemmKernel::kCublasLt) return false;
  if (std::any_of(warmed_.begin(), warmed_.end(),
                  [&](const cublasLtMatmulAlgo_t& a) { return same_algo(a, choice.algo); })) {
    return false;
  }
  warmed_.push_back(choice.algo);
  return true;
}

template <typename T, typename TOut>
Result<bool> Gemm::warm(const T* x, int64_t m, int64_t k, const T* w, int64_t n, const T* bias,
                        TOut* y, cudaStream_t stream) {
  CELLM_RETURN_IF_ERROR(check_call("run", m, k, n, x == nullptr || w == nullptr || y == nullptr));
  if (m == 0) return false;
  if (handle_ == nullptr) return InvalidState("Gemm::warm on a moved-from Gemm");
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (path_ == GemmPath::kAuto && gemv_supports(m, k, x, w)) return false;
  }
  CELLM_ASSIGN_OR_RETURN(Plan * plan, plan_for(product_key(x, m, k, w, n, bias, y), bias));
  if (!first_warm_of(plan->choice)) return false;
  CELLM_RETURN_IF_ERROR(
      (enqueue_product<T, TOut>(*plan, plan->choice, x, m, k, w, n, bias, y, stream)));
  return true;
}

template <typename T>
Result<bool> Gemm::warm_swiglu_down(const T* gate_up, int64_t m, int64_t ff, const T* w_down,
                                    int64_t n, T* act, T* y, cudaStream_t stream) {
  CELLM_RETURN_IF_ERROR(
      check_call("run_swiglu_down", m, ff, n,
                 gate_up == nullptr || w_down == nullptr || act == nullptr || y == nullptr));
  if (m == 0) return false;
  if (handle_ == nullptr) return InvalidState("Gemm::warm_swiglu_down on a moved-from Gemm");
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    // run_swiglu_down's fused GEMV, or the GEMV that run would launch on act.
    if (path_ == GemmPath::kAuto &&
        (gemv_supports(m, ff, gate_up, w_down) || gemv_supports(m, ff, act, w_down))) {
      return false;
    }
  }
  // Under kTuned the call is a key of its own; otherwise its product is run's call on act.
  const GemmKey key = path_ == GemmPath::kTuned
                          ? swiglu_down_key(gate_up, m, ff, w_down, n, act, y)
                          : product_key<T, T>(act, m, ff, w_down, n, nullptr, y);
  CELLM_ASSIGN_OR_RETURN(Plan * plan, plan_for(key, nullptr));
  if (!first_warm_of(plan->choice)) return false;
  // A cuBLASLt choice: launch_swiglu into act, then the product, as run_swiglu_down.
  CELLM_RETURN_IF_ERROR(
      enqueue_swiglu_down<T>(*plan, plan->choice, gate_up, m, ff, w_down, n, act, y, stream));
  return true;
}

template Result<bool> Gemm::warm<__nv_bfloat16, __nv_bfloat16>(const __nv_bfloat16*, int64_t,
                                                               int64_t, const __nv_bfloat16*,
                                                               int64_t, const __nv_bfloat16*,
                                                               __nv_bfloat16*, cudaStream_t);
template Result<bool> Gemm::warm<__nv_bfloat16, float>(const __nv_bfloat16*, int64_t, int64_t,
                                                       const __nv_bfloat16*, int64_t,
                                                       const __nv_bfloat16*, float*, cudaStream_t);
template Result<bool> Gemm::warm<float, float>(const float*, int64_t, int64_t, const float*,
                                               int64_t, const float*, float*, cudaStream_t);
template Result<bool> Gemm::warm_swiglu_down<__nv_bfloat16>(const __nv_bfloat16*, int64_t, int64_t,
                                                            const __nv_bfloat16*, int64_t,
                                                            __nv_bfloat16*, __nv_bfloat16*,
                                                            cudaStream_t);
template Result<bool> Gemm::warm_swiglu_down<float>(const float*, int64_t, int64_t, const float*,
                                                    int64_t, float*, float*, cudaStream_t);

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
