// sample_bench: microseconds per cuda::launch_sample, timed with CUDA events.
//
//   sample_bench [--iters N] [--vocab V] [--rows R] [--policy NAME]
//
// --vocab, --rows and --policy (a policy's name as printed, e.g. "T0.7 top-p0.9")
// keep only the shapes that match, e.g. for a kernel trace of one shape
// (bench/kernel_trace.cpp).
// For vocab 128256 (Llama 3) and 32000 (Llama 2), rows 1, 16, 64 and 256, and
// five policies (greedy; temperature 0.7 with top-p 0.9, with top-k 50, alone;
// temperature 1 with min-p 0.05), prints the time of one
// launch two ways: "eager", back-to-back launches on a stream (what a step pays
// without graphs, host launch cost included when it exceeds the GPU's), and
// "graph", launches replayed from a CUDA graph (the GPU's time, as a captured
// decode step pays it). Also the split launch_sample chose (chunks per row) and
// the logits' read bandwidth of one pass, logits bytes / graph time.
// Logits are normal with sd 2 plus a peak of 8 on a few ids per row, roughly a
// model's spread (top-p 0.9 then keeps about 11k candidates of 128k; flatter
// rows cost more, see sampling.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/kernels/sampling.h"

namespace {

using cellm::cuda::launch_sample;
using cellm::cuda::sample_split;
using cellm::cuda::sample_workspace_bytes;
using cellm::cuda::SamplingRow;

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
}

constexpr int kLaunchesPerGraph = 20;

struct Policy {
  const char* name;
  SamplingRow row;
};

// Device buffers for the largest shape, reused by every smaller one.
struct Buffers {
  float* logits = nullptr;
  SamplingRow* params = nullptr;
  int32_t* tokens = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;

  Buffers(int64_t max_rows, int64_t max_vocab) {
    workspace_bytes = sample_workspace_bytes(max_rows, max_vocab);
    const size_t logits_bytes = static_cast<size_t>(max_rows * max_vocab) * sizeof(float);
    check(cudaMalloc(&logits, logits_bytes), "cudaMalloc logits");
    check(cudaMalloc(&params, static_cast<size_t>(max_rows) * sizeof(SamplingRow)),
          "cudaMalloc params");
    check(cudaMalloc(&tokens, static_cast<size_t>(max_rows) * sizeof(int32_t)),
          "cudaMalloc tokens");
    check(cudaMalloc(&workspace, workspace_bytes), "cudaMalloc workspace");
  }
  ~Buffers() {
    cudaFree(logits);
    cudaFree(params);
    cudaFree(tokens);
    cudaFree(workspace);
  }
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
};

// Milliseconds between two events recorded around fn() on `stream`.
template <typename Fn>
float time_ms(cudaStream_t stream, Fn&& fn) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  check(cudaEventRecord(start, stream), "cudaEventRecord");
  fn();
  check(cudaEventRecord(stop, stream), "cudaEventRecord");
  check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0.f;
  check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 200;
  int64_t only_vocab = 0;
  int64_t only_rows = 0;
  std::string only_policy;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
      iters = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--vocab") == 0 && i + 1 < argc) {
      only_vocab = std::atoll(argv[++i]);
    } else if (std::strcmp(argv[i], "--rows") == 0 && i + 1 < argc) {
      only_rows = std::atoll(argv[++i]);
    } else if (std::strcmp(argv[i], "--policy") == 0 && i + 1 < argc) {
      only_policy = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: sample_bench [--iters N] [--vocab V] [--rows R] [--policy NAME]\n");
      return 2;
    }
  }
  const int64_t vocabs[] = {128256, 32000};
  const int64_t row_counts[] = {1, 16, 64, 256};
  Policy greedy{"greedy", {}};
  Policy top_p{"T0.7 top-p0.9", {}};
  top_p.row.temperature = 0.7f;
  top_p.row.top_p = 0.9f;
  Policy top_k{"T0.7 top-k50", {}};
  top_k.row.temperature = 0.7f;
  top_k.row.top_k = 50;
  Policy plain{"T0.7", {}};
  plain.row.temperature = 0.7f;
  Policy min_p{"T1 min-p0.05", {}};
  min_p.row.temperature = 1.0f;
  min_p.row.min_p = 0.05f;
  const Policy policies[] = {greedy, top_p, top_k, plain, min_p};

  const int64_t max_rows = 256;
  const int64_t max_vocab = 128256;
  Buffers buffers(max_rows, max_vocab);
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");

  cudaDeviceProp prop;
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("device: %s, %d SMs; %d launches per timing\n", prop.name, prop.multiProcessorCount,
              iters);
  std::printf("%7s %5s %-14s %7s %10s %10s %9s\n", "vocab", "rows", "policy", "chunks", "eager_us",
              "graph_us", "GB/s");

  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.f, 2.f);
  std::uniform_int_distribution<int32_t> position(0, 1 << 20);
  for (const int64_t vocab : vocabs) {
    if (only_vocab != 0 && vocab != only_vocab) continue;
    std::vector<float> logits(static_cast<size_t>(max_rows * vocab));
    for (float& x : logits) x = normal(rng);
    for (int64_t r = 0; r < max_rows; ++r) {
      for (int peak = 0; peak < 4; ++peak) {
        logits[static_cast<size_t>(r * vocab + (r * 7919 + peak * 104729) % vocab)] = 8.f;
      }
    }
    check(cudaMemcpy(buffers.logits, logits.data(), logits.size() * sizeof(float),
                     cudaMemcpyHostToDevice),
          "upload logits");
    for (const int64_t rows : row_counts) {
      if (only_rows != 0 && rows != only_rows) continue;
      for (const Policy& policy : policies) {
        if (!only_policy.empty() && only_policy != policy.name) continue;
        std::vector<SamplingRow> params(static_cast<size_t>(rows), policy.row);
        for (int64_t r = 0; r < rows; ++r) {
          params[static_cast<size_t>(r)].seed = static_cast<uint64_t>(r) + 1;
          params[static_cast<size_t>(r)].position = position(rng);
        }
        check(cudaMemcpy(buffers.params, params.data(), params.size() * sizeof(SamplingRow),
                         cudaMemcpyHostToDevice),
              "upload params");
        const auto launch = [&] {
          check(launch_sample(buffers.logits, rows, vocab, buffers.params, buffers.tokens,
                              buffers.workspace, buffers.workspace_bytes, stream),
                "launch_sample");
        };
        for (int i = 0; i < 10; ++i) launch();  // warm-up
        check(cudaStreamSynchronize(stream), "warm-up");
        const float eager_ms = time_ms(stream, [&] {
          for (int i = 0; i < iters; ++i) launch();
        });

        cudaGraph_t graph;
        check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
        for (int i = 0; i < kLaunchesPerGraph; ++i) launch();
        check(cudaStreamEndCapture(stream, &graph), "end capture");
        cudaGraphExec_t exec;
        check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
        check(cudaGraphLaunch(exec, stream), "graph warm-up");
        const int replays = std::max(1, iters / kLaunchesPerGraph);
        const float graph_ms = time_ms(stream, [&] {
          for (int i = 0; i < replays; ++i) check(cudaGraphLaunch(exec, stream), "graph launch");
        });
        check(cudaGraphExecDestroy(exec), "graph exec destroy");
        check(cudaGraphDestroy(graph), "graph destroy");

        const double eager_us = 1e3 * eager_ms / iters;
        const double graph_us = 1e3 * graph_ms / (replays * kLaunchesPerGraph);
        const double bytes = static_cast<double>(rows * vocab) * sizeof(float);
        std::printf("%7lld %5lld %-14s %7d %10.2f %10.2f %9.1f\n", static_cast<long long>(vocab),
                    static_cast<long long>(rows), policy.name, sample_split(rows, vocab).n_chunks,
                    eager_us, graph_us, bytes / (graph_us * 1e3));
      }
    }
  }
  check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  return 0;
}
