// The device sampler (src/cuda/kernels/sampling.h) against its CPU twin, the
// host sampler cellm::sample_token (include/cellm/sampler.h), row by row.
//
// Acceptance rule. Argmax rows (temperature 0, or a row without mass) and the
// uniform must match exactly. A row drawn at temperature > 0 must give the host's
// token too, except on a boundary row, where the device's exact fixed-point sums
// and the host's double sums may legitimately part. The test replays the host's
// arithmetic (its weights, its double sums, in its order; the replay must give
// sample_token's token) and calls a row a boundary row when
//   (a) r = u * kept lies within 1e-8 * kept of either end of the host token's
//       cumulative interval [before, after) in the walk (or the walk ran off its
//       end), or
//   (b) with top-p, p * total lies within 1e-8 * total of the cumulative mass
//       just before or just at the cut (so the kept count could differ by one).
// Boundary rows may differ; they are counted, and there must be at most
// 1% of the rows plus 2 of them. The weights themselves must be the host's bit
// for bit (checked through the workspace, which holds them after a launch).
#include "cuda/kernels/sampling.h"

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
#include "gpu_test.h"

namespace cellm::cuda {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
// Relative to the kept (or total) mass. The device's sums are exact in fixed
// point with 2^-(63 - bit_width(V)) per token, at most 2^(2 bit_width(V) - 63)
// <= 7.5e-9 in all below 2^18 tokens (the kept mass is >= 1); the host's double
// sums are off by far less. The brief's looser 1e-5 would call about 10% of the
// 32000-token rows boundary rows (flat rows at T = 2 keep thousands of mass) and
// make "boundary rows are rare" meaningless.
constexpr double kBoundaryTolerance = 1e-8;

void check_cuda(cudaError_t err, const char* what) {
  CELLM_CHECK_MSG(err == cudaSuccess, std::string(what) + ": " + cudaGetErrorString(err));
}

template <typename T>
DeviceBuffer upload(const std::vector<T>& host) {
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
std::vector<T> download(const DeviceBuffer& buffer, size_t count) {
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

DeviceRun sample_on_device(const Batch& batch) {
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

SamplingParams to_params(const SamplingRow& row) {
  SamplingParams params;
  params.temperature = row.temperature;
  params.top_k = row.top_k;
  params.top_p = row.top_p;
  params.min_p = row.min_p;
  return params;
}

SamplingRow policy(float temperature, int32_t top_k, float top_p, float min_p) {
  SamplingRow row;
  row.temperature = temperature;
  row.top_k = top_k;
  row.top_p = top_p;
  row.min_p = min_p;
  return row;
}

bool near(double a, double b, double scale) {
  return std::abs(a - b) <= kBoundaryTolerance * scale;
}

// The host's draw replayed step by step in its own arithmetic (a full stable
// sort instead of its partial selection: the same order and the same sums).
struct HostTrace {
  Token token = 0;
  bool boundary = false;  // the acceptance rule's (a) or (b)
};

HostTrace trace_host(std::span<const float> logits, const SamplingParams& params, float u) {
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
size_t expect_device_matches_host(const Batch& batch, const std::string& what) {
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
constexpr LogitKind kKinds[] = {LogitKind::kNormal, LogitKind::kPeaked, LogitKind::kQuantised,
                                LogitKind::kCoarse};

// One row of logits: normal (sd 2), peaked (sd 6), quantised to halves (heavy
// ties) or four integer levels (ties everywhere); the first two and the
// quantised kind sprinkle about 1% NaN and 1% -inf.
std::vector<float> make_row(int64_t vocab, LogitKind kind, std::mt19937_64& rng) {
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
std::vector<SamplingRow> policy_grid(int64_t vocab) {
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
Batch mixed_batch(int64_t vocab, size_t n_rows, uint64_t seed) {
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

TEST(SamplingUniformTest, DeviceTwinMatchesTheHostBitForBit) {
  CELLM_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(7);
  std::vector<uint64_t> seeds;
  std::vector<int32_t> positions;
  for (uint64_t seed : {uint64_t{0}, uint64_t{1}, ~uint64_t{0}, uint64_t{0x9E3779B97F4A7C15}}) {
    for (int32_t position : {0, 1, -1, INT32_MAX, INT32_MIN, 4095}) {
      seeds.push_back(seed);
      positions.push_back(position);
    }
  }
  for (int i = 0; i < 200000; ++i) {
    seeds.push_back(i % 2 == 0 ? rng() : rng() % 16);
    positions.push_back(static_cast<int32_t>(static_cast<uint32_t>(rng())));
  }
  const int64_t n = static_cast<int64_t>(seeds.size());
  DeviceBuffer d_seeds = upload(seeds);
  DeviceBuffer d_positions = upload(positions);
  DeviceBuffer d_out = DeviceBuffer::allocate(static_cast<size_t>(n) * sizeof(float)).value();
  CELLM_ASSERT_CUDA(launch_sampling_uniform(d_seeds.as<uint64_t>(), d_positions.as<int32_t>(), n,
                                            d_out.as<float>(), nullptr));
  CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
  const std::vector<float> got = download<float>(d_out, static_cast<size_t>(n));
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float want = sampling_uniform(seeds[i], positions[i]);
    if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want) && ++bad <= 5) {
      ADD_FAILURE() << "seed " << seeds[i] << " position " << positions[i] << ": device " << got[i]
                    << " host " << want;
    }
  }
  EXPECT_EQ(bad, 0u);
}

TEST(SampleArgmaxTest, MatchesTheHostOnTiesNaNAndInfinities) {
  CELLM_SKIP_WITHOUT_GPU();
  const std::vector<std::vector<float>> rows = {
      {1, 3, 3, 2, 0, 3, -1},                      // ties: the lowest id
      {kNaN, 1, 5, 5, kNaN, 0, 4},                 // NaN first, tie after it
      {kNaN, kNaN, kNaN, kNaN, kNaN, kNaN, kNaN},  // all NaN: token 0
      {-kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf},
      {kNaN, -kInf, kNaN, -kInf, kNaN, kNaN, kNaN},  // the first number
      {1, kInf, 0, kInf, kNaN, 7, -kInf},            // +inf ties
      {0, 0, 0, 0, 0, 0, 1},                         // the last id
      {-5, -4, -3, -2, -2.5f, -7, kNaN},
  };
  Batch batch;
  batch.vocab = 7;
  for (size_t r = 0; r < rows.size(); ++r) {
    batch.add(rows[r], policy(0.0f, static_cast<int32_t>(r % 3), r % 2 ? 0.5f : 1.0f, 0.1f));
  }
  const DeviceRun small = sample_on_device(batch);
  std::vector<float> scratch;
  for (size_t r = 0; r < rows.size(); ++r) {
    EXPECT_EQ(small.tokens[r], sample_token(batch.row(r), to_params(batch.rows[r]), 0.5f, scratch))
        << "row " << r;
  }

  // Long rows: maxima far apart (the block reduction crosses threads and warps).
  std::mt19937_64 rng(11);
  for (int64_t vocab : {int64_t{1}, int64_t{1000}, int64_t{32000}, int64_t{151669}}) {
    Batch big;
    big.vocab = vocab;
    for (int r = 0; r < 8; ++r) {
      std::vector<float> row = make_row(vocab, kKinds[r % 4], rng);
      if (r == 5) std::fill(row.begin(), row.end(), kNaN);
      if (r == 6 && vocab > 2) row[static_cast<size_t>(vocab - 1)] = row[1] = 100.0f;
      big.add(row, policy(0.0f, 0, 1.0f, 0.0f));
    }
    const DeviceRun device = sample_on_device(big);
    for (size_t r = 0; r < big.rows.size(); ++r) {
      EXPECT_EQ(device.tokens[r], sample_token(big.row(r), to_params(big.rows[r]), 0.0f, scratch))
          << "vocab " << vocab << " row " << r;
    }
  }
}

TEST(SampleTest, MatchesTheHostOnDegenerateRowsAtPositiveTemperature) {
  CELLM_SKIP_WITHOUT_GPU();
  const std::vector<std::vector<float>> rows = {
      {kNaN, kNaN, kNaN, kNaN, kNaN},       // no number: argmax, token 0
      {-kInf, -kInf, -kInf, -kInf, -kInf},  // no mass: argmax
      {kNaN, -kInf, kNaN, -kInf, kNaN},     // no mass: the first number
      {kInf, 1, kInf, kInf, kNaN},          // +inf: the mass splits among them
      {kNaN, kNaN, 2, kNaN, kNaN},          // one number
      {3, 3, 3, 3, 3},                      // all tied
      {0, -kInf, 0, kInf, -1},              // one +inf takes everything
  };
  const std::vector<SamplingRow> policies = {
      policy(1.0f, 0, 1.0f, 0.0f), policy(0.7f, 2, 1.0f, 0.0f), policy(2.0f, 0, 0.5f, 0.0f),
      policy(1.0f, 0, 1.0f, 0.5f), policy(1.0f, 3, 0.9f, 0.05f)};
  Batch batch;
  batch.vocab = 5;
  std::mt19937_64 rng(3);
  for (const auto& row : rows) {
    for (SamplingRow p : policies) {
      for (int draw = 0; draw < 8; ++draw) {
        p.seed = rng();
        p.position = draw;
        batch.add(row, p);
      }
    }
  }
  expect_device_matches_host(batch, "degenerate rows");

  Batch single;  // vocab 1: always token 0
  single.vocab = 1;
  for (const SamplingRow& p : policies) single.add(std::vector<float>{0.25f}, p);
  single.add(std::vector<float>{kNaN}, policies[0]);
  for (int32_t token : sample_on_device(single).tokens) EXPECT_EQ(token, 0);
}

TEST(SampleTest, WeightsAreTheHostsBitForBit) {
  CELLM_SKIP_WITHOUT_GPU();
  // The workspace holds each row's weights after a launch (sampling.h): compare
  // them with the host's w = exp((x - max) / T) on every element.
  std::mt19937_64 rng(5);
  Batch batch;
  batch.vocab = 32000;
  const float temperatures[] = {0.5f, 1.0f, 2.0f, 0.7f, 1.3f, 0.05f};
  for (size_t r = 0; r < 24; ++r) {
    SamplingRow p = policy(temperatures[r % std::size(temperatures)], 0, 1.0f, 0.0f);
    batch.add(make_row(batch.vocab, kKinds[r % 4], rng), p);
  }
  const DeviceRun device = sample_on_device(batch);
  size_t bad = 0;
  for (size_t r = 0; r < batch.rows.size(); ++r) {
    const std::span<const float> row = batch.row(r);
    float max_logit = -kInf;
    for (float x : row) {
      if (!std::isnan(x)) max_logit = std::max(max_logit, x);
    }
    for (size_t i = 0; i < row.size(); ++i) {
      const float want =
          std::isnan(row[i]) ? 0.0f : std::exp((row[i] - max_logit) / batch.rows[r].temperature);
      const float got = device.weights[r * row.size() + i];
      if (std::bit_cast<uint32_t>(got) != std::bit_cast<uint32_t>(want) && ++bad <= 5) {
        ADD_FAILURE() << "row " << r << " id " << i << " x " << row[i] << ": device " << got
                      << " host " << want;
      }
    }
  }
  EXPECT_EQ(bad, 0u);
}

TEST(SampleTest, MatchesTheHostOnATinyVocabAcrossEveryPolicy) {
  CELLM_SKIP_WITHOUT_GPU();
  expect_device_matches_host(mixed_batch(7, 180 * 8, 101), "vocab 7");
}

TEST(SampleTest, MatchesTheHostOnAThousandTokensAcrossEveryPolicy) {
  CELLM_SKIP_WITHOUT_GPU();
  expect_device_matches_host(mixed_batch(1000, 180 * 4, 102), "vocab 1000");
}

TEST(SampleTest, MatchesTheHostOn32kTokensAcrossEveryPolicy) {
  CELLM_SKIP_WITHOUT_GPU();
  expect_device_matches_host(mixed_batch(32000, 180 * 2, 103), "vocab 32000");
}

TEST(SampleTest, MatchesTheHostOnAQwenSizedVocab) {
  CELLM_SKIP_WITHOUT_GPU();
  // 151669 tokens (Qwen's vocabulary); 96 rows walk a slice of the policy grid,
  // shuffled so that each kind of logits meets many policies.
  Batch all = mixed_batch(151669, 180, 104);
  std::vector<size_t> picks(all.rows.size());
  std::iota(picks.begin(), picks.end(), 0);
  std::shuffle(picks.begin(), picks.end(), std::mt19937_64(9));
  Batch batch;
  batch.vocab = all.vocab;
  for (size_t i = 0; i < 96; ++i) batch.add(all.row(picks[i]), all.rows[picks[i]]);
  expect_device_matches_host(batch, "vocab 151669");
}

TEST(SampleTest, OneRowAtManyPositionsDrawsTheHostsTokens) {
  CELLM_SKIP_WITHOUT_GPU();
  // 512 rows (the most a step samples) of the same logits, keyed by position:
  // each draw must be the host's, and the draws must not all be one token.
  std::mt19937_64 rng(13);
  const std::vector<float> row = make_row(1000, LogitKind::kQuantised, rng);
  Batch batch;
  batch.vocab = 1000;
  for (int32_t position = 0; position < 512; ++position) {
    SamplingRow p = policy(1.0f, 0, 0.9f, 0.05f);
    p.seed = 42;
    p.position = position;
    batch.add(row, p);
  }
  expect_device_matches_host(batch, "positions");
  const DeviceRun device = sample_on_device(batch);
  std::vector<int32_t> distinct = device.tokens;
  std::sort(distinct.begin(), distinct.end());
  EXPECT_GT(std::unique(distinct.begin(), distinct.end()) - distinct.begin(), 3);
}

TEST(SampleTest, AGraphReplayDrawsWhatAnEagerLaunchDraws) {
  CELLM_SKIP_WITHOUT_GPU();
  const Batch batch = mixed_batch(1000, 64, 105);
  const std::vector<int32_t> eager = sample_on_device(batch).tokens;
  const int64_t n_rows = static_cast<int64_t>(batch.rows.size());
  Stream stream = Stream::create().value();
  DeviceBuffer logits = upload(batch.logits);
  DeviceBuffer params = upload(batch.rows);
  DeviceBuffer out = DeviceBuffer::allocate(static_cast<size_t>(n_rows) * sizeof(int32_t)).value();
  const size_t workspace_bytes = sample_workspace_bytes(n_rows, batch.vocab);
  DeviceBuffer workspace = DeviceBuffer::allocate(workspace_bytes).value();

  cudaGraph_t graph = nullptr;
  CELLM_ASSERT_CUDA(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
  CELLM_ASSERT_CUDA(launch_sample(logits.as<float>(), n_rows, batch.vocab, params.as<SamplingRow>(),
                                  out.as<int32_t>(), workspace.get(), workspace_bytes,
                                  stream.get()));
  CELLM_ASSERT_CUDA(cudaStreamEndCapture(stream.get(), &graph));
  cudaGraphExec_t exec_handle = nullptr;
  CELLM_ASSERT_CUDA(cudaGraphInstantiate(&exec_handle, graph, 0));
  GraphExec exec(exec_handle);
  CELLM_ASSERT_CUDA(cudaGraphDestroy(graph));
  for (int replay = 0; replay < 2; ++replay) {
    CELLM_ASSERT_CUDA(cudaMemsetAsync(out.get(), 0xFF, out.bytes(), stream.get()));
    CELLM_ASSERT_CUDA(cudaGraphLaunch(exec.get(), stream.get()));
    CELLM_ASSERT_CUDA(cudaStreamSynchronize(stream.get()));
    EXPECT_EQ(download<int32_t>(out, static_cast<size_t>(n_rows)), eager) << "replay " << replay;
  }
}

TEST(SampleTest, RefusesBadShapesAndAShortWorkspace) {
  CELLM_SKIP_WITHOUT_GPU();
  EXPECT_EQ(sample_workspace_bytes(0, 7), 0u);
  EXPECT_EQ(sample_workspace_bytes(2, 7), 256u);
  EXPECT_EQ(sample_workspace_bytes(512, 151669), 512u * 151669u * 4u);
  DeviceBuffer logits = DeviceBuffer::allocate(7 * sizeof(float)).value();
  DeviceBuffer params = DeviceBuffer::allocate(sizeof(SamplingRow)).value();
  DeviceBuffer out = DeviceBuffer::allocate(sizeof(int32_t)).value();
  DeviceBuffer workspace = DeviceBuffer::allocate(256).value();
  const auto launch = [&](int64_t n_rows, int64_t vocab, size_t bytes) {
    return launch_sample(logits.as<float>(), n_rows, vocab, params.as<SamplingRow>(),
                         out.as<int32_t>(), workspace.get(), bytes, nullptr);
  };
  EXPECT_EQ(launch(1, 0, 256), cudaErrorInvalidValue);
  EXPECT_EQ(launch(-1, 7, 256), cudaErrorInvalidValue);
  EXPECT_EQ(launch(1, 7, 27), cudaErrorInvalidValue);
  EXPECT_EQ(launch(0, 7, 0), cudaSuccess);
  EXPECT_EQ(launch_sample(nullptr, 1, 7, params.as<SamplingRow>(), out.as<int32_t>(),
                          workspace.get(), 256, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(launch_sampling_uniform(nullptr, nullptr, 0, nullptr, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// ---- The split first pass (sample_split): chunk boundaries, NaN and infinities
// across chunks, and the same tokens with and without the split.

// The host's tokens for every row of `batch`.
std::vector<int32_t> host_tokens(const Batch& batch) {
  std::vector<float> scratch;
  std::vector<int32_t> tokens;
  for (size_t r = 0; r < batch.rows.size(); ++r) {
    const SamplingRow& row = batch.rows[r];
    tokens.push_back(sample_token(batch.row(r), to_params(row),
                                  sampling_uniform(row.seed, row.position), scratch));
  }
  return tokens;
}

// The rows [begin, end) of `batch` as a batch of their own.
Batch slice(const Batch& batch, size_t begin, size_t end) {
  Batch part;
  part.vocab = batch.vocab;
  for (size_t r = begin; r < end; ++r) part.add(batch.row(r), batch.rows[r]);
  return part;
}

// The device's tokens for `batch` launched in groups of `rows_per_launch` rows
// (so every launch but maybe the last splits as that row count does).
std::vector<int32_t> tokens_in_launches_of(const Batch& batch, size_t rows_per_launch) {
  std::vector<int32_t> tokens;
  for (size_t begin = 0; begin < batch.rows.size(); begin += rows_per_launch) {
    const size_t end = std::min(batch.rows.size(), begin + rows_per_launch);
    const std::vector<int32_t> part = sample_on_device(slice(batch, begin, end)).tokens;
    tokens.insert(tokens.end(), part.begin(), part.end());
  }
  return tokens;
}

// Ids next to the chunk boundaries of `split` (c * chunk_logits - 1, + 0, + 1)
// and at the row's two ends, inside [0, vocab).
std::vector<int64_t> boundary_ids(const SampleSplit& split, int64_t vocab) {
  std::vector<int64_t> ids = {0, 1, vocab - 2, vocab - 1};
  for (int64_t c = 1; c < split.n_chunks; ++c) {
    for (int64_t d : {-1, 0, 1}) ids.push_back(c * split.chunk_logits + d);
  }
  std::erase_if(ids, [vocab](int64_t id) { return id < 0 || id >= vocab; });
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

// Row `r` of a set of rows that each stress the split's merge at `split`'s
// boundaries: finite normal logits (sd 2) and then one of six patterns.
std::vector<float> boundary_row(int64_t vocab, const SampleSplit& split, size_t r,
                                std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> row(static_cast<size_t>(vocab));
  for (float& x : row) x = normal(rng);
  const auto at = [&row, vocab](int64_t id) -> float& {
    return row[static_cast<size_t>(std::clamp<int64_t>(id, 0, vocab - 1))];
  };
  const int64_t n_chunks = split.n_chunks;
  const int64_t chunk = split.chunk_logits;
  const size_t variant = r / 6;
  switch (r % 6) {
    case 0: {  // one maximum next to a boundary
      const std::vector<int64_t> ids = boundary_ids(split, vocab);
      at(ids[variant % ids.size()]) = 50.0f;
      break;
    }
    case 1: {  // a tie straddling a boundary: the lower id, in the earlier chunk
      const int64_t b =
          (1 + static_cast<int64_t>(variant) % std::max<int64_t>(n_chunks - 1, 1)) * chunk;
      at(b) = 50.0f;
      at(b - 1) = 50.0f;
      break;
    }
    case 2:  // the same maximum at the last id of every chunk: chunk 0's wins
      for (int64_t c = 0; c < n_chunks; ++c) at((c + 1) * chunk - 1) = 50.0f;
      break;
    case 3: {  // chunks [0, k] all NaN (every chunk when k = n_chunks - 1: token 0)
      const int64_t k = static_cast<int64_t>(variant) % n_chunks;
      std::fill(row.begin(), row.begin() + std::min((k + 1) * chunk, vocab), kNaN);
      break;
    }
    case 4:  // +inf in every other chunk, from the last: the lowest of them
      for (int64_t c = n_chunks - 1; c >= 0; c -= 2) at(c * chunk + c % 3) = kInf;
      break;
    case 5:  // -inf everywhere after a NaN first chunk: the first -inf id (or 0)
      std::fill(row.begin(), row.end(), -kInf);
      std::fill(row.begin(), row.begin() + std::min(chunk, vocab), kNaN);
      break;
  }
  return row;
}

TEST(SampleSplitTest, ChunksFillTheDeviceAtSmallBatchAndStayLong) {
  for (int64_t vocab : {int64_t{1}, int64_t{2047}, int64_t{4095}, int64_t{4096}, int64_t{4097},
                        int64_t{32000}, int64_t{128256}, int64_t{151669}, int64_t{1} << 30}) {
    for (int64_t n_rows : {1, 2, 3, 16, 64, 255, 256, 257, 300, 511, 512, 513, 4096}) {
      SCOPED_TRACE("vocab " + std::to_string(vocab) + " rows " + std::to_string(n_rows));
      const SampleSplit split = sample_split(n_rows, vocab);
      ASSERT_GE(split.n_chunks, 1);
      EXPECT_LE(split.n_chunks * n_rows, 512 + n_rows - 1);            // about 512 blocks, no more
      EXPECT_GE(int64_t{split.n_chunks} * split.chunk_logits, vocab);  // chunks cover the row
      EXPECT_LT(int64_t{split.n_chunks - 1} * split.chunk_logits, vocab);  // none is empty
      if (split.n_chunks > 1) {
        EXPECT_GE(split.chunk_logits, 2048);
        EXPECT_LE(2 * int64_t{split.n_chunks}, vocab);  // the chunk bests fit in the row
      }
      if (n_rows >= 512 || vocab < 4096) {
        EXPECT_EQ(split.n_chunks, 1);
      }
    }
  }
  // Llama-3's vocabulary at the benchmark's row counts.
  EXPECT_EQ(sample_split(1, 128256).n_chunks, 62);
  EXPECT_EQ(sample_split(16, 128256).n_chunks, 32);
  EXPECT_EQ(sample_split(64, 128256).n_chunks, 8);
  EXPECT_EQ(sample_split(256, 128256).n_chunks, 2);
  EXPECT_EQ(sample_split(0, 128256).chunk_logits, 0);
  EXPECT_EQ(sample_split(1, 0).chunk_logits, 0);
}

TEST(SampleSplitTest, ArgmaxRowsMatchTheHostAroundEveryChunkBoundary) {
  CELLM_SKIP_WITHOUT_GPU();
  // Maxima, ties, NaN-only chunks, +inf and -inf placed at the boundaries of the
  // split each row count gives; every row's token must be the host's exactly.
  std::mt19937_64 rng(21);
  for (int64_t vocab : {int64_t{1}, int64_t{2}, int64_t{2047}, int64_t{4095}, int64_t{4096},
                        int64_t{4097}, int64_t{6143}, int64_t{8191}, int64_t{8193}, int64_t{32000},
                        int64_t{128255}, int64_t{128256}, int64_t{128257}}) {
    for (size_t rows_per_launch : {1, 16, 64, 300}) {
      const SampleSplit split = sample_split(static_cast<int64_t>(rows_per_launch), vocab);
      const std::string what = "vocab " + std::to_string(vocab) + ", " +
                               std::to_string(rows_per_launch) + " rows a launch, " +
                               std::to_string(split.n_chunks) + " chunks of " +
                               std::to_string(split.chunk_logits);
      Batch batch;
      batch.vocab = vocab;
      const size_t n_rows = std::max<size_t>(rows_per_launch, 48);
      for (size_t r = 0; r < n_rows; ++r) {
        batch.add(boundary_row(vocab, split, r, rng),
                  policy(0.0f, static_cast<int32_t>(r % 3), r % 2 ? 0.5f : 1.0f, 0.0f));
      }
      const std::vector<int32_t> device = tokens_in_launches_of(batch, rows_per_launch);
      const std::vector<int32_t> host = host_tokens(batch);
      size_t bad = 0;
      for (size_t r = 0; r < n_rows; ++r) {
        if (device[r] != host[r] && ++bad <= 5) {
          ADD_FAILURE() << what << ": row " << r << " (pattern " << r % 6 << ") device "
                        << device[r] << " host " << host[r];
        }
      }
      EXPECT_EQ(bad, 0u) << what;
    }
  }
}

TEST(SampleSplitTest, RowsWithoutMassFallBackToTheHostsArgmaxAtAnyTemperature) {
  CELLM_SKIP_WITHOUT_GPU();
  // All NaN (token 0), all -inf (token 0), NaN chunks then -inf (the first -inf
  // id), at temperature 0 and under sampling policies, which fall back to argmax.
  const std::vector<SamplingRow> policies = {
      policy(0.0f, 0, 1.0f, 0.0f), policy(1.0f, 0, 1.0f, 0.0f), policy(0.7f, 0, 0.9f, 0.0f),
      policy(2.0f, 40, 1.0f, 0.05f), policy(1.0f, 0, 1.0f, 0.5f)};
  for (int64_t vocab : {int64_t{32000}, int64_t{128256}}) {
    for (int64_t n_rows : {1, 3, 64}) {
      const SampleSplit split = sample_split(n_rows, vocab);
      std::vector<std::vector<float>> rows;
      rows.emplace_back(static_cast<size_t>(vocab), kNaN);
      rows.emplace_back(static_cast<size_t>(vocab), -kInf);
      for (int64_t k : {int64_t{1}, int64_t{split.n_chunks} / 2, int64_t{split.n_chunks} - 1}) {
        std::vector<float> row(static_cast<size_t>(vocab), -kInf);
        std::fill(row.begin(), row.begin() + std::min(k * split.chunk_logits, vocab), kNaN);
        rows.push_back(row);
      }
      Batch batch;
      batch.vocab = vocab;
      for (size_t r = 0; r < static_cast<size_t>(n_rows); ++r) {
        SamplingRow p = policies[r % policies.size()];
        p.seed = r;
        p.position = static_cast<int32_t>(r);
        batch.add(rows[(r / policies.size() + r) % rows.size()], p);
      }
      EXPECT_EQ(sample_on_device(batch).tokens, host_tokens(batch))
          << "vocab " << vocab << ", " << n_rows << " rows";
    }
  }
}

TEST(SampleSplitTest, InfinitiesInSeveralChunksShareTheMassLikeTheHost) {
  CELLM_SKIP_WITHOUT_GPU();
  // +inf logits in several chunks weigh 1 each, the rest 0: greedy takes the
  // lowest, a draw walks them (all sampling policies, one and four rows a launch).
  std::mt19937_64 rng(23);
  const int64_t vocab = 128256;
  for (int64_t n_rows : {1, 4}) {
    const SampleSplit split = sample_split(n_rows, vocab);
    ASSERT_GT(split.n_chunks, 8);
    Batch all;
    all.vocab = vocab;
    std::vector<SamplingRow> policies = policy_grid(vocab);
    policies.push_back(policy(0.0f, 0, 1.0f, 0.0f));
    for (size_t r = 0; r < policies.size(); ++r) {
      std::vector<float> row = make_row(vocab, kKinds[r % 4], rng);
      for (int64_t c = static_cast<int64_t>(r % 3); c < split.n_chunks; c += 3) {
        row[static_cast<size_t>(c * split.chunk_logits + static_cast<int64_t>(r % 5))] = kInf;
      }
      SamplingRow p = policies[r];
      p.seed = rng();
      p.position = static_cast<int32_t>(r);
      all.add(row, p);
    }
    for (size_t begin = 0; begin < all.rows.size(); begin += static_cast<size_t>(n_rows)) {
      const size_t end = std::min(all.rows.size(), begin + static_cast<size_t>(n_rows));
      expect_device_matches_host(slice(all, begin, end),
                                 "+inf rows " + std::to_string(begin) + ".." + std::to_string(end));
    }
  }
}

TEST(SampleSplitTest, ThreeHundredRowsOfMixedPoliciesMatchTheHostRowByRow) {
  CELLM_SKIP_WITHOUT_GPU();
  // Llama-3's vocabulary; every third row greedy (the acceptance rule holds
  // argmax rows to the host's token exactly). 300 rows split in 2 chunks, 64
  // rows in 8, 16 rows in 32.
  const int64_t vocab = 128256;
  for (size_t n_rows : {300, 64, 16}) {
    Batch batch = mixed_batch(vocab, n_rows, 200 + n_rows);
    for (size_t r = 0; r < n_rows; r += 3) batch.rows[r].temperature = 0.0f;
    expect_device_matches_host(batch, std::to_string(n_rows) + " mixed rows");
  }
}

TEST(SampleSplitTest, SplitAndUnsplitLaunchesDrawTheSameTokens) {
  CELLM_SKIP_WITHOUT_GPU();
  // 520 rows in one launch do not split (the row kernel scans, as before the
  // split existed); the same rows in launches of 1 to 256 rows split in 2 to 62
  // chunks. Every token must be the same: the split changes no draw, boundary
  // rows included.
  const int64_t vocab = 128256;
  const size_t n_rows = 520;
  ASSERT_EQ(sample_split(static_cast<int64_t>(n_rows), vocab).n_chunks, 1);
  Batch batch = mixed_batch(vocab, n_rows, 300);
  for (size_t r = 0; r < n_rows; r += 4) batch.rows[r].temperature = 0.0f;
  std::fill(batch.logits.begin() + 5 * vocab, batch.logits.begin() + 6 * vocab, kNaN);
  std::fill(batch.logits.begin() + 6 * vocab, batch.logits.begin() + 7 * vocab, -kInf);
  const std::vector<int32_t> unsplit = sample_on_device(batch).tokens;
  for (size_t rows_per_launch : {1, 3, 16, 64, 256}) {
    ASSERT_GT(sample_split(static_cast<int64_t>(rows_per_launch), vocab).n_chunks, 1);
    // The first 40 rows one by one take long enough; larger groups cover them all.
    const Batch first_rows = slice(batch, 0, rows_per_launch == 1 ? 40 : 0);
    const Batch& rows = rows_per_launch == 1 ? first_rows : batch;
    const std::vector<int32_t> split = tokens_in_launches_of(rows, rows_per_launch);
    const std::vector<int32_t> want(unsplit.begin(),
                                    unsplit.begin() + static_cast<std::ptrdiff_t>(split.size()));
    EXPECT_EQ(split, want) << rows_per_launch << " rows a launch";
  }
}

}  // namespace
}  // namespace cellm::cuda
