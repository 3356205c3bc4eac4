// Shared helpers of the device sampler's tests (sampling_test.cpp): batches of
// rows and policies, the device launch, the host's draw replayed step by step,
// and the acceptance rule (see sampling_test.cpp's file comment).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "cellm/sampler.h"
#include "cellm/types.h"
#include "cuda/device_memory.h"
#include "cuda/kernels/sampling.h"

namespace cellm::cuda::sampling_test {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
inline constexpr float kInf = std::numeric_limits<float>::infinity();
// Relative to the kept (or total) mass. The device's sums are exact in fixed
// point with 2^-(63 - bit_width(V)) per token, at most 2^(2 bit_width(V) - 63)
// <= 7.5e-9 in all below 2^18 tokens (the kept mass is >= 1); the host's double
// sums are off by far less. The brief's looser 1e-5 would call about 10% of the
// 32000-token rows boundary rows (flat rows at T = 2 keep thousands of mass) and
// make "boundary rows are rare" meaningless.
inline constexpr double kBoundaryTolerance = 1e-8;

inline void check_cuda(cudaError_t err, const char* what) {
  CELLM_CHECK_MSG(err == cudaSuccess, std::string(what) + ": " + cudaGetErrorString(err));
}

template <typename T>
inline DeviceBuffer upload(const std::vector<T>& host) {
  DeviceBuffer buffer =
      DeviceBuffer::allocate(std::max<size_t>(host.size(), 1) * sizeof(T)).value();
  if (!host.empty()) {
    check_cuda(
        cudaMemcpy(buffer.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
        "upload");
  }
  return buffer;
}

template <typename T>
inline std::vector<T> download(const DeviceBuffer& buffer, size_t count) {
  std::vector<T> host(count);
  if (count > 0) {
    check_cuda(cudaMemcpy(host.data(), buffer.get(), count * sizeof(T), cudaMemcpyDeviceToHost),
               "download");
  }
  return host;
}

// Rows of logits and their policies, as one launch takes them.
struct Batch {
  int64_t vocab = 0;
  std::vector<float> logits;  // [rows, vocab]
  std::vector<SamplingRow> rows;

  std::span<const float> row(size_t r) const {
    return {logits.data() + r * static_cast<size_t>(vocab), static_cast<size_t>(vocab)};
  }
  void add(std::span<const float> row_logits, const SamplingRow& policy) {
    CELLM_CHECK(static_cast<int64_t>(row_logits.size()) == vocab);
    logits.insert(logits.end(), row_logits.begin(), row_logits.end());
    rows.push_back(policy);
  }
};

// The device's tokens for `batch`, and the workspace (the weights) after it.
struct DeviceRun {
  std::vector<int32_t> tokens;
  std::vector<float> weights;  // [rows, vocab]
};

inline DeviceRun sample_on_device(const Batch& batch) {
  const int64_t n_rows = static_cast<int64_t>(batch.rows.size());
  Stream stream = Stream::create().value();
  DeviceBuffer logits = upload(batch.logits);
  DeviceBuffer params = upload(batch.rows);
  DeviceBuffer out = DeviceBuffer::allocate(std::max<int64_t>(n_rows, 1) * sizeof(int32_t)).value();
  const size_t workspace_bytes = sample_workspace_bytes(n_rows, batch.vocab);
  DeviceBuffer workspace = DeviceBuffer::allocate(std::max<size_t>(workspace_bytes, 1)).value();
  check_cuda(launch_sample(logits.as<float>(), n_rows, batch.vocab, params.as<SamplingRow>(),
                           out.as<int32_t>(), workspace.get(), workspace_bytes, stream.get()),
             "launch_sample");
  check_cuda(cudaStreamSynchronize(stream.get()), "sample");
  DeviceRun run;
  run.tokens = download<int32_t>(out, static_cast<size_t>(n_rows));
  run.weights = download<float>(workspace, static_cast<size_t>(n_rows * batch.vocab));
  return run;
}

inline SamplingParams to_params(const SamplingRow& row) {
  SamplingParams params;
  params.temperature = row.temperature;
  params.top_k = row.top_k;
  params.top_p = row.top_p;
  params.min_p = row.min_p;
  return params;
}

inline SamplingRow policy(float temperature, int32_t top_k, float top_p, float min_p) {
  SamplingRow row;
  row.temperature = temperature;
  row.top_k = top_k;
  row.top_p = top_p;
  row.min_p = min_p;
  return row;
}

inline bool near(double a, double b, double scale) {
  return std::abs(a - b) <= kBoundaryTolerance * scale;
}

// The host's draw replayed step by step in its own arithmetic (a full stable
// sort instead of its partial selection: the same order and the same sums).
struct HostTrace {
  Token token = 0;
  bool boundary = false;  // the acceptance rule's (a) or (b)
};

inline HostTrace trace_host(std::span<const float> logits, const SamplingParams& params, float u) {
  HostTrace trace;
  const size_t vocab = logits.size();
  float max_logit = -kInf;
  bool any_number = false;
  for (float x : logits) {
    if (std::isnan(x)) continue;
    any_number = true;
    max_logit = std::max(max_logit, x);
  }
  if (params.temperature == 0.0f || !any_number || max_logit == -kInf) {
    SamplingParams argmax = params;
    argmax.temperature = 0.0f;
    std::vector<float> scratch;
    trace.token = sample_token(logits, argmax, u, scratch);
    return trace;
  }
  std::vector<float> weight(vocab);
  double total = 0.0;
  for (size_t i = 0; i < vocab; ++i) {
    const float x = logits[i];
    float w;
    if (std::isnan(x)) {
      w = 0.0f;
    } else if (std::isinf(max_logit)) {
      w = x == max_logit ? 1.0f : 0.0f;
    } else {
      w = std::exp((x - max_logit) / params.temperature);
    }
    weight[i] = w;
    total += w;
  }
  const bool use_top_k = params.top_k > 0 && static_cast<size_t>(params.top_k) < vocab;
  const bool use_top_p = !use_top_k && params.top_p > 0.0f && params.top_p < 1.0f;

  std::vector<int32_t> walk;  // the kept ids, in the walk's order
  bool descending = use_top_k || use_top_p;
  if (descending) {
    std::vector<int32_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&weight](int32_t a, int32_t b) { return weight[a] > weight[b]; });
    size_t kept_count = vocab;
    if (use_top_k) {
      kept_count = static_cast<size_t>(params.top_k);
    } else {
      const double target = static_cast<double>(params.top_p) * total;
      double cumulative = 0.0;
      bool crossed = false;
      for (size_t i = 0; i < vocab && !crossed; ++i) {
        const double before = cumulative;
        cumulative += weight[order[i]];
        if (cumulative > target) {
          kept_count = i + 1;
          crossed = true;
          trace.boundary |= near(before, target, total) || near(cumulative, target, total);
        }
      }
      if (!crossed) trace.boundary = true;  // never crossed: rounding territory
    }
    for (size_t i = 0; i < kept_count && weight[order[i]] >= params.min_p; ++i) {
      walk.push_back(order[i]);
    }
  } else {
    for (size_t i = 0; i < vocab; ++i) {
      if (weight[i] >= params.min_p && weight[i] != 0.0f) walk.push_back(static_cast<int32_t>(i));
    }
  }
  double kept = 0.0;
  for (int32_t id : walk) kept += weight[id];
  const double r = static_cast<double>(u) * kept;
  double cumulative = 0.0;
  trace.token = walk.empty() ? 0 : walk.front();
  for (int32_t id : walk) {
    const float w = weight[id];
    if (w == 0.0f) break;
    const double before = cumulative;
    cumulative += w;
    trace.token = id;
    if (cumulative > r) {
      trace.boundary |= near(before, r, kept) || near(cumulative, r, kept);
      return trace;
    }
  }
  trace.boundary = true;  // ran off the end: rounding territory
  return trace;
}

// Applies the acceptance rule to every row of `batch`; returns the boundary rows.
inline size_t expect_device_matches_host(const Batch& batch, const std::string& what) {
  const DeviceRun device = sample_on_device(batch);
  std::vector<float> scratch;
  size_t boundary = 0;
  size_t off_boundary = 0;
  for (size_t r = 0; r < batch.rows.size(); ++r) {
    const SamplingRow& row = batch.rows[r];
    const SamplingParams params = to_params(row);
    const float u = sampling_uniform(row.seed, row.position);
    const Token host = sample_token(batch.row(r), params, u, scratch);
    const HostTrace trace = trace_host(batch.row(r), params, u);
    EXPECT_EQ(trace.token, host) << what << " row " << r << ": the replay is not the host";
    if (trace.boundary) ++boundary;
    if (device.tokens[r] != host && !trace.boundary) {
      if (++off_boundary <= 10) {
        ADD_FAILURE() << what << " row " << r << ": device " << device.tokens[r] << ", host "
                      << host << " (T " << row.temperature << ", top_k " << row.top_k << ", top_p "
                      << row.top_p << ", min_p " << row.min_p << ", u " << u << ")";
      }
    }
  }
  EXPECT_EQ(off_boundary, 0u) << what << ": rows off the host's token away from any boundary";
  EXPECT_LE(boundary, batch.rows.size() / 100 + 2) << what << ": too many boundary rows";
  return boundary;
}

enum class LogitKind { kNormal, kPeaked, kQuantised, kCoarse };
inline constexpr LogitKind kKinds[] = {LogitKind::kNormal, LogitKind::kPeaked,
                                       LogitKind::kQuantised, LogitKind::kCoarse};

// One row of logits: normal (sd 2), peaked (sd 6), quantised to halves (heavy
// ties) or four integer levels (ties everywhere); the first two and the
// quantised kind sprinkle about 1% NaN and 1% -inf.
inline std::vector<float> make_row(int64_t vocab, LogitKind kind, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> level(0, 3);
  std::uniform_real_distribution<float> coin(0.0f, 1.0f);
  std::vector<float> row(static_cast<size_t>(vocab));
  for (float& x : row) {
    switch (kind) {
      case LogitKind::kNormal:
        x = 2.0f * normal(rng);
        break;
      case LogitKind::kPeaked:
        x = 6.0f * normal(rng);
        break;
      case LogitKind::kQuantised:
        x = std::round(4.0f * normal(rng)) / 2.0f;
        break;
      case LogitKind::kCoarse:
        x = static_cast<float>(level(rng));
        break;
    }
    if (kind != LogitKind::kCoarse) {
      const float c = coin(rng);
      if (c < 0.01f) x = kNaN;
      if (c >= 0.01f && c < 0.02f) x = -kInf;
    }
  }
  return row;
}

// Every combination of the brief's policy values; top_k == vocab means "off by size".
inline std::vector<SamplingRow> policy_grid(int64_t vocab) {
  std::vector<SamplingRow> grid;
  for (float temperature : {0.5f, 1.0f, 2.0f}) {
    for (int32_t top_k : {0, 1, 5, 50, static_cast<int32_t>(vocab)}) {
      for (float top_p : {0.1f, 0.5f, 0.9f, 1.0f}) {
        for (float min_p : {0.0f, 0.05f, 0.5f}) {
          grid.push_back(policy(temperature, top_k, top_p, min_p));
        }
      }
    }
  }
  return grid;
}

// n_rows rows of `vocab` logits with mixed policies and kinds, random keys.
inline Batch mixed_batch(int64_t vocab, size_t n_rows, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> position(0, INT32_MAX);
  const std::vector<SamplingRow> grid = policy_grid(vocab);
  Batch batch;
  batch.vocab = vocab;
  for (size_t r = 0; r < n_rows; ++r) {
    SamplingRow row = grid[r % grid.size()];
    row.seed = rng();
    row.position = position(rng);
    const LogitKind kind = kKinds[(r + r / grid.size()) % std::size(kKinds)];
    batch.add(make_row(vocab, kind, rng), row);
  }
  return batch;
}

}  // namespace cellm::cuda::sampling_test
