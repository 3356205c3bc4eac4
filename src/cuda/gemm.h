// Gemm: the linear layers' matrix product y = x · wᵀ (+ bias): through cuBLASLt, with one
// cached plan (descriptors, layouts, preference, heuristic algorithm) per call shape, or,
// for the decode shapes (bf16, at most kGemvMaxRows rows), through the GEMV kernel of
// kernels/gemv.h, which reads the weights once in one launch where cuBLASLt's split-K
// algorithms add a reduction kernel.
//
// Shapes (row-major, as PyTorch's Linear): x [m, k], w [n, k] ([out_features,
// in_features]), bias [n] or null, y [m, n]. Every product is accumulated in f32
// (CUBLAS_COMPUTE_32F, f32 alpha/beta). Type combinations (T, TOut):
//   (__nv_bfloat16, __nv_bfloat16), (__nv_bfloat16, float)   production (bf16 A/B)
//   (float, float)   the exact-parity mode: true f32 products, never TF32
//
// Row-major -> column-major mapping. cuBLASLt is column-major, and a row-major [r, c]
// matrix (leading dimension c) is, byte for byte, the column-major [c, r] matrix: its
// transpose. So, with the suffix c for the column-major view of the same memory,
//   x [m, k] = xc [k, m], ld k        w [n, k] = wc [k, n], ld k        y [m, n] = yc [n, m], ld n
// and y = x · wᵀ  <=>  yᵀ = w · xᵀ  <=>  yc = wcᵀ · xc. cuBLASLt computes D = op(A) · op(B)
// with A = wc (op T), B = xc (op N), C = D = yc (beta = 0): M = n, N = m, K = k. The bias
// [n] is then a per-row vector of D ([n, m]) broadcast over its m columns — exactly what
// CUBLASLT_EPILOGUE_BIAS adds.
//
// The bias goes through that epilogue when its type equals TOut (bf16 -> bf16, f32 -> f32);
// otherwise (bf16 -> f32), or when cuBLASLt offers no epilogue algorithm for the shape,
// a separate kernel adds it after the product (launch_add_bias, kernels/bias.h).
//
// The GEMV serves a bf16 call (either TOut) when gemv_supports(m, k, x, w) (1 <= m <=
// kGemvMaxRows, k % 8 == 0, x and w 16-byte aligned; kernels/gemv.h). It adds the bias in
// f32 before its single rounding, needs no plan and no workspace, and gives a row of y
// the same bits for every m it serves. Under kAuto it serves every such call;
// GemmPath::kCublasLtOnly turns it off (benchmarks, and tests of the cuBLASLt path);
// under kTuned it is one of the candidates (below).
//
// Plans (cuBLASLt calls, and every call under kTuned) are keyed by GemmKey (gemm_tuning.h:
// the operation, T, TOut, m, n, k, bias or not, the alignment of each pointer up to 256
// bytes): the first call of a key builds its plan and runs cuBLASLt's heuristic (host work
// only); later calls only set the bias pointer and enqueue the product, so they are safe
// inside CUDA graph capture. Warm every shape before capturing (GEMV calls under kAuto need
// no warming).
//
// Tuned mode (GemmPath::kTuned). While set_tuning(true) is in effect, the first call of a
// key outside CUDA graph capture (cudaStreamIsCapturing) times candidates on the call's own
// operands and stream (GemmTimer, gemm_tuning.h) and keeps the fastest: the first 8
// algorithms of cuBLASLt's heuristic, up to 8 more from a second query restricted to
// algorithms without a separate reduction kernel (CUBLASLT_REDUCTION_SCHEME_NONE |
// INPLACE), from 64 rows the first of them again with 64x64, 64x128 and 128x64 tiles and no
// split (clusters 1x1x1 and 1x2x1; what cublasLtMatmulAlgoCheck accepts), deduplicated, and
// the GEMV's two kernels (GemvKernel) for the bf16 calls they serve. run_swiglu_down's
// candidates are whole units: the fused tensor-core GEMV, or
// launch_swiglu followed by the kRows GEMV or by each cuBLASLt algorithm. For bf16 outputs, split-K
// algorithms that reduce in the output type (INPLACE, OUTPUT_TYPE) are left out: they round partial
// sums to bf16, outside the accumulation contract above, which every candidate meets. A candidate
// that fails (cublasLtMatmul refuses it) is skipped; when none runs, the call returns an Internal
// Status naming the shape. Timing runs each candidate about ten times, writing y (and act)
// each time, which are outputs anyway; the call then runs the chosen kernel, so y holds
// its result. Choices go into a process-wide table (gemm_tuning.h) that every later Gemm
// of the process adopts for the key: the same kernels, so the same bits, within a process;
// another process may choose differently (timing). With tuning off, or while the stream
// captures, a new key takes the table's choice if there is one, else the heuristic's
// first (as kCublasLtOnly does), and is timed when it next comes with tuning on outside
// capture. Timing synchronises the stream and allocates a flush buffer (freed by
// set_tuning(false)), so callers turn tuning on only around the shapes worth tuning and
// repeat (the decode buckets), never for shapes that vary per call (prefill).
//
// Owns the cuBLASLt handle and a device workspace (RAII; movable, not copyable).
// Thread-safety: none. Calls on different streams must not overlap in time (they share
// the workspace).
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "cellm/status.h"
#include "cuda/device_memory.h"
#include "cuda/gemm_tuning.h"

namespace cellm::cuda {

// Which kernels serve Gemm::run.
enum class GemmPath {
  kAuto,          // the GEMV for the shapes it serves (see above), cuBLASLt otherwise
  kCublasLtOnly,  // cuBLASLt for every call
  kTuned,         // per key, the fastest of cuBLASLt's candidates and the GEMV (see above)
};

class Gemm {
 public:
  // A cuBLASLt handle and a workspace of `workspace_bytes` (cuBLASLt advises 32 MiB on
  // Hopper).
  static Result<Gemm> create(size_t workspace_bytes = size_t{32} << 20,
                             GemmPath path = GemmPath::kAuto);

  Gemm(Gemm&& other) noexcept;
  Gemm& operator=(Gemm&& other) noexcept;
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;
  ~Gemm();

  // y[m, n] = x[m, k] · w[n, k]ᵀ (+ bias[n] when bias != nullptr), enqueued on `stream`.
  // m = 0 enqueues nothing. REQUIRES: m >= 0, n > 0, k > 0; device pointers; y does not
  // overlap x, w or bias. Errors (a shape cuBLASLt cannot serve, a launch failure) come
  // back as an Internal Status naming the shape.
  template <typename T, typename TOut>
  Status run(const T* x, int64_t m, int64_t k, const T* w, int64_t n, const T* bias, TOut* y,
             cudaStream_t stream);

  // The MLP's activation and down projection:
  //   y[m, n] = swiglu(gate_up)[m, ff] · w_down[n, ff]ᵀ,  swiglu as launch_swiglu computes it.
  // gate_up: [m, 2 ff] (gate | up per row, the gate_up projection's output); w_down:
  // [n, ff]; act: [m, ff] scratch; y: [m, n]. T is __nv_bfloat16 or float.
  // Under kAuto, a bf16 call with gemv_supports(m, ff, gate_up, w_down) is one fused GEMV
  // launch that computes the activation as it stages its input; act is neither read nor
  // written, and y equals launch_swiglu followed by launch_gemv (kPlain) bit for bit.
  // Every other call (more rows, f32, odd alignment, kCublasLtOnly) is launch_swiglu into
  // act followed by run<T, T>(act, ...). Under kTuned the call is a key of its own, whose
  // choice is the fused GEMV (act untouched) or launch_swiglu into act followed by the
  // kRows GEMV, launch_skinny_gemm or a cuBLASLt product, timed as a whole. So a forward calls this
  // in place of the two for every batch size and gives it the activation buffer it already has. m =
  // 0 enqueues nothing. REQUIRES: m >= 0, ff > 0, n > 0; device pointers; act and y overlap neither
  // each other nor the inputs. Errors as run's.
  template <typename T>
  Status run_swiglu_down(const T* gate_up, int64_t m, int64_t ff, const T* w_down, int64_t n,
                         T* act, T* y, cudaStream_t stream);

  // Warming (before serving). cuBLASLt loads a kernel's code the first time the process
  // launches it: milliseconds a kernel, which would land on whichever request's
  // prefill first meets a shape whose heuristic choice names that kernel. warm() builds
  // the plan run() would use for the same call (host work, as run's first call does)
  // and, when the plan's kernel is a cuBLASLt algorithm this Gemm has not warmed yet,
  // enqueues the call once (writing y, and act for warm_swiglu_down); other calls
  // enqueue nothing. It never times candidates (tuning is for run under set_tuning).
  // Returns whether it enqueued. REQUIRES and errors: as run's / run_swiglu_down's.
  template <typename T, typename TOut>
  Result<bool> warm(const T* x, int64_t m, int64_t k, const T* w, int64_t n, const T* bias, TOut* y,
                    cudaStream_t stream);
  template <typename T>
  Result<bool> warm_swiglu_down(const T* gate_up, int64_t m, int64_t ff, const T* w_down, int64_t n,
                                T* act, T* y, cudaStream_t stream);
  // Distinct cuBLASLt algorithms warm() has enqueued.
  size_t warmed_algorithms() const { return warmed_.size(); }

  // Under kTuned: whether keys met from now on (and keys met before that still run the
  // heuristic's choice) may be timed (see above). Off at creation; turning it off frees
  // the timer and its flush buffer. No effect under the other paths.
  void set_tuning(bool on);
  bool tuning() const { return tuning_; }

  // Plans built so far (one per distinct key; see above).
  size_t cached_plans() const { return plans_.size(); }

  // How a plan's kernel was chosen.
  enum class PlanSource {
    kHeuristic,  // cuBLASLt's first choice
    kTimed,      // timed here (kTuned)
    kAdopted,    // another Gemm's timed choice, from the process-wide table (kTuned)
  };
  struct PlanInfo {
    GemmKey key;
    GemmChoice choice;
    PlanSource source = PlanSource::kHeuristic;
  };
  // Every plan built so far, ordered by key.
  std::vector<PlanInfo> describe_plans() const;

 private:
  struct Plan;
  using Enqueue = std::function<Status(const GemmChoice&, cudaStream_t)>;

  explicit Gemm(GemmPath path);
  // The cached plan of `key`, built on first use (bias: the call's bias pointer, which the
  // heuristic reads for its alignment): the table's choice under kTuned when there is one,
  // else the heuristic's first.
  Result<Plan*> plan_for(const GemmKey& key, const void* bias);
  // True (and remembered) when `choice` is a cuBLASLt algorithm warm() has not enqueued.
  bool first_warm_of(const GemmChoice& choice);
  // Sets the plan's epilogue (bias or none) to match `choice` and makes it the plan's.
  Status adopt(Plan& plan, const GemmChoice& choice, const void* bias, PlanSource source);
  // True when this call may time the plan's candidates: kTuned, tuning on, the plan not
  // timed or adopted yet, and the stream not capturing.
  Result<bool> wants_timing(const Plan& plan, cudaStream_t stream) const;
  // Times every candidate with `enqueue` on `stream` (the GEMVs among them when
  // `gemv_candidate`, launch_skinny_gemm when `skinny_candidate`), stores the fastest in
  // the process-wide table and adopts it (or the table's choice, when another Gemm stored
  // one first).
  Status tune(Plan& plan, bool gemv_candidate, bool skinny_candidate, const void* bias,
              const Enqueue& enqueue, cudaStream_t stream);
  // The cuBLASLt algorithms worth timing for the plan (see above), the heuristic's first
  // choice first when it qualifies.
  Result<std::vector<GemmChoice>> cublaslt_candidates(const Plan& plan);
  // One run of `choice` for a product / a SwiGLU down projection.
  template <typename T, typename TOut>
  Status enqueue_product(const Plan& plan, const GemmChoice& choice, const T* x, int64_t m,
                         int64_t k, const T* w, int64_t n, const T* bias, TOut* y,
                         cudaStream_t stream);
  template <typename T>
  Status enqueue_swiglu_down(const Plan& plan, const GemmChoice& choice, const T* gate_up,
                             int64_t m, int64_t ff, const T* w_down, int64_t n, T* act, T* y,
                             cudaStream_t stream);

  GemmPath path_ = GemmPath::kAuto;
  int device_ = 0;  // the device current at create()
  bool tuning_ = false;
  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer workspace_;
  std::unique_ptr<GemmTimer> timer_;  // while tuning, from the first timed key
  std::map<GemmKey, std::unique_ptr<Plan>> plans_;
  std::vector<cublasLtMatmulAlgo_t> warmed_;  // by warm(), in order
};

}  // namespace cellm::cuda
