#include "cuda/score_rows.h"

#include <algorithm>
#include <string>

#include "cellm/sampler.h"

namespace cellm::cuda {

std::optional<ScoreTargets> score_targets(const BatchInput& batch) {
  const bool scoring = std::any_of(batch.inputs.begin(), batch.inputs.end(),
                                   [](const Input& in) { return in.score; });
  if (!scoring) return std::nullopt;
  ScoreTargets t;
  for (size_t i = 0; i < batch.inputs.size(); ++i) {
    const Input& in = batch.inputs[i];
    for (size_t r = 0; r < in.size; ++r) {
      const size_t next = in.offset + r + 1;
      t.input.push_back(static_cast<int32_t>(i));
      t.target.push_back(in.score && next < in.tokens->size() ? (*in.tokens)[next] : -1);
    }
  }
  return t;
}

SliceSelection select_with_scores(std::span<const int32_t> sampling_rows,
                                  const ScoreTargets* targets, int32_t offset, int32_t length) {
  SliceSelection sel;
  sel.rows.assign(sampling_rows.begin(), sampling_rows.end());
  std::vector<int32_t> scored_rows;
  if (targets != nullptr) {
    for (int32_t r = 0; r < length; ++r) {
      if (targets->target[static_cast<size_t>(offset + r)] >= 0) scored_rows.push_back(r);
    }
    sel.rows.insert(sel.rows.end(), scored_rows.begin(), scored_rows.end());
    std::sort(sel.rows.begin(), sel.rows.end());
    sel.rows.erase(std::unique(sel.rows.begin(), sel.rows.end()), sel.rows.end());
  }
  auto index_of = [&](int32_t row) {
    return static_cast<int32_t>(std::lower_bound(sel.rows.begin(), sel.rows.end(), row) -
                                sel.rows.begin());
  };
  for (int32_t row : sampling_rows) sel.sampling.push_back(index_of(row));
  for (int32_t row : scored_rows) {
    sel.scored.push_back(index_of(row));
    sel.scored_at.push_back(offset + row);
  }
  return sel;
}

Status score_slice(const BatchInput& batch, const ScoreTargets& targets, const SliceSelection& sel,
                   std::span<const int32_t> logit_rows, const ForwardEngine& engine,
                   const SessionTable& sessions, std::vector<float>& scratch, BatchOutput& out) {
  for (size_t k = 0; k < sel.scored.size(); ++k) {
    const auto at = static_cast<size_t>(sel.scored_at[k]);
    const Token target = targets.target[at];
    const auto input = static_cast<size_t>(targets.input[at]);
    const auto it = std::lower_bound(logit_rows.begin(), logit_rows.end(), sel.scored[k]);
    if (it == logit_rows.end() || *it != sel.scored[k]) {
      return Internal("a scored row has no copied logits");
    }
    std::span<const float> logits =
        engine.host_logits(static_cast<size_t>(it - logit_rows.begin()));
    if (target >= static_cast<Token>(logits.size())) {
      return InvalidArgument("a scored token (" + std::to_string(target) +
                             ") lies outside the vocabulary");
    }
    out.scores[input].push_back(
        token_logprobs(logits, target, sessions.num_logprobs(batch.inputs[input].sid), scratch));
  }
  return Status::Ok();
}

}  // namespace cellm::cuda
