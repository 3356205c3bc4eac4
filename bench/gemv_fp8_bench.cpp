// gemv_fp8_bench: the e4m3 decode GEMV (launch_gemv_fp8, src/cuda/kernels/gemv_fp8.h)
// against the bf16 GEMV (launch_gemv, GemvKernel::kTensorCores) on Llama-3-8B's linear
// layers, over the same weights (the bf16 copy is the device decode of the e4m3 codes).
//
//   gemv_fp8_bench [--iters N] [--peak-gbs G]
//
// For each weight shape (qkv 4096 -> 6144, o 4096 -> 4096, gate_up 4096 -> 28672, down
// 14336 -> 4096 with the fused SwiGLU input) and m in {1, 4, 8}: microseconds per call of
// each kernel, the GB/s of its weight bytes (n k for e4m3, 2 n k for bf16) and that as a
// percentage of G (default 3350 GB/s), and the fp8 kernel's speed-up. Each timing is N
// calls (default 200) recorded in one CUDA graph, as decode runs them, best of 5 replays;
// the calls rotate over copies of the weights totalling >= 512 MiB each, so every call reads
// its weights from HBM and not from the 50 MB L2. Both kernels are launched with
// programmatic dependent launch, so consecutive calls overlap as in a decode step. The
// last column is the largest relative difference between the two kernels' f32 outputs (the
// scale is 1: they compute the same product in different summation orders; a sanity check,
// the tests hold the tolerances).
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
#include "cuda/kernels/gemv.h"
#include "cuda/kernels/gemv_fp8.h"
#include "graph_timing.h"

namespace {

using cellm::bench::check;
using cellm::bench::time_per_call;
using cellm::cuda::DeviceBuffer;
using cellm::cuda::GemvInput;
using Bf16 = __nv_bfloat16;

constexpr int64_t kRotationBytes = int64_t{512} << 20;

DeviceBuffer allocate(int64_t bytes) {
  cellm::Result<DeviceBuffer> b = DeviceBuffer::allocate(static_cast<size_t>(bytes));
  check(b.status());
  return std::move(b).value();
}

// `bytes` bytes: a random block of `block` bytes from make_block, uploaded once and
// repeated over the buffer by device copies.
DeviceBuffer repeated(int64_t bytes, const std::vector<unsigned char>& block_data) {
  DeviceBuffer b = allocate(bytes);
  auto* p = b.as<unsigned char>();
  const auto block = std::min<int64_t>(bytes, static_cast<int64_t>(block_data.size()));
  check(cudaMemcpy(p, block_data.data(), static_cast<size_t>(block), cudaMemcpyHostToDevice),
        "upload");
  for (int64_t done = block; done < bytes;) {
    const int64_t n = std::min(done, bytes - done);
    check(cudaMemcpy(p + done, p, static_cast<size_t>(n), cudaMemcpyDeviceToDevice), "tile");
    done += n;
  }
  return b;
}

// `elements` bf16 values with magnitude in [0.1, 1), either sign.
DeviceBuffer random_bf16(std::mt19937& rng, int64_t elements) {
  std::vector<unsigned char> block(static_cast<size_t>(std::min<int64_t>(elements, 1 << 20) * 2));
  std::uniform_real_distribution<float> magnitude(0.1f, 1.0f);
  for (size_t i = 0; i < block.size(); i += 2) {
    const float m = magnitude(rng);
    const Bf16 v = __float2bfloat16_rn((rng() & 1u) != 0 ? m : -m);
    std::memcpy(&block[i], &v, 2);
  }
  return repeated(elements * 2, block);
}

// `elements` e4m3 codes of magnitude in [2^-3, 2^3] (exponent field 4..10), either sign:
// weights of a checkpoint's typical spread, never NaN.
DeviceBuffer random_e4m3(std::mt19937& rng, int64_t elements) {
  std::vector<unsigned char> block(static_cast<size_t>(std::min<int64_t>(elements, 1 << 20)));
  for (unsigned char& c : block) {
    const auto exponent = static_cast<unsigned>(4 + rng() % 7);
    c = static_cast<unsigned char>((rng() & 0x80u) | exponent << 3 | (rng() & 7u));
  }
  return repeated(elements, block);
}

// Copies of one weight matrix [n, k] in e4m3 and decoded to bf16, enough of each to rotate
// over, with a unit scale and the input rows.
struct Operands {
  int64_t k, n, fp8_copies, bf16_copies;
  DeviceBuffer w8, w16, scale, x;
  Operands(std::mt19937& rng, int64_t k_, int64_t n_)
      : k(k_),
        n(n_),
        fp8_copies(std::max<int64_t>(2, (kRotationBytes + n * k - 1) / (n * k))),
        bf16_copies(std::max<int64_t>(2, (kRotationBytes + n * k * 2 - 1) / (n * k * 2))) {
    w8 = random_e4m3(rng, fp8_copies * n * k);
    w16 = allocate(bf16_copies * n * k * 2);
    for (int64_t c = 0; c < bf16_copies; ++c) {
      check(cellm::cuda::launch_decode_e4m3(w8.as<uint8_t>(), n * k, w16.as<Bf16>() + c * n * k,
                                            nullptr),
            "decode");
    }
    const std::vector<float> ones(static_cast<size_t>(n), 1.0f);
    scale = allocate(n * 4);
    check(cudaMemcpy(scale.get(), ones.data(), ones.size() * 4, cudaMemcpyHostToDevice), "scale");
    // [gate | up] rows for kSwiGLU, the first k columns of each as kPlain rows.
    x = random_bf16(rng, cellm::cuda::kGemvMaxRows * 2 * k);
    check(cudaDeviceSynchronize(), "operands");
  }
  const uint8_t* fp8(int i) const { return w8.as<uint8_t>() + (i % fp8_copies) * n * k; }
  const Bf16* bf16(int i) const { return w16.as<Bf16>() + (i % bf16_copies) * n * k; }
};

// The largest |a - b| / max(|b|, 1e-3 max|b|) over two f32 outputs.
double max_rel_diff(const DeviceBuffer& a, const DeviceBuffer& b, int64_t elements) {
  std::vector<float> ha(static_cast<size_t>(elements)), hb(static_cast<size_t>(elements));
  check(cudaMemcpy(ha.data(), a.get(), ha.size() * 4, cudaMemcpyDeviceToHost), "get");
  check(cudaMemcpy(hb.data(), b.get(), hb.size() * 4, cudaMemcpyDeviceToHost), "get");
  double scale = 0;
  for (const float v : hb) scale = std::max(scale, std::fabs(double{v}));
  double worst = 0;
  for (size_t i = 0; i < ha.size(); ++i) {
    const double d =
        std::fabs(double{ha[i]} - hb[i]) / std::max(std::fabs(double{hb[i]}), 1e-3 * scale);
    worst = std::max(worst, d);
  }
  return worst;
}

struct Options {
  int iters = 200;
  double peak_gbs = 3350;
};

void bench_shape(const char* name, int64_t k, int64_t n, GemvInput input, const Options& o,
                 std::mt19937& rng) {
  const Operands op(rng, k, n);
  DeviceBuffer y8 = allocate(cellm::cuda::kGemvMaxRows * n * 4);
  DeviceBuffer y16 = allocate(cellm::cuda::kGemvMaxRows * n * 4);
  for (const int64_t m : {1, 4, 8}) {
    const auto fp8 = [&](int i, cudaStream_t s) {
      check(
          cellm::cuda::launch_gemv_fp8<float>(op.x.as<Bf16>(), m, k, input, op.fp8(i),
                                              op.scale.as<float>(), n, nullptr, y8.as<float>(), s),
          "launch_gemv_fp8");
    };
    const auto bf16 = [&](int i, cudaStream_t s) {
      check(cellm::cuda::launch_gemv<float>(op.x.as<Bf16>(), m, k, input, op.bf16(i), n, nullptr,
                                            y16.as<float>(), s),
            "launch_gemv");
    };
    const double us8 = time_per_call(o.iters, fp8);
    const double us16 = time_per_call(o.iters, bf16);
    // Both outputs of the same weights (copy 0) for the sanity column.
    fp8(0, nullptr);
    bf16(0, nullptr);
    check(cudaDeviceSynchronize(), "outputs");
    const double gbs8 = double(n * k) / us8 / 1e3;
    const double gbs16 = double(n * k * 2) / us16 / 1e3;
    std::printf(
        "%-8s %6ld -> %6ld m=%ld | bf16 %8.2f us %7.1f GB/s %5.1f%% | e4m3 %8.2f us %7.1f "
        "GB/s %5.1f%% | x%.2f | %.1e\n",
        name, static_cast<long>(k), static_cast<long>(n), static_cast<long>(m), us16, gbs16,
        100 * gbs16 / o.peak_gbs, us8, gbs8, 100 * gbs8 / o.peak_gbs, us16 / us8,
        max_rel_diff(y8, y16, m * n));
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--iters" && i + 1 < argc) {
      o.iters = std::atoi(argv[++i]);
    } else if (arg == "--peak-gbs" && i + 1 < argc) {
      o.peak_gbs = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--iters N] [--peak-gbs G]\n", argv[0]);
      return 2;
    }
  }
  if (o.iters < 1 || !(o.peak_gbs > 0)) {
    std::fprintf(stderr, "--iters and --peak-gbs must be positive\n");
    return 2;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "gemv_fp8_bench: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "device properties");
  std::printf("%s, %d SMs; %d calls per graph; f32 outputs, no bias; %% of %.0f GB/s\n", prop.name,
              prop.multiProcessorCount, o.iters, o.peak_gbs);
  std::mt19937 rng(7);
  bench_shape("qkv", 4096, 6144, GemvInput::kPlain, o, rng);
  bench_shape("o", 4096, 4096, GemvInput::kPlain, o, rng);
  bench_shape("gate_up", 4096, 28672, GemvInput::kPlain, o, rng);
  bench_shape("down", 14336, 4096, GemvInput::kSwiGLU, o, rng);
  return 0;
}
