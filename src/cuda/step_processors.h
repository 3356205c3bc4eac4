// StepProcessors: the logits processors (cellm/logits_processor.h) of one step's sampling
// rows. collect() finds them before the step is queued; the forward engine calls the
// source it returns once the forward is queued, which runs each processor's prepare() on
// the host while the device computes; after the step, accept() tells each processor its
// row's token.
//
// Thread-safety: none; one step at a time (the executor's engine thread). Neither
// copyable nor movable: the source refers to this object.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cellm/logits_processor.h"
#include "core/session_table.h"
#include "cuda/cuda_forward.h"

namespace cellm::cuda {

class StepProcessors {
 public:
  explicit StepProcessors(const SessionTable& sessions) : sessions_(sessions) {}
  StepProcessors(const StepProcessors&) = delete;
  StepProcessors& operator=(const StepProcessors&) = delete;

  // Collects the processors of the sampling rows (`sids[s]` is sampling row s's session,
  // at selected row at[s], or s when `at` is empty); nullptr when none has one (the step
  // then runs as it would without processors).
  const AdjustmentSource* collect(std::span<const SessionId> sids,
                                  std::span<const int32_t> at = {});

  // After a step collect() gave a source for: each processor's accept() of its row's
  // token (`tokens` indexed by selected row).
  void accept(const int32_t* tokens);

 private:
  const SessionTable& sessions_;
  std::vector<int32_t> rows_;                 // selected rows with a processor, ascending
  std::vector<LogitsProcessor*> processors_;  // [rows_.size()]
  std::vector<LogitAdjustments> adjustments_;
  std::vector<RowAdjustments> prepared_;
  AdjustmentSource source_;
};

}  // namespace cellm::cuda
