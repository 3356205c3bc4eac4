#include "cellm/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <string>

namespace cellm {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::string format_float(float value) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(value));
  return buf;
}

// Lowest id among the largest non-NaN logits; 0 when every logit is NaN.
Token argmax(std::span<const float> logits) {
  size_t best = logits.size();
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) continue;
    if (best == logits.size() || logits[i] > logits[best]) best = i;
  }
  return best == logits.size() ? 0 : static_cast<Token>(best);
}

// The first `count` entries of `order` become the highest-weight ids, descending,
// ties by ascending id. REQUIRES: count <= order.size().
template <typename Less>
void select_top(std::vector<int32_t>& order, size_t begin, size_t count, Less less) {
  const auto first = order.begin() + static_cast<std::ptrdiff_t>(begin);
  const auto mid = order.begin() + static_cast<std::ptrdiff_t>(begin + count);
  if (mid != order.end()) std::nth_element(first, mid, order.end(), less);
  std::sort(first, mid, less);
}

}  // namespace

Status validate_sampling(const SamplingParams& params) {
  if (!std::isfinite(params.temperature) || params.temperature < 0.0f) {
    return InvalidArgument("temperature must be finite and >= 0, got " +
                           format_float(params.temperature));
  }
  if (params.top_k < 0) {
    return InvalidArgument("top_k must be >= 0, got " + std::to_string(params.top_k));
  }
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f)) {
    return InvalidArgument("top_p must be in (0, 1], got " + format_float(params.top_p));
  }
  if (!(params.min_p >= 0.0f && params.min_p <= 1.0f)) {
    return InvalidArgument("min_p must be in [0, 1], got " + format_float(params.min_p));
  }
  return Status::Ok();
}

float sampling_uniform(uint64_t seed, Position position) {
  const uint64_t key = splitmix64_mix(seed + kGolden);
  const uint64_t counter = static_cast<uint64_t>(static_cast<uint32_t>(position));
  const uint64_t bits = splitmix64_mix(key + (counter + 1) * kGolden);
  return static_cast<float>(bits >> 40) * 0x1.0p-24f;
}

Token sample_token(std::span<const float> logits, const SamplingParams& params, float u,
                   std::vector<float>& scratch) {
  // REQUIRES: a non-empty row, valid params, u in [0, 1).
  CELLM_CHECK(!logits.empty());
  CELLM_CHECK_MSG(validate_sampling(params).ok(), validate_sampling(params).message());
  CELLM_CHECK_MSG(u >= 0.0f && u < 1.0f, "u = " + format_float(u));

  if (params.temperature == 0.0f) return argmax(logits);

  const size_t vocab = logits.size();
  float max_logit = -std::numeric_limits<float>::infinity();
  bool any_number = false;
  for (float x : logits) {
    if (std::isnan(x)) continue;
    any_number = true;
    max_logit = std::max(max_logit, x);
  }
  // No probability mass anywhere (all NaN or all -inf): fall back to argmax.
  if (!any_number || max_logit == -std::numeric_limits<float>::infinity()) {
    return argmax(logits);
  }

  // Unnormalized probabilities: w = exp((x - max) / T), so the largest is exactly 1
  // and min-p compares against min_p itself.
  std::vector<float>& weight = scratch;
  weight.resize(vocab);
  const bool infinite_max = std::isinf(max_logit);
  double total = 0.0;
  for (size_t i = 0; i < vocab; ++i) {
    const float x = logits[i];
    float w;
    if (std::isnan(x)) {
      w = 0.0f;
    } else if (infinite_max) {
      w = x == max_logit ? 1.0f : 0.0f;
    } else {
      w = std::exp((x - max_logit) / params.temperature);
    }
    weight[i] = w;
    total += w;
  }

  const bool use_top_k = params.top_k > 0 && static_cast<size_t>(params.top_k) < vocab;
  const bool use_top_p = !use_top_k && params.top_p > 0.0f && params.top_p < 1.0f;
  const float min_weight = params.min_p;  // min_p times the largest weight, which is 1

  if (!use_top_k && !use_top_p) {
    // Token-id order over every token that min-p keeps.
    double kept = 0.0;
    for (size_t i = 0; i < vocab; ++i) {
      if (weight[i] >= min_weight) kept += weight[i];
    }
    const double r = static_cast<double>(u) * kept;
    double cumulative = 0.0;
    size_t last = 0;
    for (size_t i = 0; i < vocab; ++i) {
      if (weight[i] < min_weight || weight[i] == 0.0f) continue;
      cumulative += weight[i];
      if (cumulative > r) return static_cast<Token>(i);
      last = i;
    }
    return static_cast<Token>(last);
  }

  // Descending order by weight, ties by ascending id; only the prefix that is
  // needed gets sorted.
  thread_local std::vector<int32_t> order;
  order.resize(vocab);
  std::iota(order.begin(), order.end(), 0);
  const auto descending = [&weight](int32_t a, int32_t b) {
    return weight[a] > weight[b] || (weight[a] == weight[b] && a < b);
  };

  size_t kept_end = 0;
  if (use_top_k) {
    kept_end = static_cast<size_t>(params.top_k);
    select_top(order, 0, kept_end, descending);
  } else {
    // Top-p: sort growing chunks of the head until the mass first exceeds p.
    const double target = static_cast<double>(params.top_p) * total;
    double cumulative = 0.0;
    size_t sorted_end = 0;
    size_t chunk = 64;
    kept_end = vocab;
    while (sorted_end < vocab) {
      const size_t count = std::min(chunk, vocab - sorted_end);
      select_top(order, sorted_end, count, descending);
      bool crossed = false;
      for (size_t i = sorted_end; i < sorted_end + count; ++i) {
        cumulative += weight[order[i]];
        if (cumulative > target) {
          kept_end = i + 1;
          crossed = true;
          break;
        }
      }
      if (crossed) break;
      sorted_end += count;
      chunk *= 4;
    }
  }

  // Min-p drops a suffix of the descending prefix; the most probable token stays.
  double kept = 0.0;
  size_t end = 0;
  while (end < kept_end && weight[order[end]] >= min_weight) kept += weight[order[end++]];

  const double r = static_cast<double>(u) * kept;
  double cumulative = 0.0;
  Token last = order[0];
  for (size_t i = 0; i < end; ++i) {
    const float w = weight[order[i]];
    if (w == 0.0f) break;  // descending: nothing after carries mass
    cumulative += w;
    if (cumulative > r) return order[i];
    last = order[i];
  }
  return last;
}

}  // namespace cellm
