// The prefix cache through the executor seam, for any executor created with
// ExecutorLimits::prefix_cache on: a closed session's cells are attached to a
// new session as a partial prefix (shared, not copied), and the next token's
// logprobs then equal a fresh prefill's; release_cells and a second attach
// resume a session with the same next token.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "cellm/executor.h"
#include "executor_driver.h"

namespace cellm::testing {

// Runs tokens[from, end) of `sid` (its committed length is `from`) with an output.
inline Output run_slice(Executor& e, SessionId sid, const std::vector<Token>& tokens, size_t from,
                        size_t end) {
  BatchInput b;
  b.inputs.push_back(make_input(sid, std::make_shared<const std::vector<Token>>(tokens), from,
                                end - from, 0, true));
  BatchOutput o;
  const Status s = e.execute(b, o);
  EXPECT_TRUE(s.ok()) << s.to_string();
  if (!s.ok() || o.outputs.size() != 1 || !o.outputs[0]) return Output{};
  return *o.outputs[0];
}

// Same token (where the top two are clearly apart) and logprobs within `tolerance`.
inline void expect_same_prediction(const Output& got, const Output& want, float tolerance,
                                   const std::string& where) {
  ASSERT_EQ(got.logprobs.size(), 1u) << where;
  ASSERT_EQ(want.logprobs.size(), 1u) << where;
  const TokenLogprobs& g = got.logprobs[0];
  const TokenLogprobs& w = want.logprobs[0];
  ASSERT_EQ(g.top.size(), w.top.size()) << where;
  ASSERT_GE(w.top.size(), 2u) << where;
  if (w.top[0].second - w.top[1].second > tolerance) {
    EXPECT_EQ(got.tokens, want.tokens) << where;
  }
  EXPECT_NEAR(g.logprob, w.logprob, tolerance) << where;
  for (size_t k = 0; k < w.top.size(); ++k) {
    EXPECT_NEAR(g.top[k].second, w.top[k].second, tolerance) << where << " rank " << k;
  }
}

// REQUIRES: prompt.size() >= 3, the executor's cache on and empty, room for 3
// sessions of prompt.size() + 2 tokens.
inline void check_prefix_attach(Executor& e, const std::vector<Token>& prompt, int32_t vocab,
                                float tolerance) {
  const SamplingParams with_logprobs{.num_logprobs = 8};
  const auto p = prompt.size();

  // A: the prompt and two decoded tokens, then closed: P + 2 cells cached.
  const SessionId a = *e.open_session();
  e.set_sampling(a, SamplingParams{}, 0);
  std::vector<Token> history = prompt;
  history.push_back(run_slice(e, a, history, 0, p).tokens.at(0));
  history.push_back(run_slice(e, a, history, p, p + 1).tokens.at(0));
  (void)run_slice(e, a, history, p + 1, p + 2);
  e.close_session(a);
  KvMetrics kv = e.kv_metrics();
  EXPECT_EQ(kv.cells_in_use, 0);
  EXPECT_EQ(kv.cells_cached, static_cast<int64_t>(p + 2));

  // B: a key that leaves A's history inside the prompt (a partial match).
  const size_t m = p - 1;
  std::vector<Token> key(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(m));
  key.push_back((prompt[m] + 1) % vocab);
  key.push_back(prompt[0]);
  const size_t n = key.size();
  const SessionId b = *e.open_session();
  e.set_sampling(b, with_logprobs, 0);
  ASSERT_EQ(e.attach_prefix(b, key), static_cast<Position>(m));
  kv = e.kv_metrics();
  EXPECT_EQ(kv.cells_in_use, static_cast<int64_t>(m)) << "attached cells are shared";
  EXPECT_EQ(kv.cells_cached, 3) << "A's cells B does not share";
  EXPECT_EQ(kv.prefix_lookups, 1);
  EXPECT_EQ(kv.prefix_hits, 1);
  EXPECT_EQ(kv.prefix_hit_tokens, static_cast<int64_t>(m));
  EXPECT_EQ(e.kv_budget().cached, 3);
  const Output attached = run_slice(e, b, key, m, n);

  // C: the same key prefilled from scratch.
  const SessionId c = *e.open_session();
  e.set_sampling(c, with_logprobs, 0);
  const Output fresh = run_slice(e, c, key, 0, n);
  expect_same_prediction(attached, fresh, tolerance, "attached vs fresh prefill");
  EXPECT_EQ(e.kv_metrics().cells_in_use, static_cast<int64_t>(m + 2 + n));

  // B released: its cells go to the cache; attaching all but its last token and
  // running that one gives the same prediction.
  ASSERT_TRUE(e.release_cells(b));
  EXPECT_EQ(e.kv_metrics().cells_in_use, static_cast<int64_t>(n)) << "only C's";
  ASSERT_EQ(e.attach_prefix(b, std::vector<Token>(key.begin(), key.end() - 1)),
            static_cast<Position>(n - 1));
  const Output resumed = run_slice(e, b, key, n - 1, n);
  expect_same_prediction(resumed, attached, tolerance, "resumed vs before release");
  EXPECT_EQ(resumed.tokens, attached.tokens);

  e.close_session(b);
  e.close_session(c);
  kv = e.kv_metrics();
  EXPECT_EQ(kv.cells_in_use, 0);
  EXPECT_EQ(kv.prefix_lookups, 2);
  EXPECT_EQ(kv.prefix_hits, 2);
  const KvBudget budget = e.kv_budget();
  EXPECT_EQ(budget.free + budget.cached, budget.capacity);
  EXPECT_EQ(budget.reserved, 0);
}

// With the cache off (the default), nothing is cached or attached.
inline void check_prefix_cache_off(Executor& e, const std::vector<Token>& prompt) {
  const SessionId a = *e.open_session();
  e.set_sampling(a, SamplingParams{}, 0);
  (void)run_slice(e, a, prompt, 0, prompt.size());
  e.close_session(a);
  const SessionId b = *e.open_session();
  EXPECT_EQ(e.attach_prefix(b, prompt), 0);
  const KvMetrics kv = e.kv_metrics();
  EXPECT_EQ(kv.cells_in_use, 0);
  EXPECT_EQ(kv.cells_cached, 0);
  EXPECT_EQ(kv.prefix_lookups, 0);
  e.close_session(b);
}

}  // namespace cellm::testing
