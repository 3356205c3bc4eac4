// The Engine façade (include/cellm/engine.h) as an embedder calls it: the bundled model by
// default, the executor resolved by availability, engines sharing one loaded model, and
// the errors of a bad source.
#include "cellm/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
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

TEST(EngineTest, MemorySizedLimitsResolve) {
  EXPECT_GT(default_cpu_kv_bytes(), 0);
  Result<std::shared_ptr<const LoadedModel>> model = load_model({}, /*with_tokenizer=*/false);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  const ModelConfig& config = (*model)->weights->config();  // kjv-small: context 256
  const int64_t per_cell = 2 * config.num_layers() * config.kv_dim() * 4;

  // A byte budget given: its whole cells, the model's context.
  EngineOptions options = cpu_options();
  options.limits.capacity_rule = false;
  options.limits.max_session_tokens = 0;
  options.limits.max_sessions = 16;
  options.limits.kv_memory_bytes = 1000 * per_cell + 1;
  Result<Engine> engine = Engine::create(*model, options);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EXPECT_EQ(engine->limits().max_cells, 1000);
  EXPECT_EQ(engine->limits().max_session_tokens, config.max_position_embeddings());
  EXPECT_FALSE(engine->limits().capacity_rule);
  const KvPoolReport& pool = engine->kv_pool();
  EXPECT_EQ(pool.cells, 1000);
  EXPECT_EQ(pool.bytes_per_cell, per_cell);
  EXPECT_EQ(pool.pool_bytes, 1000 * per_cell);
  EXPECT_EQ(pool.table_bytes, 0);
  EXPECT_EQ(pool.max_context, config.max_position_embeddings());
  EXPECT_TRUE(pool.by_memory);
  EXPECT_FALSE(pool.capacity_rule);
  const std::string line = describe_kv_pool(pool);
  EXPECT_NE(line.find("KV pool: 1000 cells"), std::string::npos) << line;
  EXPECT_NE(line.find("shared by need"), std::string::npos) << line;
  EXPECT_NE(line.find("context 256 tokens"), std::string::npos) << line;
  // 16 generations at once in 1000 cells: more than fixed slots of the context allow.
  std::vector<Session> sessions;
  std::vector<GenerationHandle> handles;
  GenConfig config16;
  config16.max_new_tokens = 20;
  for (int i = 0; i < 16; ++i) {
    std::optional<Session> s = engine->runner().open_session_async().get();
    ASSERT_TRUE(s.has_value()) << i;
    sessions.push_back(std::move(*s));
    handles.push_back(sessions.back().generate_async(
        std::vector<Token>(static_cast<size_t>(20 + i), static_cast<Token>(100 + i)), config16,
        nullptr));
  }
  for (GenerationHandle& h : handles) {
    h.wait();
    EXPECT_EQ(h.finish_reason(), FinishReason::kNewTokenLimit) << h.error_message();
  }

  // Nothing given: the engine fills the CPU budget in (a quarter of the RAM), which
  // the cap of 16 x max_sessions x context bounds here.
  options.limits.kv_memory_bytes = 0;
  engine = Engine::create(*model, options);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const int64_t by_ram = default_cpu_kv_bytes() / per_cell;
  EXPECT_EQ(engine->limits().max_cells,
            std::min<int64_t>(by_ram, 16 * 16 * config.max_position_embeddings()));
  EXPECT_TRUE(engine->kv_pool().by_memory);

  // Rule mode keeps fixed slots: max_sessions x cap + 1.
  options = cpu_options();
  engine = Engine::create(*model, options);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EXPECT_EQ(engine->limits().max_cells, 2 * 64 + 1);
  EXPECT_TRUE(engine->kv_pool().capacity_rule);
  EXPECT_FALSE(engine->kv_pool().by_memory);
  EXPECT_NE(describe_kv_pool(engine->kv_pool()).find("fixed slots"), std::string::npos);

  // The executor's refusal comes through unchanged.
  options.limits.capacity_rule = false;
  options.limits.max_session_tokens = 200;
  options.limits.max_cells = 150;
  Result<Engine> refused = Engine::create(*model, options);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("max_session_tokens 200 needs 201 cells"),
            std::string::npos)
      << refused.status().message();
}

}  // namespace
}  // namespace cellm
