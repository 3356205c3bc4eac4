// matmul_bench: achieved bandwidth and throughput of cpu::matmul.
//
//   matmul_bench [--threads N] [--dtype bf16|f16|f32] [--prefill-m M] [--quick]
//
// Prints, per weight shape [n, k] of the 110M model (d 768, ff 2048, vocab 32000):
//   M=1    GB/s of weight bytes read, with the weights rotated over > 2x L3 so
//          every call streams them from DRAM ("cold"), and repeated ("hot");
//   M=128  GFLOP/s (2*M*N*K per call), weights hot (--prefill-m changes M).
// Also: a DRAM read bandwidth baseline (a plain f32 sum on the same threads) to
// compare against, the thread pool's per-call floor, and one decode token of the
// whole model's linear layers (M=1, cold) as ms/token and GB/s.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/kernels/convert.h"
#include "cpu/kernels/matmul.h"
#include "cpu/kernels/simd.h"
#include "cpu/kernels/thread_pool.h"

namespace {

using cellm::cpu::DType;
using cellm::cpu::ThreadPool;
using cellm::cpu::TypedPtr;
using Clock = std::chrono::steady_clock;

constexpr int64_t kColdBytes = int64_t{192} << 20;  // well past the 32 MiB L3

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Best of `reps` timings of `iters` calls of fn(i), in seconds per call (the
// minimum: on a shared machine other processes only ever add time).
template <typename Fn>
double time_per_call(int reps, int iters, Fn&& fn) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) fn(i);
    t.push_back(seconds_since(t0) / iters);
  }
  return *std::min_element(t.begin(), t.end());
}

// `copies` independent weight matrices [n, k] of dtype t, filled with small values.
struct Weights {
  DType dtype;
  int64_t n, k;
  std::vector<std::vector<uint16_t>> h16;
  std::vector<std::vector<float>> f32;

  Weights(DType t, int64_t n_, int64_t k_, int copies) : dtype(t), n(n_), k(k_) {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> dist(-0.05f, 0.05f);
    for (int c = 0; c < copies; ++c) {
      if (t == DType::kF32) {
        f32.emplace_back(static_cast<size_t>(n * k));
        for (float& v : f32.back()) v = dist(rng);
      } else {
        h16.emplace_back(static_cast<size_t>(n * k));
        for (uint16_t& v : h16.back()) {
          v = t == DType::kBF16 ? cellm::cpu::f32_to_bf16(dist(rng))
                                : cellm::cpu::f32_to_f16(dist(rng));
        }
      }
    }
  }
  int copies() const { return static_cast<int>(dtype == DType::kF32 ? f32.size() : h16.size()); }
  TypedPtr at(int c) const {
    return {dtype == DType::kF32 ? static_cast<const void*>(f32[static_cast<size_t>(c)].data())
                                 : static_cast<const void*>(h16[static_cast<size_t>(c)].data()),
            dtype};
  }
  int64_t bytes() const { return n * k * cellm::cpu::dtype_bytes(dtype); }
};

int copies_for_cold(int64_t bytes) {
  return static_cast<int>(std::max<int64_t>(2, (kColdBytes + bytes - 1) / bytes));
}

double dram_read_gbps(ThreadPool& pool) {
  const int64_t n = kColdBytes / 4;
  std::vector<float> a(static_cast<size_t>(n), 1.0f);
  std::vector<float> partial(static_cast<size_t>(pool.num_threads()) * 16);
  const double s = time_per_call(5, 1, [&](int) {
    pool.parallel_for(pool.num_threads(), [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const auto [b, e] = ThreadPool::chunk(n, pool.num_threads(), static_cast<int>(t));
        cellm::cpu::simd::Vf acc0 = cellm::cpu::simd::zero(), acc1 = acc0;
        int64_t i = b;
        for (; i + 2 * cellm::cpu::simd::kLanes <= e; i += 2 * cellm::cpu::simd::kLanes) {
          acc0 = cellm::cpu::simd::add(acc0, cellm::cpu::simd::load<DType::kF32>(a.data() + i));
          acc1 = cellm::cpu::simd::add(
              acc1, cellm::cpu::simd::load<DType::kF32>(a.data() + i + cellm::cpu::simd::kLanes));
        }
        partial[static_cast<size_t>(t) * 16] =
            cellm::cpu::simd::reduce_add(cellm::cpu::simd::add(acc0, acc1));
      }
    });
  });
  return static_cast<double>(kColdBytes) / s / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 0;
  DType dtype = DType::kBF16;
  bool quick = false;
  int64_t pm = 128;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) {
      threads = std::stoi(argv[++i]);
    } else if (a == "--dtype" && i + 1 < argc) {
      const std::string d = argv[++i];
      dtype = d == "f32" ? DType::kF32 : d == "f16" ? DType::kF16 : DType::kBF16;
    } else if (a == "--prefill-m" && i + 1 < argc) {
      pm = std::stoll(argv[++i]);
    } else if (a == "--quick") {
      quick = true;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--threads N] [--dtype bf16|f16|f32] [--prefill-m M] [--quick]\n",
                   argv[0]);
      return 2;
    }
  }
  ThreadPool pool(threads);
  const int reps = quick ? 3 : 7;
  std::printf("matmul_bench: %d threads, weights %s, isa %s\n", pool.num_threads(),
              cellm::cpu::to_string(dtype), cellm::cpu::simd::isa_name());
  std::printf("DRAM read baseline (f32 sum over %lld MiB): %.1f GB/s\n",
              static_cast<long long>(kColdBytes >> 20), dram_read_gbps(pool));

  {
    // Cost of one parallel_for whose chunks do almost nothing: the pool's floor.
    std::vector<int64_t> sink(static_cast<size_t>(pool.num_threads()) * 16);
    const double t = time_per_call(reps, 100000, [&](int) {
      pool.parallel_for(pool.num_threads(), [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) sink[static_cast<size_t>(i) * 16] += 1;
      });
    });
    std::printf("ThreadPool::parallel_for overhead: %.2f us/call\n\n", t * 1e6);
  }

  struct Shape {
    int64_t n, k;
  };
  const Shape shapes[] = {{768, 768}, {2048, 768}, {768, 2048}, {32000, 768}};
  const std::string pm_title = "M=" + std::to_string(pm) + " GFLOP/s";
  std::printf("%-12s %14s %14s %16s\n", "[n x k]", "M=1 cold GB/s", "M=1 hot GB/s",
              pm_title.c_str());
  std::vector<float> x(static_cast<size_t>(std::max<int64_t>(pm, 1) * 2048)),
      y(static_cast<size_t>(std::max<int64_t>(pm, 1) * 32000));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 17) * 0.01f - 0.08f;
  for (const Shape& s : shapes) {
    const Weights cold(dtype, s.n, s.k,
                       copies_for_cold(s.n * s.k * cellm::cpu::dtype_bytes(dtype)));
    const int c = cold.copies();
    const double bytes = static_cast<double>(cold.bytes());
    const double t_cold = time_per_call(reps, c, [&](int i) {
      cellm::cpu::matmul(pool, x.data(), 1, s.k, cold.at(i % c), s.n, TypedPtr{}, y.data());
    });
    const int hot_iters = std::max(4, static_cast<int>(2e8 / bytes));
    const double t_hot = time_per_call(reps, hot_iters, [&](int) {
      cellm::cpu::matmul(pool, x.data(), 1, s.k, cold.at(0), s.n, TypedPtr{}, y.data());
    });
    const double flops =
        2.0 * static_cast<double>(pm) * static_cast<double>(s.n) * static_cast<double>(s.k);
    const int pf_iters = std::max(2, static_cast<int>(4e9 / flops / (quick ? 4 : 1)));
    const double t_pf = time_per_call(reps, pf_iters, [&](int) {
      cellm::cpu::matmul(pool, x.data(), pm, s.k, cold.at(0), s.n, TypedPtr{}, y.data());
    });
    char name[32];
    std::snprintf(name, sizeof(name), "%lld x %lld", static_cast<long long>(s.n),
                  static_cast<long long>(s.k));
    std::printf("%-12s %14.1f %14.1f %16.1f\n", name, bytes / t_cold / 1e9, bytes / t_hot / 1e9,
                flops / t_pf / 1e9);
  }

  // One decode token of the 110M model's linear layers: 12 x (q, k, v, o, gate,
  // up, down) + the LM head, every matrix distinct (as in a real model: cold).
  {
    const int layers = 12;
    std::vector<Weights> per_layer;
    per_layer.emplace_back(dtype, 768, 768, 4 * layers);
    per_layer.emplace_back(dtype, 2048, 768, 2 * layers);
    per_layer.emplace_back(dtype, 768, 2048, layers);
    const Weights head(dtype, 32000, 768, 1);
    double bytes = static_cast<double>(head.bytes());
    for (const Weights& w : per_layer) bytes += static_cast<double>(w.bytes()) * w.copies();
    const double t = time_per_call(reps, 3, [&](int) {
      for (int l = 0; l < layers; ++l) {
        for (int j = 0; j < 4; ++j) {
          cellm::cpu::matmul(pool, x.data(), 1, 768, per_layer[0].at(4 * l + j), 768, TypedPtr{},
                             y.data());
        }
        for (int j = 0; j < 2; ++j) {
          cellm::cpu::matmul(pool, x.data(), 1, 768, per_layer[1].at(2 * l + j), 2048, TypedPtr{},
                             y.data());
        }
        cellm::cpu::matmul(pool, x.data(), 1, 2048, per_layer[2].at(l), 768, TypedPtr{}, y.data());
      }
      cellm::cpu::matmul(pool, x.data(), 1, 768, head.at(0), 32000, TypedPtr{}, y.data());
    });
    std::printf(
        "\n110M model, one decode token (M=1, %d matmuls, %.0f MB of weights): "
        "%.2f ms/token, %.1f GB/s\n",
        layers * 7 + 1, bytes / 1e6, t * 1e3, bytes / t / 1e9);
  }
  return 0;
}
