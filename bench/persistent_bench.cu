// persistent_bench: can one persistent kernel keep HBM streaming across dependent products?
//
//   persistent_bench [--layers L] [--iters N] [--blocks-per-sm B] [--prefetch C]
//                    [--peak-gbs G]
//
// The question behind the 8B's one-row target (issue "CUDA speed", docs/PERFORMANCE.md):
// its products, launched one after another, each stream at 71-100% of the bandwidth, and
// what is lost sits at their edges (ramp and tail), which PDL only partly overlaps. This
// bench chains the one-row products of L Llama-3-8B layers (qkv 4096 -> 6144, o 4096 ->
// 4096, gate_up 4096 -> 28672, down 14336 -> 4096; default L = 32), each product's input
// being the first k values of the previous one's output, and times the chain two ways:
//   graph       one launch_gemv (kRows, cellm's decode GEMV) per product, captured in a
//               CUDA graph with programmatic dependent launch, as a decode step runs them;
//   persistent  one cooperative kernel: every warp owns row groups of every product and,
//               before the grid barrier that publishes a product's output, already holds
//               the first weights of its next product in registers and has asked the L2
//               for C more chunks of them (default 4), so the weight stream need not stop
//               at a product's edge.
// Prints ms per chain, the weight bytes over the time against G (default 4250 GB/s), and
// the outputs' largest difference after the first layer and at the end (different sum
// orders, same f32 accumulation: a sanity check, not a tolerance test).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cellm/status.h"
#include "cuda/kernels/gemv.h"

namespace {

using Bf16 = __nv_bfloat16;

void check(cudaError_t err, const char* what) {
  CELLM_CHECK_MSG(err == cudaSuccess, std::string(what) + ": " + cudaGetErrorString(err));
}

constexpr int kWarps = 8;        // warps per block
constexpr int kRows = 4;         // weight rows a warp group owns
constexpr int kUnroll = 2;       // chunks in flight per warp
constexpr int kChunkCols = 256;  // a warp's chunk: 32 lanes x 8 bf16 of each row

// One product of the chain: y[n] = w[n, k] · x[k].
struct Product {
  const Bf16* w;
  const Bf16* x;
  Bf16* y;
  int64_t n;
  int k;
  int split;  // warps sharing a row group's chunks (1, 2, 4 or 8)
};

struct ChainParams {
  const Product* products;
  int n_products;
  unsigned* barrier;  // arrivals, zero before the launch
  int prefetch;       // chunks per row asked of the L2 before a barrier
};

__device__ __forceinline__ uint4 load_weights(const Bf16* p) {
  uint4 v;
  asm volatile("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

__device__ __forceinline__ void add_products(const uint4& w, const uint4& x, float& acc) {
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
  const uint32_t xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 wf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&ws[i]));
    const float2 xf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&xs[i]));
    acc = fmaf(wf.x, xf.x, acc);
    acc = fmaf(wf.y, xf.y, acc);
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Where a warp's work in product p starts: its first row group and chunk. Consecutive
// groups go to consecutive blocks, so a product of fewer groups than the grid has warp
// groups still spreads over every SM; a warp's next group is gridDim.x * (kWarps / split)
// further.
struct Start {
  int64_t group;
  int part;
};
__device__ __forceinline__ Start start_of(const Product& q, int warp) {
  return {int64_t{warp / q.split} * gridDim.x + blockIdx.x, warp % q.split};
}

// Loads the kUnroll chunks from c0 of rows [row0, row0 + kRows) of q (rows past n read row
// n - 1; columns past k read zeros).
__device__ __forceinline__ void load_run(const Product& q, int64_t row0, int c0, int lane,
                                         uint4 (&wv)[kUnroll][kRows]) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int col = (c0 + u) * kChunkCols + 8 * lane;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t row = min(row0 + r, q.n - 1);
      wv[u][r] = col < q.k ? load_weights(q.w + row * q.k + col) : make_uint4(0, 0, 0, 0);
    }
  }
}

__global__ void __launch_bounds__(kWarps * 32) chain_kernel(const ChainParams p) {
  __shared__ float s_parts[kWarps][kRows];
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t block_groups_stride = int64_t{gridDim.x};  // times groups per block
  uint4 wv[kUnroll][kRows];

  // The first run of product 0 before anything else.
  {
    const Product q = p.products[0];
    const Start s = start_of(q, warp);
    load_run(q, s.group * kRows, s.part * kUnroll, lane, wv);
  }
  for (int pi = 0; pi < p.n_products; ++pi) {
    const Product q = p.products[pi];
    const int S = q.split;
    const int groups_per_block = kWarps / S;
    const int64_t groups = (q.n + kRows - 1) / kRows;
    const int64_t rounds = (groups + block_groups_stride * groups_per_block - 1) /
                           (block_groups_stride * groups_per_block);
    const int chunks = (q.k + kChunkCols - 1) / kChunkCols;
    const int stride = S * kUnroll;
    const Start s = start_of(q, warp);

    // The barrier that publishes product pi - 1's output (this product's x).
    if (pi > 0) {
      __syncthreads();
      if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(p.barrier, 1u);
        const unsigned target = static_cast<unsigned>(pi) * gridDim.x;
        while (*reinterpret_cast<volatile unsigned*>(p.barrier) < target) {
        }
        __threadfence();
      }
      __syncthreads();
    }

    for (int64_t round = 0; round < rounds; ++round) {
      const int64_t group = s.group + round * block_groups_stride * groups_per_block;
      const int64_t row0 = group * kRows;
      float acc[kRows] = {};
      for (int c0 = s.part * kUnroll; c0 < chunks; c0 += stride) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int col = (c0 + u) * kChunkCols + 8 * lane;
          if (col >= q.k) continue;
          // Through the L2: x was written by other SMs since this launch began.
          const uint4 xv = __ldcg(reinterpret_cast<const uint4*>(q.x + col));
#pragma unroll
          for (int r = 0; r < kRows; ++r) add_products(wv[u][r], xv, acc[r]);
        }
        // The next run: of this group, else of this warp's next group, else the first
        // run of the next product (its weights need no barrier), plus L2 prefetches of
        // that product's following chunks.
        if (c0 + stride < chunks) {
          load_run(q, row0, c0 + stride, lane, wv);
        } else if (round + 1 < rounds) {
          load_run(q, row0 + block_groups_stride * groups_per_block * kRows, s.part * kUnroll, lane,
                   wv);
        } else if (pi + 1 < p.n_products) {
          const Product next = p.products[pi + 1];
          const Start ns = start_of(next, warp);
          load_run(next, ns.group * kRows, ns.part * kUnroll, lane, wv);
          const int next_chunks = (next.k + kChunkCols - 1) / kChunkCols;
          if ((lane & 7) == 0) {
            for (int i = 1; i <= p.prefetch; ++i) {
              const int c = ns.part * kUnroll + i * next.split * kUnroll;
              if (c >= next_chunks) break;
#pragma unroll
              for (int u = 0; u < kUnroll; ++u) {
                const int col = (c + u) * kChunkCols + 8 * lane;
                if (col >= next.k) continue;
#pragma unroll
                for (int r = 0; r < kRows; ++r) {
                  prefetch_l2(next.w + min(ns.group * kRows + r, next.n - 1) * next.k + col);
                }
              }
            }
          }
        }
      }
      float sums[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) sums[r] = warp_sum(acc[r]);
      if (S > 1) {
        if (lane == 0) {
#pragma unroll
          for (int r = 0; r < kRows; ++r) s_parts[warp][r] = sums[r];
        }
        __syncthreads();
        if (s.part == 0) {
          for (int w = warp + 1; w < warp + S; ++w) {
#pragma unroll
            for (int r = 0; r < kRows; ++r) sums[r] += s_parts[w][r];
          }
        }
        __syncthreads();  // s_parts is reused by the next round
      }
      if (s.part == 0 && lane < kRows && row0 + lane < q.n) {
        float v = sums[0];
#pragma unroll
        for (int r = 1; r < kRows; ++r) v = lane == r ? sums[r] : v;
        q.y[row0 + lane] = __float2bfloat16(v);
      }
    }
  }
}

// Uniform values in [-a, a] from a hash of the index (fills 14 GB in milliseconds).
__global__ void fill_kernel(Bf16* out, int64_t n, uint64_t seed, float a) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint64_t h = (static_cast<uint64_t>(i) + seed) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    const float u = static_cast<float>(h >> 40) / static_cast<float>(1 << 24);  // [0, 1)
    out[i] = __float2bfloat16((2.f * u - 1.f) * a);
  }
}

void fill(Bf16* out, int64_t n, uint64_t seed, float a) {
  fill_kernel<<<1024, 256>>>(out, n, seed, a);
  check(cudaGetLastError(), "fill");
}

std::vector<float> download(const Bf16* p, int64_t n) {
  std::vector<Bf16> h(static_cast<size_t>(n));
  check(cudaMemcpy(h.data(), p, h.size() * sizeof(Bf16), cudaMemcpyDeviceToHost), "download");
  std::vector<float> f(h.size());
  for (size_t i = 0; i < h.size(); ++i) f[i] = __bfloat162float(h[i]);
  return f;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float d = 0.f;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

// Warps per row group: doubled while the product's groups leave warps of the grid idle and
// each warp keeps at least two runs (as the kRows launcher's rule, for one wave).
int split_for(int64_t n, int k, int64_t warps) {
  const int64_t groups = (n + kRows - 1) / kRows;
  const int chunks = (k + kChunkCols - 1) / kChunkCols;
  int split = 1;
  while (split < kWarps && groups * split * 2 <= warps && chunks >= 2 * split * 2 * kUnroll) {
    split *= 2;
  }
  return split;
}

}  // namespace

int main(int argc, char** argv) {
  int layers = 32, iters = 10, blocks_per_sm = 2, prefetch = 4;
  double peak_gbs = 4250;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--layers")
      layers = std::max(1, std::atoi(argv[i + 1]));
    else if (flag == "--iters")
      iters = std::max(1, std::atoi(argv[i + 1]));
    else if (flag == "--blocks-per-sm")
      blocks_per_sm = std::max(1, std::atoi(argv[i + 1]));
    else if (flag == "--prefetch")
      prefetch = std::max(0, std::atoi(argv[i + 1]));
    else if (flag == "--peak-gbs")
      peak_gbs = std::atof(argv[i + 1]);
  }
  int device = 0, sms = 0, cooperative = 0, per_sm = 0;
  check(cudaGetDevice(&device), "device");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "SMs");
  check(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device), "coop");
  CELLM_CHECK_MSG(cooperative != 0, "the device has no cooperative launch");
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, chain_kernel, kWarps * 32, 0),
        "occupancy");
  blocks_per_sm = std::min(blocks_per_sm, per_sm);
  const int blocks = sms * blocks_per_sm;
  const int64_t warps = int64_t{blocks} * kWarps;

  // The 8B layer's products: {k, n}; each input is the previous output's first k values.
  const int64_t shapes[4][2] = {{4096, 6144}, {4096, 4096}, {4096, 28672}, {14336, 4096}};
  std::vector<Product> products;
  int64_t weight_bytes = 0, max_out = 0;
  std::vector<Bf16*> owned;
  auto alloc = [&](int64_t elems) {
    Bf16* p = nullptr;
    check(cudaMalloc(&p, static_cast<size_t>(elems) * sizeof(Bf16)), "cudaMalloc");
    owned.push_back(p);
    return p;
  };
  Bf16* x0 = alloc(14336);
  fill(x0, 14336, 1, 1.f);
  const Bf16* x = x0;
  for (int l = 0; l < layers; ++l) {
    for (const auto& s : shapes) {
      const int k = static_cast<int>(s[0]);
      const int64_t n = s[1];
      Bf16* w = alloc(n * k);
      // Uniform in +-sqrt(3 / k): the outputs keep the inputs' RMS.
      fill(w, n * k, 1000 + products.size(), std::sqrt(3.f / static_cast<float>(k)));
      Bf16* y = alloc(std::max<int64_t>(n, 14336));
      check(cudaMemset(y, 0, static_cast<size_t>(std::max<int64_t>(n, 14336)) * sizeof(Bf16)),
            "clear y");
      products.push_back({w, x, y, n, k, split_for(n, k, warps)});
      weight_bytes += n * k * 2;
      max_out = std::max(max_out, n);
      x = y;
    }
  }
  Product* dev_products = nullptr;
  check(cudaMalloc(&dev_products, products.size() * sizeof(Product)), "products");
  check(cudaMemcpy(dev_products, products.data(), products.size() * sizeof(Product),
                   cudaMemcpyHostToDevice),
        "upload products");
  unsigned* barrier = nullptr;
  check(cudaMalloc(&barrier, sizeof(unsigned)), "barrier");
  check(cudaDeviceSynchronize(), "fill");

  cudaStream_t stream = nullptr;
  check(cudaStreamCreate(&stream), "stream");
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");

  // (a) the graph of kRows launches.
  cudaGraph_t graph = nullptr;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
  for (const Product& q : products) {
    check(cellm::cuda::launch_gemv<Bf16>(q.x, 1, q.k, cellm::cuda::GemvInput::kPlain, q.w, q.n,
                                         nullptr, q.y, stream, cellm::cuda::GemvKernel::kRows),
          "launch_gemv");
  }
  check(cudaStreamEndCapture(stream, &graph), "end capture");
  cudaGraphExec_t exec = nullptr;
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  check(cudaGraphLaunch(exec, stream), "warm-up");
  check(cudaStreamSynchronize(stream), "warm-up");
  const std::vector<float> graph_first = download(products[3].y, products[3].n);
  const std::vector<float> graph_last = download(products.back().y, products.back().n);
  float graph_ms = 1e30f;
  for (int i = 0; i < iters; ++i) {
    check(cudaEventRecord(start, stream), "record");
    check(cudaGraphLaunch(exec, stream), "replay");
    check(cudaEventRecord(stop, stream), "record");
    check(cudaEventSynchronize(stop), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    graph_ms = std::min(graph_ms, ms);
  }

  // (b) the persistent kernel.
  for (const Product& q : products) {
    check(cudaMemset(q.y, 0, static_cast<size_t>(q.n) * sizeof(Bf16)), "clear y");
  }
  ChainParams params{dev_products, static_cast<int>(products.size()), barrier, prefetch};
  void* args[] = {&params};
  auto run_chain = [&] {
    check(cudaMemsetAsync(barrier, 0, sizeof(unsigned), stream), "clear barrier");
    check(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(chain_kernel), dim3(blocks),
                                      dim3(kWarps * 32), args, 0, stream),
          "cooperative launch");
  };
  run_chain();
  check(cudaStreamSynchronize(stream), "chain");
  const std::vector<float> chain_first = download(products[3].y, products[3].n);
  const std::vector<float> chain_last = download(products.back().y, products.back().n);
  float chain_ms = 1e30f;
  for (int i = 0; i < iters; ++i) {
    check(cudaEventRecord(start, stream), "record");
    run_chain();
    check(cudaEventRecord(stop, stream), "record");
    check(cudaEventSynchronize(stop), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    chain_ms = std::min(chain_ms, ms);
  }

  const double gb = static_cast<double>(weight_bytes) / 1e9;
  std::printf(
      "%d layers of 8B one-row products, %.2f GB of weights; %d SMs x %d blocks of %d "
      "warps, L2 prefetch %d chunks; best of %d\n",
      layers, gb, sms, blocks_per_sm, kWarps, prefetch, iters);
  std::printf("  graph of kRows GEMVs: %8.3f ms  %5.1f%% of %.0f GB/s\n", graph_ms,
              100.0 * gb / (graph_ms * 1e-3) / peak_gbs, peak_gbs);
  std::printf("  persistent kernel:    %8.3f ms  %5.1f%% of %.0f GB/s\n", chain_ms,
              100.0 * gb / (chain_ms * 1e-3) / peak_gbs, peak_gbs);
  std::printf("  largest difference: after layer 1 %.3g, at the end %.3g (outputs' RMS ~1)\n",
              max_abs_diff(graph_first, chain_first), max_abs_diff(graph_last, chain_last));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  for (Bf16* p : owned) cudaFree(p);
  cudaFree(dev_products);
  cudaFree(barrier);
  return 0;
}
