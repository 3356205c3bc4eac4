// The CPU executor's prefix cache (ExecutorLimits::prefix_cache) through the
// seam: a cached partial prefix attached to a new session shares its cells and
// predicts what a fresh prefill does; release_cells then attach resumes a
// session; off by default, nothing is cached.
#include <gtest/gtest.h>

#include "cellm/cpu_executor.h"
#include "fixture_model.h"
#include "prefix_attach_check.h"

namespace cellm {
namespace {

using testing::Fixture;

// The CPU tests' tolerance on logprobs.
constexpr float kTolerance = 1e-4f;

std::unique_ptr<CpuExecutor> make(const Fixture& f, bool prefix_cache) {
  Result<ModelWeights> w = ModelWeights::load(f.dir);
  CELLM_CHECK_MSG(w.ok(), w.status().to_string());
  ExecutorLimits l;
  l.max_sessions = 4;
  l.max_session_tokens = 128;
  l.step_width = 16;
  l.prefix_cache = prefix_cache;
  CpuExecutorOptions o;
  o.initial_cells = 16;
  o.num_threads = 2;
  Result<std::unique_ptr<CpuExecutor>> e =
      CpuExecutor::create(std::make_shared<const ModelWeights>(std::move(*w)), l, o);
  CELLM_CHECK_MSG(e.ok(), e.status().to_string());
  return std::move(*e);
}

const std::vector<Token>& longest_prompt(const Fixture& f) {
  const std::vector<Token>* best = &f.prompts[0].ids;
  for (const auto& p : f.prompts) {
    if (p.ids.size() > best->size()) best = &p.ids;
  }
  return *best;
}

class CpuPrefixTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CpuPrefixTest, AnAttachedPartialPrefixPredictsLikeAFreshPrefill) {
  const Fixture f = testing::load_fixture(GetParam());
  auto e = make(f, true);
  const std::vector<Token>& prompt = longest_prompt(f);
  ASSERT_GE(prompt.size(), 3u);
  testing::check_prefix_attach(*e, prompt, static_cast<int32_t>(e->config().vocab_size()),
                               kTolerance);
}

TEST_P(CpuPrefixTest, OffByDefault) {
  const Fixture f = testing::load_fixture(GetParam());
  EXPECT_FALSE(ExecutorLimits{}.prefix_cache);
  auto e = make(f, false);
  testing::check_prefix_cache_off(*e, longest_prompt(f));
}

INSTANTIATE_TEST_SUITE_P(Architectures, CpuPrefixTest,
                         ::testing::ValuesIn(testing::fixture_names()), testing::fixture_test_name);

}  // namespace
}  // namespace cellm
