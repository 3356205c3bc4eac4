// launch_gather_vocab_slices (kernels/vocab_gather.h) against its host twin, every
// element: the tensor-parallel plans of real vocabularies (near-equal slices of uneven
// width) over 1, 2, 3, 4 and 8 ranks, 1 to 17 rows, eagerly and from a graph; bad
// slice lists are refused without a launch.
#include "cuda/kernels/vocab_gather.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cellm/tensor_parallel.h"
#include "device_test_util.h"
#include "gpu_test.h"

namespace cellm::cuda {
namespace {

using testing::DeviceArray;

// The host twin: out[s, begin[r] + j] = gathered[r * chunk + s * size[r] + j].
std::vector<float> gather_on_host(const std::vector<float>& gathered, int64_t chunk,
                                  const VocabSlices& v, int64_t rows, int64_t vocab) {
  std::vector<float> out(static_cast<size_t>(rows * vocab));
  for (int r = 0; r < v.world; ++r) {
    for (int64_t s = 0; s < rows; ++s) {
      for (int64_t j = 0; j < v.size[r]; ++j) {
        out[static_cast<size_t>(s * vocab + v.begin[r] + j)] =
            gathered[static_cast<size_t>(r * chunk + s * v.size[r] + j)];
      }
    }
  }
  return out;
}

// The slices plan_shard gives a model of this vocabulary over `world` ranks.
VocabSlices slices_of(int64_t vocab, int world) {
  ModelSpec spec;
  spec.hidden_size = 192;
  spec.num_hidden_layers = 1;
  spec.num_attention_heads = 24;  // splits over 1, 2, 3, 4 and 8
  spec.num_key_value_heads = 24;
  spec.head_dim = 8;
  spec.intermediate_size = 256;
  spec.vocab_size = vocab;
  spec.max_position_embeddings = 64;
  Result<ModelConfig> config = ModelConfig::from_spec(spec);
  EXPECT_TRUE(config.ok()) << config.status().to_string();
  VocabSlices v;
  v.world = world;
  for (int r = 0; r < world; ++r) {
    Result<ShardPlan> p = plan_shard(*config, r, world);
    EXPECT_TRUE(p.ok()) << p.status().to_string();
    v.begin[r] = p->vocab_begin;
    v.size[r] = p->vocab_size;
  }
  return v;
}

TEST(VocabGatherTest, EveryRankCountAndRowCountMatchesTheHost) {
  CELLM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  for (int64_t vocab : {int64_t{259}, int64_t{32000}, int64_t{128256}}) {
    for (int world : {1, 2, 3, 4, 8}) {
      const VocabSlices v = slices_of(vocab, world);
      for (int64_t rows : {int64_t{1}, int64_t{5}, int64_t{17}}) {
        int64_t widest = 0;
        for (int r = 0; r < world; ++r) widest = std::max(widest, v.size[r]);
        const int64_t chunk = rows * widest + 3;  // a chunk wider than any rank's rows
        std::vector<float> gathered(static_cast<size_t>(world * chunk));
        for (float& x : gathered) x = u(rng);
        const DeviceArray<float> d_in(gathered);
        DeviceArray<float> d_out(static_cast<size_t>(rows * vocab));
        testing::poison(d_out);
        ASSERT_EQ(
            launch_gather_vocab_slices(d_in.get(), chunk, v, rows, vocab, d_out.get(), nullptr),
            cudaSuccess);
        CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
        const std::string what = "vocab " + std::to_string(vocab) + " over " +
                                 std::to_string(world) + ", rows " + std::to_string(rows);
        testing::expect_bitwise_equal(d_out.download(),
                                      gather_on_host(gathered, chunk, v, rows, vocab), what);
      }
    }
  }
}

TEST(VocabGatherTest, AGraphReplayWritesWhatAnEagerLaunchDoes) {
  CELLM_SKIP_WITHOUT_GPU();
  const VocabSlices v = slices_of(49152, 4);
  const int64_t rows = 8, vocab = 49152, chunk = rows * v.size[0];
  std::vector<float> gathered(static_cast<size_t>(4 * chunk));
  for (size_t i = 0; i < gathered.size(); ++i) gathered[i] = static_cast<float>(i % 977) - 488.0f;
  const DeviceArray<float> d_in(gathered);
  DeviceArray<float> eager(static_cast<size_t>(rows * vocab)),
      replayed(static_cast<size_t>(rows * vocab));
  testing::poison(replayed);
  ASSERT_EQ(launch_gather_vocab_slices(d_in.get(), chunk, v, rows, vocab, eager.get(), nullptr),
            cudaSuccess);
  cudaStream_t stream = nullptr;
  CELLM_ASSERT_CUDA(cudaStreamCreate(&stream));
  const GraphExec exec = testing::capture_graph(stream, [&] {
    ASSERT_EQ(launch_gather_vocab_slices(d_in.get(), chunk, v, rows, vocab, replayed.get(), stream),
              cudaSuccess);
  });
  ASSERT_TRUE(exec.get() != nullptr);
  CELLM_ASSERT_CUDA(cudaGraphLaunch(exec.get(), stream));
  CELLM_ASSERT_CUDA(cudaStreamSynchronize(stream));
  CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_TRUE(testing::same_bits(eager, replayed, rows * vocab));
  cudaStreamDestroy(stream);
}

// Refused before any launch, so no GPU is needed.
TEST(VocabGatherTest, SlicesThatDoNotTileTheVocabularyAreRefused) {
  VocabSlices v = slices_of(1000, 2);
  float dummy = 0;
  const int64_t chunk = 4 * v.size[0];
  EXPECT_EQ(launch_gather_vocab_slices(&dummy, chunk, v, 4, 1001, &dummy, nullptr),
            cudaErrorInvalidValue);  // covers 1000, not 1001
  EXPECT_EQ(launch_gather_vocab_slices(&dummy, chunk - 1, v, 4, 1000, &dummy, nullptr),
            cudaErrorInvalidValue);  // a rank's rows do not fit its chunk
  VocabSlices gap = v;
  gap.begin[1] += 1;
  gap.size[1] -= 1;
  EXPECT_EQ(launch_gather_vocab_slices(&dummy, chunk, gap, 4, 1000, &dummy, nullptr),
            cudaErrorInvalidValue);
  VocabSlices many = v;
  many.world = kMaxVocabRanks + 1;
  EXPECT_EQ(launch_gather_vocab_slices(&dummy, chunk, many, 4, 1000, &dummy, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(launch_gather_vocab_slices(&dummy, chunk, v, 0, 1000, &dummy, nullptr), cudaSuccess);
}

}  // namespace
}  // namespace cellm::cuda
