// gemv_bench: the decode GEMV (launch_gemv, src/cuda/kernels/gemv.h) against cuBLASLt
// (Gemm with GemmPath::kCublasLtOnly) on Llama-3-8B's linear layers.
//
//   gemv_bench [--iters N] [--peak-gbs G] [--skinny-only] [--skinny-shape K,N]...
//              [--rows-shape K,N]...
//
// For each weight shape (qkv, o, gate_up, down, LM head with f32 logits) and m in
// {1, 2, 4, 8}: microseconds per call of the GEMV's two kernels (GemvKernel::kTensorCores,
// kRows) and of cuBLASLt, each with the bytes a call must move (weights, x, y) as a
// percentage of G (default 4250 GB/s). Each timing is N calls (default 200)
// recorded in one CUDA graph, as decode runs them, best of 5 replays; the calls rotate over
// copies of the weights totalling >= 512 MiB, so every call reads its weights from HBM and
// not from the 50 MB L2. Then, for the down projection, the MLP's activation + product
// four ways: the fused SwiGLU GEMV (each kernel), launch_swiglu + the GEMV, launch_swiglu +
// cuBLASLt. The last columns give the largest relative difference between each GEMV
// kernel's and cuBLASLt's outputs (a sanity check; the tests hold the tolerances). The
// GEMV kernels are launched with programmatic dependent launch, so consecutive calls
// overlap as they do in a decode step. Last, the skinny GEMM (launch_skinny_gemm,
// kernels/skinny_gemm.h), with each of its rings, against cuBLASLt at 16, 32, 64 and 128
// rows on the same 8B shapes: that table alone with --skinny-only, or for the shapes K x N
// given with --skinny-shape (K a multiple of 128) instead. --rows-shape K,N: the kRows GEMV
// at m = 1 under each of its splits (gemv.h), for the shapes given alone.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cellm/status.h"
#include "cpu/kernels/convert.h"
#include "cuda/device_memory.h"
#include "cuda/gemm.h"
#include "cuda/kernels/gemv.h"
#include "cuda/kernels/skinny_gemm.h"
#include "cuda/kernels/swiglu.h"
#include "graph_timing.h"

namespace {

using cellm::bench::check;
using cellm::bench::time_per_call;
using cellm::cuda::DeviceBuffer;
using cellm::cuda::Gemm;
using cellm::cuda::GemmPath;
using cellm::cuda::GemvInput;
using Bf16 = __nv_bfloat16;

constexpr int64_t kRotationBytes = int64_t{512} << 20;

DeviceBuffer allocate(int64_t bytes) {
  cellm::Result<DeviceBuffer> b = DeviceBuffer::allocate(static_cast<size_t>(bytes));
  check(b.status());
  return std::move(b).value();
}

// `elements` bf16 values with magnitude in [0.1, 1), either sign: a random block uploaded
// once and repeated over the buffer by device copies.
DeviceBuffer random_bf16(std::mt19937& rng, int64_t elements) {
  DeviceBuffer b = allocate(elements * 2);
  const int64_t block = std::min<int64_t>(elements, int64_t{1} << 20);
  std::vector<uint16_t> host(static_cast<size_t>(block));
  std::uniform_real_distribution<float> magnitude(0.1f, 1.0f);
  for (uint16_t& v : host) {
    const float m = magnitude(rng);
    v = cellm::cpu::f32_to_bf16((rng() & 1u) != 0 ? m : -m);
  }
  auto* bytes = b.as<unsigned char>();
  check(cudaMemcpy(bytes, host.data(), static_cast<size_t>(block) * 2, cudaMemcpyHostToDevice),
        "upload");
  for (int64_t done = block; done < elements;) {
    const int64_t n = std::min(done, elements - done);
    check(cudaMemcpy(bytes + done * 2, bytes, static_cast<size_t>(n) * 2, cudaMemcpyDeviceToDevice),
          "tile");
    done += n;
  }
  return b;
}

// Copies of a weight matrix [n, k] (and its input rows) enough to rotate over.
struct Operands {
  int64_t k, n, copies;
  DeviceBuffer w, x, gate_up, act;
  Operands(std::mt19937& rng, int64_t k_, int64_t n_)
      : k(k_), n(n_), copies(std::max<int64_t>(2, (kRotationBytes + n * k * 2 - 1) / (n * k * 2))) {
    w = random_bf16(rng, copies * n * k);
    x = random_bf16(rng, cellm::cuda::kSkinnyMaxRows * k);
    gate_up = random_bf16(rng, cellm::cuda::kGemvMaxRows * 2 * k);
    act = allocate(cellm::cuda::kGemvMaxRows * k * 2);
  }
  const Bf16* weights(int i) const { return w.as<Bf16>() + (i % copies) * n * k; }
};

// The largest |a - b| / max(|b|, 1e-3 max|b|) over m rows of two [m, n] outputs.
template <typename TOut>
double max_rel_diff(const DeviceBuffer& a, const DeviceBuffer& b, int64_t elements) {
  std::vector<TOut> ha(static_cast<size_t>(elements)), hb(static_cast<size_t>(elements));
  check(cudaMemcpy(ha.data(), a.get(), ha.size() * sizeof(TOut), cudaMemcpyDeviceToHost), "get");
  check(cudaMemcpy(hb.data(), b.get(), hb.size() * sizeof(TOut), cudaMemcpyDeviceToHost), "get");
  const auto to_f = [](TOut v) {
    if constexpr (std::is_same_v<TOut, float>) {
      return v;
    } else {
      return __bfloat162float(v);
    }
  };
  double scale = 0;
  for (const TOut v : hb) scale = std::max(scale, std::fabs(double{to_f(v)}));
  double worst = 0;
  for (size_t i = 0; i < ha.size(); ++i) {
    const double ref = to_f(hb[i]);
    const double d = std::fabs(double{to_f(ha[i])} - ref) / std::max(std::fabs(ref), 1e-3 * scale);
    worst = std::max(worst, d);
  }
  return worst;
}

struct Options {
  int iters = 200;
  double peak_gbs = 4250;
  bool skinny_only = false;  // --skinny-only: the skinny GEMM's table alone
  // --skinny-shape K,N (repeatable): the skinny GEMM's table for these shapes alone.
  std::vector<std::pair<int64_t, int64_t>> skinny_shapes;
  // --rows-shape K,N (repeatable): kRows at m = 1 under each split, for these shapes alone
  // (N > 100000 gives f32 outputs, as the LM head's).
  std::vector<std::pair<int64_t, int64_t>> rows_shapes;
};

// kRows at m = 1 under each split (launch_gemv's rows_split), for --rows-shape.
template <typename TOut>
void bench_rows_splits(const Operands& op, const Options& o) {
  DeviceBuffer y = allocate(op.n * int64_t{sizeof(TOut)});
  std::printf("%6ld -> %6ld %s |", static_cast<long>(op.k), static_cast<long>(op.n),
              std::is_same_v<TOut, float> ? "f32 " : "bf16");
  const double bytes = double(op.n * op.k * 2);
  for (int split = cellm::cuda::kGemvRowsAutoSplit; split <= cellm::cuda::kGemvRowsMaxSplit;
       split = split == 0 ? 1 : 2 * split) {
    const auto rows = [&](int i, cudaStream_t s) {
      check(cellm::cuda::launch_gemv<TOut>(op.x.as<Bf16>(), 1, op.k, GemvInput::kPlain,
                                           op.weights(i), op.n, nullptr, y.as<TOut>(), s,
                                           cellm::cuda::GemvKernel::kRows, split),
            "launch_gemv rows");
    };
    const double us = time_per_call(o.iters, rows);
    std::printf(" %8.2f %5.1f%% |", us, 100 * bytes / us / 1e3 / o.peak_gbs);
  }
  std::printf("\n");
}

// cuBLASLt's y = x[:m] · weights(i)ᵀ as an enqueue for time_per_call, its plans made now
// (outside any capture) for every copy of the weights.
template <typename TOut>
std::function<void(int, cudaStream_t)> cublaslt_product(Gemm& cublaslt, const Operands& op,
                                                        int64_t m, DeviceBuffer& y) {
  auto lt = [&cublaslt, &op, &y, m](int i, cudaStream_t s) {
    check(cublaslt.run<Bf16, TOut>(op.x.as<Bf16>(), m, op.k, op.weights(i), op.n, nullptr,
                                   y.as<TOut>(), s));
  };
  for (int i = 0; i < op.copies; ++i) lt(i, nullptr);
  return lt;
}

template <typename TOut>
void bench_shape(const char* name, const Operands& op, Gemm& cublaslt, const Options& o) {
  const int64_t k = op.k, n = op.n;
  DeviceBuffer y_gemv = allocate(cellm::cuda::kGemvMaxRows * n * sizeof(TOut));
  DeviceBuffer y_lt = allocate(cellm::cuda::kGemvMaxRows * n * sizeof(TOut));
  for (const int64_t m : {1, 2, 4, 8}) {
    const auto gemv = [&](int i, cudaStream_t s) {
      check(cellm::cuda::launch_gemv<TOut>(op.x.as<Bf16>(), m, k, GemvInput::kPlain, op.weights(i),
                                           n, nullptr, y_gemv.as<TOut>(), s),
            "launch_gemv");
    };
    const auto rows = [&](int i, cudaStream_t s) {
      check(cellm::cuda::launch_gemv<TOut>(op.x.as<Bf16>(), m, k, GemvInput::kPlain, op.weights(i),
                                           n, nullptr, y_gemv.as<TOut>(), s,
                                           cellm::cuda::GemvKernel::kRows),
            "launch_gemv rows");
    };
    const auto lt = cublaslt_product<TOut>(cublaslt, op, m, y_lt);
    gemv(0, nullptr);
    lt(0, nullptr);
    check(cudaDeviceSynchronize(), "sync");
    const double diff = max_rel_diff<TOut>(y_gemv, y_lt, m * n);
    const double bytes = double(n * k * 2 + m * k * 2 + m * n * int64_t{sizeof(TOut)});
    rows(0, nullptr);
    check(cudaDeviceSynchronize(), "sync");
    const double diff_rows = max_rel_diff<TOut>(y_gemv, y_lt, m * n);
    const double us_gemv = time_per_call(o.iters, gemv);
    const double us_rows = time_per_call(o.iters, rows);
    const double us_lt = time_per_call(o.iters, lt);
    const auto gbs = [&](double us) { return bytes / us / 1e3; };
    std::printf("%-22s %2ld | %8.2f %5.1f%% | %8.2f %5.1f%% | %8.2f %5.1f%% | %5.2fx | %.1e %.1e\n",
                name, static_cast<long>(m), us_gemv, 100 * gbs(us_gemv) / o.peak_gbs, us_rows,
                100 * gbs(us_rows) / o.peak_gbs, us_lt, 100 * gbs(us_lt) / o.peak_gbs,
                us_lt / std::min(us_gemv, us_rows), diff, diff_rows);
  }
}

// launch_skinny_gemm with each ring against cuBLASLt at 16, 32, 64 and 128 rows.
void print_skinny_header() {
  std::printf(
      "\n%-22s   m | shared ring %%peak | whole-SM   %%peak | cuBLASLt  %%peak | best    | "
      "max rel diff (shared, whole-SM)\n",
      "shape (k -> n)");
}
template <typename TOut>
void bench_skinny(const char* name, const Operands& op, Gemm& cublaslt, const Options& o) {
  using cellm::cuda::SkinnyRing;
  const int64_t k = op.k, n = op.n;
  constexpr int64_t kMaxRows = cellm::cuda::kSkinnyMaxRows;
  DeviceBuffer y_shared = allocate(kMaxRows * n * int64_t{sizeof(TOut)});
  DeviceBuffer y_whole = allocate(kMaxRows * n * int64_t{sizeof(TOut)});
  DeviceBuffer y_lt = allocate(kMaxRows * n * int64_t{sizeof(TOut)});
  for (const int64_t m : {16, 32, 64, 128}) {
    const auto skinny = [&](SkinnyRing ring, DeviceBuffer& y) {
      return [&, ring](int i, cudaStream_t s) {
        check(cellm::cuda::launch_skinny_gemm<TOut>(op.x.as<Bf16>(), m, k, op.weights(i), n,
                                                    nullptr, y.as<TOut>(), ring, s),
              "launch_skinny_gemm");
      };
    };
    const auto shared = skinny(SkinnyRing::kShared, y_shared);
    const auto whole = skinny(SkinnyRing::kWholeSm, y_whole);
    const auto lt = cublaslt_product<TOut>(cublaslt, op, m, y_lt);
    shared(0, nullptr);
    whole(0, nullptr);
    lt(0, nullptr);
    check(cudaDeviceSynchronize(), "sync");
    const double diff_shared = max_rel_diff<TOut>(y_shared, y_lt, m * n);
    const double diff_whole = max_rel_diff<TOut>(y_whole, y_lt, m * n);
    const double bytes = double(n * k * 2 + m * k * 2 + m * n * int64_t{sizeof(TOut)});
    const double us_shared = time_per_call(o.iters, shared);
    const double us_whole = time_per_call(o.iters, whole);
    const double us_lt = time_per_call(o.iters, lt);
    const auto pct = [&](double us) { return 100 * bytes / us / 1e3 / o.peak_gbs; };
    std::printf("%-22s %3ld | %8.2f %5.1f%% | %8.2f %5.1f%% | %8.2f %5.1f%% | %5.2fx | %.1e %.1e\n",
                name, static_cast<long>(m), us_shared, pct(us_shared), us_whole, pct(us_whole),
                us_lt, pct(us_lt), us_lt / std::min(us_shared, us_whole), diff_shared, diff_whole);
  }
}

void bench_swiglu_down(const Operands& op, Gemm& cublaslt, const Options& o) {
  const int64_t ff = op.k, n = op.n;
  DeviceBuffer y = allocate(cellm::cuda::kGemvMaxRows * n * 2);
  std::printf("\ndown with its SwiGLU (%ld -> %ld), us per call:\n", static_cast<long>(ff),
              static_cast<long>(n));
  std::printf(" m | fused mma | fused rows | swiglu + gemv | swiglu + cuBLASLt\n");
  for (const int64_t m : {1, 2, 4, 8}) {
    const auto swiglu = [&](cudaStream_t s) {
      check(cellm::cuda::launch_swiglu<Bf16>(op.gate_up.as<Bf16>(), m, ff, op.act.as<Bf16>(), s),
            "launch_swiglu");
    };
    const auto fused = [&](int i, cudaStream_t s) {
      check(cellm::cuda::launch_gemv<Bf16>(op.gate_up.as<Bf16>(), m, ff, GemvInput::kSwiGLU,
                                           op.weights(i), n, nullptr, y.as<Bf16>(), s),
            "launch_gemv swiglu");
    };
    const auto fused_rows = [&](int i, cudaStream_t s) {
      check(cellm::cuda::launch_gemv<Bf16>(op.gate_up.as<Bf16>(), m, ff, GemvInput::kSwiGLU,
                                           op.weights(i), n, nullptr, y.as<Bf16>(), s,
                                           cellm::cuda::GemvKernel::kRows),
            "launch_gemv swiglu rows");
    };
    const auto two = [&](int i, cudaStream_t s) {
      swiglu(s);
      check(cellm::cuda::launch_gemv<Bf16>(op.act.as<Bf16>(), m, ff, GemvInput::kPlain,
                                           op.weights(i), n, nullptr, y.as<Bf16>(), s),
            "launch_gemv");
    };
    const auto lt = [&](int i, cudaStream_t s) {
      swiglu(s);
      check(cublaslt.run<Bf16, Bf16>(op.act.as<Bf16>(), m, ff, op.weights(i), n, nullptr,
                                     y.as<Bf16>(), s));
    };
    for (int i = 0; i < op.copies; ++i) lt(i, nullptr);
    check(cudaDeviceSynchronize(), "sync");
    std::printf("%2ld | %9.2f | %10.2f | %13.2f | %17.2f\n", static_cast<long>(m),
                time_per_call(o.iters, fused), time_per_call(o.iters, fused_rows),
                time_per_call(o.iters, two), time_per_call(o.iters, lt));
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--iters" && i + 1 < argc) {
      o.iters = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--peak-gbs" && i + 1 < argc) {
      o.peak_gbs = std::atof(argv[++i]);
    } else if (long long k = 0, n = 0; a == "--rows-shape" && i + 1 < argc &&
                                       std::sscanf(argv[i + 1], "%lld,%lld", &k, &n) == 2) {
      o.rows_shapes.emplace_back(k, n);
      ++i;
    } else if (a == "--skinny-only") {
      o.skinny_only = true;
    } else if (long long k = 0, n = 0; a == "--skinny-shape" && i + 1 < argc &&
                                       std::sscanf(argv[i + 1], "%lld,%lld", &k, &n) == 2 &&
                                       k > 0 && k % cellm::cuda::kSkinnyKStep == 0 && n > 0) {
      o.skinny_shapes.emplace_back(k, n);
      ++i;
    } else {
      std::fprintf(stderr,
                   "usage: gemv_bench [--iters N] [--peak-gbs G] [--skinny-only] "
                   "[--skinny-shape K,N]... [--rows-shape K,N]...\n");
      return 2;
    }
  }
  if (!cellm::cuda::gpu_available()) {
    std::fprintf(stderr, "gemv_bench: no GPU\n");
    return 1;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "device properties");
  std::printf("%s, %d SMs; %d calls per graph, best of 5; %% of %.0f GB/s\n\n", prop.name,
              prop.multiProcessorCount, o.iters, o.peak_gbs);
  cellm::Result<Gemm> cublaslt = Gemm::create(size_t{32} << 20, GemmPath::kCublasLtOnly);
  check(cublaslt.status());
  std::mt19937 rng(1);
  if (!o.rows_shapes.empty()) {
    std::printf("kRows at m = 1, us and %% of peak: split auto | 1 | 2 | 4 | 8\n");
    for (const auto& [k, n] : o.rows_shapes) {
      const Operands op(rng, k, n);
      if (n > 100000) {
        bench_rows_splits<float>(op, o);
      } else {
        bench_rows_splits<Bf16>(op, o);
      }
    }
    return 0;
  }
  if (!o.skinny_shapes.empty()) {
    print_skinny_header();
    for (const auto& [k, n] : o.skinny_shapes) {
      const std::string name = std::to_string(k) + "->" + std::to_string(n);
      bench_skinny<Bf16>(name.c_str(), Operands(rng, k, n), *cublaslt, o);
    }
    return 0;
  }
  if (o.skinny_only) {
    print_skinny_header();
    bench_skinny<Bf16>("qkv 4096->6144", Operands(rng, 4096, 6144), *cublaslt, o);
    bench_skinny<Bf16>("o 4096->4096", Operands(rng, 4096, 4096), *cublaslt, o);
    bench_skinny<Bf16>("gate_up 4096->28672", Operands(rng, 4096, 28672), *cublaslt, o);
    bench_skinny<Bf16>("down 14336->4096", Operands(rng, 14336, 4096), *cublaslt, o);
    return 0;
  }
  std::printf(
      "%-22s  m |  mma us  %%peak |  rows us  %%peak | cuBLASLt  %%peak | best gemv | "
      "max rel diff (mma, rows)\n",
      "shape (k -> n)");
  const Operands qkv(rng, 4096, 6144);
  bench_shape<Bf16>("qkv 4096->6144", qkv, *cublaslt, o);
  const Operands o_proj(rng, 4096, 4096);
  bench_shape<Bf16>("o 4096->4096", o_proj, *cublaslt, o);
  const Operands gate_up(rng, 4096, 28672);
  bench_shape<Bf16>("gate_up 4096->28672", gate_up, *cublaslt, o);
  const Operands down(rng, 14336, 4096);
  bench_shape<Bf16>("down 14336->4096", down, *cublaslt, o);
  {
    const Operands head(rng, 4096, 128256);
    bench_shape<float>("lm_head 4096->128256 f32", head, *cublaslt, o);
  }
  bench_swiglu_down(down, *cublaslt, o);
  print_skinny_header();
  bench_skinny<Bf16>("qkv 4096->6144", qkv, *cublaslt, o);
  bench_skinny<Bf16>("o 4096->4096", o_proj, *cublaslt, o);
  bench_skinny<Bf16>("gate_up 4096->28672", gate_up, *cublaslt, o);
  bench_skinny<Bf16>("down 14336->4096", down, *cublaslt, o);
  // The Llama-3.2-1B shapes (the `1b` preset): small enough that launch, ramp-up
  // and tail weigh more than on the 8B ones.
  std::printf("\n");
  const Operands qkv_1b(rng, 2048, 3072);
  bench_shape<Bf16>("1b qkv 2048->3072", qkv_1b, *cublaslt, o);
  const Operands o_1b(rng, 2048, 2048);
  bench_shape<Bf16>("1b o 2048->2048", o_1b, *cublaslt, o);
  const Operands gate_up_1b(rng, 2048, 16384);
  bench_shape<Bf16>("1b gate_up 2048->16384", gate_up_1b, *cublaslt, o);
  const Operands down_1b(rng, 8192, 2048);
  bench_shape<Bf16>("1b down 8192->2048", down_1b, *cublaslt, o);
  return 0;
}
