// The row transform every executor applies for a LogitsProcessor (the CUDA
// sampler's twin must give the same row).
#include "cellm/logits_processor.h"

#include <cmath>
#include <limits>

namespace cellm {

void apply_logit_adjustments(std::span<float> logits, const LogitAdjustments& adjustments) {
  const size_t vocab = logits.size();
  for (const LogitEdit& e : adjustments.edits) {
    if (e.token < 0 || static_cast<size_t>(e.token) >= vocab) continue;
    float& x = logits[static_cast<size_t>(e.token)];
    x = (x > 0.0f ? x / e.scale : x * e.scale) + e.bias;
  }
  if (adjustments.allowed.empty()) return;
  constexpr float kForbidden = -std::numeric_limits<float>::infinity();
  const std::vector<uint64_t>& mask = adjustments.allowed;
  for (size_t t = 0; t < vocab; ++t) {
    const size_t word = t / 64;
    const bool allowed = word < mask.size() && ((mask[word] >> (t % 64)) & 1u) != 0;
    if (!allowed) logits[t] = kForbidden;
  }
}

}  // namespace cellm
