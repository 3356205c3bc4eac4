// quant_matmul_bench: achieved weight bandwidth and throughput of
// cpu::quant::quant_matmul on SmolLM2-135M's linear shapes.
//
//   quant_matmul_bench [--types q8_0,q4_0,q4_1,q5_0,q4_k,q6_k,bf16,bf16-exact]
//                      [--threads 1,2] [--rows 1,16] [--isa best|scalar|avx2|avx512-vnni]
//                      [--rotate-mib 64] [--ms 150]
//
// Shapes [rows, cols] (hidden 576, intermediate 1536, vocabulary 49152):
// q_proj/o_proj [576, 576], k_proj/v_proj [192, 576], gate/up [1536, 576], down
// [576, 1536], lm_head [49152, 576]. Each row of output prints, per type, shape,
// activation rows M and threads: microseconds per call, GB/s of weight bytes read
// (the decode measure) and GFLOP/s (2 M rows cols per call), by wall time and by
// CPU time per thread (the estimate for idle cores on a shared machine). Weights
// rotate over copies totalling --rotate-mib so each call reads them past L2, as a
// decode step does.
// K-quants need cols a multiple of 256, so their [*, 576] rows print n/a (GGUF
// files store those tensors in a fallback type: Q5_0 for Q4_K, Q8_0 for Q6_K).
// "bf16" is quant_matmul's BF16 path (bf16_dot_matmul where the CPU has AVX-512
// BF16), "bf16-exact" is cpu::matmul's (x kept f32); vs-exact is each type's
// speed over bf16-exact's by CPU time. The types of one (shape, M, threads) are
// timed in interleaved rounds, so they share whatever else the machine runs.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cpu/kernels/matmul.h"
#include "cpu/kernels/thread_pool.h"
#include "cpu/quant/quant_matmul.h"
#include "model/half.h"

namespace {

using cellm::cpu::ThreadPool;
using namespace cellm::cpu::quant;
using Clock = std::chrono::steady_clock;

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

// Random blocks: every byte random, then every fp16 scale field a small value
// (the kernels' cost does not depend on the values).
std::vector<uint8_t> random_matrix(std::mt19937_64& rng, QuantType t, int64_t rows, int64_t cols) {
  const QuantTypeInfo& info = type_info(t);
  const int64_t bytes = row_bytes(t, cols).value() * rows;
  std::vector<uint8_t> w(static_cast<size_t>(bytes));
  for (int64_t i = 0; i + 8 <= bytes; i += 8) {
    const uint64_t r = rng();
    std::memcpy(w.data() + i, &r, 8);
  }
  const uint16_t small = cellm::f32_to_f16(0.001f);
  if (info.block_weights == 1) {  // f32/f16/bf16: small values everywhere
    const uint16_t bf = cellm::f32_to_bf16(0.001f);
    for (int64_t i = 0; i + 2 <= bytes; i += 2) std::memcpy(w.data() + i, &bf, 2);
    return w;
  }
  for (int64_t b = 0; b < bytes / info.block_bytes; ++b) {
    uint8_t* blk = w.data() + b * info.block_bytes;
    if (t == QuantType::kQ6_K) {
      std::memcpy(blk + 208, &small, 2);
    } else {
      std::memcpy(blk, &small, 2);
      if (t == QuantType::kQ4_1 || t == QuantType::kQ5_1 || t == QuantType::kQ4_K ||
          t == QuantType::kQ5_K) {
        std::memcpy(blk + 2, &small, 2);
      }
    }
  }
  return w;
}

double process_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Shape {
  const char* name;
  int64_t rows, cols;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> types = split("q8_0,q4_0,q4_1,q5_0,q4_k,q6_k,bf16,bf16-exact");
  std::vector<std::string> threads = split("1,2"), ms = split("1,16");
  std::string isa_name = "best";
  int64_t rotate_mib = 64;
  double min_ms = 150.0;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    const auto next = [&]() -> std::string { return a + 1 < argc ? argv[++a] : ""; };
    if (arg == "--types") {
      types = split(next());
    } else if (arg == "--threads") {
      threads = split(next());
    } else if (arg == "--rows") {
      ms = split(next());
    } else if (arg == "--isa") {
      isa_name = next();
    } else if (arg == "--rotate-mib") {
      rotate_mib = std::stoll(next());
    } else if (arg == "--ms") {
      min_ms = std::stod(next());
    } else {
      std::printf("usage: see the comment atop bench/quant_matmul_bench.cpp\n");
      return arg == "-h" || arg == "--help" ? 0 : 2;
    }
  }
  QuantIsa isa = best_isa();
  for (const QuantIsa i : {QuantIsa::kScalar, QuantIsa::kAvx2, QuantIsa::kAvx512Vnni}) {
    if (isa_name == to_string(i)) isa = i;
  }
  if (!isa_supported(isa)) {
    std::printf("this CPU cannot run %s\n", to_string(isa));
    return 1;
  }
  const Shape shapes[] = {{"q/o_proj", 576, 576},
                          {"k/v_proj", 192, 576},
                          {"gate/up", 1536, 576},
                          {"down", 576, 1536},
                          {"lm_head", 49152, 576}};
  std::printf(
      "quant_matmul_bench: block kernels on %s (best here: %s); weights rotated over %lld MiB "
      "per type\n",
      to_string(isa), to_string(best_isa()), static_cast<long long>(rotate_mib));
  std::printf("%-10s %-9s %6s %6s %3s %3s %9s %7s %8s %9s %7s %8s %9s\n", "type", "shape", "rows",
              "cols", "M", "thr", "wall-us", "GB/s", "GFLOP/s", "cpu-us", "GB/s", "GFLOP/s",
              "vs-exact");
  // "bf16": quant_matmul's path (bf16_dot_matmul where the CPU has AVX-512 BF16);
  // "bf16-exact": cpu::matmul (x kept f32, W widened), the HF-folder path and the
  // reference of the vs-exact column.
  struct Variant {
    std::string name;
    QuantType type;
    bool exact;
  };
  std::vector<Variant> variants;
  for (const std::string& tname : types) {
    const bool exact = tname == "bf16-exact";
    const auto t = exact ? std::optional<QuantType>(QuantType::kBF16) : type_from_name(tname);
    if (!t.has_value()) {
      std::printf("unknown type %s\n", tname.c_str());
      return 2;
    }
    variants.push_back({tname, *t, exact});
  }
  std::mt19937_64 rng(1);
  for (const Shape& s : shapes) {
    // Every variant's weight copies, made once per shape.
    std::vector<std::vector<std::vector<uint8_t>>> w(variants.size());
    for (size_t v = 0; v < variants.size(); ++v) {
      const QuantType t = variants[v].type;
      if (!check_weights(t, s.cols).ok()) {
        std::printf("%-10s %-9s %6lld %6lld   n/a: cols not a multiple of %lld\n",
                    variants[v].name.c_str(), s.name, static_cast<long long>(s.rows),
                    static_cast<long long>(s.cols),
                    static_cast<long long>(type_info(t).block_weights));
        continue;
      }
      const int64_t matrix_bytes = row_bytes(t, s.cols).value() * s.rows;
      const int64_t copies = std::max<int64_t>(1, (rotate_mib << 20) / matrix_bytes);
      for (int64_t c = 0; c < copies; ++c) w[v].push_back(random_matrix(rng, t, s.rows, s.cols));
    }
    for (const std::string& mstr : ms) {
      const int64_t m = std::stoll(mstr);
      std::vector<float> x(static_cast<size_t>(m * s.cols));
      std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
      for (float& e : x) e = dist(rng);
      std::vector<float> y(static_cast<size_t>(m * s.rows));
      for (const std::string& tstr : threads) {
        ThreadPool pool(std::stoi(tstr));
        std::vector<size_t> call(variants.size(), 0);
        const auto once = [&](size_t v) {
          const auto& copies = w[v];
          const QuantWeights qw{copies[call[v]++ % copies.size()].data(), variants[v].type, s.rows,
                                s.cols};
          if (variants[v].exact) {
            cellm::cpu::matmul(pool, x.data(), m, s.cols, {qw.data, cellm::DType::kBF16}, s.rows,
                               {}, y.data());
          } else {
            quant_matmul(pool, x.data(), m, qw, {}, y.data(), isa);
          }
        };
        // Rounds in which every variant runs for min_ms / kRounds in turn, best round
        // kept: on a shared machine others only add time, and interleaving exposes
        // every variant to the same load. Beside wall time, the process's CPU time
        // per call divided by the threads estimates the time on idle cores.
        constexpr int kRounds = 6;
        std::vector<double> best(variants.size(), 1e30), best_cpu(variants.size(), 1e30);
        for (size_t v = 0; v < variants.size(); ++v) {
          for (int i = 0; i < 3 && !w[v].empty(); ++i) once(v);  // warm up
        }
        for (int r = 0; r < kRounds; ++r) {
          for (size_t v = 0; v < variants.size(); ++v) {
            if (w[v].empty()) continue;
            int iters = 0;
            const auto t0 = Clock::now();
            const double c0 = process_cpu_seconds();
            double elapsed = 0.0;
            do {
              once(v);
              ++iters;
              elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
            } while (elapsed * 1e3 < min_ms / kRounds);
            best[v] = std::min(best[v], elapsed / iters);
            best_cpu[v] =
                std::min(best_cpu[v], (process_cpu_seconds() - c0) / iters / pool.num_threads());
          }
        }
        double exact_cpu = 0.0;
        for (size_t v = 0; v < variants.size(); ++v) {
          if (variants[v].exact && !w[v].empty()) exact_cpu = best_cpu[v];
        }
        for (size_t v = 0; v < variants.size(); ++v) {
          if (w[v].empty()) continue;
          const double flops = 2.0 * static_cast<double>(m * s.rows * s.cols);
          const double bytes = static_cast<double>(w[v][0].size());
          std::printf(
              "%-10s %-9s %6lld %6lld %3lld %3s %9.1f %7.2f %8.2f %9.1f %7.2f %8.2f %8.2fx\n",
              variants[v].name.c_str(), s.name, static_cast<long long>(s.rows),
              static_cast<long long>(s.cols), static_cast<long long>(m), tstr.c_str(),
              best[v] * 1e6, bytes / best[v] / 1e9, flops / best[v] / 1e9, best_cpu[v] * 1e6,
              bytes / best_cpu[v] / 1e9, flops / best_cpu[v] / 1e9,
              exact_cpu > 0.0 ? exact_cpu / best_cpu[v] : 0.0);
        }
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
