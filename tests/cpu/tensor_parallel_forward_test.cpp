// A forward split over 2 and 4 tensor-parallel ranks (ModelWeights::shard, one
// CpuForward and KV store per rank on its own thread, the partial sums added by an
// all-reduce over the threads, the vocabulary slices of the logits put together)
// gives the whole model's logits, on every fixture architecture: kv heads split and
// replicated, q/k/v biases, q/k norms, sliding windows, tied and untied heads.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "cellm/model_weights.h"
#include "cellm/tensor_parallel.h"
#include "cpu/cpu_forward.h"
#include "fixture_model.h"

namespace cellm {
namespace {

// The sum over the ranks' threads: every rank posts its values, each adds all of
// them in rank order (the same bits on every rank), and takes the sum once all have
// read.
class ThreadAllReduce {
 public:
  explicit ThreadAllReduce(int world)
      : world_(world), barrier_(world), parts_(static_cast<size_t>(world)) {}

  void sum(int rank, float* data, int64_t count) {
    parts_[static_cast<size_t>(rank)] = data;
    barrier_.arrive_and_wait();
    std::vector<float> total(static_cast<size_t>(count), 0.0f);
    for (int r = 0; r < world_; ++r) {
      const float* part = parts_[static_cast<size_t>(r)];
      for (int64_t i = 0; i < count; ++i) total[static_cast<size_t>(i)] += part[i];
    }
    barrier_.arrive_and_wait();
    std::copy(total.begin(), total.end(), data);
  }

 private:
  int world_;
  std::barrier<> barrier_;
  std::vector<float*> parts_;
};

// A prompt as one forward from cell 0, then one decode step of `next`: the logits
// [rows of the prompt + 1, lm_head rows] of each step, concatenated.
struct Steps {
  std::vector<Token> prompt;
  Token next = 0;
};

std::vector<float> run_steps(cpu::CpuForward& fwd, cpu::KvStore& kv, const ModelWeights& w,
                             const Steps& steps) {
  const auto n = static_cast<int64_t>(steps.prompt.size());
  const int64_t vocab_out = w.lm_head().shape[0];
  std::vector<Position> positions(static_cast<size_t>(n + 1));
  std::iota(positions.begin(), positions.end(), 0);
  std::vector<CellId> cells(static_cast<size_t>(n + 1));
  std::iota(cells.begin(), cells.end(), 0);
  const std::span<const CellId> all(cells);
  std::vector<std::span<const CellId>> seq_cells(static_cast<size_t>(n), all.first(n));
  std::vector<int32_t> rows(static_cast<size_t>(n));
  std::iota(rows.begin(), rows.end(), 0);
  std::vector<float> logits(static_cast<size_t>((n + 1) * vocab_out));
  fwd.run(
      {steps.prompt, std::span<const Position>(positions).first(n), all.first(n), seq_cells, rows},
      kv, std::span<float>(logits).first(static_cast<size_t>(n * vocab_out)));
  const std::vector<std::span<const CellId>> decode_cells(1, all);
  const std::vector<int32_t> one_row{0};
  fwd.run({std::span<const Token>(&steps.next, 1), std::span<const Position>(positions).last(1),
           all.last(1), decode_cells, one_row},
          kv, std::span<float>(logits).last(static_cast<size_t>(vocab_out)));
  return logits;
}

std::vector<float> whole_logits(const std::shared_ptr<const ModelWeights>& w, const Steps& steps) {
  const ModelConfig& c = w->config();
  const auto cells = static_cast<int64_t>(steps.prompt.size()) + 1;
  cpu::ThreadPool pool(1);
  cpu::KvStore kv(c.num_layers(), c.kv_dim(), cells, cells);
  cpu::CpuForward fwd(w, pool, cells);
  return run_steps(fwd, kv, *w, steps);
}

// The logits of `world` ranks, each rank's vocabulary slice put in its place.
std::vector<float> parallel_logits(const ModelWeights& whole, int world, const Steps& steps) {
  const ModelConfig& c = whole.config();
  const auto cells = static_cast<int64_t>(steps.prompt.size()) + 1;
  ThreadAllReduce reduce(world);
  std::vector<std::vector<float>> parts(static_cast<size_t>(world));
  std::vector<ShardPlan> plans;
  std::vector<std::shared_ptr<const ModelWeights>> shards;
  for (int r = 0; r < world; ++r) {
    Result<ShardPlan> plan = plan_shard(c, r, world);
    EXPECT_TRUE(plan.ok()) << plan.status().to_string();
    Result<ModelWeights> shard = whole.shard(*plan);
    EXPECT_TRUE(shard.ok()) << shard.status().to_string();
    plans.push_back(*plan);
    shards.push_back(std::make_shared<const ModelWeights>(std::move(*shard)));
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      const ModelWeights& w = *shards[static_cast<size_t>(r)];
      cpu::ThreadPool pool(1);
      cpu::KvStore kv(w.config().num_layers(), w.config().kv_dim(), cells, cells);
      cpu::CpuForward fwd(shards[static_cast<size_t>(r)], pool, cells);
      fwd.set_partial_sums([&, r](float* data, int64_t count) { reduce.sum(r, data, count); });
      parts[static_cast<size_t>(r)] = run_steps(fwd, kv, w, steps);
    });
  }
  for (std::thread& t : threads) t.join();
  const int64_t vocab = c.vocab_size();
  std::vector<float> logits(static_cast<size_t>(cells * vocab));
  for (int r = 0; r < world; ++r) {
    const ShardPlan& p = plans[static_cast<size_t>(r)];
    for (int64_t row = 0; row < cells; ++row) {
      std::copy_n(parts[static_cast<size_t>(r)].begin() + row * p.vocab_size, p.vocab_size,
                  logits.begin() + row * vocab + p.vocab_begin);
    }
  }
  return logits;
}

class TensorParallelForwardTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TensorParallelForwardTest, RanksGiveTheWholeModelsLogits) {
  const testing::Fixture f = testing::load_fixture(GetParam());
  Result<ModelWeights> loaded = ModelWeights::load(f.dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  const auto whole = std::make_shared<const ModelWeights>(std::move(*loaded));
  const testing::FixturePrompt& p = f.prompts.front();
  const Steps steps{p.ids, p.argmax};
  const std::vector<float> want = whole_logits(whole, steps);
  float scale = 1;
  for (float x : want) scale = std::max(scale, std::abs(x));
  int worlds_run = 0;
  for (int world : {2, 4}) {
    if (!plan_shard(whole->config(), 0, world).ok()) continue;
    ++worlds_run;
    const std::vector<float> got = parallel_logits(*whole, world, steps);
    ASSERT_EQ(got.size(), want.size());
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      // Only the summation order differs (partial sums per rank, then across ranks).
      if (!(std::abs(got[i] - want[i]) <= 1e-5f * scale) && ++bad <= 5) {
        ADD_FAILURE() << GetParam() << " over " << world << " ranks, logit " << i << ": " << got[i]
                      << " vs " << want[i];
      }
    }
    EXPECT_EQ(bad, 0u) << GetParam() << " over " << world;
  }
  EXPECT_GT(worlds_run, 0) << GetParam() << " splits over neither 2 nor 4 ranks";
}

INSTANTIATE_TEST_SUITE_P(Architectures, TensorParallelForwardTest,
                         ::testing::ValuesIn(testing::fixture_names()), testing::fixture_test_name);

}  // namespace
}  // namespace cellm
