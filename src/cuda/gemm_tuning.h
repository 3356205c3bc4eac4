// What Gemm's tuned mode (GemmPath::kTuned, gemm.h) measures with and remembers: the key
// of a call shape, the kernel chosen for it, a timer of candidate kernels, and the
// process-wide record of every choice made.
//
// Timing (GemmTimer::time). A candidate is an enqueue of the whole unit being chosen
// (a cuBLASLt product and its bias kernel, or the GEMV; for the MLP's down projection
// also the activation kernel). It runs twice untimed (lazy module loading), then
// kCallsPerGraph times in a captured CUDA graph, each call after an L2 flush
// (kernels/l2_flush.h: a read of twice the L2), as a decode step runs it: in a forward
// each GEMM reads weights that a layer's worth of other weights has pushed out of L2,
// while a loop over one GEMM would find most of a 32 MiB weight (the 8B o_proj) in the
// 50 MB L2 and flatter whichever kernel reuses it best; and the graph gives the
// candidate the launch it has in a step (kernels launched with programmatic dependent
// launch overlap the flush's tail as they overlap a small kernel's). The score is the
// best of kReplays replays, less the best replay of a graph of the flushes alone,
// divided by kCallsPerGraph. A candidate whose first replay already scores past the
// caller's bound (a margin over the best so far) stops there. Timing synchronises the
// stream and captures on it, so it never happens inside CUDA graph capture (Gemm
// checks).
//
// Choices (find_tuned_choice / remember_tuned_choice / tuned_gemms): one process-wide
// table, keyed by (device ordinal, workspace bytes, GemmKey), guarded by a mutex. The
// first choice stored for a key wins and every Gemm of the process that meets the key
// afterwards adopts it, so two executors in one process run the same kernels and give
// the same bits. Another process may choose differently (timings are noisy near a tie);
// every candidate meets the same accuracy contract (gemm.h: f32 accumulation, one
// rounding to the output type), so choices differ only in rounding, as the heuristic's
// choice already does between batch sizes.
//
// Thread-safety: the choice table is safe from any thread; GemmTimer is used by one
// thread at a time.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cellm/status.h"
#include "cuda/device_memory.h"
#include "cuda/kernels/skinny_gemm.h"

namespace cellm::cuda {

// Which operation a key describes.
enum class GemmOp {
  kProduct,     // Gemm::run: y = x · wᵀ (+ bias)
  kSwiGLUDown,  // Gemm::run_swiglu_down: y = swiglu(gate_up) · w_downᵀ
};

// One call shape of Gemm: its plan and its tuned choice are keyed by it. For kSwiGLUDown,
// x is the activation buffer (act, [m, k]) the cuBLASLt product reads and align_gate_up
// the alignment of gate_up (the fused GEMV reads it instead).
struct GemmKey {
  GemmOp op = GemmOp::kProduct;
  int a_type = 0;    // cudaDataType_t of x and w
  int out_type = 0;  // cudaDataType_t of y
  int64_t m = 0, n = 0, k = 0;
  bool has_bias = false;
  // Largest power of two (capped at 256) dividing each pointer; 0 for a null one.
  uint32_t align_x = 0, align_w = 0, align_y = 0, align_bias = 0, align_gate_up = 0;
  auto operator<=>(const GemmKey&) const = default;
};

enum class GemmKernel {
  kCublasLt,  // cublasLtMatmul with `algo` (+ launch_add_bias when the bias is not in its
              // epilogue; + launch_swiglu before it for kSwiGLUDown)
  kGemv,      // launch_gemv with GemvKernel::kTensorCores (kSwiGLU input for kSwiGLUDown)
  kGemvRows,  // launch_gemv with GemvKernel::kRows (kSwiGLUDown: launch_swiglu, then kPlain)
  kSkinny,    // launch_skinny_gemm, 9-128 rows (kSwiGLUDown: launch_swiglu, then it)
};

// The kernel a key runs and, when it was tuned, what the timing found.
struct GemmChoice {
  GemmKernel kernel = GemmKernel::kCublasLt;
  cublasLtMatmulAlgo_t algo{};                   // kCublasLt
  bool bias_in_epilogue = false;                 // kCublasLt: CUBLASLT_EPILOGUE_BIAS adds the bias
  SkinnyRing skinny_ring = SkinnyRing::kShared;  // kSkinny
  int gemv_rows_split = 0;  // kGemvRows: launch_gemv's rows_split (kGemvRowsAutoSplit: its rule)
  // "gemv", "gemv rows split 8", "skinny", "skinny whole-SM ring",
  // "cublasLt h0: id 66 tile 20 stages 10"
  std::string name;
  float us = 0;            // mean device time of the choice (0: not timed)
  float heuristic_us = 0;  // of the heuristic's first choice (0: not timed or failed)
};

// A cuBLASLt algorithm in words: "cublasLt <origin>: id I tile T stages S[ splitK K
// <reduction>]" (the numbers are cuBLASLt's enum values).
std::string describe_algo(const cublasLtMatmulAlgo_t& algo, const std::string& origin);
// The split-K factor and reduction scheme (cublasLtReductionScheme_t) of an algorithm.
struct AlgoSplit {
  int32_t splits = 1;
  uint32_t reduction = 0;
};
AlgoSplit algo_split(const cublasLtMatmulAlgo_t& algo);

// The stored choice of `key`, if any Gemm of this process tuned it.
std::optional<GemmChoice> find_tuned_choice(int device, size_t workspace_bytes, const GemmKey& key);
// Stores `choice` for `key` unless a choice is stored already; returns the stored one.
GemmChoice remember_tuned_choice(int device, size_t workspace_bytes, const GemmKey& key,
                                 const GemmChoice& choice);

// Every choice stored so far, ordered by (device, workspace bytes, key).
struct TunedGemm {
  int device = 0;
  GemmKey key;
  GemmChoice choice;
};
std::vector<TunedGemm> tuned_gemms();
// One line: "<op> <types> m=M n=N k=K[ +bias]: <choice> X us (heuristic Y us)".
std::string describe(const TunedGemm& tuned);

// Times candidate enqueues on a stream (see above). Owns its events and the flush buffer
// (2 x L2 bytes; none when that allocation fails: timing then runs without flushing).
class GemmTimer {
 public:
  static constexpr int kCallsPerGraph = 10;
  static constexpr int kReplays = 3;

  static Result<GemmTimer> create(int device);

  // The score in microseconds of `enqueue(s)`, which enqueues the candidate on stream s;
  // the error of the first failed enqueue or stream operation otherwise (a failed enqueue
  // leaves no CUDA error pending). Waits for `caller` (whose work made the operands),
  // then runs everything on the timer's own stream (capture needs a stream that is not
  // the legacy default one). Stops after a replay whose score already exceeds
  // `give_up_above_us`.
  using Enqueue = std::function<Status(cudaStream_t)>;
  Result<float> time(const Enqueue& enqueue, cudaStream_t caller, float give_up_above_us);

 private:
  GemmTimer() = default;
  Status enqueue_flush();
  // A graph of kCallsPerGraph (flush, enqueue) pairs; flushes only for a null enqueue.
  Result<GraphExec> capture(const Enqueue& enqueue);
  Result<float> replay_us(const GraphExec& exec);

  Stream stream_;
  DeviceBuffer flush_;  // [flush_bytes_] read by the flush kernel, then its sink word
  size_t flush_bytes_ = 0;
  Event start_, end_;
  std::optional<float> flush_only_us_;  // one replay of the flushes-only graph
};

}  // namespace cellm::cuda
