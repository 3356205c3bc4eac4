// The neutral vocabulary shared by the runner, the scheduler and every executor:
// plain value types, no behaviour beyond trivial helpers.
//
// Positions are absolute: the position of a token in its own session, counted
// from 0. A session's length (its "position") is the position of its next token.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace cellm {

using Token = int32_t;      // a vocabulary id
using SessionId = int64_t;  // unique for the lifetime of a process; never reused
using Position = int32_t;   // absolute position of a token in its session
using TaskId = int64_t;     // issued by the runner; unique among queued tasks

// How the next token is drawn from a row of logits (see sampler.h).
// temperature 0 is greedy argmax; top_k 0 and top_p 1 and min_p 0 are "off".
struct SamplingParams {
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  // Log-probabilities to report with each sampled token: 0 = none; n in [1, 20] =
  // the sampled token's and the n most likely alternatives' (OpenAI `logprobs`,
  // `top_logprobs`). See TokenLogprobs.
  int32_t num_logprobs = 0;
};

// The largest SamplingParams::num_logprobs (OpenAI's top_logprobs cap).
inline constexpr int32_t kMaxLogprobs = 20;

// Log-probabilities of one sampled token, as OpenAI and vLLM report them by
// default: the log-softmax of the RAW logits row (before temperature, top-k,
// top-p and min-p), computed in f32 with a stable log-sum-exp
// (logprob(i) = x_i - max - log(sum_j exp(x_j - max))).
//   logprob  the sampled token's, always given, even when it is not in `top`
//            (as with temperature sampling) and whatever num_logprobs is.
//   top      the num_logprobs most likely tokens as (token, logprob), most likely
//            first, ties by lower id; fewer only when the vocabulary is smaller.
// A NaN logit counts as -inf (probability 0); see token_logprobs in sampler.h.
struct TokenLogprobs {
  float logprob = 0.0f;
  std::vector<std::pair<Token, float>> top;  // [min(num_logprobs, V)]
};

// One slice of work for one session. The slice is tokens[offset, offset + size)
// and sits at absolute positions [position + offset, position + offset + size):
// `position` is the base of the whole backing buffer, not of the slice, so every
// chunk of one prompt shares one buffer and one base.
struct Input {
  SessionId sid = 0;
  bool produce_output = false;                       // sample a token after the slice's last token
  size_t offset = 0;                                 // first token of the slice within *tokens
  size_t size = 0;                                   // tokens in the slice
  std::shared_ptr<const std::vector<Token>> tokens;  // the whole backing, immutable
  Position position = 0;                             // absolute position of (*tokens)[0]
  // Score the slice: for each of its tokens that has a successor in the buffer, the
  // log-probabilities of that successor given the tokens up to it (BatchOutput::scores).
  bool score = false;

  Position start() const { return position + static_cast<Position>(offset); }
  Position end() const { return start() + static_cast<Position>(size); }
  Token token(size_t i) const { return (*tokens)[offset + i]; }
};

// What an executor produced for an input with produce_output: one token, or more
// for a speculative executor (all but the last are committed by the executor).
struct Output {
  SessionId sid = 0;
  std::vector<Token> tokens;
  // Parallel to tokens when the session's SamplingParams ask for num_logprobs > 0;
  // empty otherwise.
  std::vector<TokenLogprobs> logprobs;
};

// A schedulable unit. `is_decode`, not the size, decides decode versus prefill:
// a decode is exactly one token continuing a generation.
struct Task {
  TaskId tid = 0;
  bool cancelled = false;
  Input input;
  bool is_decode = false;
};

struct BatchInput {
  std::vector<Input> inputs;
  // Sum of the input sizes: the tokens this batch puts through the model.
  size_t size() const {
    size_t n = 0;
    for (const Input& in : inputs) n += in.size;
    return n;
  }
};

// Answered by position: outputs[i] answers inputs[i]; nullopt iff
// inputs[i].produce_output is unset.
//
// scores: empty when no input has `score`; else parallel to the inputs, and for an
// input with `score` it holds one TokenLogprobs per token of its slice that has a
// successor in the buffer, in order (the slice's size, less one for the slice that
// ends the buffer): the successor's log-probabilities from that token's row (raw
// logits, with the session's num_logprobs alternatives); empty for the others.
struct BatchOutput {
  std::vector<std::optional<Output>> outputs;
  std::vector<std::vector<TokenLogprobs>> scores;
};

// Moves each task's input out, keeping order.
inline BatchInput to_batch_input(std::vector<Task>& tasks) {
  BatchInput batch;
  batch.inputs.reserve(tasks.size());
  for (Task& t : tasks) batch.inputs.push_back(std::move(t.input));
  return batch;
}

}  // namespace cellm
