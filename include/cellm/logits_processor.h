// Logits processing: what a generation asks of the sampler beyond SamplingParams.
// A processor gives, before each sampled token, a set of allowed tokens
// (constrained decoding) and sparse edits of single logits (penalties,
// logit_bias, min_tokens); the executor applies them to the raw row, then
// samples as sampler.h describes, then tells the processor the token.
//
// The contract with executors (Executor::set_logits_processor):
//   - For each token an executor returns in a session's Output, in order, it
//     calls prepare() once, applies the adjustments to that token's row of
//     logits (apply_logit_adjustments, or a device twin giving the same row),
//     samples from the adjusted row, and calls accept() with the token.
//     Tokens fed as input are never passed to accept(), and a token the
//     executor does not return (a step queued ahead and dropped) must never
//     have been accepted.
//   - prepare() never depends on the logits, so an executor may call it while
//     the device computes the row.
//   - Calls come from the engine thread only, one at a time per processor.
//   - Log-probabilities (TokenLogprobs) stay those of the raw row.
// The randomness of a draw still comes from (seed, position), so a seeded
// generation with a processor is as reproducible as one without.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "cellm/status.h"
#include "cellm/types.h"

namespace cellm {

// x -> (x > 0 ? x / scale : x * scale) + bias for one token's logit: `scale` is
// a repetition penalty (1 = none; > 1 makes the token less likely whatever the
// sign of its logit), `bias` an additive term (penalties, logit_bias; -inf
// forbids the token).
struct LogitEdit {
  Token token = 0;
  float scale = 1.0f;
  float bias = 0.0f;
};

// The adjustments for one sampled token. First the edits, in order, then the
// mask: a token outside `allowed` gets -inf.
struct LogitAdjustments {
  // Empty: every token is allowed. Else a bitset over the vocabulary of
  // ceil(V / 64) words: token t is allowed iff bit t % 64 of word t / 64 is set.
  std::vector<uint64_t> allowed;
  // Distinct tokens, each in [0, V).
  std::vector<LogitEdit> edits;

  void clear() {
    allowed.clear();
    edits.clear();
  }
  bool empty() const { return allowed.empty() && edits.empty(); }
};

// Applies `adjustments` to one row of V logits as documented above. Edits of
// tokens outside [0, V) and mask words beyond the row are ignored; a mask with
// fewer than ceil(V / 64) words forbids the tokens it does not cover.
void apply_logit_adjustments(std::span<float> logits, const LogitAdjustments& adjustments);

// One generation's processor. Not thread-safe; see the contract above.
class LogitsProcessor {
 public:
  virtual ~LogitsProcessor() = default;
  // Writes the adjustments for the next sampled token into `out` (cleared first).
  virtual void prepare(LogitAdjustments& out) = 0;
  // The token sampled after the last prepare().
  virtual void accept(Token token) = 0;
};

// OpenAI's and vLLM's sampling penalties for one generation.
struct PenaltyParams {
  // Subtracted once from the logit of every token the output already holds
  // (OpenAI presence_penalty, [-2, 2]).
  float presence_penalty = 0.0f;
  // Subtracted times the number of times the output holds the token
  // (OpenAI frequency_penalty, [-2, 2]).
  float frequency_penalty = 0.0f;
  // The LogitEdit scale of every token in the prompt or the output
  // (vLLM / transformers repetition_penalty, > 0; 1 = off).
  float repetition_penalty = 1.0f;
  // Added to the token's logit (OpenAI logit_bias, [-100, 100]); distinct ids.
  std::vector<std::pair<Token, float>> logit_bias;
  // Until the output holds this many tokens, the stop tokens get -inf
  // (vLLM min_tokens).
  int32_t min_tokens = 0;
  std::vector<Token> stop_tokens;
};

// Ok, or InvalidArgument naming the field: penalties finite and in range,
// repetition_penalty finite and > 0, min_tokens >= 0, logit_bias ids in
// [0, vocab_size) and distinct, biases finite and in [-100, 100], stop_tokens
// ids in [0, vocab_size).
Status validate_penalties(const PenaltyParams& params, int32_t vocab_size);

// True when `params` change nothing (no processor is needed).
bool penalties_are_neutral(const PenaltyParams& params);

// A processor applying `params`; `prompt` is the tokens the repetition penalty
// counts besides the output. Each prepare() gives one edit per distinct token
// whose logit changes: scale = repetition_penalty for a token of the prompt or
// the output, bias = logit_bias[t] - (frequency_penalty * count(t) +
// presence_penalty * [count(t) > 0]) where count(t) counts accepted tokens, and
// -inf for a stop token while fewer than min_tokens tokens were accepted. State
// is kept incrementally: a step costs O(distinct tokens touched), not O(prompt).
// REQUIRES: validate_penalties(params, V).ok().
std::unique_ptr<LogitsProcessor> make_penalty_processor(const PenaltyParams& params,
                                                        std::span<const Token> prompt);

// One processor running several, in order: masks are intersected (a shorter
// mask forbids what it does not cover), edits concatenated; null members are
// dropped and a single member is returned as is.
// REQUIRES: at most one member ever gives edits for the same token.
std::unique_ptr<LogitsProcessor> chain_logits_processors(
    std::vector<std::unique_ptr<LogitsProcessor>> processors);

}  // namespace cellm
