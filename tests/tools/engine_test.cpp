// The Engine façade (include/cellm/engine.h) as an embedder calls it: the bundled model by
// default, the executor resolved by availability, engines sharing one loaded model, and
// the errors of a bad source.
#include "cellm/engine.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cellm/metrics.h"

namespace cellm {
namespace {

EngineOptions cpu_options() {
  EngineOptions options;  // the bundled model
  options.executor = ExecutorKind::kCpu;
  options.limits.max_sessions = 2;
  options.limits.max_session_tokens = 64;
  options.limits.step_width = 32;
  options.cpu.num_threads = 2;
  return options;
}

TEST(EngineTest, TheBundledModelLoadsWithItsTokenizerAndGenerates) {
  size_t last_done = 0, total = 0;
  EngineOptions options = cpu_options();
  options.load_progress = [&](size_t done, size_t all) {
    last_done = done;
    total = all;
  };
  Result<Engine> engine = Engine::create(options);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EXPECT_EQ(engine->executor_kind(), ExecutorKind::kCpu);
  EXPECT_EQ(engine->device_description(), "");
  EXPECT_FALSE(engine->step_time_report().has_value());
  EXPECT_EQ(engine->limits().max_session_tokens, 64);
  ASSERT_NE(engine->tokenizer(), nullptr);
  EXPECT_EQ(engine->config().vocab_size(), engine->model().weights->config().vocab_size());
  EXPECT_GT(total, 0u);
  EXPECT_EQ(last_done, total);  // the progress ends at every byte touched

  std::optional<Session> session = engine->runner().open_session_async().get();
  ASSERT_TRUE(session.has_value());
  GenConfig config;
  config.max_new_tokens = 4;
  GenerationHandle h = session->generate_async(
      engine->tokenizer()->encode("In the beginning", true), config, nullptr);
  h.wait();
  EXPECT_EQ(h.finish_reason(), FinishReason::kNewTokenLimit) << h.error_message();
  EXPECT_EQ(h.metrics().n_generated_tokens, 4);
}

TEST(EngineTest, AutoPicksAnExecutorThisBuildHas) {
  EngineOptions options = cpu_options();
  options.executor = ExecutorKind::kAuto;
  EXPECT_NE(Engine::default_executor_kind(), ExecutorKind::kAuto);
  if (Engine::default_executor_kind() != ExecutorKind::kCpu) {
    GTEST_SKIP() << "a CUDA device is present: kAuto builds the CUDA executor";
  }
  Result<Engine> engine = Engine::create(options);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EXPECT_EQ(engine->executor_kind(), ExecutorKind::kCpu);
}

TEST(EngineTest, EnginesOfOtherSizesShareOneLoadedModel) {
  Result<std::shared_ptr<const LoadedModel>> model = load_model({}, /*with_tokenizer=*/false);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_FALSE((*model)->tokenizer.has_value());
  EngineOptions options = cpu_options();
  Result<Engine> a = Engine::create(*model, options);
  options.limits.max_sessions = 4;
  Result<Engine> b = Engine::create(*model, options);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(a->shared_model(), b->shared_model());
  EXPECT_EQ(b->limits().max_sessions, 4);
  EXPECT_EQ(a->tokenizer(), nullptr);
}

TEST(EngineTest, APresetHasRandomWeightsAndNoTokenizer) {
  ModelSource source;
  source.preset = "110m";
  source.seed = 1;
  Result<std::shared_ptr<const LoadedModel>> model = load_model(source, /*with_tokenizer=*/true);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_EQ((*model)->name, "preset:110m");
  EXPECT_TRUE((*model)->dir.empty());
  EXPECT_FALSE((*model)->tokenizer.has_value());
  EXPECT_FALSE((*model)->chat_template.has_value());
}

TEST(EngineTest, BadSourcesAndOptionsAreNamed) {
  EngineOptions options = cpu_options();
  options.model.path = "/nonexistent/model";
  Result<Engine> missing = Engine::create(options);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/model"), std::string::npos);

  options = cpu_options();
  options.model.preset = "nope";
  EXPECT_FALSE(Engine::create(options).ok());

  options = cpu_options();
  options.limits.max_session_tokens = 1 << 24;  // beyond the model's context
  Result<Engine> too_long = Engine::create(options);
  ASSERT_FALSE(too_long.ok());
  EXPECT_EQ(too_long.status().code(), StatusCode::kInvalidArgument);

  if (!Engine::has_cuda_executor()) {
    options = cpu_options();
    options.executor = ExecutorKind::kCuda;
    Result<Engine> cuda = Engine::create(options);
    ASSERT_FALSE(cuda.ok());
    EXPECT_EQ(cuda.status().code(), StatusCode::kNotSupported);
  }
}

}  // namespace
}  // namespace cellm
