#include "cuda/gemm_tuning.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "cuda/cuda_check.h"
#include "cuda/kernels/l2_flush.h"

namespace cellm::cuda {
namespace {

using ChoiceKey = std::tuple<int, size_t, GemmKey>;

struct ChoiceTable {
  std::mutex mutex;
  std::map<ChoiceKey, GemmChoice> choices;  // guarded by mutex
};

ChoiceTable& choice_table() {
  static ChoiceTable table;
  return table;
}

template <typename V>
V algo_attribute(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  V value{};
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &value, sizeof(value), &written) !=
      CUBLAS_STATUS_SUCCESS) {
    return V{};
  }
  return value;
}

const char* reduction_name(uint32_t scheme) {
  switch (scheme) {
    case CUBLASLT_REDUCTION_SCHEME_INPLACE:
      return "in place";
    case CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE:
      return "reduced in f32";
    case CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE:
      return "reduced in the output type";
    default:
      return "unreduced";
  }
}

const char* data_type_name(int t) {
  switch (static_cast<cudaDataType_t>(t)) {
    case CUDA_R_16BF:
      return "bf16";
    case CUDA_R_8F_E4M3:
      return "e4m3";
    default:
      return "f32";
  }
}

}  // namespace

AlgoSplit algo_split(const cublasLtMatmulAlgo_t& algo) {
  AlgoSplit split;
  split.splits =
      std::max<int32_t>(1, algo_attribute<int32_t>(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM));
  split.reduction = algo_attribute<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME);
  return split;
}

std::string describe_algo(const cublasLtMatmulAlgo_t& algo, const std::string& origin) {
  const AlgoSplit split = algo_split(algo);
  std::string s =
      "cublasLt " + origin + ": id " +
      std::to_string(algo_attribute<int32_t>(algo, CUBLASLT_ALGO_CONFIG_ID)) + " tile " +
      std::to_string(algo_attribute<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_TILE_ID)) + " stages " +
      std::to_string(algo_attribute<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID));
  if (split.splits > 1) {
    s += " splitK " + std::to_string(split.splits) + " " + reduction_name(split.reduction);
  }
  return s;
}

std::optional<GemmChoice> find_tuned_choice(int device, size_t workspace_bytes,
                                            const GemmKey& key) {
  ChoiceTable& table = choice_table();
  const std::lock_guard<std::mutex> lock(table.mutex);
  const auto it = table.choices.find(ChoiceKey{device, workspace_bytes, key});
  if (it == table.choices.end()) return std::nullopt;
  return it->second;
}

GemmChoice remember_tuned_choice(int device, size_t workspace_bytes, const GemmKey& key,
                                 const GemmChoice& choice) {
  ChoiceTable& table = choice_table();
  const std::lock_guard<std::mutex> lock(table.mutex);
  return table.choices.emplace(ChoiceKey{device, workspace_bytes, key}, choice).first->second;
}

std::vector<TunedGemm> tuned_gemms() {
  ChoiceTable& table = choice_table();
  const std::lock_guard<std::mutex> lock(table.mutex);
  std::vector<TunedGemm> all;
  all.reserve(table.choices.size());
  for (const auto& [key, choice] : table.choices) {
    all.push_back(TunedGemm{std::get<0>(key), std::get<2>(key), choice});
  }
  return all;
}

std::string describe(const TunedGemm& tuned) {
  const GemmKey& k = tuned.key;
  char times[96];
  if (tuned.choice.heuristic_us > 0) {
    std::snprintf(times, sizeof(times), " %.1f us (heuristic %.1f us)", tuned.choice.us,
                  tuned.choice.heuristic_us);
  } else {
    std::snprintf(times, sizeof(times), " %.1f us", tuned.choice.us);
  }
  std::string s = k.op == GemmOp::kSwiGLUDown ? "swiglu+down " : "gemm ";
  s += std::string(data_type_name(k.a_type)) + "->" + data_type_name(k.out_type) +
       " m=" + std::to_string(k.m) + " n=" + std::to_string(k.n) + " k=" + std::to_string(k.k) +
       (k.has_bias ? " +bias" : "");
  if (tuned.device != 0) s += " (device " + std::to_string(tuned.device) + ")";
  return s + ": " + tuned.choice.name + times;
}

Result<GemmTimer> GemmTimer::create(int device) {
  GemmTimer timer;
  CELLM_ASSIGN_OR_RETURN(timer.stream_, Stream::create());
  CELLM_ASSIGN_OR_RETURN(timer.start_, Event::create());
  CELLM_ASSIGN_OR_RETURN(timer.end_, Event::create());
  int l2_bytes = 0;
  CELLM_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device),
                             "reading the L2 size");
  if (l2_bytes > 0) {
    // Twice the L2, and a scratch word for the flush kernel's sink after it.
    const size_t flush_bytes = 2 * static_cast<size_t>(l2_bytes) / 16 * 16;
    Result<DeviceBuffer> flush = DeviceBuffer::allocate(flush_bytes + 16);
    if (flush.ok()) {
      timer.flush_ = std::move(*flush);
      timer.flush_bytes_ = flush_bytes;
      CELLM_CUDA_RETURN_IF_ERROR(cudaMemset(timer.flush_.get(), 0, timer.flush_.bytes()),
                                 "clearing the L2 flush buffer");
    } else {
      cudaGetLastError();  // the failed allocation must not surface at a later launch
    }
  }
  return timer;
}

Status GemmTimer::enqueue_flush() {
  const cudaStream_t stream = stream_.get();
  if (flush_bytes_ == 0) return Status::Ok();
  auto* sink = reinterpret_cast<uint32_t*>(flush_.as<unsigned char>() + flush_bytes_);
  CELLM_CUDA_RETURN_IF_ERROR(launch_l2_flush(flush_.get(), flush_bytes_, sink, stream),
                             "flushing the L2");
  return Status::Ok();
}

Result<GraphExec> GemmTimer::capture(const Enqueue& enqueue) {
  const cudaStream_t stream = stream_.get();
  CELLM_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                             "capturing GEMM candidates");
  Status status;
  for (int c = 0; c < kCallsPerGraph && status.ok(); ++c) {
    status = enqueue_flush();
    if (status.ok() && enqueue) status = enqueue(stream);
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  if (!status.ok()) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();
    return status;
  }
  CELLM_CUDA_RETURN_IF_ERROR(end, "capturing GEMM candidates");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  CELLM_CUDA_RETURN_IF_ERROR(inst, "instantiating GEMM candidates");
  return GraphExec(exec);
}

Result<float> GemmTimer::replay_us(const GraphExec& exec) {
  const cudaStream_t stream = stream_.get();
  CELLM_CUDA_RETURN_IF_ERROR(cudaEventRecord(start_.get(), stream), "timing a GEMM");
  CELLM_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec.get(), stream), "replaying GEMM candidates");
  CELLM_CUDA_RETURN_IF_ERROR(cudaEventRecord(end_.get(), stream), "timing a GEMM");
  CELLM_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(end_.get()), "running a GEMM candidate");
  float ms = 0;
  CELLM_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start_.get(), end_.get()),
                             "reading a GEMM's time");
  return 1000.0f * ms;
}

Result<float> GemmTimer::time(const Enqueue& enqueue, cudaStream_t caller, float give_up_above_us) {
  const auto failed = [](Status s) {
    cudaGetLastError();  // a launch error of the candidate is its own, not a later kernel's
    return s;
  };
  CELLM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(caller), "waiting for a GEMM's operands");
  const cudaStream_t stream = stream_.get();
  for (int warm = 0; warm < 2; ++warm) {
    if (Status s = enqueue(stream); !s.ok()) return failed(std::move(s));
  }
  CELLM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "running a GEMM candidate");
  if (!flush_only_us_) {
    // The flushes alone, once per timer: what every candidate's graph pays besides it.
    CELLM_ASSIGN_OR_RETURN(GraphExec flushes, capture(nullptr));
    float best = std::numeric_limits<float>::infinity();
    for (int r = 0; r < kReplays + 1; ++r) {  // the first replay uploads the graph
      CELLM_ASSIGN_OR_RETURN(const float us, replay_us(flushes));
      if (r > 0) best = std::min(best, us);
    }
    flush_only_us_ = best;
  }
  Result<GraphExec> exec = capture(enqueue);
  if (!exec.ok()) return failed(exec.status());
  float best = std::numeric_limits<float>::infinity();
  for (int r = 0; r < kReplays + 1; ++r) {
    CELLM_ASSIGN_OR_RETURN(const float us, replay_us(*exec));
    if (r == 0) continue;
    best = std::min(best, us);
    const float per_call = std::max(0.0f, best - *flush_only_us_) / kCallsPerGraph;
    if (per_call > give_up_above_us) return per_call;
  }
  return std::max(0.0f, best - *flush_only_us_) / kCallsPerGraph;
}

}  // namespace cellm::cuda
