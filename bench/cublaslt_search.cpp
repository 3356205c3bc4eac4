// cublaslt_search: whether cuBLASLt has faster kernels for the 8B's decode products at
// many rows than the ones its heuristic proposes (which are what Gemm's tuner times).
//
//   cublaslt_search [--m M]... [--max-configs N] [--peak-gbs G]
//
// For each of the 8B's products (q/k/v 4096 -> 6144, o 4096 -> 4096, gate_up 4096 ->
// 28672, down 14336 -> 4096; bf16 in and out, f32 accumulation, the operand layouts of
// src/cuda/gemm.cpp) and each M (default 128): first the heuristic's 16 candidates, then
// around each of them (keeping its stages, inner shape and custom option) every tile,
// split-K count (1-16; split sums reduced in f32, as Gemm allows for a bf16 output), CTA
// swizzle and cluster shape, then every configuration cublasLtMatmulAlgoCheck accepts
// among each algorithm id's own tiles, stage counts, splits and swizzles, up to N
// accepted a shape (default 4000; around the heuristic alone the o product has ~26,000,
// some minutes of the H200). Each configuration is timed as 10 calls in a CUDA graph (one
// replay) whose calls rotate over copies of the weights totalling >= 512 MiB, so each
// reads its weights from HBM; the 8 fastest are timed again (50 calls, best of 5
// replays). Printed per shape: the heuristic's best and the search's best five, in
// microseconds a call and the weights' rate as a percentage of G (default 4250 GB/s).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_set>
#include <vector>

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "cublaslt_search: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cublaslt_search: %s: cuBLAS status %d\n", what, static_cast<int>(s));
    std::exit(1);
  }
}

constexpr size_t kWorkspaceBytes = size_t{32} << 20;
constexpr int64_t kRotationBytes = int64_t{512} << 20;

struct Config {
  cublasLtMatmulAlgo_t algo;
  std::string name;
  double us = 0;
};

template <typename V>
void set_algo(cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr, V v) {
  check(cublasLtMatmulAlgoConfigSetAttribute(algo, attr, &v, sizeof(v)), "AlgoConfigSetAttribute");
}

template <typename V>
V get_config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  V v{};
  size_t written = 0;
  check(cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written),
        "AlgoConfigGetAttribute");
  return v;
}

// A capability that is a list of uint32 (tiles, stages); empty when there is none.
std::vector<uint32_t> cap_list(const cublasLtMatmulAlgo_t& algo,
                               cublasLtMatmulAlgoCapAttributes_t cap) {
  size_t bytes = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, cap, nullptr, 0, &bytes) != CUBLAS_STATUS_SUCCESS ||
      bytes == 0) {
    return {};
  }
  std::vector<uint32_t> v(bytes / sizeof(uint32_t));
  check(cublasLtMatmulAlgoCapGetAttribute(&algo, cap, v.data(), bytes, &bytes), "AlgoCapGet");
  return v;
}

template <typename V>
V cap_value(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t cap) {
  V v{};
  size_t bytes = 0;
  check(cublasLtMatmulAlgoCapGetAttribute(&algo, cap, &v, sizeof(v), &bytes), "AlgoCapGet");
  return v;
}

std::string describe(const cublasLtMatmulAlgo_t& algo) {
  char buf[200];
  std::snprintf(
      buf, sizeof buf,
      "id %d tile %u stages %u split %u red %u swizzle %u cluster %u inner %u custom %u",
      get_config<int32_t>(algo, CUBLASLT_ALGO_CONFIG_ID),
      get_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
      get_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID),
      get_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
      get_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
      get_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
      static_cast<unsigned>(get_config<uint16_t>(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID)),
      static_cast<unsigned>(get_config<uint16_t>(algo, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID)),
      get_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION));
  return buf;
}

struct Problem {
  cublasLtHandle_t handle;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t a, b, d;
  std::vector<void*> weights;  // copies
  void* x;
  void* y;
  void* workspace;
  cudaStream_t stream;
};

// Microseconds a call: `calls` calls in a graph, best of `replays` replays; < 0 if the
// configuration fails to run.
double time_config(const Problem& p, const cublasLtMatmulAlgo_t& algo, int calls, int replays) {
  const float alpha = 1.0f, beta = 0.0f;
  cudaGraph_t graph = nullptr;
  check(cudaStreamBeginCapture(p.stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  bool ok = true;
  for (int i = 0; i < calls && ok; ++i) {
    ok = cublasLtMatmul(p.handle, p.desc, &alpha,
                        p.weights[static_cast<size_t>(i) % p.weights.size()], p.a, p.x, p.b, &beta,
                        p.y, p.d, p.y, p.d, &algo, p.workspace, kWorkspaceBytes,
                        p.stream) == CUBLAS_STATUS_SUCCESS;
  }
  const cudaError_t end = cudaStreamEndCapture(p.stream, &graph);
  if (!ok || end != cudaSuccess) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    return -1;
  }
  cudaGraphExec_t exec = nullptr;
  if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
    cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    return -1;
  }
  cudaGraphDestroy(graph);
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  double best = -1;
  bool failed = cudaGraphLaunch(exec, p.stream) != cudaSuccess;  // warm-up
  failed = failed || cudaStreamSynchronize(p.stream) != cudaSuccess;
  for (int r = 0; r < replays && !failed; ++r) {
    check(cudaEventRecord(start, p.stream), "record");
    failed = cudaGraphLaunch(exec, p.stream) != cudaSuccess;
    check(cudaEventRecord(stop, p.stream), "record");
    failed = failed || cudaEventSynchronize(stop) != cudaSuccess;
    float ms = 0;
    if (!failed) check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    const double us = 1e3 * ms / calls;
    if (!failed && (best < 0 || us < best)) best = us;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec);
  if (failed) {
    (void)cudaGetLastError();
    return -1;
  }
  return best;
}

void search(const char* name, int64_t k, int64_t n, int64_t m, int max_configs, double peak_gbs,
            cublasLtHandle_t handle, cudaStream_t stream, void* workspace) {
  Problem p{};
  p.handle = handle;
  p.stream = stream;
  p.workspace = workspace;
  const int64_t w_bytes = k * n * 2;
  const int64_t copies = std::max<int64_t>(2, (kRotationBytes + w_bytes - 1) / w_bytes);
  for (int64_t c = 0; c < copies; ++c) {
    void* w = nullptr;
    check(cudaMalloc(&w, static_cast<size_t>(w_bytes)), "cudaMalloc weights");
    check(cudaMemset(w, 0x3c, static_cast<size_t>(w_bytes)), "fill weights");
    p.weights.push_back(w);
  }
  check(cudaMalloc(&p.x, static_cast<size_t>(m * k * 2)), "cudaMalloc x");
  check(cudaMemset(p.x, 0x3c, static_cast<size_t>(m * k * 2)), "fill x");
  check(cudaMalloc(&p.y, static_cast<size_t>(m * n * 2)), "cudaMalloc y");
  check(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "DescCreate");
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta),
        "TRANSA");
  check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb),
        "TRANSB");
  check(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, k, n, k), "layout w");
  check(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, k, m, k), "layout x");
  check(cublasLtMatrixLayoutCreate(&p.d, CUDA_R_16BF, n, m, n), "layout y");

  const auto rate = [&](double us) {
    return 100.0 * static_cast<double>(w_bytes) / (us * 1e3) / peak_gbs;
  };
  const auto refine = [&](std::vector<Config>& list) {
    std::sort(list.begin(), list.end(),
              [](const Config& a, const Config& b) { return a.us < b.us; });
    for (size_t i = 0; i < list.size() && i < 8; ++i) {
      const double us = time_config(p, list[i].algo, 50, 5);
      list[i].us = us < 0 ? 1e9 : us;
    }
    std::sort(list.begin(), list.begin() + static_cast<int64_t>(std::min<size_t>(8, list.size())),
              [](const Config& a, const Config& b) { return a.us < b.us; });
  };

  // The heuristic's candidates.
  std::vector<Config> heuristic;
  {
    cublasLtMatmulPreference_t pref = nullptr;
    check(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
    const uint64_t ws = kWorkspaceBytes;
    check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                               sizeof ws),
          "MAX_WORKSPACE");
    cublasLtMatmulHeuristicResult_t results[16];
    int count = 0;
    check(cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.d, p.d, pref, 16, results,
                                         &count),
          "AlgoGetHeuristic");
    cublasLtMatmulPreferenceDestroy(pref);
    for (int i = 0; i < count; ++i) {
      if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
      const double us = time_config(p, results[i].algo, 10, 1);
      if (us > 0) heuristic.push_back({results[i].algo, describe(results[i].algo), us});
    }
  }
  refine(heuristic);

  // Every configuration the library accepts.
  std::vector<Config> found;
  int tried = 0, accepted = 0;
  const uint32_t splits[] = {1, 2, 3, 4, 5, 6, 8, 12, 16};
  // Sets a configuration's tile, split (its sums reduced in f32) and swizzle.
  const auto configure = [](cublasLtMatmulAlgo_t* algo, uint32_t tile, uint32_t split,
                            uint32_t swz) {
    set_algo(algo, CUBLASLT_ALGO_CONFIG_TILE_ID, tile);
    set_algo(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, split);
    set_algo(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
             static_cast<uint32_t>(split > 1 ? CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE
                                             : CUBLASLT_REDUCTION_SCHEME_NONE));
    set_algo(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, swz);
  };
  // Times a configuration the library accepts once (a quick first timing).
  std::unordered_set<std::string> seen;
  const auto try_config = [&](const cublasLtMatmulAlgo_t& algo) {
    std::string name = describe(algo);
    if (!seen.insert(name).second) return;
    ++tried;
    cublasLtMatmulHeuristicResult_t result{};
    if (cublasLtMatmulAlgoCheck(handle, p.desc, p.a, p.b, p.d, p.d, &algo, &result) !=
            CUBLAS_STATUS_SUCCESS ||
        result.state != CUBLAS_STATUS_SUCCESS || result.workspaceSize > kWorkspaceBytes) {
      return;
    }
    ++accepted;
    const double us = time_config(p, algo, 10, 1);
    if (us > 0) found.push_back({algo, std::move(name), us});
  };
  // Around each of the heuristic's candidates (whose stages, inner shape and custom
  // option the plain enumeration cannot set): every tile, split, swizzle and cluster shape.
  const uint16_t clusters[] = {0, 2, 3, 4, 5, 6, 8};
  for (const Config& h : std::vector<Config>(heuristic)) {
    const std::vector<uint32_t> tiles = cap_list(h.algo, CUBLASLT_ALGO_CAP_TILE_IDS);
    const int32_t splitk = cap_value<int32_t>(h.algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT);
    const uint32_t swizzle = cap_value<uint32_t>(h.algo, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT);
    for (uint32_t tile : tiles) {
      for (uint32_t split : splits) {
        if (split > 1 && splitk == 0) continue;
        for (uint32_t swz = 0; swz <= (swizzle != 0 ? 1u : 0u); ++swz) {
          for (uint16_t cluster : clusters) {
            if (accepted >= max_configs) break;
            cublasLtMatmulAlgo_t algo = h.algo;
            configure(&algo, tile, split, swz);
            set_algo(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, cluster);
            try_config(algo);
          }
        }
      }
    }
  }
  // Then every algorithm id's own tiles, stages, splits and swizzles.
  int ids[256];
  int n_ids = 0;
  check(cublasLtMatmulAlgoGetIds(handle, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF,
                                 CUDA_R_16BF, CUDA_R_16BF, 256, ids, &n_ids),
        "AlgoGetIds");
  for (int i = 0; i < n_ids && accepted < max_configs; ++i) {
    cublasLtMatmulAlgo_t base;
    if (cublasLtMatmulAlgoInit(handle, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF,
                               CUDA_R_16BF, CUDA_R_16BF, ids[i], &base) != CUBLAS_STATUS_SUCCESS) {
      continue;
    }
    std::vector<uint32_t> tiles = cap_list(base, CUBLASLT_ALGO_CAP_TILE_IDS);
    if (tiles.empty()) tiles.push_back(CUBLASLT_MATMUL_TILE_UNDEFINED);
    std::vector<uint32_t> stages = cap_list(base, CUBLASLT_ALGO_CAP_STAGES_IDS);
    if (stages.empty()) stages.push_back(CUBLASLT_MATMUL_STAGES_UNDEFINED);
    const int32_t splitk = cap_value<int32_t>(base, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT);
    const uint32_t reductions = cap_value<uint32_t>(base, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK);
    const uint32_t swizzle = cap_value<uint32_t>(base, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT);
    for (uint32_t tile : tiles) {
      for (uint32_t stage : stages) {
        for (uint32_t split : splits) {
          if (split > 1 &&
              (splitk == 0 || (reductions & CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE) == 0)) {
            continue;
          }
          for (uint32_t swz = 0; swz <= (swizzle != 0 ? 1u : 0u); ++swz) {
            if (accepted >= max_configs) break;
            cublasLtMatmulAlgo_t algo = base;
            set_algo(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, stage);
            configure(&algo, tile, split, swz);
            try_config(algo);
          }
        }
      }
    }
  }
  refine(found);

  std::printf(
      "%s (k %ld -> n %ld, m %ld, %.1f MB of weights): %d algorithm ids, %d configurations "
      "tried, %d accepted, %zu ran\n",
      name, static_cast<long>(k), static_cast<long>(n), static_cast<long>(m), w_bytes / 1e6, n_ids,
      tried, accepted, found.size());
  if (!heuristic.empty()) {
    std::printf("  heuristic best  %8.2f us (%5.1f%%)  %s\n", heuristic[0].us,
                rate(heuristic[0].us), heuristic[0].name.c_str());
  }
  for (size_t i = 0; i < found.size() && i < 5; ++i) {
    std::printf("  search #%zu       %8.2f us (%5.1f%%)  %s\n", i + 1, found[i].us,
                rate(found[i].us), found[i].name.c_str());
  }
  std::fflush(stdout);
  cublasLtMatrixLayoutDestroy(p.a);
  cublasLtMatrixLayoutDestroy(p.b);
  cublasLtMatrixLayoutDestroy(p.d);
  cublasLtMatmulDescDestroy(p.desc);
  for (void* w : p.weights) cudaFree(w);
  cudaFree(p.x);
  cudaFree(p.y);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> ms;
  int max_configs = 4000;
  double peak_gbs = 4250;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--m") == 0 && i + 1 < argc) {
      ms.push_back(std::atoll(argv[++i]));
    } else if (std::strcmp(argv[i], "--max-configs") == 0 && i + 1 < argc) {
      max_configs = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--peak-gbs") == 0 && i + 1 < argc) {
      peak_gbs = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr, "cublaslt_search: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (ms.empty()) ms.push_back(128);
  cublasLtHandle_t handle = nullptr;
  check(cublasLtCreate(&handle), "cublasLtCreate");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  void* workspace = nullptr;
  check(cudaMalloc(&workspace, kWorkspaceBytes), "cudaMalloc workspace");
  struct Shape {
    const char* name;
    int64_t k, n;
  };
  const Shape shapes[] = {
      {"o", 4096, 4096}, {"qkv", 4096, 6144}, {"down", 14336, 4096}, {"gate_up", 4096, 28672}};
  for (int64_t m : ms) {
    for (const Shape& s : shapes)
      search(s.name, s.k, s.n, m, max_configs, peak_gbs, handle, stream, workspace);
  }
  return 0;
}
