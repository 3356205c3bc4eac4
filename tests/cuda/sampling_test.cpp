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
#include "sampling_test_util.h"

namespace cellm::cuda {
namespace {

using namespace sampling_test;  // NOLINT(google-build-using-namespace)

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

// ---- The chunked path's cuts (sampling.h, launches 3-6): candidates found from
// chunk histograms, compacted, and the draw over them; or the whole row when
// they do not fit.

enum class CutRow { kModel, kTiesAtTheCut, kOneToken, kFlat, kNearlyFlat };
constexpr CutRow kCutRows[] = {CutRow::kModel, CutRow::kTiesAtTheCut, CutRow::kOneToken,
                               CutRow::kFlat, CutRow::kNearlyFlat};

// A row of `vocab` logits of the given shape, for launches of `split`:
//   model: normal (sd 2) with a few peaks of 8, like sample_bench's;
//   ties at the cut: 20 ids at 6 and 3000 ids at 3, all tied, laid across every
//     chunk boundary, the rest far below: top-p 0.9 and top-k 50 both cut
//     inside the tie, whose ids span chunks;
//   one token: one logit of 60 takes (almost) all the mass;
//   flat: every logit equal (every id a candidate: the whole-row fallback);
//   nearly flat: tiny noise, so top-p 0.9 needs most of the row.
std::vector<float> cut_row(int64_t vocab, const SampleSplit& split, CutRow kind,
                           std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> row(static_cast<size_t>(vocab));
  switch (kind) {
    case CutRow::kModel:
      for (float& x : row) x = 2.0f * normal(rng);
      for (int peak = 0; peak < 4; ++peak) row[rng() % row.size()] = 8.0f;
      break;
    case CutRow::kTiesAtTheCut: {
      for (float& x : row) x = -30.0f + normal(rng);
      std::vector<int64_t> ids;
      for (int64_t c = 0; c <= split.n_chunks; ++c) {
        for (int64_t d = -1500 / (split.n_chunks + 1); d < 1500 / (split.n_chunks + 1); ++d) {
          ids.push_back(std::clamp<int64_t>(c * split.chunk_logits + d, 0, vocab - 1));
        }
      }
      for (int64_t id : ids) row[static_cast<size_t>(id)] = 3.0f;
      for (int i = 0; i < 20; ++i) row[rng() % row.size()] = 6.0f;
      break;
    }
    case CutRow::kOneToken:
      for (float& x : row) x = 2.0f * normal(rng);
      row[rng() % row.size()] = 60.0f;
      break;
    case CutRow::kFlat:
      std::fill(row.begin(), row.end(), 1.5f);
      break;
    case CutRow::kNearlyFlat:
      for (float& x : row) x = -4.0f + 0.01f * normal(rng);
      break;
  }
  return row;
}

// Every pair of a cut-row shape and a policy from the brief's list, n_rows rows.
Batch cut_batch(int64_t vocab, size_t n_rows, uint64_t seed) {
  const std::vector<SamplingRow> policies = {
      policy(0.7f, 0, 0.9f, 0.0f),  policy(0.7f, 50, 1.0f, 0.0f), policy(1.0f, 0, 1.0f, 0.05f),
      policy(0.7f, 0, 1.0f, 0.0f),  policy(1.0f, 0, 0.9f, 0.05f), policy(1.0f, 50, 0.9f, 0.1f),
      policy(2.0f, 0, 0.99f, 0.0f), policy(0.7f, 1, 1.0f, 0.0f)};
  std::mt19937_64 rng(seed);
  const SampleSplit split = sample_split(static_cast<int64_t>(n_rows), vocab);
  Batch batch;
  batch.vocab = vocab;
  for (size_t r = 0; r < n_rows; ++r) {
    SamplingRow p = policies[r % policies.size()];
    p.seed = rng();
    p.position = static_cast<int32_t>(rng() & 0x7FFFFFFF);
    const CutRow kind = kCutRows[(r + r / policies.size()) % std::size(kCutRows)];
    batch.add(cut_row(vocab, split, kind, rng), p);
  }
  return batch;
}

TEST(SampleChunkedTest, Llama3RowsMatchTheHostAtOneSixteenAnd256Rows) {
  CELLM_SKIP_WITHOUT_GPU();
  // Model-like, tied, one-token, flat and nearly flat rows under top-p 0.9,
  // top-k 50, min-p 0.05, plain temperature, top-p with min-p; one row a launch
  // (62 chunks) for the first 40, then 16 rows (32 chunks) and 256 (2 chunks).
  const int64_t vocab = 128256;
  const Batch ones = cut_batch(vocab, 40, 400);
  for (size_t r = 0; r < ones.rows.size(); ++r) {
    expect_device_matches_host(slice(ones, r, r + 1), "one row, row " + std::to_string(r));
  }
  expect_device_matches_host(cut_batch(vocab, 16, 401), "16 rows");
  expect_device_matches_host(cut_batch(vocab, 80, 402), "80 rows");
  expect_device_matches_host(cut_batch(vocab, 256, 403), "256 rows");
}

TEST(SampleChunkedTest, TiesAtTheCutAcrossChunkBoundariesKeepTheLowestIds) {
  CELLM_SKIP_WITHOUT_GPU();
  // Only rows whose cut falls inside a tie laid over every chunk boundary, at
  // vocab sizes whose chunks end at odd places, one to 64 rows a launch.
  std::mt19937_64 rng(31);
  for (int64_t vocab : {int64_t{4096}, int64_t{8193}, int64_t{32000}, int64_t{151669}}) {
    for (size_t n_rows : {1, 7, 64}) {
      const SampleSplit split = sample_split(static_cast<int64_t>(n_rows), vocab);
      Batch batch;
      batch.vocab = vocab;
      for (size_t r = 0; r < n_rows; ++r) {
        SamplingRow p = r % 2 == 0 ? policy(0.7f, 0, 0.9f, 0.0f) : policy(0.7f, 50, 1.0f, 0.0f);
        if (r % 3 == 2) p = policy(1.0f, 30, 1.0f, 0.0f);  // inside the ties at 6
        p.seed = rng();
        p.position = static_cast<int32_t>(r);
        batch.add(cut_row(vocab, split, CutRow::kTiesAtTheCut, rng), p);
      }
      expect_device_matches_host(
          batch, "ties, vocab " + std::to_string(vocab) + ", " + std::to_string(n_rows) + " rows");
    }
  }
}

TEST(SampleChunkedTest, ChunkedAndOneBlockLaunchesDrawTheSameTokens) {
  CELLM_SKIP_WITHOUT_GPU();
  // 600 rows split in 1 chunk each (the whole row is one chunk); the same rows
  // 16 a launch split in 32. Every token, boundary rows included, must agree.
  const int64_t vocab = 32000;
  const Batch batch = cut_batch(vocab, 600, 404);
  ASSERT_EQ(sample_split(600, vocab).n_chunks, 1);
  EXPECT_EQ(tokens_in_launches_of(batch, 600), tokens_in_launches_of(batch, 16));
}

}  // namespace
}  // namespace cellm::cuda
