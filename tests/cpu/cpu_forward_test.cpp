// The CPU forward against the reference stack (transformers, fp32) on the tiny
// fixture models of every architecture: logits at the last prompt position and
// at every position, within 1e-4 relative to the row's scale.
#include "cpu/cpu_forward.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <numeric>

#include "cellm/model_weights.h"
#include "cpu/quant/bf16_dot_matmul.h"
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
                                  const std::vector<Token>& ids, const std::vector<int32_t>& rows,
                                  bool bf16_activations = false) {
  const auto n = static_cast<int64_t>(ids.size());
  const ModelConfig& c = w->config();
  cpu::ThreadPool pool(2);
  cpu::KvStore kv(c.num_layers(), c.kv_dim(), n + 1, n + 1);
  cpu::CpuForward fwd(w, pool, n, bf16_activations);
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

void expect_close_within(const float* row, const std::vector<int32_t>& ids,
                         const std::vector<float>& ref, double tolerance, const std::string& what) {
  float scale = 1;
  for (float r : ref) scale = std::max(scale, std::abs(r));
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_NEAR(row[ids[i]], ref[i], tolerance * scale) << what << " id " << ids[i];
  }
}

void expect_close(const float* row, const std::vector<int32_t>& ids, const std::vector<float>& ref,
                  const std::string& what) {
  expect_close_within(row, ids, ref, kRelTolerance, what);
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

// bf16_activations: each product rounds its activations to bf16 (at most 2^-8 relative
// per product), which these tiny random models amplify through their layers: the
// logits' mean distance from the exact forward's stays under kBf16Mean of the scale
// and the largest under kBf16Max, the reference's top logits within kBf16Max; where the CPU has
// AVX-512 BF16 they differ from the exact forward (the rounded path ran), elsewhere they equal it.
TEST_P(CpuForwardFixtureTest, Bf16ActivationsStayNearTheReference) {
  constexpr double kBf16Mean = 1e-2;
  constexpr double kBf16Max = 0.1;
  const Fixture f = testing::load_fixture(GetParam());
  Result<ModelWeights> w = ModelWeights::load(f.dir);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  auto weights = std::make_shared<const ModelWeights>(std::move(*w));
  for (const FixturePrompt& p : f.prompts) {
    std::vector<int32_t> rows(p.ids.size());
    std::iota(rows.begin(), rows.end(), 0);
    const std::vector<float> exact = forward_prompt(weights, p.ids, rows);
    const std::vector<float> rounded = forward_prompt(weights, p.ids, rows, true);
    ASSERT_EQ(exact.size(), rounded.size());
    float scale = 1;
    for (float e : exact) scale = std::max(scale, std::abs(e));
    double worst = 0, sum = 0;
    for (size_t i = 0; i < exact.size(); ++i) {
      const double diff = std::abs(rounded[i] - exact[i]);
      worst = std::max(worst, diff);
      sum += diff;
    }
    const double mean = sum / static_cast<double>(exact.size());
    std::printf("%s: |rounded - exact| mean %.3g, max %.3g, scale %.3g\n", p.text.c_str(), mean,
                worst, scale);
    EXPECT_LE(mean, kBf16Mean * scale) << p.text;
    EXPECT_LE(worst, kBf16Max * scale) << p.text;
    if (cpu::quant::bf16_dot_supported()) {
      EXPECT_GT(worst, 0.0) << p.text << ": the bf16 dot product path did not run";
    } else {
      EXPECT_EQ(worst, 0.0) << p.text;
    }
    const size_t last = (p.ids.size() - 1) * static_cast<size_t>(f.vocab_size);
    expect_close_within(rounded.data() + last, p.top_ids, p.top_logits, kBf16Max,
                        p.text + " (top)");
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, CpuForwardFixtureTest,
                         ::testing::ValuesIn(testing::fixture_names()), testing::fixture_test_name);

}  // namespace
}  // namespace cellm
