// Tests of launch_after_foreign_start (cuda/graph_edges.h): which edges of a captured
// graph it rewrites (a cuBLASLt kernel followed by one of cellm's programmatic launches;
// never an edge between cellm's kernels, nor one from a copy), that a second pass finds
// nothing left to rewrite, and that the rewritten graph computes the same bits.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "cuda/device_memory.h"
#include "cuda/gemm.h"
#include "cuda/graph_edges.h"
#include "cuda/kernels/swiglu.h"
#include "cuda/launch_control.h"
#include "device_test_util.h"
#include "gpu_test.h"

namespace cellm::cuda {
namespace {

using testing::capture_raw_graph;
using testing::device_array;
using testing::DeviceArray;
using testing::instantiate_graph;
using testing::random_values;
using Bf16 = __nv_bfloat16;

constexpr int64_t kM = 16, kK = 256, kFf = 256;

// SwiGLU of gate_up into out [kM, kFf], then (optionally) x [kM, kK] · w [2 kFf, kK]ᵀ
// through cuBLASLt into gate_up, then SwiGLU into out twice (all rows, then half).
struct Step {
  std::mt19937 rng{7};
  DeviceArray<Bf16> x = device_array<Bf16>(random_values<Bf16>(rng, kM* kK));
  DeviceArray<Bf16> w = device_array<Bf16>(random_values<Bf16>(rng, 2 * kFf * kK));
  DeviceArray<Bf16> gate_up = device_array<Bf16>(std::vector<float>(kM * 2 * kFf, 0.f));
  DeviceArray<Bf16> out = device_array<Bf16>(std::vector<float>(kM * kFf, 0.f));
  Gemm gemm = std::move(Gemm::create(size_t{8} << 20, GemmPath::kCublasLtOnly)).value();

  // A SwiGLU first, so that the GEMM is not the graph's root (the rewrite leaves roots
  // alone: it cannot tell whose they are).
  void enqueue(cudaStream_t s, bool with_gemm) {
    EXPECT_EQ(launch_swiglu<Bf16>(gate_up.get(), kM, kFf, out.get(), s), cudaSuccess);
    if (with_gemm) {
      const Status st =
          gemm.run<Bf16, Bf16>(x.get(), kM, kK, w.get(), 2 * kFf, nullptr, gate_up.get(), s);
      EXPECT_TRUE(st.ok()) << st.to_string();
    }
    EXPECT_EQ(launch_swiglu<Bf16>(gate_up.get(), kM, kFf, out.get(), s), cudaSuccess);
    EXPECT_EQ(launch_swiglu<Bf16>(gate_up.get(), kM / 2, kFf, out.get(), s), cudaSuccess);
  }
};

TEST(GraphEdgesTest, OnlyEdgesFromCublasIntoCellmKernelsAreRewritten) {
  CELLM_SKIP_WITHOUT_GPU();
  if (!programmatic_launch_enabled()) GTEST_SKIP() << "programmatic launch is off";
  Stream stream = std::move(Stream::create()).value();
  Step step;
  step.enqueue(stream.get(), true);  // warms cuBLASLt's plan outside the capture
  CELLM_ASSERT_CUDA(cudaStreamSynchronize(stream.get()));
  const std::vector<Bf16> eager = step.out.download();

  // SwiGLU -> GEMM -> SwiGLU -> SwiGLU: one edge from cuBLASLt into cellm's kernel (the
  // SwiGLUs' own edges are cellm's to cellm's). cuBLASLt may launch more than one kernel; only the
  // edge into the SwiGLU counts.
  cudaGraph_t graph = capture_raw_graph(stream.get(), [&] { step.enqueue(stream.get(), true); });
  ASSERT_NE(graph, nullptr);
  Result<int> rewritten = launch_after_foreign_start(graph);
  ASSERT_TRUE(rewritten.ok()) << rewritten.status().to_string();
  EXPECT_EQ(*rewritten, 1);
  Result<int> again = launch_after_foreign_start(graph);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(*again, 0);
  const GraphExec exec = instantiate_graph(graph);
  ASSERT_NE(exec.get(), nullptr);
  // The graph writes the buffers it captured: clear `out` in place.
  CELLM_ASSERT_CUDA(cudaMemsetAsync(step.out.get(), 0, kM * kFf * sizeof(Bf16), stream.get()));
  for (int i = 0; i < 3; ++i) CELLM_ASSERT_CUDA(cudaGraphLaunch(exec.get(), stream.get()));
  CELLM_ASSERT_CUDA(cudaStreamSynchronize(stream.get()));
  const std::vector<Bf16> replayed = step.out.download();
  ASSERT_EQ(replayed.size(), eager.size());
  EXPECT_EQ(std::memcmp(replayed.data(), eager.data(), eager.size() * sizeof(Bf16)), 0);

  // cellm's kernels alone: nothing to rewrite.
  cudaGraph_t ours = capture_raw_graph(stream.get(), [&] { step.enqueue(stream.get(), false); });
  ASSERT_NE(ours, nullptr);
  Result<int> none = launch_after_foreign_start(ours);
  cudaGraphDestroy(ours);
  ASSERT_TRUE(none.ok()) << none.status().to_string();
  EXPECT_EQ(*none, 0);
}

}  // namespace
}  // namespace cellm::cuda
