// Drives any Executor directly through the seam, the way the runner would, for
// executor tests: prompts (cut into prefill chunks) in one batch, then one batch
// of single-token decodes per step.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cellm/executor.h"

namespace cellm::testing {

inline Input make_input(SessionId sid, std::shared_ptr<const std::vector<Token>> tokens,
                        size_t offset, size_t size, Position base, bool output) {
  Input in;
  in.sid = sid;
  in.tokens = std::move(tokens);
  in.offset = offset;
  in.size = size;
  in.position = base;
  in.produce_output = output;
  return in;
}

inline Input single_token(SessionId sid, Token t, Position position) {
  return make_input(sid, std::make_shared<const std::vector<Token>>(std::vector<Token>{t}), 0, 1,
                    position, true);
}

// Decodes every prompt concurrently for `n_new` tokens and returns each step's
// output. Prompt i samples with params[i] (greedy for all when params is
// empty) and seed 0. `forced`, when given, feeds forced[i][step] instead of the
// executor's own token after each step (teacher forcing), still returning what
// it predicted.
inline std::vector<std::vector<Output>> drive_outputs(
    Executor& e, const std::vector<std::vector<Token>>& prompts, size_t chunk, size_t n_new,
    const std::vector<SamplingParams>& params = {},
    const std::vector<std::vector<Token>>* forced = nullptr) {
  std::vector<SessionId> sids;
  BatchInput first;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto& p = prompts[i];
    const SessionId sid = *e.open_session();
    e.set_sampling(sid, params.empty() ? SamplingParams{} : params.at(i), 0);
    sids.push_back(sid);
    auto buf = std::make_shared<const std::vector<Token>>(p);
    for (size_t off = 0; off < p.size(); off += chunk) {
      const size_t n = std::min(chunk, p.size() - off);
      first.inputs.push_back(make_input(sid, buf, off, n, 0, off + n == p.size()));
    }
  }
  std::vector<std::vector<Output>> out(prompts.size());
  std::vector<Position> pos(prompts.size());
  BatchOutput o;
  const Status prefill = e.execute(first, o);
  EXPECT_TRUE(prefill.ok()) << prefill.to_string();
  size_t k = 0;
  for (size_t i = 0; i < first.inputs.size(); ++i) {
    if (!first.inputs[i].produce_output) continue;
    EXPECT_TRUE(o.outputs[i].has_value());
    if (!o.outputs[i]) return out;
    out[k].push_back(*o.outputs[i]);
    pos[k] = static_cast<Position>(prompts[k].size());
    ++k;
  }
  for (size_t step = 1; step < n_new; ++step) {
    BatchInput b;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const Token next = forced ? (*forced)[i][step - 1] : out[i].back().tokens.at(0);
      b.inputs.push_back(single_token(sids[i], next, pos[i]));
    }
    const Status s = e.execute(b, o);
    EXPECT_TRUE(s.ok()) << s.to_string();
    for (size_t i = 0; i < prompts.size(); ++i) {
      if (!o.outputs[i]) return out;
      out[i].push_back(*o.outputs[i]);
      ++pos[i];
    }
  }
  for (SessionId sid : sids) e.close_session(sid);
  return out;
}

// Greedy-decodes every prompt concurrently for `n_new` tokens and returns them
// (drive_outputs' first tokens).
inline std::vector<std::vector<Token>> drive(
    Executor& e, const std::vector<std::vector<Token>>& prompts, size_t chunk, size_t n_new,
    const std::vector<std::vector<Token>>* forced = nullptr) {
  std::vector<std::vector<Token>> tokens(prompts.size());
  const std::vector<std::vector<Output>> outputs =
      drive_outputs(e, prompts, chunk, n_new, {}, forced);
  for (size_t i = 0; i < outputs.size(); ++i) {
    for (const Output& o : outputs[i]) tokens[i].push_back(o.tokens.at(0));
  }
  return tokens;
}

// Two drives of the same sessions gave the same tokens and logprobs, bit for bit, each
// session `steps` outputs long.
inline void expect_same_outputs(const std::vector<std::vector<Output>>& a,
                                const std::vector<std::vector<Output>>& b, const std::string& mode,
                                size_t steps) {
  ASSERT_EQ(a.size(), b.size()) << mode;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), steps) << mode << " session " << i;
    ASSERT_EQ(b[i].size(), steps) << mode << " session " << i;
    for (size_t step = 0; step < steps; ++step) {
      const std::string where =
          mode + " session " + std::to_string(i) + " step " + std::to_string(step);
      const Output& x = a[i][step];
      const Output& y = b[i][step];
      ASSERT_EQ(x.tokens, y.tokens) << where;
      ASSERT_EQ(x.logprobs.size(), y.logprobs.size()) << where;
      for (size_t t = 0; t < x.logprobs.size(); ++t) {
        EXPECT_EQ(x.logprobs[t].logprob, y.logprobs[t].logprob) << where;
        EXPECT_EQ(x.logprobs[t].top, y.logprobs[t].top) << where;
      }
    }
  }
}

// The first token of each output of each session (a greedy reference's continuation, to
// teacher-force another executor with).
inline std::vector<std::vector<Token>> first_tokens(const std::vector<std::vector<Output>>& out) {
  std::vector<std::vector<Token>> tokens(out.size());
  for (size_t i = 0; i < out.size(); ++i) {
    for (const Output& o : out[i]) tokens[i].push_back(o.tokens.at(0));
  }
  return tokens;
}

// `got` (tokens predicted under teacher forcing with first_tokens(reference)) against a
// greedy reference driven with num_logprobs = 2: every step whose reference top-1 leads
// its top-2 by at least `margin` (nats) must have predicted the reference's token. Prints
// and returns how many steps were that clear.
inline int expect_tokens_where_the_margin_is_clear(
    const std::vector<std::vector<Output>>& reference, const std::vector<std::vector<Token>>& got,
    float margin, const std::string& what) {
  int checked = 0, agreed = 0;
  for (size_t i = 0; i < reference.size(); ++i) {
    for (size_t s = 0; s < reference[i].size(); ++s) {
      const auto& top = reference[i][s].logprobs.at(0).top;
      EXPECT_EQ(top.size(), 2u) << what;
      if (top.size() < 2 || top[0].second - top[1].second < margin) continue;
      ++checked;
      const Token want = reference[i][s].tokens.at(0);
      agreed += got.at(i).at(s) == want ? 1 : 0;
      EXPECT_EQ(got[i][s], want) << what << ": prompt " << i << " step " << s;
    }
  }
  std::printf("%s: %d of %d clear steps agree with the reference\n", what.c_str(), agreed, checked);
  return checked;
}

}  // namespace cellm::testing
