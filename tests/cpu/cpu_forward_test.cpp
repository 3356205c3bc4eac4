// The CPU forward against the reference stack (transformers, fp32) on the tiny
// fixture models of every architecture: logits at the last prompt position and
// at every position, within 1e-4 relative to the row's scale.
#include "cpu/cpu_forward.h"

#include <gtest/gtest.h>

#include <numeric>

#include "cellm/model_weights.h"
#include "fixture_model.h"

namespace cellm {
namespace {

using testing::Fixture;
using testing::FixturePrompt;

constexpr double kRelTolerance = 1e-4;

class CpuForwardFixtureTest : public ::testing::TestWithParam<std::string> {};

// Runs one prompt as one forward on an empty KV store (cells 0..n-1) and
// returns logits for `rows`.
std::vector<float> forward_prompt(const std::shared_ptr<const ModelWeights>& w,
                                  const std::vector<Token>& ids, const std::vector<int32_t>& rows) {
  const auto n = static_cast<int64_t>(ids.size());
  const ModelConfig& c = w->config();
  cpu::ThreadPool pool(2);
  cpu::KvStore kv(c.num_layers(), c.kv_dim(), n + 1, n + 1);
  cpu::CpuForward fwd(w, pool, n);
  std::vector<Position> positions(ids.size());
  std::iota(positions.begin(), positions.end(), 0);
  std::vector<CellId> cells(ids.size());
  std::iota(cells.begin(), cells.end(), 0);
  std::vector<std::span<const CellId>> seq_cells(ids.size(), std::span<const CellId>(cells));
  cpu::ForwardSlice s{ids, positions, cells, seq_cells, rows};
  std::vector<float> logits(rows.size() * static_cast<size_t>(c.vocab_size()));
  fwd.run(s, kv, logits);
  return logits;
}

void expect_close(const float* row, const std::vector<int32_t>& ids, const std::vector<float>& ref,
                  const std::string& what) {
  float scale = 1;
  for (float r : ref) scale = std::max(scale, std::abs(r));
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_NEAR(row[ids[i]], ref[i], kRelTolerance * scale) << what << " id " << ids[i];
  }
}

TEST_P(CpuForwardFixtureTest, LastPositionLogitsMatchTheReference) {
  const Fixture f = testing::load_fixture(GetParam());
  Result<ModelWeights> w = ModelWeights::load(f.dir);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  auto weights = std::make_shared<const ModelWeights>(std::move(*w));
  for (const FixturePrompt& p : f.prompts) {
    const int32_t last = static_cast<int32_t>(p.ids.size()) - 1;
    std::vector<float> logits = forward_prompt(weights, p.ids, {last});
    expect_close(logits.data(), p.top_ids, p.top_logits, p.text + " (top)");
    expect_close(logits.data(), f.sampled_ids, p.sampled_logits, p.text + " (sampled)");
    EXPECT_NEAR(testing::logsumexp(logits.data(), f.vocab_size), p.logsumexp,
                kRelTolerance * std::max(1.0, std::abs(p.logsumexp)))
        << p.text;
    const auto best = std::max_element(logits.begin(), logits.end()) - logits.begin();
    EXPECT_EQ(best, p.argmax) << p.text;
  }
}

TEST_P(CpuForwardFixtureTest, EveryPositionsLogitsMatchTheReference) {
  const Fixture f = testing::load_fixture(GetParam());
  Result<ModelWeights> w = ModelWeights::load(f.dir);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  auto weights = std::make_shared<const ModelWeights>(std::move(*w));
  int checked = 0;
  for (const FixturePrompt& p : f.prompts) {
    if (!p.all_positions) continue;
    std::vector<int32_t> rows(p.ids.size());
    std::iota(rows.begin(), rows.end(), 0);
    std::vector<float> logits = forward_prompt(weights, p.ids, rows);
    ASSERT_EQ(p.all_positions->size(), p.ids.size());
    for (size_t r = 0; r < rows.size(); ++r) {
      expect_close(logits.data() + r * static_cast<size_t>(f.vocab_size), f.sampled_ids,
                   (*p.all_positions)[r], p.text + " position " + std::to_string(r));
    }
    ++checked;
  }
  EXPECT_EQ(checked, 1);
}

INSTANTIATE_TEST_SUITE_P(Architectures, CpuForwardFixtureTest,
                         ::testing::ValuesIn(testing::fixture_names()), testing::fixture_test_name);

}  // namespace
}  // namespace cellm
