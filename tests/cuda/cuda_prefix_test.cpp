// The CUDA executor's prefix cache (ExecutorLimits::prefix_cache) through the
// seam, as cpu_prefix_test checks the CPU executor's: a cached partial prefix
// attached to a new session (its cells written into the session's row of the
// device cell table) predicts what a fresh prefill does; release_cells then
// attach resumes a session; off by default, nothing is cached.
#include <gtest/gtest.h>

#include "cellm/cuda_executor.h"
#include "fixture_model.h"
#include "gpu_test.h"
#include "prefix_attach_check.h"

namespace cellm {
namespace {

using testing::Fixture;

// cuda_executor_test's tolerance on f32 logprobs.
constexpr float kTolerance = 1e-3f;

std::unique_ptr<CudaExecutor> make(const Fixture& f, bool prefix_cache, bool graphs) {
  Result<ModelWeights> w = ModelWeights::load(f.dir);
  CELLM_CHECK_MSG(w.ok(), w.status().to_string());
  ExecutorLimits l;
  l.max_sessions = 4;
  l.max_session_tokens = 128;
  l.step_width = 16;
  l.prefix_cache = prefix_cache;
  CudaExecutorOptions o;
  o.precision = CudaPrecision::kF32;
  o.cuda_graph_for_decode = graphs;
  Result<std::unique_ptr<CudaExecutor>> e =
      CudaExecutor::create(std::make_shared<const ModelWeights>(std::move(*w)), l, o);
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

class CudaPrefixTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaPrefixTest, AnAttachedPartialPrefixPredictsLikeAFreshPrefill) {
  CELLM_SKIP_WITHOUT_GPU();
  const Fixture f = testing::load_fixture(GetParam());
  const std::vector<Token>& prompt = longest_prompt(f);
  ASSERT_GE(prompt.size(), 3u);
  for (bool graphs : {true, false}) {
    SCOPED_TRACE(graphs ? "graphs" : "eager");
    auto e = make(f, true, graphs);
    testing::check_prefix_attach(*e, prompt, static_cast<int32_t>(f.vocab_size), kTolerance);
  }
}

TEST_P(CudaPrefixTest, OffByDefault) {
  CELLM_SKIP_WITHOUT_GPU();
  const Fixture f = testing::load_fixture(GetParam());
  auto e = make(f, false, true);
  testing::check_prefix_cache_off(*e, longest_prompt(f));
}

INSTANTIATE_TEST_SUITE_P(Architectures, CudaPrefixTest,
                         ::testing::ValuesIn(testing::fixture_names()), testing::fixture_test_name);

}  // namespace
}  // namespace cellm
