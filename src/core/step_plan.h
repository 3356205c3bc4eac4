// plan_slices: cuts a packed batch of `total` tokens into the forwards an
// executor with a static one-token `decode` and a dynamic `prefill` of
// [min_prefill_tokens, max_step_tokens] runs, in order and without gaps.
//
// Walk from offset 0 in pieces of length = min(max_step_tokens, remaining): a
// piece with length >= min_prefill_tokens and length > 1 is one Prefill slice;
// otherwise each of its tokens is its own Decode slice. No rebalancing: only the
// tail can fall below the width. An empty batch plans nothing.
//
//   total, W, bound   plan
//   1, 8, 2           D
//   2, 8, 2           P(0,2)
//   9, 8, 2           P(0,8) D(8)
//   10, 8, 2          P(0,8) P(8,2)
//   4, 8, 5           D D D D
//   11, 8, 5          P(0,8) D(8) D(9) D(10)
#pragma once

#include <algorithm>
#include <vector>

#include "cellm/status.h"

namespace cellm {

enum class StepMethod { kDecode, kPrefill };

struct StepSlice {
  int offset = 0;  // first token of the slice in the packed batch
  int length = 0;  // tokens in the slice
  StepMethod method = StepMethod::kDecode;

  bool operator==(const StepSlice&) const = default;
};

// REQUIRES: max_step_tokens > 0 (a program without a prefill width is a bug).
inline std::vector<StepSlice> plan_slices(int total, int max_step_tokens, int min_prefill_tokens) {
  CELLM_CHECK_MSG(max_step_tokens > 0, "plan_slices needs a positive step width");
  std::vector<StepSlice> plan;
  for (int offset = 0; offset < total;) {
    const int length = std::min(max_step_tokens, total - offset);
    if (length >= min_prefill_tokens && length > 1) {
      plan.push_back({offset, length, StepMethod::kPrefill});
    } else {
      for (int i = 0; i < length; ++i) plan.push_back({offset + i, 1, StepMethod::kDecode});
    }
    offset += length;
  }
  return plan;
}

}  // namespace cellm
