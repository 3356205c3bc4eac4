#include "cuda/step_processors.h"

namespace cellm::cuda {

const AdjustmentSource* StepProcessors::collect(std::span<const SessionId> sids,
                                                std::span<const int32_t> at) {
  rows_.clear();
  processors_.clear();
  for (size_t s = 0; s < sids.size(); ++s) {
    if (LogitsProcessor* processor = sessions_.logits_processor(sids[s])) {
      rows_.push_back(at.empty() ? static_cast<int32_t>(s) : at[s]);
      processors_.push_back(processor);
    }
  }
  if (rows_.empty()) return nullptr;
  if (adjustments_.size() < rows_.size()) adjustments_.resize(rows_.size());
  if (!source_) {
    source_ = [this]() -> std::span<const RowAdjustments> {
      prepared_.clear();
      for (size_t k = 0; k < rows_.size(); ++k) {
        processors_[k]->prepare(adjustments_[k]);
        prepared_.push_back(RowAdjustments{rows_[k], &adjustments_[k]});
      }
      return prepared_;
    };
  }
  return &source_;
}

void StepProcessors::accept(const int32_t* tokens) {
  for (size_t k = 0; k < rows_.size(); ++k)
    processors_[k]->accept(tokens[static_cast<size_t>(rows_[k])]);
  rows_.clear();
  processors_.clear();
}

}  // namespace cellm::cuda
