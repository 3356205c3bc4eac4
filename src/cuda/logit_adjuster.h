// LogitAdjuster: brings the LogitAdjustments of some rows of a step (a LogitsProcessor's
// allowed-token masks and edits; cellm/logits_processor.h) to the device and applies them
// to the step's logits before the sampler reads them (cuda/kernels/logit_adjust.h).
//
// apply() packs every adjusted row into one pinned block (row descriptors, mask words,
// edits), copies it with one cudaMemcpyAsync and launches one kernel, all on `stream`.
// Rows without adjustments cost nothing; a step without any launches nothing.
//
// Thread-safety: none; one step at a time (the executor's engine thread).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <vector>

#include "cellm/logits_processor.h"
#include "cellm/status.h"
#include "cuda/device_memory.h"
#include "cuda/kernels/logit_adjust.h"

namespace cellm::cuda {

// The adjustments of one row of a step's logits; `adjustments` stays valid until apply()
// returns.
struct RowAdjustments {
  int32_t row = 0;  // the row of the logits
  const LogitAdjustments* adjustments = nullptr;
};

// The device form of a step's adjustments, as apply() uploads it.
struct PackedAdjustments {
  std::vector<LogitAdjustRow> rows;    // one per row with something to apply
  std::vector<uint64_t> masks;         // every row's mask words, in turn
  std::vector<DeviceLogitEdit> edits;  // every row's edits of tokens in [0, vocab), in turn
};

// Packs `rows` for a [n_rows, vocab] block: rows whose adjustments are empty (or null) are
// left out; edits of tokens outside [0, vocab) are dropped and mask words beyond
// ceil(vocab / 64) cut (the host function ignores both); a row that edits a token twice
// is flagged in_order. `seen` is scratch: vocab words, all zero between calls (resized
// and zeroed when its size differs). Exposed for tests.
// REQUIRES: every row in [0, n_rows).
void pack_adjustments(std::span<const RowAdjustments> rows, int64_t vocab, PackedAdjustments& out,
                      std::vector<uint32_t>& seen);

class LogitAdjuster {
 public:
  explicit LogitAdjuster(int64_t vocab) : vocab_(vocab) {}

  // Applies `rows` to `logits` [n_rows, vocab] on `stream`, in stream order after
  // everything before it. The pinned staging is reused by the next call: the caller
  // synchronises the stream between calls (a step waits for its tokens). InvalidArgument
  // naming the row when a row lies outside [0, n_rows); Internal for a CUDA error.
  Status apply(std::span<const RowAdjustments> rows, float* logits, int64_t n_rows,
               cudaStream_t stream);

  // Rows the last apply() adjusted on the device (0: it launched nothing).
  int32_t last_adjusted_rows() const { return last_rows_; }

 private:
  int64_t vocab_;
  PackedAdjustments packed_;
  std::vector<uint32_t> seen_;
  PinnedBuffer host_;
  DeviceBuffer device_;
  int32_t last_rows_ = 0;
};

}  // namespace cellm::cuda
