// Shared by the prefix cache and prompt capture tests: a Runner over the
// HistoryExecutor, whose predictions hash the whole committed history read back
// from the cell pool, so a continuation from a restored prefix equals the
// oracle's (the continuation computed without any cache) only if the restore
// was exact.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "cellm/prefix_cache.h"
#include "cellm/runner.h"
#include "support/history_executor.h"
#include "support/runner_harness.h"

namespace cellm::testing {

using Wrapper = std::function<GenerationCallback(GenerationCallback)>;

inline HistoryExecutorOptions options(int32_t max_sessions = 16) {
  HistoryExecutorOptions o;
  o.max_sessions = max_sessions;
  o.max_session_tokens = 128;
  o.vocab_size = 64;
  o.step_width = 8;
  return o;
}

// The executor outlives the runner (members are destroyed in reverse order).
struct Env {
  explicit Env(const HistoryExecutorOptions& o = options())
      : executor(o), runner(executor, make_scheduler(4, 4)) {}
  HistoryExecutor executor;
  Runner runner;
};

inline std::vector<Token> concat(std::vector<Token> a, const std::vector<Token>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

inline std::vector<Token> head(const std::vector<Token>& v, size_t n) {
  return std::vector<Token>(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n));
}

// Generates up to `n` greedy tokens after `delta`, delivering to `callback`;
// fails the test unless the budget ended it.
inline void run_raw(Session& session, const std::vector<Token>& delta, int n,
                    GenerationCallback callback) {
  GenerationHandle handle = session.generate_async(delta, config(n), std::move(callback));
  handle.wait();
  EXPECT_EQ(handle.finish_reason(), FinishReason::kNewTokenLimit) << handle.error_message();
}

// As run_raw through `wrap(recorder)`; returns the delivered tokens.
inline std::vector<Token> run_with(Session& session, const std::vector<Token>& delta, int n,
                                   const Wrapper& wrap) {
  auto updates = std::make_shared<Updates>();
  run_raw(session, delta, n, wrap(into(updates)));
  return updates->tokens();
}

inline std::vector<Token> run(Session& session, const std::vector<Token>& delta, int n) {
  return run_with(session, delta, n, [](GenerationCallback cb) { return cb; });
}

inline std::vector<Token> run_captured(Session& session, const std::vector<Token>& delta, int n,
                                       const PromptCapture& capture) {
  return run_with(session, delta, n, [&](GenerationCallback cb) { return capture.wrap(cb); });
}

// Runs `prompt` on a fresh session with a capture and collects it; returns the
// snapshot's id. The source session is closed on return.
inline SessionId remember(Env& env, PrefixCache& cache, const std::vector<Token>& prompt) {
  Session source = open_session(env.runner);
  PromptCapture capture = cache.capture_prompt(source, prompt);
  EXPECT_EQ(run_captured(source, prompt, 3, capture), env.executor.greedy_continuation(prompt, 3));
  EXPECT_TRUE(capture.collect());
  cache.check_invariants();
  const std::vector<HistoryClone> clones = env.executor.clones();
  if (clones.empty() || !clones.back().child) {
    ADD_FAILURE() << "no snapshot was cloned";
    return 0;
  }
  EXPECT_EQ(env.executor.history(*clones.back().child), prompt);
  return *clones.back().child;
}

// Continues a hit with the request's unmatched suffix and compares with the
// oracle; also checks that only the suffix went through the executor.
inline void expect_warm_equals_cold(Env& env, PrefixMatch& match, const std::vector<Token>& request,
                                    int n = 5) {
  ASSERT_LT(match.matched_tokens, request.size());
  ASSERT_EQ(match.session.position(), static_cast<Position>(match.matched_tokens));
  const std::vector<Token> suffix(
      request.begin() + static_cast<std::ptrdiff_t>(match.matched_tokens), request.end());
  EXPECT_EQ(run(match.session, suffix, n), env.executor.greedy_continuation(request, n));
  const std::vector<HistoryInput> inputs = env.executor.inputs_of(match.session.id());
  ASSERT_FALSE(inputs.empty());
  EXPECT_EQ(inputs.front().start, static_cast<Position>(match.matched_tokens));
  EXPECT_EQ(inputs.front().tokens, head(suffix, inputs.front().tokens.size()));
}

inline SessionId last_clone_source(const Env& env) {
  const std::vector<HistoryClone> clones = env.executor.clones();
  return clones.empty() ? 0 : clones.back().source;
}

inline std::optional<Session> clone_now(const Session& session, Position upto) {
  auto future = session.clone_async(upto);
  return settle(future);
}

inline GenerationUpdate update_with(std::vector<Token> tokens) {
  GenerationUpdate u;
  u.tokens = std::move(tokens);
  return u;
}

}  // namespace cellm::testing
