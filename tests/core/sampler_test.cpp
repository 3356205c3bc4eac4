#include "cellm/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace cellm {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int kGrid = 20000;  // u steps in a sweep

SamplingParams Params(float temperature, int32_t top_k = 0, float top_p = 1.0f,
                      float min_p = 0.0f) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  return p;
}

SamplingParams WithLogprobs(int32_t n) {
  SamplingParams p;
  p.num_logprobs = n;
  return p;
}

Token Sample(const std::vector<float>& logits, const SamplingParams& params, float u) {
  std::vector<float> scratch;
  return sample_token(logits, params, u, scratch);
}

// The tokens chosen as u sweeps [0, 1) on a fine grid, in grid order.
std::vector<Token> SweepTokens(const std::vector<float>& logits, const SamplingParams& params) {
  std::vector<float> scratch;
  std::vector<Token> chosen;
  for (int j = 0; j < kGrid; ++j) {
    const float u = (static_cast<float>(j) + 0.5f) / kGrid;
    chosen.push_back(sample_token(logits, params, u, scratch));
  }
  return chosen;
}

// The share of the sweep that chose each token.
std::vector<double> SweepShares(const std::vector<float>& logits, const SamplingParams& params) {
  std::vector<double> share(logits.size(), 0.0);
  for (Token t : SweepTokens(logits, params)) share[static_cast<size_t>(t)] += 1.0 / kGrid;
  return share;
}

// Logits whose softmax at temperature 1 is exactly proportional to `probs`.
std::vector<float> LogitsOf(const std::vector<double>& probs) {
  std::vector<float> logits;
  for (double p : probs) logits.push_back(static_cast<float>(std::log(p)));
  return logits;
}

std::vector<double> Softmax(const std::vector<float>& logits, double temperature) {
  const double max = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p;
  double sum = 0.0;
  for (float x : logits) {
    p.push_back(std::exp((x - max) / temperature));
    sum += p.back();
  }
  for (double& v : p) v /= sum;
  return p;
}

// `probs` restricted to `kept` and renormalized.
std::vector<double> Restrict(const std::vector<double>& probs, const std::set<Token>& kept) {
  double mass = 0.0;
  for (Token t : kept) mass += probs[static_cast<size_t>(t)];
  std::vector<double> out(probs.size(), 0.0);
  for (Token t : kept) out[static_cast<size_t>(t)] = probs[static_cast<size_t>(t)] / mass;
  return out;
}

void ExpectShares(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 2.0 / kGrid) << "token " << i;
  }
}

// The order in which the sweep first meets each token.
std::vector<Token> FirstSeen(const std::vector<Token>& chosen) {
  std::vector<Token> order;
  for (Token t : chosen) {
    if (std::find(order.begin(), order.end(), t) == order.end()) order.push_back(t);
  }
  return order;
}

// Probabilities {0.5, 0.3, 0.15, 0.05} on tokens {2, 0, 3, 1}.
const std::vector<double> kProbs = {0.3, 0.05, 0.5, 0.15};

TEST(SamplerArgmaxTest, TemperatureZeroPicksTheLargestLogit) {
  EXPECT_EQ(Sample({0.1f, 2.0f, -1.0f, 1.9f}, Params(0.0f), 0.99f), 1);
  EXPECT_EQ(Sample({-5.0f}, Params(0.0f), 0.0f), 0);
  // top-k, top-p and min-p do not matter when greedy.
  EXPECT_EQ(Sample({0.1f, 2.0f, -1.0f, 1.9f}, Params(0.0f, 2, 0.5f, 0.9f), 0.5f), 1);
}

TEST(SamplerArgmaxTest, TiesGoToTheLowestId) {
  EXPECT_EQ(Sample({1.0f, 3.0f, 3.0f, 3.0f}, Params(0.0f), 0.7f), 1);
  EXPECT_EQ(Sample({-kInf, -kInf}, Params(0.0f), 0.7f), 0);
}

TEST(SamplerArgmaxTest, NaNLogitsAreNeverChosen) {
  EXPECT_EQ(Sample({kNaN, 1.0f, 3.0f, kNaN}, Params(0.0f), 0.1f), 2);
  EXPECT_EQ(Sample({kNaN, -kInf, kNaN}, Params(0.0f), 0.1f), 1);
  EXPECT_EQ(Sample({kNaN, kNaN}, Params(0.0f), 0.1f), 0);
  // Sampling treats NaN as probability 0 as well.
  for (Token t : SweepTokens({kNaN, 0.0f, kNaN, 0.0f}, Params(1.0f))) {
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
  EXPECT_EQ(Sample({kNaN, kNaN, 2.0f}, Params(1.0f), 0.9f), 2);
  EXPECT_EQ(Sample({-kInf, -kInf, kNaN}, Params(1.0f), 0.9f), 0);
}

TEST(SamplerDistributionTest, EachTokenIsChosenForExactlyItsProbabilityMass) {
  const std::vector<float> logits = {0.3f, -1.2f, 2.5f, 0.0f, 1.1f, -0.4f, 0.9f};
  const std::vector<Token> chosen = SweepTokens(logits, Params(1.0f));
  ExpectShares(SweepShares(logits, Params(1.0f)), Softmax(logits, 1.0));
  // With no top-k or top-p the walk is in token-id order, so tokens rise with u.
  EXPECT_TRUE(std::is_sorted(chosen.begin(), chosen.end()));
}

TEST(SamplerDistributionTest, InfiniteLogitsShareAllTheMass) {
  const std::vector<double> share = SweepShares({1.0f, kInf, 3.0f, kInf}, Params(1.0f));
  ExpectShares(share, {0.0, 0.5, 0.0, 0.5});
}

TEST(SamplerDistributionTest, TemperatureSharpensBelowOneAndFlattensAboveOne) {
  const std::vector<float> logits = {0.0f, 1.0f};
  const double e = std::exp(1.0);
  const double sharp = e * e / (1.0 + e * e);
  const double plain = e / (1.0 + e);
  const double flat = std::sqrt(e) / (1.0 + std::sqrt(e));
  ExpectShares(SweepShares(logits, Params(0.5f)), {1.0 - sharp, sharp});
  ExpectShares(SweepShares(logits, Params(1.0f)), {1.0 - plain, plain});
  ExpectShares(SweepShares(logits, Params(2.0f)), {1.0 - flat, flat});
  EXPECT_GT(sharp, plain);
  EXPECT_GT(plain, flat);
  // A tiny temperature is greedy; a huge one is uniform.
  ExpectShares(SweepShares({0.0f, 1.0f, 0.5f}, Params(1e-6f)), {0.0, 1.0, 0.0});
  ExpectShares(SweepShares({0.0f, 1.0f, 0.5f}, Params(1e7f)), {1 / 3.0, 1 / 3.0, 1 / 3.0});
}

TEST(SamplerTopKTest, KeepsTheKMostProbableWalkingThemInDescendingOrder) {
  const std::vector<float> logits = {1.0f, 5.0f, 3.0f, 5.0f, 2.0f, 0.0f};
  const std::vector<Token> chosen = SweepTokens(logits, Params(1.0f, 3));
  // Ties break by id: 1 before 3.
  EXPECT_EQ(FirstSeen(chosen), (std::vector<Token>{1, 3, 2}));
  ExpectShares(SweepShares(logits, Params(1.0f, 3)), Restrict(Softmax(logits, 1.0), {1, 2, 3}));
  // k = 1 is greedy; k >= V is off.
  for (Token t : SweepTokens(logits, Params(1.0f, 1))) EXPECT_EQ(t, 1);
  ExpectShares(SweepShares(logits, Params(1.0f, 6)), Softmax(logits, 1.0));
  ExpectShares(SweepShares(logits, Params(1.0f, 60)), Softmax(logits, 1.0));
}

TEST(SamplerTopKTest, TopKTakesPrecedenceOverTopP) {
  const std::vector<float> logits = LogitsOf(kProbs);
  // top_p 0.1 alone keeps only token 2; with top_k 3 it is ignored.
  for (Token t : SweepTokens(logits, Params(1.0f, 0, 0.1f))) EXPECT_EQ(t, 2);
  ExpectShares(SweepShares(logits, Params(1.0f, 3, 0.1f)), Restrict(kProbs, {2, 0, 3}));
}

TEST(SamplerTopPTest, KeepsUpToAndIncludingTheTokenThatCrossesP) {
  const std::vector<float> logits = LogitsOf(kProbs);
  // Descending: 2 (0.5), 0 (0.8), 3 (0.95), 1 (1.0).
  ExpectShares(SweepShares(logits, Params(1.0f, 0, 0.4f)), Restrict(kProbs, {2}));
  ExpectShares(SweepShares(logits, Params(1.0f, 0, 0.6f)), Restrict(kProbs, {2, 0}));
  ExpectShares(SweepShares(logits, Params(1.0f, 0, 0.79f)), Restrict(kProbs, {2, 0}));
  ExpectShares(SweepShares(logits, Params(1.0f, 0, 0.81f)), Restrict(kProbs, {2, 0, 3}));
  ExpectShares(SweepShares(logits, Params(1.0f, 0, 0.96f)), kProbs);
  EXPECT_EQ(FirstSeen(SweepTokens(logits, Params(1.0f, 0, 0.9f))), (std::vector<Token>{2, 0, 3}));
}

TEST(SamplerMinPTest, DropsTokensBelowMinPTimesTheMostProbable) {
  const std::vector<float> logits = LogitsOf(kProbs);
  // 0.5 * 0.5 = 0.25: keeps 2 (0.5) and 0 (0.3), walked in id order.
  const std::vector<Token> chosen = SweepTokens(logits, Params(1.0f, 0, 1.0f, 0.5f));
  EXPECT_EQ(FirstSeen(chosen), (std::vector<Token>{0, 2}));
  ExpectShares(SweepShares(logits, Params(1.0f, 0, 1.0f, 0.5f)), Restrict(kProbs, {0, 2}));
  // 0.2 * 0.5 = 0.1: keeps 0.15 as well.
  ExpectShares(SweepShares(logits, Params(1.0f, 0, 1.0f, 0.2f)), Restrict(kProbs, {0, 2, 3}));
  // min_p 1 keeps only the most probable; after top-k it trims the kept list.
  ExpectShares(SweepShares(logits, Params(1.0f, 0, 1.0f, 1.0f)), Restrict(kProbs, {2}));
  ExpectShares(SweepShares(logits, Params(1.0f, 3, 1.0f, 0.5f)), Restrict(kProbs, {2, 0}));
  ExpectShares(SweepShares(logits, Params(1.0f, 0, 0.96f, 0.2f)), Restrict(kProbs, {2, 0, 3}));
}

// A plain full-sort sampler over the same float weights, to check the partial
// selection on a large vocabulary token for token. One token per entry of `us`.
std::vector<Token> ReferenceSamples(const std::vector<float>& logits, const SamplingParams& params,
                                    const std::vector<float>& us) {
  const float max = *std::max_element(logits.begin(), logits.end());
  std::vector<float> w;
  double total = 0.0;
  for (float x : logits) {
    w.push_back(std::exp((x - max) / params.temperature));
    total += w.back();
  }
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&w](int32_t a, int32_t b) { return w[a] > w[b]; });
  size_t kept = order.size();
  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < order.size()) {
    kept = static_cast<size_t>(params.top_k);
  } else if (params.top_p < 1.0f) {
    double cumulative = 0.0;
    for (size_t i = 0; i < order.size(); ++i) {
      cumulative += w[order[i]];
      if (cumulative > static_cast<double>(params.top_p) * total) {
        kept = i + 1;
        break;
      }
    }
  }
  double mass = 0.0;
  for (size_t i = 0; i < kept; ++i) mass += w[order[i]];
  std::vector<Token> tokens;
  for (float u : us) {
    const double r = static_cast<double>(u) * mass;
    double cumulative = 0.0;
    Token token = order[kept - 1];
    for (size_t i = 0; i < kept; ++i) {
      cumulative += w[order[i]];
      if (cumulative > r) {
        token = order[i];
        break;
      }
    }
    tokens.push_back(token);
  }
  return tokens;
}

// sample_token against ReferenceSamples, token for token, for each policy and u.
void ExpectTheReferencesTokens(const std::vector<float>& logits,
                               const std::vector<SamplingParams>& policies,
                               const std::vector<float>& us) {
  std::vector<float> scratch;
  for (const SamplingParams& params : policies) {
    const std::vector<Token> want = ReferenceSamples(logits, params, us);
    for (size_t i = 0; i < us.size(); ++i) {
      EXPECT_EQ(sample_token(logits, params, us[i], scratch), want[i])
          << "top_k " << params.top_k << " top_p " << params.top_p << " u " << us[i];
    }
  }
}

// `n` logits drawn from a normal distribution of mean 0 and deviation `sd`.
std::vector<float> NormalLogits(size_t n, float sd, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sd);
  std::vector<float> logits(n);
  for (float& x : logits) x = normal(rng);
  return logits;
}

TEST(SamplerLargeVocabTest, PartialSelectionMatchesAFullSortOnAHugeVocabulary) {
  constexpr size_t kVocab = 150000;
  std::vector<float> logits = NormalLogits(kVocab, 3.0f, 7);
  // Many exact ties, to exercise the id tie-break.
  for (size_t i = 0; i < kVocab; i += 97) logits[i] = 4.0f;
  ExpectTheReferencesTokens(logits,
                            {Params(1.0f, 0, 0.9f), Params(0.7f, 0, 0.3f), Params(1.3f, 0, 0.999f),
                             Params(1.0f, 1000), Params(1.0f, 40), Params(1.0f, 149999)},
                            {0.0f, 0.013f, 0.25f, 0.5f, 0.77f, 0.999f});
}

// A flat row (a nucleus of most of the vocabulary, as an untrained model's): the
// selection sorts nearly everything, its last chunks the whole rest at once.
TEST(SamplerLargeVocabTest, PartialSelectionMatchesAFullSortOnAFlatVocabulary) {
  constexpr size_t kVocab = 60000;
  std::vector<float> logits = NormalLogits(kVocab, 0.25f, 11);
  for (size_t i = 5; i < kVocab; i += 13) logits[i] = 0.1f;  // ties inside the nucleus
  ExpectTheReferencesTokens(logits,
                            {Params(1.0f, 0, 0.9f), Params(1.0f, 0, 0.99f), Params(0.5f, 0, 0.5f),
                             Params(1.0f, 59000), Params(2.0f, 30000)},
                            {0.0f, 0.031f, 0.4f, 0.66f, 0.9f, 0.9999f});
}

TEST(SamplerValidationTest, AcceptsTheDefaultsAndTheEdgesOfEachRange) {
  EXPECT_TRUE(validate_sampling(SamplingParams{}).ok());
  EXPECT_TRUE(validate_sampling(Params(0.0f, 0, 1.0f, 0.0f)).ok());
  EXPECT_TRUE(validate_sampling(Params(100.0f, 100000, 1e-6f, 1.0f)).ok());
  EXPECT_TRUE(validate_sampling(WithLogprobs(kMaxLogprobs)).ok());
  EXPECT_EQ(kMaxLogprobs, 20);
}

TEST(SamplerValidationTest, RefusalsNameTheFieldAndTheValue) {
  struct Case {
    SamplingParams params;
    std::string message;
  };
  const std::vector<Case> cases = {
      {Params(-1.0f), "temperature must be finite and >= 0, got -1"},
      {Params(kInf), "temperature must be finite and >= 0, got inf"},
      {Params(1.0f, -2), "top_k must be >= 0, got -2"},
      {Params(1.0f, 0, 1.5f), "top_p must be in (0, 1], got 1.5"},
      {Params(1.0f, 0, 0.0f), "top_p must be in (0, 1], got 0"},
      {Params(1.0f, 0, kNaN), "top_p must be in (0, 1], got nan"},
      {Params(1.0f, 0, 1.0f, -0.25f), "min_p must be in [0, 1], got -0.25"},
      {Params(1.0f, 0, 1.0f, 1.5f), "min_p must be in [0, 1], got 1.5"},
      {WithLogprobs(-1), "num_logprobs must be in [0, 20], got -1"},
      {WithLogprobs(21), "num_logprobs must be in [0, 20], got 21"},
  };
  for (const Case& c : cases) {
    const Status s = validate_sampling(c.params);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.message;
    EXPECT_EQ(s.message(), c.message);
  }
  EXPECT_NE(validate_sampling(Params(kNaN)).message().find("temperature"), std::string::npos);
}

// ---------------------------------------------------------------------------
// token_logprobs

// log-softmax of `logits` in double precision.
std::vector<double> LogSoftmax64(const std::vector<float>& logits) {
  double max = -std::numeric_limits<double>::infinity();
  for (float x : logits) max = std::max(max, static_cast<double>(x));
  double sum = 0.0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - max);
  std::vector<double> out;
  for (float x : logits) out.push_back(static_cast<double>(x) - max - std::log(sum));
  return out;
}

// Every id by descending logit, ties by ascending id (a full sort).
std::vector<Token> RankedIds(const std::vector<float>& logits) {
  std::vector<Token> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&logits](Token a, Token b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)];
  });
  return ids;
}

TokenLogprobs Logprobs(const std::vector<float>& logits, Token sampled, int32_t n) {
  std::vector<float> scratch;
  return token_logprobs(logits, sampled, n, scratch);
}

// Checks `got` against the double-precision log-softmax and a full sort.
void ExpectLogprobsOf(const std::vector<float>& logits, Token sampled, int32_t n,
                      const TokenLogprobs& got, double tolerance) {
  const std::vector<double> want = LogSoftmax64(logits);
  const std::vector<Token> ranked = RankedIds(logits);
  EXPECT_NEAR(got.logprob, want[static_cast<size_t>(sampled)], tolerance);
  ASSERT_EQ(got.top.size(), std::min(static_cast<size_t>(n), logits.size()));
  for (size_t k = 0; k < got.top.size(); ++k) {
    EXPECT_EQ(got.top[k].first, ranked[k]) << "rank " << k;
    EXPECT_NEAR(got.top[k].second, want[static_cast<size_t>(ranked[k])], tolerance) << "rank " << k;
  }
}

TEST(TokenLogprobsTest, MatchTheDoublePrecisionLogSoftmaxMostLikelyFirst) {
  std::mt19937 rng(7);
  std::normal_distribution<float> logit(0.0f, 4.0f);
  std::vector<float> logits(5000);
  for (float& x : logits) x = logit(rng);
  std::vector<float> scratch;
  for (int32_t n : {0, 1, 5, 20}) {
    for (Token sampled : {Token{0}, Token{1234}, RankedIds(logits)[0]}) {
      ExpectLogprobsOf(logits, sampled, n, token_logprobs(logits, sampled, n, scratch), 1e-5);
    }
  }
}

TEST(TokenLogprobsTest, AreStableForLogitsFarFromZero) {
  // exp(1e4) overflows f32 and f64: only a max-subtracted sum survives.
  for (float offset : {1e4f, -1e4f}) {
    const std::vector<float> logits = {offset + 1.0f, offset + 3.0f, offset, offset + 2.5f};
    const TokenLogprobs got = Logprobs(logits, 2, 4);
    ASSERT_TRUE(std::isfinite(got.logprob)) << offset;
    ExpectLogprobsOf(logits, 2, 4, got, 1e-5);
  }
}

TEST(TokenLogprobsTest, MassOverTheWholeVocabularySumsToOne) {
  const std::vector<float> logits = LogitsOf(kProbs);
  const TokenLogprobs got = Logprobs(logits, 1, 4);
  double mass = 0.0;
  for (const auto& [token, lp] : got.top) mass += std::exp(static_cast<double>(lp));
  EXPECT_NEAR(mass, 1.0, 1e-6);
  EXPECT_EQ(got.top[0].first, 2);  // 0.5
  EXPECT_NEAR(got.top[0].second, std::log(0.5), 1e-6);
}

TEST(TokenLogprobsTest, TiesGoToTheLowerId) {
  const std::vector<float> logits = {1.0f, 3.0f, 0.0f, 3.0f, 3.0f, 2.0f};
  const TokenLogprobs got = Logprobs(logits, 5, 2);
  ASSERT_EQ(got.top.size(), 2u);
  EXPECT_EQ(got.top[0].first, 1);
  EXPECT_EQ(got.top[1].first, 3);
  EXPECT_EQ(got.top[0].second, got.top[1].second);
  ExpectLogprobsOf(logits, 5, 2, got, 1e-6);
}

TEST(TokenLogprobsTest, TheSampledTokenIsGivenEvenOutsideTheTop) {
  const std::vector<float> logits = {0.5f, -3.0f, 2.0f, 1.0f};
  const TokenLogprobs got = Logprobs(logits, 1, 2);
  ASSERT_EQ(got.top.size(), 2u);
  EXPECT_EQ(got.top[0].first, 2);
  EXPECT_EQ(got.top[1].first, 3);
  EXPECT_NEAR(got.logprob, LogSoftmax64(logits)[1], 1e-6);
  EXPECT_TRUE(Logprobs(logits, 1, 0).top.empty()) << "n = 0: the sampled token alone";
  EXPECT_EQ(Logprobs(logits, 1, 20).top.size(), 4u) << "n past V: every token";
}

TEST(TokenLogprobsTest, PartialSelectionMatchesAFullSortOnAHugeVocabularyWithTies) {
  // 151669 ids on 97 distinct logits: thousands of ties at every rank.
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> level(0, 96);
  std::vector<float> logits(151669);
  for (float& x : logits) x = static_cast<float>(level(rng)) * 0.125f - 6.0f;
  std::vector<float> scratch;
  ExpectLogprobsOf(logits, 77, kMaxLogprobs, token_logprobs(logits, 77, kMaxLogprobs, scratch),
                   1e-5);
}

TEST(TokenLogprobsTest, NaNCountsAsMinusInfinityAndInfinitiesShareTheMass) {
  // NaN: no mass, ranked with -inf by id after every number.
  const TokenLogprobs nan = Logprobs({kNaN, 0.0f, -kInf, 0.0f}, 0, 4);
  EXPECT_EQ(nan.logprob, -kInf);
  ASSERT_EQ(nan.top.size(), 4u);
  const std::vector<Token> order = {1, 3, 0, 2};
  const std::vector<float> values = {std::log(0.5f), std::log(0.5f), -kInf, -kInf};
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(nan.top[k].first, order[k]) << "rank " << k;
    EXPECT_FLOAT_EQ(nan.top[k].second, values[k]) << "rank " << k;
  }

  // +inf logits split the mass evenly.
  const TokenLogprobs inf = Logprobs({kInf, 5.0f, kInf, kNaN}, 2, 2);
  EXPECT_FLOAT_EQ(inf.logprob, -std::log(2.0f));
  EXPECT_EQ(inf.top[0].first, 0);
  EXPECT_EQ(inf.top[1].first, 2);
  EXPECT_EQ(Logprobs({kInf, 5.0f, kInf, kNaN}, 1, 0).logprob, -kInf);

  // No mass at all: -inf everywhere.
  const TokenLogprobs none = Logprobs({-kInf, kNaN, -kInf}, 1, 3);
  EXPECT_EQ(none.logprob, -kInf);
  for (const auto& [token, lp] : none.top) EXPECT_EQ(lp, -kInf) << token;
  EXPECT_EQ(none.top[0].first, 0);
}

TEST(SamplingUniformTest, FollowsTheDocumentedFormulaBitForBit) {
  // bits >> 40 of the documented hash; a CUDA sampler must give the same values.
  EXPECT_EQ(sampling_uniform(0, 0), 10946269.0f / 16777216.0f);
  EXPECT_EQ(sampling_uniform(0, 1), 11764387.0f / 16777216.0f);
  EXPECT_EQ(sampling_uniform(1, 0), 6177195.0f / 16777216.0f);
  EXPECT_EQ(sampling_uniform(42, 7), 12326563.0f / 16777216.0f);
  EXPECT_EQ(sampling_uniform(0xDEADBEEFCAFEF00Dull, 123456), 13291403.0f / 16777216.0f);
}

TEST(SamplingUniformTest, IsDeterministicAndDiffersAcrossPositionsAndSeeds) {
  EXPECT_EQ(sampling_uniform(1234, 56), sampling_uniform(1234, 56));
  std::set<float> by_position;
  std::set<float> by_seed;
  for (int i = 0; i < 1000; ++i) {
    by_position.insert(sampling_uniform(99, i));
    by_seed.insert(sampling_uniform(static_cast<uint64_t>(i), 99));
  }
  // 24-bit values: a handful of chance collisions at most.
  EXPECT_GE(by_position.size(), 990u);
  EXPECT_GE(by_seed.size(), 990u);
  // Neighbouring seeds do not give shifted copies of one stream.
  int same = 0;
  for (int i = 0; i < 1000; ++i) same += sampling_uniform(5, i + 1) == sampling_uniform(6, i);
  EXPECT_LE(same, 2);
}

TEST(SamplingUniformTest, LiesInTheUnitIntervalAndIsRoughlyUniform) {
  constexpr int kDraws = 100000;
  constexpr int kBuckets = 100;
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<int> counts(kBuckets, 0);
    for (int i = 0; i < kDraws; ++i) {
      const float u = pass == 0 ? sampling_uniform(2024, i)
                                : sampling_uniform(static_cast<uint64_t>(i) * 7919u, 3);
      ASSERT_GE(u, 0.0f);
      ASSERT_LT(u, 1.0f);
      ++counts[static_cast<size_t>(u * kBuckets)];
    }
    const double expected = static_cast<double>(kDraws) / kBuckets;
    double chi_square = 0.0;
    for (int c : counts) chi_square += (c - expected) * (c - expected) / expected;
    // 99 degrees of freedom: mean 99, sd about 14; a broken hash lands far above.
    EXPECT_LT(chi_square, 200.0) << "pass " << pass;
  }
}

TEST(SamplingUniformTest, TheSameSeedAndPositionGiveTheSameTokenInAnyCallOrder) {
  const std::vector<float> logits = {0.2f, 0.1f, 0.0f, 0.3f, -0.1f, 0.25f, 0.05f, 0.15f};
  const SamplingParams params = Params(1.0f, 0, 0.95f);
  std::vector<float> scratch;
  std::vector<Token> forward;
  for (Position p = 0; p < 64; ++p) {
    forward.push_back(sample_token(logits, params, sampling_uniform(77, p), scratch));
  }
  std::vector<Token> backward(64);
  for (Position p = 63; p >= 0; --p) {
    // Unrelated draws in between change nothing.
    sample_token(logits, params, sampling_uniform(static_cast<uint64_t>(p), p + 1), scratch);
    backward[static_cast<size_t>(p)] =
        sample_token(logits, params, sampling_uniform(77, p), scratch);
  }
  EXPECT_EQ(forward, backward);
  // And the draws really vary over positions.
  EXPECT_GE(std::set<Token>(forward.begin(), forward.end()).size(), 4u);
}

}  // namespace
}  // namespace cellm
