#include "cuda/gemm_tuning.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <numeric>
#include <tuple>
#include <utility>

#include "cuda/cuda_check.h"

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
  return static_cast<cudaDataType_t>(t) == CUDA_R_16BF ? "bf16" : "f32";
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
  for (int r = 0; r < kTimedRuns; ++r) {
    CELLM_ASSIGN_OR_RETURN(Event start, Event::create());
    CELLM_ASSIGN_OR_RETURN(Event end, Event::create());
    timer.starts_.push_back(std::move(start));
    timer.ends_.push_back(std::move(end));
  }
  int l2_bytes = 0;
  CELLM_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device),
                             "reading the L2 size");
  if (l2_bytes > 0) {
    Result<DeviceBuffer> flush = DeviceBuffer::allocate(2 * static_cast<size_t>(l2_bytes));
    if (flush.ok()) {
      timer.flush_ = std::move(*flush);
    } else {
      cudaGetLastError();  // the failed allocation must not surface at a later launch
    }
  }
  return timer;
}

Result<float> GemmTimer::time(const std::function<Status()>& enqueue, cudaStream_t stream,
                              float give_up_above_us) {
  const auto failed = [](Status s) {
    cudaGetLastError();  // a launch error of the candidate is its own, not a later kernel's
    return s;
  };
  for (int warm = 0; warm < 2; ++warm) {
    if (Status s = enqueue(); !s.ok()) return failed(std::move(s));
  }
  CELLM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "running a GEMM candidate");

  std::vector<float> runs_us;
  const auto timed_runs = [&](int count) -> Status {
    for (int r = 0; r < count; ++r) {
      if (flush_.get() != nullptr) {
        CELLM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flush_.get(), r, flush_.bytes(), stream),
                                   "flushing the L2");
      }
      const auto i = static_cast<size_t>(r);
      CELLM_CUDA_RETURN_IF_ERROR(cudaEventRecord(starts_[i].get(), stream), "timing a GEMM");
      if (Status s = enqueue(); !s.ok()) return failed(std::move(s));
      CELLM_CUDA_RETURN_IF_ERROR(cudaEventRecord(ends_[i].get(), stream), "timing a GEMM");
    }
    CELLM_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(ends_[static_cast<size_t>(count - 1)].get()),
                               "running a GEMM candidate");
    for (int r = 0; r < count; ++r) {
      float ms = 0;
      const auto i = static_cast<size_t>(r);
      CELLM_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, starts_[i].get(), ends_[i].get()),
                                 "reading a GEMM's time");
      runs_us.push_back(1000.0f * ms);
    }
    return Status::Ok();
  };

  CELLM_RETURN_IF_ERROR(timed_runs(kEarlyRuns));
  const float early_us =
      std::accumulate(runs_us.begin(), runs_us.end(), 0.0f) / static_cast<float>(runs_us.size());
  if (early_us > give_up_above_us) return early_us;
  CELLM_RETURN_IF_ERROR(timed_runs(kTimedRuns - kEarlyRuns));
  std::sort(runs_us.begin(), runs_us.end());
  const size_t kept = runs_us.size() - runs_us.size() / 4;
  return std::accumulate(runs_us.begin(), runs_us.begin() + static_cast<std::ptrdiff_t>(kept),
                         0.0f) /
         static_cast<float>(kept);
}

}  // namespace cellm::cuda
