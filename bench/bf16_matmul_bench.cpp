// bf16_matmul_bench: the bf16 linear layers of SmolLM2-135M (d 576, ff 1536, vocab
// 49152, 30 layers) on the CPU, cpu::matmul (W widened, x exact) against
// quant::bf16_dot_matmul (x rounded to bf16, AVX-512 BF16 dot products).
//
//   bf16_matmul_bench [--threads N] [--reps R] [--cpu-time] [--rows 1,16,128]
//
// --cpu-time times by the process's CPU seconds: with --threads 1 on a loaded
// machine that is the kernel's own time, without the waits for a core.
//
// Prints per shape [n, k] and rows m (--rows, default 1, 16, 128; a prefill step of
// 512 rows is the CPU executor's default width): microseconds per call with the
// weights rotated over 30 copies (a decode step streams every layer's weights once,
// so they come from DRAM), the GB/s of weight bytes and the GFLOP/s (2*m*n*k).
// Then one whole decode/prefill step of the model's products (30 layers + the tied
// LM head) in ms. Timings are the minimum of R repeats: on a shared machine other
// processes only ever add time.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "cpu/kernels/convert.h"
#include "cpu/kernels/matmul.h"
#include "cpu/kernels/thread_pool.h"
#include "cpu/quant/bf16_dot_matmul.h"

namespace {

using cellm::cpu::DType;
using cellm::cpu::ThreadPool;
using cellm::cpu::TypedPtr;
using Clock = std::chrono::steady_clock;

struct Shape {
  const char* name;
  int64_t n, k, copies;
};

constexpr Shape kShapes[] = {{"q/o", 576, 576, 60},
                             {"k/v", 192, 576, 60},
                             {"gate/up", 1536, 576, 60},
                             {"down", 576, 1536, 30},
                             {"lm_head", 49152, 576, 1}};

std::vector<uint16_t> random_bf16(size_t count, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-0.05f, 0.05f);
  std::vector<uint16_t> v(count);
  for (auto& e : v) {
    const float f = u(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    e = static_cast<uint16_t>(bits >> 16);
  }
  return v;
}

bool g_cpu_time = false;  // --cpu-time: the process's CPU seconds instead of wall

double now_seconds() {
  if (g_cpu_time) {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

template <typename Fn>
double best_seconds(int reps, Fn&& fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_seconds();
    fn();
    best = std::min(best, now_seconds() - t0);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, reps = 5;
  std::vector<int64_t> rows = {1, 16, 128};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--cpu-time") g_cpu_time = true;
    if (a == "--threads" && i + 1 < argc) threads = std::stoi(argv[++i]);
    if (a == "--reps" && i + 1 < argc) reps = std::stoi(argv[++i]);
    if (a == "--rows" && i + 1 < argc) {
      rows.clear();
      std::string list = argv[++i];
      for (size_t at = 0; at <= list.size();) {
        const size_t comma = std::min(list.find(',', at), list.size());
        rows.push_back(std::stoll(list.substr(at, comma - at)));
        at = comma + 1;
      }
    }
  }
  const bool dot = cellm::cpu::quant::bf16_dot_supported();
  ThreadPool pool(threads);
  std::mt19937 rng(1);
  std::vector<std::vector<uint16_t>> weights;
  for (const Shape& s : kShapes) weights.push_back(random_bf16(size_t(s.n * s.k * s.copies), rng));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int64_t max_rows = *std::max_element(rows.begin(), rows.end());
  std::vector<float> x(static_cast<size_t>(max_rows) * 1536);
  for (auto& e : x) e = u(rng);
  std::vector<float> y(static_cast<size_t>(max_rows) * 49152);

  std::printf("threads %d, AVX-512 BF16 %s, %s time\n", threads, dot ? "yes" : "no",
              g_cpu_time ? "CPU" : "wall");
  std::printf("%-8s %6s %6s %4s | %10s %7s %7s | %10s %7s %7s\n", "shape", "n", "k", "m",
              "matmul us", "GB/s", "GFLOP/s", "dot us", "GB/s", "GFLOP/s");
  for (const int64_t m : rows) {
    double step_mm = 0, step_dot = 0;
    for (size_t si = 0; si < std::size(kShapes); ++si) {
      const Shape& s = kShapes[si];
      const uint16_t* w = weights[si].data();
      const int64_t per = s.n * s.k;
      const auto run = [&](bool use_dot) {
        return best_seconds(reps,
                            [&] {
                              for (int64_t c = 0; c < s.copies; ++c) {
                                if (use_dot) {
                                  cellm::cpu::quant::bf16_dot_matmul(pool, x.data(), m, s.k,
                                                                     w + c * per, s.n, y.data());
                                } else {
                                  cellm::cpu::matmul(pool, x.data(), m, s.k,
                                                     TypedPtr{w + c * per, DType::kBF16}, s.n,
                                                     TypedPtr{}, y.data());
                                }
                              }
                            }) /
               static_cast<double>(s.copies);
      };
      const double t_mm = run(false);
      const double t_dot = dot ? run(true) : 0.0;
      const double bytes = 2.0 * static_cast<double>(per);
      const double flops = 2.0 * static_cast<double>(m * per);
      std::printf("%-8s %6lld %6lld %4lld | %10.1f %7.1f %7.1f | %10.1f %7.1f %7.1f\n", s.name,
                  (long long)s.n, (long long)s.k, (long long)m, t_mm * 1e6, bytes / t_mm * 1e-9,
                  flops / t_mm * 1e-9, t_dot * 1e6, dot ? bytes / t_dot * 1e-9 : 0.0,
                  dot ? flops / t_dot * 1e-9 : 0.0);
      // Per layer: q, o (2 of q/o), k, v, gate, up, down; one LM head.
      const double uses = si == 4 ? 1.0 : si == 3 ? 30.0 : 60.0;
      step_mm += uses * t_mm;
      step_dot += uses * t_dot;
    }
    std::printf("step m=%lld: matmul %.2f ms, dot %.2f ms\n", (long long)m, step_mm * 1e3,
                step_dot * 1e3);
  }
  return 0;
}
