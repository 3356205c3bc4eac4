// fp8_gemm_bench: the FP8 product for many rows (Fp8Gemm, src/cuda/fp8_gemm.h, after
// launch_quantize_rows_e4m3 of the bf16 activations) against the bf16 cuBLASLt product
// (Gemm with GemmPath::kCublasLtOnly) on Llama-3-8B's linear layers.
//
//   fp8_gemm_bench [--iters N]
//
// For each weight shape (qkv 4096 -> 6144, o 4096 -> 4096, gate_up 4096 -> 28672, down
// 14336 -> 4096 whose fp8 input is the fused SwiGLU quantization of a [m, 2 * 14336]
// gate_up) and m in {16, 64, 256, 2048}: microseconds and TFLOP/s (2 m n k per call) of
//   bf16     Gemm::run<bf16, bf16> (for down: launch_swiglu + run, run_swiglu_down's path)
//   fp8      launch_quantize_rows_e4m3 + Fp8Gemm::run<bf16> (Fp8Scaling::kAuto, tuning on
//            as the executor's decode warm-up has it), the whole replacement of the bf16 call
//   fp8 gemm Fp8Gemm::run alone, and the plan kind kAuto chose (outer, kernel, skinny)
//   quant    launch_quantize_rows_e4m3 alone, and the GB/s of its bytes (x read, codes and
//            scales written)
//   skinny   launch_quantize_rows_e4m3 + Fp8Gemm::run<bf16> with the forced kSkinny path
//            (cellm's skinny kernel, shared ring; "-" where it does not serve: m > 64)
//   fallback launch_quantize_rows_e4m3 + Fp8Gemm::run<bf16> with the forced
//            kEpilogueKernel path
// and the speed-up of fp8 over bf16. Each timing is N calls (default 20) captured in one
// CUDA graph, best of 5 replays after a warm one. The weights are the same matrix in both
// (the e4m3 copy is its per-channel quantization by the same kernel), so the last column,
// the largest |fp8 - bf16| over the largest |bf16| of the outputs, shows the quantization
// error (a sanity check; the tests hold the tolerances).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cellm/status.h"
#include "cuda/device_memory.h"
#include "cuda/fp8_gemm.h"
#include "cuda/gemm.h"
#include "cuda/kernels/quantize_e4m3.h"
#include "cuda/kernels/skinny_gemm.h"
#include "cuda/kernels/swiglu.h"
#include "graph_timing.h"

namespace {

using cellm::bench::check;
using cellm::cuda::DeviceBuffer;
using cellm::cuda::Fp8Gemm;
using cellm::cuda::Fp8PlanKind;
using cellm::cuda::Fp8Scaling;
using cellm::cuda::Gemm;
using cellm::cuda::GemmPath;
using cellm::cuda::GemvInput;
using Bf16 = __nv_bfloat16;

// Microseconds per call of enqueue(stream), iters calls in one graph (graph_timing.h).
double time_per_call(int iters, const std::function<void(cudaStream_t)>& enqueue) {
  return cellm::bench::time_per_call(iters, [&](int, cudaStream_t s) { enqueue(s); });
}

DeviceBuffer allocate(int64_t bytes) {
  cellm::Result<DeviceBuffer> b = DeviceBuffer::allocate(static_cast<size_t>(bytes));
  check(b.status());
  return std::move(b).value();
}

// `elements` bf16 values, magnitudes in [0.1, 1) * scale, either sign: a random block of
// up to 1 Mi elements repeated by device copies.
DeviceBuffer random_bf16(std::mt19937& rng, int64_t elements, float scale) {
  const int64_t block = std::min<int64_t>(elements, int64_t{1} << 20);
  std::vector<Bf16> host(static_cast<size_t>(block));
  std::uniform_real_distribution<float> magnitude(0.1f, 1.0f);
  for (Bf16& v : host) v = __float2bfloat16_rn(magnitude(rng) * scale * ((rng() & 1u) ? 1 : -1));
  DeviceBuffer b = allocate(elements * 2);
  auto* p = b.as<Bf16>();
  check(cudaMemcpy(p, host.data(), static_cast<size_t>(block) * 2, cudaMemcpyHostToDevice),
        "upload");
  for (int64_t done = block; done < elements;) {
    const int64_t n = std::min(done, elements - done);
    check(cudaMemcpy(p + done, p, static_cast<size_t>(n) * 2, cudaMemcpyDeviceToDevice), "tile");
    done += n;
  }
  return b;
}

std::vector<float> download_bf16(const DeviceBuffer& b, int64_t elements) {
  std::vector<Bf16> host(static_cast<size_t>(elements));
  check(cudaMemcpy(host.data(), b.get(), static_cast<size_t>(elements) * 2, cudaMemcpyDeviceToHost),
        "download");
  std::vector<float> out(host.size());
  for (size_t i = 0; i < host.size(); ++i) out[i] = __bfloat162float(host[i]);
  return out;
}

struct Shape {
  const char* name;
  int64_t n, k;
  bool swiglu;
};

}  // namespace

int main(int argc, char** argv) {
  int iters = 20;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
      iters = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: fp8_gemm_bench [--iters N]\n");
      return 2;
    }
  }
  int device_count = 0;
  if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
    std::fprintf(stderr, "fp8_gemm_bench: no GPU\n");
    return 1;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "properties");
  std::printf("device: %s, %d calls per timing\n", prop.name, iters);
  std::printf(
      "%-8s %5s | %9s %7s | %9s %7s | %9s %7s %-6s | %8s %6s | %9s %7s | %9s %7s | %7s | %8s\n",
      "shape", "m", "bf16 us", "TFLOP/s", "fp8 us", "TFLOP/s", "gemm us", "TFLOP/s", "plan",
      "quant us", "GB/s", "skinny us", "TFLOP/s", "fallbk us", "TFLOP/s", "speedup", "rel diff");

  cellm::Result<Gemm> gemm_r = Gemm::create(size_t{32} << 20, GemmPath::kCublasLtOnly);
  check(gemm_r.status());
  Gemm gemm = std::move(gemm_r).value();
  cellm::Result<Fp8Gemm> fp8_r = Fp8Gemm::create();
  check(fp8_r.status());
  Fp8Gemm fp8 = std::move(fp8_r).value();
  fp8.set_tuning(true);
  cellm::Result<Fp8Gemm> skinny_r = Fp8Gemm::create(size_t{32} << 20, Fp8Scaling::kSkinny);
  check(skinny_r.status());
  Fp8Gemm skinny = std::move(skinny_r).value();
  cellm::Result<Fp8Gemm> fallback_r =
      Fp8Gemm::create(size_t{32} << 20, Fp8Scaling::kEpilogueKernel);
  check(fallback_r.status());
  Fp8Gemm fallback = std::move(fallback_r).value();

  std::mt19937 rng(42);
  const Shape shapes[] = {{"qkv", 6144, 4096, false},
                          {"o", 4096, 4096, false},
                          {"gate_up", 28672, 4096, false},
                          {"down", 4096, 14336, true}};
  for (const Shape& s : shapes) {
    // Weights ~ 0.02 (an 8B's linear layers), quantized per output channel by the same kernel.
    DeviceBuffer w = random_bf16(rng, s.n * s.k, 0.05f);
    DeviceBuffer w8 = allocate(s.n * s.k);
    DeviceBuffer w_scale = allocate(s.n * 4);
    check(cellm::cuda::launch_quantize_rows_e4m3(w.as<Bf16>(), s.n, s.k, GemvInput::kPlain,
                                                 w8.as<uint8_t>(), w_scale.as<float>(), nullptr),
          "quantize weights");
    for (const int64_t m : {int64_t{16}, int64_t{64}, int64_t{256}, int64_t{2048}}) {
      const int64_t in_cols = s.swiglu ? 2 * s.k : s.k;
      DeviceBuffer x = random_bf16(rng, m * in_cols, s.swiglu ? 4.0f : 1.0f);
      DeviceBuffer act = allocate(m * s.k * 2);
      DeviceBuffer x8 = allocate(m * s.k);
      DeviceBuffer x_scale = allocate(m * 4);
      DeviceBuffer y16 = allocate(m * s.n * 2);
      DeviceBuffer y8 = allocate(m * s.n * 2);
      const GemvInput input = s.swiglu ? GemvInput::kSwiGLU : GemvInput::kPlain;

      const auto bf16_call = [&](cudaStream_t st) {
        const Bf16* in = x.as<Bf16>();
        if (s.swiglu) {
          check(cellm::cuda::launch_swiglu<Bf16>(x.as<Bf16>(), m, s.k, act.as<Bf16>(), st),
                "swiglu");
          in = act.as<Bf16>();
        }
        check(gemm.run<Bf16, Bf16>(in, m, s.k, w.as<Bf16>(), s.n, nullptr, y16.as<Bf16>(), st));
      };
      const auto quantize = [&](cudaStream_t st) {
        check(cellm::cuda::launch_quantize_rows_e4m3(x.as<Bf16>(), m, s.k, input, x8.as<uint8_t>(),
                                                     x_scale.as<float>(), st),
              "quantize");
      };
      const auto product = [&](Fp8Gemm& g, cudaStream_t st) {
        check(g.run<Bf16>(x8.as<uint8_t>(), x_scale.as<float>(), m, s.k, w8.as<uint8_t>(),
                          w_scale.as<float>(), s.n, nullptr, y8.as<Bf16>(), st));
      };
      // Warm (plans are built outside capture), then compare the outputs.
      bf16_call(nullptr);
      quantize(nullptr);
      product(fallback, nullptr);
      product(skinny, nullptr);
      product(fp8, nullptr);
      check(cudaDeviceSynchronize(), "warm");
      const std::vector<float> ref = download_bf16(y16, m * s.n);
      const std::vector<float> got = download_bf16(y8, m * s.n);
      double max_ref = 0, max_diff = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        max_ref = std::max(max_ref, std::fabs(double{ref[i]}));
        max_diff = std::max(max_diff, std::fabs(double{got[i]} - double{ref[i]}));
      }
      const char* plan = "?";
      for (const Fp8Gemm::PlanInfo& info : fp8.describe_plans()) {
        if (info.key.m == m && info.key.n == s.n && info.key.k == s.k) {
          plan = info.kind == Fp8PlanKind::kOuterVector ? "outer"
                 : info.kind == Fp8PlanKind::kSkinny    ? "skinny"
                                                        : "kernel";
        }
      }

      const double flops =
          2.0 * static_cast<double>(m) * static_cast<double>(s.n) * static_cast<double>(s.k);
      const auto tflops = [&](double us) { return flops / (us * 1e-6) / 1e12; };
      const double bf16_us = time_per_call(iters, bf16_call);
      const double fp8_us = time_per_call(iters, [&](cudaStream_t st) {
        quantize(st);
        product(fp8, st);
      });
      const double gemm_us = time_per_call(iters, [&](cudaStream_t st) { product(fp8, st); });
      const double quant_us = time_per_call(iters, quantize);
      const double quant_bytes = static_cast<double>(m) * (in_cols * 2 + s.k + 4);
      const bool serves = cellm::cuda::skinny_gemm_e4m3_supports(m, s.n, s.k, x8.get(), w8.get());
      const double skinny_us = !serves ? 0.0 : time_per_call(iters, [&](cudaStream_t st) {
        quantize(st);
        product(skinny, st);
      });
      const double fallback_us = time_per_call(iters, [&](cudaStream_t st) {
        quantize(st);
        product(fallback, st);
      });
      char skinny_cols[32] = "        -       -";
      if (serves) {
        std::snprintf(skinny_cols, sizeof(skinny_cols), "%9.1f %7.1f", skinny_us,
                      tflops(skinny_us));
      }
      std::printf(
          "%-8s %5lld | %9.1f %7.1f | %9.1f %7.1f | %9.1f %7.1f %-6s | %8.1f %6.0f | %s | %9.1f "
          "%7.1f | %6.2fx | %8.2e\n",
          s.name, static_cast<long long>(m), bf16_us, tflops(bf16_us), fp8_us, tflops(fp8_us),
          gemm_us, tflops(gemm_us), plan, quant_us, quant_bytes / (quant_us * 1e3), skinny_cols,
          fallback_us, tflops(fallback_us), bf16_us / fp8_us,
          max_ref > 0 ? max_diff / max_ref : 0.0);
    }
  }
  return 0;
}
