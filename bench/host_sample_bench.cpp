// host_sample_bench: microseconds per cellm::sample_token (the host sampler the CPU
// executor draws every token with), one row at a time.
//
//   host_sample_bench [--iters N]
//
// For vocab 32000 and 128256, rows of normal logits with sd 0.5 ("flat": an untrained
// model's spread, where top-p keeps most of the row) and sd 2 ("peaked": top-p 0.9 at
// T 0.7 keeps about a tenth), each with a few peaks, and five policies; the draws' u
// sweep [0, 1). Prints the mean time a call and the sum of the tokens drawn (the same
// sum on any build that draws the same tokens).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "cellm/sampler.h"

int main(int argc, char** argv) {
  int iters = 40;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
      iters = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: host_sample_bench [--iters N]\n");
      return 2;
    }
  }
  struct Policy {
    const char* name;
    cellm::SamplingParams params;
  };
  const auto policy = [](const char* name, float temperature, int32_t top_k, float top_p,
                         float min_p) {
    cellm::SamplingParams p;
    p.temperature = temperature;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    return Policy{name, p};
  };
  const Policy policies[] = {
      policy("greedy", 0.f, 0, 1.f, 0.f), policy("T0.7 top-p0.9", 0.7f, 0, 0.9f, 0.f),
      policy("T0.7 top-k50", 0.7f, 50, 1.f, 0.f), policy("T0.7", 0.7f, 0, 1.f, 0.f),
      policy("T1 top-p0.95 min-p0.01", 1.f, 0, 0.95f, 0.01f)};
  std::printf("%7s %-6s %-24s %10s %12s\n", "vocab", "row", "policy", "us", "token sum");
  for (const size_t vocab : {size_t{32000}, size_t{128256}}) {
    for (const float sd : {0.5f, 2.0f}) {
      std::mt19937 rng(1);
      std::normal_distribution<float> normal(0.f, sd);
      std::vector<float> logits(vocab);
      for (float& x : logits) x = normal(rng);
      for (size_t peak = 0; peak < 4; ++peak) logits[(peak * 104729) % vocab] = 4 * sd;
      for (const Policy& p : policies) {
        std::vector<float> scratch;
        long long sum = 0;
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) {
          const float u = (static_cast<float>(i) + 0.5f) / static_cast<float>(iters);
          sum += cellm::sample_token(logits, p.params, u, scratch);
        }
        const auto t1 = std::chrono::steady_clock::now();
        std::printf("%7zu %-6s %-24s %10.1f %12lld\n", vocab, sd < 1.f ? "flat" : "peaked", p.name,
                    std::chrono::duration<double, std::micro>(t1 - t0).count() / iters, sum);
      }
    }
  }
  return 0;
}
