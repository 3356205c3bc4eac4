// Scoring on the CUDA executor (Input::score, BatchOutput::scores): which rows of a
// step get logits for scoring, beside the rows that sample. A scored row is a fed token
// of a scored input that has a successor in its buffer; it joins the step's selection,
// so the LM head runs over it and its raw logits are copied back, where the
// successor's log-probabilities are taken exactly as for a sampled token's logprobs
// (token_logprobs, cellm/sampler.h). Inputs without `score` pay nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "cellm/status.h"
#include "cellm/types.h"
#include "core/session_table.h"
#include "cuda/cuda_forward.h"

namespace cellm::cuda {

// Per packed row (pack flattens the inputs in order): its input, and for a row of a
// scored input the token that follows it in the buffer (-1: none).
struct ScoreTargets {
  std::vector<int32_t> input;
  std::vector<Token> target;
};

// nullopt when no input of the batch has `score`.
std::optional<ScoreTargets> score_targets(const BatchInput& batch);

// One slice's selection (ascending slice rows whose logits the step computes).
struct SliceSelection {
  std::vector<int32_t> rows;       // the selection
  std::vector<int32_t> sampling;   // [sampling rows] each sampling row's index in `rows`
  std::vector<int32_t> scored;     // indices in `rows` of the scored rows, ascending
  std::vector<int32_t> scored_at;  // [scored] their packed rows (offset + slice row)
};

// The selection of the slice [offset, offset + length) of the packed step:
// `sampling_rows` (ascending slice rows that sample) and, with `targets`, every
// scored row.
SliceSelection select_with_scores(std::span<const int32_t> sampling_rows,
                                  const ScoreTargets* targets, int32_t offset, int32_t length);

// Appends the scores of a slice's scored rows to out.scores, from the raw logits the
// run copied back (`logit_rows`: the run's ascending logit rows, every scored row among
// them): the successor's log-probabilities with the session's num_logprobs
// alternatives, as the CPU executor computes them. InvalidArgument for a successor
// outside the vocabulary.
Status score_slice(const BatchInput& batch, const ScoreTargets& targets, const SliceSelection& sel,
                   std::span<const int32_t> logit_rows, const ForwardEngine& engine,
                   const SessionTable& sessions, std::vector<float>& scratch, BatchOutput& out);

}  // namespace cellm::cuda
