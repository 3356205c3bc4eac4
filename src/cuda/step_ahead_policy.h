// StepAheadPolicy: when the CUDA executor queues a decode step ahead of the runner's
// next batch (CudaExecutorOptions::overlap_decode). Host-only; no CUDA.
//
// A step queued ahead is free when the next batch is that step (the same sessions, each
// continuing) and costs a whole step of device time when it is not: it is dropped, and
// the next batch waits for it. Batches that keep changing (sessions finishing and others
// arriving every few steps, as in a busy server) would drop many. So a step is queued only
// once the same sessions have decoded `threshold()` batches in a row. The threshold starts
// at kMinThreshold (the second batch of a run queues); each dropped step doubles it (up to
// kMaxThreshold) and each kUsedToRelax steps used in a row halve it again. A workload whose
// batches hold still queues from its second batch; one whose batches change every few
// steps soon drops at most one step per threshold-long run of unchanged batches, which
// the threshold makes rare. Not adaptive: the threshold stays at kMinThreshold.
#pragma once

#include <algorithm>
#include <cstdint>

namespace cellm::cuda {

class StepAheadPolicy {
 public:
  static constexpr int32_t kMinThreshold = 2;
  static constexpr int32_t kMaxThreshold = 64;
  static constexpr int32_t kUsedToRelax = 8;

  explicit StepAheadPolicy(bool adaptive) : adaptive_(adaptive) {}

  // `stable_run`: how many decode batches in a row, this one included, had the same
  // sessions in the same order.
  bool should_queue(int64_t stable_run) const { return stable_run >= threshold_; }

  void used() {
    if (!adaptive_ || ++used_in_a_row_ < kUsedToRelax) return;
    used_in_a_row_ = 0;
    threshold_ = std::max(kMinThreshold, threshold_ / 2);
  }

  void dropped() {
    used_in_a_row_ = 0;
    if (adaptive_) threshold_ = std::min(kMaxThreshold, threshold_ * 2);
  }

  int32_t threshold() const { return threshold_; }

 private:
  bool adaptive_;
  int32_t threshold_ = kMinThreshold;
  int32_t used_in_a_row_ = 0;
};

}  // namespace cellm::cuda
