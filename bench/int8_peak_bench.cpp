// int8_peak_bench: the CPU's 8-bit dot-product rate, the ceiling that the quantized
// matmul's compute-bound calls (prefill, batched decode) are held against.
//
//   int8_peak_bench [--threads 1,2] [--ms 300]
//
// Two loops per thread count, each thread on its own registers, timed by wall and by
// each thread's CPU time (the estimate for idle cores on a shared machine):
//   raw      12 independent vpdpbusd chains (512-bit, 64 multiply-adds each): the
//            instruction's throughput.
//   blocked  the 32-weight formats' inner step: vpdpbusd from a fresh accumulator,
//            then to f32, times the weight scale, fused-add times the activation scale
//            (quant_matmul_simd.inc's tile32_zmm): the most a kernel that scales every
//            block pair to f32 can reach.
//   bf16     24 chains of vdpbf16ps (bf16_dot_matmul's instruction), where the CPU
//            has AVX-512 BF16; f32fma: 24 chains of f32 FMA (cpu::matmul's exact
//            path): the ceilings of bf16_matmul_bench's GFLOP/s.
// Rates are in GOP/s, 2 ops per multiply-add, comparable to quant_matmul_bench's GFLOP/s.
// Prints a line saying so and exits 0 where the CPU lacks AVX-512 VNNI.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cpu/quant/cpu_features.h"

#if defined(__x86_64__)
#include "cpu/kernels/x86_intrinsics.h"
#endif

namespace {

#if defined(__x86_64__)
constexpr int kRawChains = 12, kBlockedChains = 8;

// Multiply-adds done in `iters` rounds of the raw loop; the sum defeats dead-code removal.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) int64_t raw_loop(int64_t iters,
                                                                        int32_t* sink) {
  __m512i acc[kRawChains];
  for (__m512i& a : acc) a = _mm512_setzero_si512();
  __m512i u = _mm512_set1_epi8(3);
  const __m512i s = _mm512_set1_epi8(-5);
  for (int64_t it = 0; it < iters; ++it) {
    asm volatile("" : "+v"(u));  // keeps every product inside the loop
    for (__m512i& a : acc) a = _mm512_dpbusd_epi32(a, u, s);
  }
  __m512i total = _mm512_setzero_si512();
  for (const __m512i& a : acc) total = _mm512_add_epi32(total, a);
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, total);
  *sink = lanes[0];
  return iters * kRawChains * 64;
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) int64_t blocked_loop(int64_t iters,
                                                                            float* sink) {
  __m512 acc[kBlockedChains];
  for (__m512& a : acc) a = _mm512_setzero_ps();
  // A different activation vector per chain, so no two chains share a product.
  __m512i s[kBlockedChains];
  for (int k = 0; k < kBlockedChains; ++k) s[k] = _mm512_set1_epi8(static_cast<char>(k - 5));
  __m512i u = _mm512_set1_epi8(3);
  const __m512i init = _mm512_set1_epi32(7);
  const __m512 dw = _mm512_set1_ps(1e-3f), dx = _mm512_set1_ps(1e-3f);
  for (int64_t it = 0; it < iters; ++it) {
    asm volatile("" : "+v"(u));
    for (int k = 0; k < kBlockedChains; ++k) {
      const __m512i p = _mm512_dpbusd_epi32(init, u, s[k]);
      acc[k] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(p), dw), dx, acc[k]);
    }
  }
  __m512 total = _mm512_setzero_ps();
  for (const __m512& a : acc) total = _mm512_add_ps(total, a);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, total);
  *sink = lanes[0];
  return iters * kBlockedChains * 64;
}

// The ceilings of the bf16 products (bf16_matmul_bench): 24 independent chains of
// vdpbf16ps (32 bf16 multiply-adds each: bf16_dot_matmul's instruction) or of f32
// FMA (16 each: cpu::matmul's exact path). 24 chains: 12 left both loops short of
// their throughput on a core whose latency exceeds 12 of them. The chains are unrolled
// by index: a range-for over the array kept every accumulator in memory (a load and a
// store around each instruction), which measured the store-forwarding latency instead.
constexpr int kWideChains = 24;

__attribute__((target("avx512f,avx512bw,avx512bf16"))) int64_t bf16_loop(int64_t iters,
                                                                         float* sink) {
  __m512 acc[kWideChains];
  for (__m512& a : acc) a = _mm512_setzero_ps();
  __m512i u = _mm512_set1_epi32(0x3f803f80);  // bf16 pairs of 1.0
  for (int64_t it = 0; it < iters; ++it) {
    asm volatile("" : "+v"(u));
    __m512bh b;
    std::memcpy(&b, &u, sizeof(b));
#pragma GCC unroll 24
    for (int c = 0; c < kWideChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], b, b);
  }
  __m512 total = _mm512_setzero_ps();
  for (const __m512& a : acc) total = _mm512_add_ps(total, a);
  *sink = _mm512_reduce_add_ps(total);
  return iters * kWideChains * 32;
}

__attribute__((target("avx512f"))) int64_t fma_loop(int64_t iters, float* sink) {
  __m512 acc[kWideChains];
  for (__m512& a : acc) a = _mm512_setzero_ps();
  __m512 u = _mm512_set1_ps(1e-3f);
  for (int64_t it = 0; it < iters; ++it) {
    asm volatile("" : "+v"(u));
#pragma GCC unroll 24
    for (int c = 0; c < kWideChains; ++c) acc[c] = _mm512_fmadd_ps(u, u, acc[c]);
  }
  __m512 total = _mm512_setzero_ps();
  for (const __m512& a : acc) total = _mm512_add_ps(total, a);
  *sink = _mm512_reduce_add_ps(total);
  return iters * kWideChains * 16;
}
#endif

double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> threads = {1, 2};
  double min_ms = 300.0;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    if (arg == "--threads" && a + 1 < argc) {
      threads.clear();
      std::stringstream in(argv[++a]);
      for (std::string item; std::getline(in, item, ',');) threads.push_back(std::stoi(item));
    } else if (arg == "--ms" && a + 1 < argc) {
      min_ms = std::stod(argv[++a]);
    } else {
      std::printf("usage: int8_peak_bench [--threads 1,2] [--ms 300]\n");
      return arg == "-h" || arg == "--help" ? 0 : 2;
    }
  }
#if defined(__x86_64__)
  if (!cellm::cpu::cpu_features().avx512_vnni) {
    std::printf("int8_peak_bench: this CPU has no AVX-512 VNNI; nothing to measure\n");
    return 0;
  }
  std::printf("%-8s %3s %12s %12s\n", "loop", "thr", "wall-GOP/s", "cpu-GOP/s");
  const bool bf16 = cellm::cpu::cpu_features().avx512_bf16;
  for (const int loop : {0, 1, 2, 3}) {
    if (loop == 2 && !bf16) continue;
    const bool blocked = loop == 1;
    const char* name = loop == 0 ? "raw" : loop == 1 ? "blocked" : loop == 2 ? "bf16" : "f32fma";
    for (const int t : threads) {
      // Rounds sized so one takes ~min_ms on an idle core (~100 G multiply-adds/s).
      const auto iters = static_cast<int64_t>(min_ms * 1e-3 * 1e11 / (64.0 * 12));
      std::vector<double> cpu(static_cast<size_t>(t));
      std::vector<int64_t> macs(static_cast<size_t>(t));
      std::vector<std::thread> pool;
      const auto start = std::chrono::steady_clock::now();
      for (int k = 0; k < t; ++k) {
        pool.emplace_back([&, k] {
          const double c0 = thread_cpu_seconds();
          int32_t isink = 0;
          float fsink = 0.0f;
          macs[static_cast<size_t>(k)] = loop == 0   ? raw_loop(iters, &isink)
                                         : blocked   ? blocked_loop(iters, &fsink)
                                         : loop == 2 ? bf16_loop(iters, &fsink)
                                                     : fma_loop(iters, &fsink);
          cpu[static_cast<size_t>(k)] = thread_cpu_seconds() - c0;
          if (isink == 1 && fsink == 1.0f) std::printf(" ");
        });
      }
      for (std::thread& th : pool) th.join();
      const double wall =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      double total = 0.0, per_cpu = 0.0;
      for (int k = 0; k < t; ++k) {
        total += static_cast<double>(macs[static_cast<size_t>(k)]);
        per_cpu +=
            2.0 * static_cast<double>(macs[static_cast<size_t>(k)]) / cpu[static_cast<size_t>(k)];
      }
      std::printf("%-8s %3d %12.1f %12.1f\n", name, t, 2.0 * total / wall * 1e-9, per_cpu * 1e-9);
    }
  }
#else
  std::printf("int8_peak_bench: not an x86-64 CPU; nothing to measure\n");
#endif
  return 0;
}
