// NcclGroup (src/cuda/nccl_group.h): a group of one GPU and of every GPU of the host
// sums and gathers like the host does, eagerly and replayed from a captured graph;
// its errors name what is wrong.
#include "cuda/nccl_group.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gpu_test.h"

namespace cellm::cuda {
namespace {

TEST(NcclGroupTest, ALibraryThatCannotBeLoadedIsNamed) {
  setenv("CELLM_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
  Result<std::unique_ptr<NcclGroup>> g = NcclGroup::create({0});
  unsetenv("CELLM_NCCL_LIBRARY");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kNotSupported);
  EXPECT_NE(g.status().message().find("/nonexistent/libnccl.so.2"), std::string::npos)
      << g.status().to_string();
}

TEST(NcclGroupTest, BadDeviceListsAreRefused) {
  EXPECT_EQ(NcclGroup::create({}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclGroup::create({0, 0}).status().code(), StatusCode::kInvalidArgument);
}

int DeviceCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

std::vector<int> FirstDevices(int n) {
  std::vector<int> d;
  for (int i = 0; i < n; ++i) d.push_back(i);
  return d;
}

// Rank r's value i: (r + 1) * (i % 16), exact in bf16 and in any sum of up to 8 ranks.
float Value(int rank, size_t i) {
  return static_cast<float>((rank + 1) * static_cast<int>(i % 16));
}

// Runs fn(rank) on one thread per rank (each on its own device) and waits.
template <typename Fn>
void OnEveryRank(int world, Fn fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back([&, r] { fn(r); });
  for (std::thread& t : threads) t.join();
}

// Sums and gathers `count` values over a group of `world` GPUs, f32 and bf16, each
// rank from its own thread, and checks every value on every rank against the host.
void SumAndGather(int world, size_t count) {
  Result<std::unique_ptr<NcclGroup>> made = NcclGroup::create(FirstDevices(world));
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  NcclGroup& group = **made;
  EXPECT_EQ(group.world(), world);
  const float ranks_sum = static_cast<float>(world * (world + 1) / 2);
  std::vector<std::string> failures(static_cast<size_t>(world));
  OnEveryRank(world, [&](int rank) {
    std::string& fail = failures[static_cast<size_t>(rank)];
    cudaSetDevice(rank);
    cudaStream_t stream = nullptr;
    cudaStreamCreate(&stream);
    std::vector<float> host(count);
    for (size_t i = 0; i < count; ++i) host[i] = Value(rank, i);
    std::vector<__nv_bfloat16> host_bf16(count);
    for (size_t i = 0; i < count; ++i) host_bf16[i] = __float2bfloat16(host[i]);
    float* f32 = nullptr;
    __nv_bfloat16* bf16 = nullptr;
    float* gathered = nullptr;
    cudaMalloc(&f32, count * sizeof(float));
    cudaMalloc(&bf16, count * sizeof(__nv_bfloat16));
    cudaMalloc(&gathered, count * world * sizeof(float));
    cudaMemcpy(f32, host.data(), count * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemcpy(bf16, host_bf16.data(), count * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice);
    Status s = group.all_gather(rank, f32, gathered, count, DType::kF32, stream);
    if (s.ok()) s = group.all_reduce_sum(rank, f32, count, DType::kF32, stream);
    if (s.ok()) s = group.all_reduce_sum(rank, bf16, count, DType::kBF16, stream);
    if (!s.ok()) fail = s.to_string();
    cudaStreamSynchronize(stream);
    std::vector<float> got(count), got_gathered(count * world);
    cudaMemcpy(got.data(), f32, count * sizeof(float), cudaMemcpyDeviceToHost);
    cudaMemcpy(host_bf16.data(), bf16, count * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost);
    cudaMemcpy(got_gathered.data(), gathered, count * world * sizeof(float),
               cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < count && fail.empty(); ++i) {
      const float want = ranks_sum * static_cast<float>(i % 16);
      if (got[i] != want || __bfloat162float(host_bf16[i]) != want) {
        fail = "sum [" + std::to_string(i) + "]: f32 " + std::to_string(got[i]) + ", bf16 " +
               std::to_string(__bfloat162float(host_bf16[i])) + ", want " + std::to_string(want);
      }
      for (int r = 0; r < world && fail.empty(); ++r) {
        if (got_gathered[r * count + i] != Value(r, i)) {
          fail = "gather [" + std::to_string(r) + ", " + std::to_string(i) + "]";
        }
      }
    }
    cudaFree(f32);
    cudaFree(bf16);
    cudaFree(gathered);
    cudaStreamDestroy(stream);
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(failures[static_cast<size_t>(r)], "") << "rank " << r;
}

TEST(NcclGroupTest, AGroupOfOneGpuKeepsItsValues) {
  CELLM_SKIP_WITHOUT_GPU();
  SumAndGather(1, 4099);
}

TEST(NcclGroupTest, EveryGpuOfTheHostSumsAndGathersLikeTheHost) {
  CELLM_SKIP_WITHOUT_GPU();
  if (DeviceCount() < 2) GTEST_SKIP() << "one GPU: the group of one is the test above";
  SumAndGather(DeviceCount(), 1 << 20);
}

// A decode step's graph holds its all-reduces: capture one per rank, replay it twice.
TEST(NcclGroupTest, ACapturedAllReduceReplaysOnEveryRank) {
  CELLM_SKIP_WITHOUT_GPU();
  const int world = DeviceCount();
  Result<std::unique_ptr<NcclGroup>> made = NcclGroup::create(FirstDevices(world));
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  NcclGroup& group = **made;
  constexpr size_t kCount = 8192;
  std::vector<std::string> failures(static_cast<size_t>(world));
  std::vector<cudaGraphExec_t> execs(static_cast<size_t>(world), nullptr);
  std::vector<cudaStream_t> streams(static_cast<size_t>(world), nullptr);
  std::vector<float*> data(static_cast<size_t>(world), nullptr);
  // Capture on every rank at once (NCCL's communicators of one group capture together).
  OnEveryRank(world, [&](int rank) {
    const auto r = static_cast<size_t>(rank);
    cudaSetDevice(rank);
    cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking);
    cudaMalloc(&data[r], kCount * sizeof(float));
    cudaGraph_t graph = nullptr;
    cudaStreamBeginCapture(streams[r], cudaStreamCaptureModeThreadLocal);
    const Status s = group.all_reduce_sum(rank, data[r], kCount, DType::kF32, streams[r]);
    cudaStreamEndCapture(streams[r], &graph);
    if (!s.ok() || graph == nullptr || cudaGraphInstantiate(&execs[r], graph, 0) != cudaSuccess) {
      failures[r] = "capture: " + s.to_string();
    }
    if (graph != nullptr) cudaGraphDestroy(graph);
  });
  for (int r = 0; r < world; ++r) ASSERT_EQ(failures[static_cast<size_t>(r)], "") << "rank " << r;
  const float ranks_sum = static_cast<float>(world * (world + 1) / 2);
  OnEveryRank(world, [&](int rank) {
    const auto r = static_cast<size_t>(rank);
    cudaSetDevice(rank);
    std::vector<float> host(kCount);
    for (size_t i = 0; i < kCount; ++i) host[i] = Value(rank, i);
    cudaMemcpy(data[r], host.data(), kCount * sizeof(float), cudaMemcpyHostToDevice);
    for (int replay = 1; replay <= 2; ++replay) {
      cudaGraphLaunch(execs[r], streams[r]);
      cudaStreamSynchronize(streams[r]);
      cudaMemcpy(host.data(), data[r], kCount * sizeof(float), cudaMemcpyDeviceToHost);
      // After the first replay every rank holds the sum; the second sums world copies.
      const float factor = replay == 1 ? ranks_sum : ranks_sum * static_cast<float>(world);
      for (size_t i = 0; i < kCount; ++i) {
        if (host[i] != factor * static_cast<float>(i % 16)) {
          failures[r] = "replay " + std::to_string(replay) + " [" + std::to_string(i) + "]";
          break;
        }
      }
    }
    cudaGraphExecDestroy(execs[r]);
    cudaFree(data[r]);
    cudaStreamDestroy(streams[r]);
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(failures[static_cast<size_t>(r)], "") << "rank " << r;
}

TEST(NcclGroupTest, ABadRankOrDtypeIsNamed) {
  CELLM_SKIP_WITHOUT_GPU();
  Result<std::unique_ptr<NcclGroup>> made = NcclGroup::create({0});
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  const Status rank = (*made)->all_reduce_sum(1, nullptr, 0, DType::kF32, nullptr);
  EXPECT_NE(rank.message().find("rank 1 is not in a group of 1"), std::string::npos)
      << rank.to_string();
  const Status fp8 = (*made)->all_reduce_sum(0, nullptr, 0, DType::kF8E4M3, nullptr);
  EXPECT_NE(fp8.message().find("F8_E4M3"), std::string::npos) << fp8.to_string();
}

}  // namespace
}  // namespace cellm::cuda
