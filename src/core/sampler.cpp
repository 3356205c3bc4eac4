#include "cellm/sampler.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <utility>

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

// The log-softmax of one key (a logit, NaN read as -inf) given its row's largest
// key and the log of the row's mass relative to it.
struct LogSoftmax {
  float max_key;
  float log_sum;

  float operator()(float key) const {
    constexpr float kInf = std::numeric_limits<float>::infinity();
    if (key == -kInf) return -kInf;  // also every key of a row with no mass
    if (max_key == kInf) return key == kInf ? -log_sum : -kInf;
    return (key - max_key) - log_sum;
  }
};

// Sorts `keys` ascending. Long runs take an LSD radix sort, a byte a pass, skipping
// the bytes every key shares (a row's keys differ in about six of their eight);
// `buffer` is its scratch.
void sort_keys(std::span<uint64_t> keys, std::vector<uint64_t>& buffer) {
  if (keys.size() < 4096) {
    std::sort(keys.begin(), keys.end());
    return;
  }
  uint64_t any = 0, all = ~uint64_t{0};
  for (const uint64_t k : keys) {
    any |= k;
    all &= k;
  }
  const uint64_t varying = any ^ all;
  buffer.resize(keys.size());
  std::span<uint64_t> from = keys, to(buffer.data(), keys.size());
  for (int shift = 0; shift < 64; shift += 8) {
    if (((varying >> shift) & 0xFFu) == 0) continue;
    std::array<size_t, 256> start{};
    for (const uint64_t k : from) ++start[(k >> shift) & 0xFFu];
    size_t sum = 0;
    for (size_t& s : start) sum += std::exchange(s, sum);
    for (const uint64_t k : from) to[start[(k >> shift) & 0xFFu]++] = k;
    std::swap(from, to);
  }
  if (from.data() != keys.data()) std::copy(from.begin(), from.end(), keys.begin());
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
  if (params.num_logprobs < 0 || params.num_logprobs > kMaxLogprobs) {
    return InvalidArgument("num_logprobs must be in [0, " + std::to_string(kMaxLogprobs) +
                           "], got " + std::to_string(params.num_logprobs));
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
  scratch.resize(vocab);  // the weights
  std::span<float> weight(scratch.data(), vocab);
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

  // The kept ids in descending weight order, ties by ascending id: top-k's first k,
  // or top-p's up to and including the token where the mass (summed in that order)
  // first exceeds p. Each id is a 64-bit key, its weight's bits complemented above the
  // id (weights are >= 0, so their bits order like their values): ascending keys are
  // the walk's order, and the head is selected and sorted only as far as needed, with
  // no comparison reading memory beside the keys. Ties add equal mass, so the sums do
  // not depend on how ties are ordered.
  thread_local std::vector<uint64_t> keys;
  thread_local std::vector<uint64_t> buffer;
  keys.resize(vocab);
  for (size_t i = 0; i < vocab; ++i) {
    keys[i] = (uint64_t{~std::bit_cast<uint32_t>(weight[i])} << 32) | static_cast<uint64_t>(i);
  }
  const auto weight_of_key = [](uint64_t key) {
    return std::bit_cast<float>(~static_cast<uint32_t>(key >> 32));
  };
  size_t kept_count = vocab;
  if (use_top_k) {
    kept_count = static_cast<size_t>(params.top_k);
    const auto kth = keys.begin() + static_cast<std::ptrdiff_t>(kept_count - 1);
    std::nth_element(keys.begin(), kth, keys.end());
    sort_keys(std::span(keys.data(), kept_count), buffer);
  } else {
    const double target = static_cast<double>(params.top_p) * total;
    double cumulative = 0.0;
    size_t sorted_end = 0;
    size_t chunk = 64;
    bool crossed = false;
    while (!crossed && sorted_end < vocab) {
      const size_t rest = vocab - sorted_end;
      // A chunk of at least half the rest: sort the rest outright.
      const size_t count = 2 * chunk >= rest ? rest : chunk;
      const auto first = keys.begin() + static_cast<std::ptrdiff_t>(sorted_end);
      const auto last = first + static_cast<std::ptrdiff_t>(count);
      if (count < rest) std::nth_element(first, last - 1, keys.end());
      sort_keys(std::span(keys.data() + sorted_end, count), buffer);
      for (size_t i = sorted_end; i < sorted_end + count; ++i) {
        cumulative += weight_of_key(keys[i]);
        if (cumulative > target) {
          kept_count = i + 1;
          crossed = true;
          break;
        }
      }
      sorted_end += count;
      chunk *= 4;
    }
  }
  thread_local std::vector<int32_t> order;
  order.resize(kept_count);
  for (size_t i = 0; i < kept_count; ++i) order[i] = static_cast<int32_t>(keys[i] & 0xFFFFFFFFu);

  // Min-p drops a suffix of the descending prefix; the most probable token stays.
  double kept = 0.0;
  size_t end = 0;
  while (end < kept_count && weight[order[end]] >= min_weight) kept += weight[order[end++]];

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

TokenLogprobs token_logprobs(std::span<const float> logits, Token sampled, int32_t n,
                             std::vector<float>& scratch) {
  // REQUIRES: a non-empty row, a sampled id inside it, n >= 0.
  CELLM_CHECK(!logits.empty());
  CELLM_CHECK_MSG(sampled >= 0 && static_cast<size_t>(sampled) < logits.size(),
                  "sampled token " + std::to_string(sampled) + " outside a row of " +
                      std::to_string(logits.size()));
  CELLM_CHECK(n >= 0);

  constexpr float kInf = std::numeric_limits<float>::infinity();
  const size_t vocab = logits.size();
  // key: the logit with NaN read as -inf; the ranking and the mass both use it.
  scratch.resize(2 * vocab);  // [0, V): keys; [V, 2V): selection workspace
  std::span<float> key(scratch.data(), vocab);
  float max_key = -kInf;
  for (size_t i = 0; i < vocab; ++i) {
    key[i] = std::isnan(logits[i]) ? -kInf : logits[i];
    max_key = std::max(max_key, key[i]);
  }

  // logprob(x) = (x - max) - log(sum_j exp(x_j - max)), the sum in double; with
  // +inf logits, log_sum is the log of their count and they share the mass.
  LogSoftmax log_softmax{max_key, 0.0f};
  if (max_key == kInf) {
    log_softmax.log_sum =
        static_cast<float>(std::log(static_cast<double>(std::count(key.begin(), key.end(), kInf))));
  } else if (max_key > -kInf) {
    double sum = 0.0;
    for (float x : key) sum += std::exp(static_cast<double>(x - max_key));
    log_softmax.log_sum = static_cast<float>(std::log(sum));
  }

  TokenLogprobs result;
  result.logprob = log_softmax(key[static_cast<size_t>(sampled)]);
  const size_t count = std::min(static_cast<size_t>(n), vocab);
  if (count == 0) return result;

  // The count-th largest key by partial selection on a copy; then every id above
  // it and the lowest ids at it, sorted: most likely first, ties by lower id.
  std::span<float> values(scratch.data() + vocab, vocab);
  std::copy(key.begin(), key.end(), values.begin());
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(count - 1),
                   values.end(), std::greater<float>());
  const float threshold = values[count - 1];
  result.top.reserve(count);
  for (size_t i = 0; i < vocab; ++i) {
    if (key[i] > threshold) result.top.emplace_back(static_cast<Token>(i), key[i]);
  }
  for (size_t i = 0; i < vocab && result.top.size() < count; ++i) {
    if (key[i] == threshold) result.top.emplace_back(static_cast<Token>(i), key[i]);
  }
  CELLM_CHECK(result.top.size() == count);
  std::sort(result.top.begin(), result.top.end(), [](const auto& a, const auto& b) {
    return a.second > b.second || (a.second == b.second && a.first < b.first);
  });
  for (auto& [token, value] : result.top) value = log_softmax(value);
  return result;
}

}  // namespace cellm
