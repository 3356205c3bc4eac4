// sync_stream_bench: what a grid-wide "the next input is ready" signal costs a persistent
// kernel whose blocks stream weights through a shared-memory ring, and whether a signal
// relayed inside thread-block clusters costs less.
//
//   sync_stream_bench [--stages-per-block N] [--stages S] [--iters N] [--quick] [--script]
//
// The persistent one-row kernel (src/cuda/kernels/decode_layers.cu) streams each product's
// weights into a ring of shared-memory stages from one producer lane a block, and between
// products its blocks count themselves in on a global counter and poll it before they read
// the next product's input from the L2. Session 27 (docs/PERFORMANCE.md) found those counts
// cost about as long as the weight bytes the ring keeps in flight: the poll's answer and
// the input's bytes come back to the SM behind them. This bench isolates that, with no
// arithmetic: every block is a producer lane (16 KB bulk copies into S stages) and a
// consumer lane (waits for a stage to land, frees it); every P stages the consumer stops
// at a sync and goes on only once the signal and X bytes of "input" have arrived. Modes:
//   stream  no syncs: the ring's copy rate, the bound of the others.
//   count   decode_layers.cu's way: each block adds one to a global counter (a release
//           add), polls it (acquire loads) until every block is in, then bulk-copies the
//           X input bytes from global memory into its shared memory.
//   relay   clusters of C blocks; rank 0 streams nothing. The others count themselves in;
//           rank 0, whose SM has no weights in flight, polls, copies the input into its
//           own shared memory, and pushes it and the signal to its peers through
//           distributed shared memory (a shared::cta -> shared::cluster bulk copy and a
//           remote mbarrier arrive), so nothing comes back to a streaming SM through the
//           L2's return path.
//   mcast   relay, but rank 0 sends the input with one multicast bulk copy from global
//           memory to every peer.
// Each row is also run with the producers streaming nothing (idle): the signal alone.
// --script runs whole layers' chains instead (run_scripts below).
// Printed per row: the launch time, the streamed bytes' rate, and the signal's latency,
// from the last block's arrival to each block having its input (mean over blocks and
// syncs, and the mean over syncs of the slowest block), from %globaltimer.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda/kernels/mbarrier.cuh"  // barriers and the global -> shared bulk copy

namespace {

using cellm::cuda::detail::barrier_arrive;
using cellm::cuda::detail::barrier_arrive_expect;
using cellm::cuda::detail::barrier_init;
using cellm::cuda::detail::barrier_wait;
using cellm::cuda::detail::bulk_copy;
using cellm::cuda::detail::fence_barrier_init;
using cellm::cuda::detail::smem_addr;

constexpr int kStageBytes = 16 * 1024;
constexpr int kMaxStages = 12;
constexpr int kMaxXBytes = 128 * 1024;     // count mode; a cluster mode's input is <= 16 KB
constexpr int kMaxSmemBytes = 227 * 1024;  // an H100 / H200 block's dynamic limit
constexpr int kThreads = 64;               // warp 0: the producer lane; warp 1: the consumer lane

enum Mode : int { kStream = 0, kCount = 1, kRelay = 2, kMcast = 3 };

struct Params {
  const unsigned char* weights;  // chunks x kStageBytes
  int64_t chunks;
  const unsigned char* x;  // the input, kMaxXBytes
  uint32_t* counter;
  long long* t_arrive;  // [streamers][epochs]
  long long* t_ready;   // [streamers][epochs]
  long long* t_seen;    // [grid][epochs]: a relay's rank 0 saw every block in
  int stages;           // ring stages
  int stages_per_block;
  int period;   // stages between syncs
  int epochs;   // stages_per_block / period (0 in kStream)
  int x_bytes;  // count mode: a multiple of 16 KB above 16 KB (copied 16 KB at a time)
  int mode;
  int cluster;  // C (1 outside relay and mcast)
  int stream;   // 0: the producers copy nothing (the signal alone)
};

__device__ __forceinline__ long long now_ns() {
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

__device__ __forceinline__ uint32_t cluster_id() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(r));
  return r;
}

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::
                   : "memory");
}

// The shared::cluster address of this block's `p` in the block of rank `rank`.
__device__ __forceinline__ uint32_t peer_addr(const void* p, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(smem_addr(p)), "r"(rank));
  return r;
}

// Waits for phase `parity` of a barrier a peer may arrive on (acquire at cluster scope).
__device__ __forceinline__ void cluster_barrier_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  for (uint32_t tries = 0; !done; ++tries) {
    if (tries == (1u << 26)) __trap();
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  }
}

__device__ __forceinline__ void count_in(uint32_t* counter) {
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
}

__device__ __forceinline__ void poll(const uint32_t* counter, uint32_t target) {
  uint32_t seen = 0;
  for (uint32_t tries = 0;; ++tries) {
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
    if (seen >= target) return;
    if (tries == (1u << 26)) __trap();  // a lost block: a launch error, not a hang
  }
}

// The producer lane: `count` 16 KB stages into a ring of `stages`, stage i of streamer
// `index` (of `streamers`) being chunk i x streamers + index of the weights.
__device__ __forceinline__ void produce(const unsigned char* weights, int64_t chunks, int count,
                                        int streamers, int index, unsigned char* ring, int stages,
                                        uint64_t* full, uint64_t* empty) {
  for (int i = 0; i < count; ++i) {
    const int slot = i % stages;
    if (i >= stages) barrier_wait(&empty[slot], ((i / stages) - 1) & 1);
    const int64_t chunk = (int64_t{i} * streamers + index) % chunks;
    barrier_arrive_expect(&full[slot], kStageBytes);
    bulk_copy(ring + slot * kStageBytes, weights + chunk * kStageBytes, kStageBytes, &full[slot]);
  }
}

__global__ void __launch_bounds__(kThreads, 1) sync_stream_kernel(Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* ring = smem;
  unsigned char* xbuf = smem + p.stages * kStageBytes;
  auto* full = reinterpret_cast<uint64_t*>(xbuf + (p.x_bytes + 127) / 128 * 128);
  uint64_t* empty = full + kMaxStages;
  uint64_t* go = empty + kMaxStages;  // the signal (and input) for the current sync
  uint64_t* own = go + 1;             // a relay's rank 0: its own copy of the input

  const bool clustered = p.mode == kRelay || p.mode == kMcast;
  const uint32_t rank = clustered ? cluster_rank() : 0;
  const bool leader = clustered && rank == 0;
  const int streamers = clustered ? static_cast<int>(gridDim.x / p.cluster) * (p.cluster - 1)
                                  : static_cast<int>(gridDim.x);
  const int sidx = clustered ? static_cast<int>(cluster_id() * (p.cluster - 1) + rank - 1)
                             : static_cast<int>(blockIdx.x);
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int warp = static_cast<int>(threadIdx.x >> 5);

  if (threadIdx.x == 0) {
    for (int s = 0; s < p.stages; ++s) {
      barrier_init(&full[s], 1);
      barrier_init(&empty[s], 1);
    }
    // go: the consumer's own arrive, and in a cluster rank 0's remote one.
    barrier_init(go, clustered ? 2 : 1);
    barrier_init(own, 1);
    fence_barrier_init();
  }
  if (clustered) {
    cluster_sync();  // every block's barriers exist before a peer arrives on them
  } else {
    __syncthreads();
  }

  if (!leader && warp == 0 && lane == 0 && p.stream) {
    produce(p.weights, p.chunks, p.stages_per_block, streamers, sidx, ring, p.stages, full, empty);
  }

  if (!leader && warp == 1 && lane == 0) {
    int epoch = 0;
    for (int i = 0; i < p.stages_per_block; ++i) {
      if (p.stream) {
        const int slot = i % p.stages;
        barrier_wait(&full[slot], (i / p.stages) & 1);
        barrier_arrive(&empty[slot]);
      }
      if (p.mode == kStream || (i + 1) % p.period != 0 || epoch >= p.epochs) continue;
      // A sync: count in, then wait for the signal and the input.
      const long long arrived = now_ns();
      if (clustered) {
        if (p.x_bytes > 0) {
          barrier_arrive_expect(go, static_cast<uint32_t>(p.x_bytes));
        } else {
          barrier_arrive(go);
        }
        count_in(p.counter);
        cluster_barrier_wait(go, epoch & 1);
      } else {
        count_in(p.counter);
        poll(p.counter, static_cast<uint32_t>((epoch + 1) * streamers));
        if (p.x_bytes > 0) {
          barrier_arrive_expect(go, static_cast<uint32_t>(p.x_bytes));
          for (int off = 0; off < p.x_bytes; off += 16 * 1024) {
            bulk_copy(xbuf + off, p.x + off, static_cast<uint32_t>(min(16 * 1024, p.x_bytes - off)),
                      go);
          }
          barrier_wait(go, epoch & 1);
        }
      }
      const long long ready = now_ns();
      p.t_arrive[int64_t{sidx} * p.epochs + epoch] = arrived;
      p.t_ready[int64_t{sidx} * p.epochs + epoch] = ready;
      ++epoch;
    }
  }

  if (leader && warp == 1) {
    // Lane 0 polls and fetches the input; then lane r (1 <= r < C) serves peer r, so the
    // peers hear at once rather than one after another.
    const uint32_t peers_mask = ((1u << p.cluster) - 1) & ~1u;
    for (int epoch = 0; epoch < p.epochs; ++epoch) {
      if (lane == 0) {
        poll(p.counter, static_cast<uint32_t>((epoch + 1) * streamers));
        p.t_seen[int64_t{blockIdx.x} * p.epochs + epoch] = now_ns();
        if (p.x_bytes > 0 && p.mode == kRelay) {
          barrier_arrive_expect(own, static_cast<uint32_t>(p.x_bytes));
          bulk_copy(xbuf, p.x, static_cast<uint32_t>(p.x_bytes), own);
        }
        if (p.x_bytes > 0 && p.mode == kMcast) {
          asm volatile(
              "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::"
              "cluster [%0], [%1], %2, [%3], %4;" ::"r"(smem_addr(xbuf)),
              "l"(p.x), "r"(p.x_bytes), "r"(smem_addr(go)), "h"(static_cast<uint16_t>(peers_mask))
              : "memory");
        }
      }
      __syncwarp();
      if (p.x_bytes > 0 && p.mode == kRelay) barrier_wait(own, epoch & 1);
      if (lane >= 1 && lane < p.cluster) {
        const auto r = static_cast<uint32_t>(lane);
        if (p.x_bytes > 0 && p.mode == kRelay) {
          asm volatile(
              "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], "
              "%2, [%3];" ::"r"(peer_addr(xbuf, r)),
              "r"(smem_addr(xbuf)), "r"(p.x_bytes), "r"(peer_addr(go, r))
              : "memory");
        }
        asm volatile(
            "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(peer_addr(go, r))
            : "memory");
      }
      __syncwarp();
    }
    // The last sync's copies must land before rank 0's shared memory goes away: the peers
    // wait for them before the cluster barrier below.
  }
  __syncwarp();
  if (clustered) {
    cluster_sync();
  }
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "sync_stream_bench: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// The median time of `iters` launches of `kernel` (after two untimed), each after
// `counter_bytes` of counters are zeroed; events on the legacy stream.
template <typename Params>
double median_launch_us(const cudaLaunchConfig_t& config, void (*kernel)(Params), const Params& p,
                        void* counters, size_t counter_bytes, int iters) {
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  std::vector<float> times;
  for (int it = 0; it < iters + 2; ++it) {
    check(cudaMemset(counters, 0, counter_bytes), "reset counters");
    check(cudaEventRecord(start), "record");
    check(cudaLaunchKernelEx(&config, kernel, p), "launch");
    check(cudaEventRecord(stop), "record");
    check(cudaEventSynchronize(stop), "run");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    if (it >= 2) times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return 1e3 * times[times.size() / 2];
}

// --- A layer's chain as a script (--script): which syncs a persistent design makes ---
//
// The producer streams as above; the consumer lane walks `layers` copies of a script of
// steps: consume S stages, then a sync, then read R bytes of input from the L2 (16 KB
// bulk copies). Syncs:
//   grid     every block counts in on one counter and polls it (with spin_ns, blocks
//            0-7 first spend that long on the chain: the five-sync chain's attention);
//   group    blocks b % 8 == g count in on group g's counter; block g polls it, spends
//            spin_ns (a kv head's attention), then sets the group's flag, which the other
//            members poll;
//   reduce   each cluster's ranks 1..C-1 copy an 8 KB partial sum into rank 0's shared
//            memory over distributed shared memory; rank 0 waits for them, spends spin_ns
//            (their sum), writes 8 KB to global memory and counts in; every block polls
//            for every cluster's rank 0;
//   none     no sync (the same stages streamed: the script's bound).
enum SyncKind : int { kGridSync = 0, kGroupWait = 1, kClusterReduce = 2, kNoSync = 3 };
struct Step {
  int stages;
  int kind;
  int read_bytes;
  int spin_ns;
};
constexpr int kMaxSteps = 8;
constexpr int kGroups = 8;
constexpr int kPartialBytes = 8 * 1024;

struct ScriptParams {
  const unsigned char* weights;
  int64_t chunks;
  const unsigned char* x;  // kMaxXBytes
  unsigned char* out;      // [grid][kPartialBytes]
  uint32_t* counters;      // [0] grid, [1 + g] group g's count, [1 + kGroups + g] its flag
  Step steps[kMaxSteps];
  int n_steps;
  int layers;
  int stages;  // ring
  int xcap;    // bytes of the input buffer
  int cluster;
  int stream;
};

__device__ __forceinline__ void spin_for(int ns) {
  const long long t0 = now_ns();
  while (now_ns() - t0 < ns) {
  }
}

__global__ void __launch_bounds__(kThreads, 1) script_kernel(ScriptParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* ring = smem;
  unsigned char* xbuf = smem + p.stages * kStageBytes;
  auto* full = reinterpret_cast<uint64_t*>(xbuf + p.xcap);
  uint64_t* empty = full + kMaxStages;
  uint64_t* go = empty + kMaxStages;  // the input read after a sync
  uint64_t* red = go + 1;             // rank 0: the peers' partial sums

  const auto b = static_cast<int>(blockIdx.x);
  const auto blocks = static_cast<int>(gridDim.x);
  const uint32_t rank = cluster_rank();
  const int clusters = blocks / p.cluster;
  const int g = b % kGroups;
  const int members = blocks / kGroups + (g < blocks % kGroups ? 1 : 0);
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int warp = static_cast<int>(threadIdx.x >> 5);
  int per_layer = 0;
  for (int s = 0; s < p.n_steps; ++s) per_layer += p.steps[s].stages;
  const int total = per_layer * p.layers;

  if (threadIdx.x == 0) {
    for (int s = 0; s < p.stages; ++s) {
      barrier_init(&full[s], 1);
      barrier_init(&empty[s], 1);
    }
    barrier_init(go, 1);
    barrier_init(red, 1);
    fence_barrier_init();
  }
  cluster_sync();

  if (warp == 0 && lane == 0 && p.stream) {
    produce(p.weights, p.chunks, total, blocks, b, ring, p.stages, full, empty);
  }

  if (warp == 1 && lane == 0) {
    int i = 0;
    uint32_t grid_target = 0, group_epoch = 0, go_phase = 0, red_phase = 0;
    for (int layer = 0; layer < p.layers; ++layer) {
      for (int s = 0; s < p.n_steps; ++s) {
        const Step st = p.steps[s];
        for (int k = 0; k < st.stages; ++k, ++i) {
          if (!p.stream) continue;
          const int slot = i % p.stages;
          barrier_wait(&full[slot], (i / p.stages) & 1);
          barrier_arrive(&empty[slot]);
        }
        if (st.kind == kGridSync) {
          if (st.spin_ns > 0 && b < kGroups) spin_for(st.spin_ns);
          count_in(&p.counters[0]);
          grid_target += static_cast<uint32_t>(blocks);
          poll(&p.counters[0], grid_target);
        } else if (st.kind == kGroupWait) {
          ++group_epoch;
          count_in(&p.counters[1 + g]);
          uint32_t* flag = &p.counters[1 + kGroups + g];
          if (b < kGroups) {
            poll(&p.counters[1 + g], group_epoch * static_cast<uint32_t>(members));
            spin_for(st.spin_ns);
            asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(flag), "r"(group_epoch)
                         : "memory");
          } else {
            poll(flag, group_epoch);
          }
        } else if (st.kind == kClusterReduce) {
          if (rank != 0) {
            asm volatile(
                "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], "
                "[%1], %2, [%3];" ::"r"(peer_addr(xbuf + (rank - 1) * kPartialBytes, 0)),
                "r"(smem_addr(xbuf)), "r"(kPartialBytes), "r"(peer_addr(red, 0))
                : "memory");
          } else {
            barrier_arrive_expect(red, static_cast<uint32_t>((p.cluster - 1) * kPartialBytes));
            cluster_barrier_wait(red, red_phase);
            red_phase ^= 1;
            spin_for(st.spin_ns);
            asm volatile(
                "cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n"
                "cp.async.bulk.commit_group;\n"
                "cp.async.bulk.wait_group 0;" ::"l"(p.out + int64_t{b} * kPartialBytes),
                "r"(smem_addr(xbuf)), "r"(kPartialBytes)
                : "memory");
            count_in(&p.counters[0]);
          }
          grid_target += static_cast<uint32_t>(clusters);
          poll(&p.counters[0], grid_target);
        }
        if (st.read_bytes > 0) {
          barrier_arrive_expect(go, static_cast<uint32_t>(st.read_bytes));
          for (int off = 0; off < st.read_bytes; off += 16 * 1024) {
            bulk_copy(xbuf + off, p.x + off,
                      static_cast<uint32_t>(min(16 * 1024, st.read_bytes - off)), go);
          }
          barrier_wait(go, go_phase);
          go_phase ^= 1;
        }
      }
    }
  }
  __syncwarp();
  cluster_sync();
}

// Runs the layer scripts (--script): the five-sync chain decode_layers.cu has, the
// two-sync design of docs/PERFORMANCE.md (session 28), each with and without its chain's
// work, and their stages streamed with no sync; prints each launch's median time and its
// loss a layer against the streamed bound.
void run_scripts(const unsigned char* weights, int64_t chunks, const unsigned char* x, int iters) {
  constexpr int kCluster = 8, kLayers = 16, kXcap = 128 * 1024;  // 16 clusters' partials
  constexpr int kBarrierBytes = (2 * kMaxStages + 2) * 8;
  const int ring = std::min(kMaxStages, (kMaxSmemBytes - kXcap - kBarrierBytes) / kStageBytes);
  check(cudaFuncSetAttribute(script_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kMaxSmemBytes),
        "opt in to shared memory");
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = kCluster;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  config.attrs = &attr;
  config.numAttrs = 1;
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = static_cast<size_t>(ring) * kStageBytes + kXcap + kBarrierBytes;
  config.gridDim = dim3(kCluster);
  int clusters = 0;
  check(cudaOccupancyMaxActiveClusters(&clusters, script_kernel, &config), "cluster occupancy");
  const int blocks = clusters * kCluster;
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  uint32_t* counters = nullptr;
  unsigned char* out = nullptr;
  check(cudaMalloc(&counters, (1 + 2 * kGroups) * sizeof(uint32_t)), "cudaMalloc counters");
  check(cudaMalloc(&out, static_cast<size_t>(blocks) * kPartialBytes), "cudaMalloc partials");

  // Stages a block streams a 1B layer (16 KB stages over `blocks` blocks): q/k/v 12.6 MB,
  // o 8.4, gate_up 67.1, down 33.5.
  const auto per_block = [&](double mb) {
    return std::max(1, static_cast<int>(mb * 1e6 / blocks / kStageBytes + 0.5));
  };
  const int qkv = per_block(12.58), o = per_block(8.39), gate_up = per_block(67.11),
            down = per_block(33.55);
  struct Script {
    const char* name;
    std::vector<Step> steps;
  };
  const auto five = [&](int attention_ns) {
    return std::vector<Step>{{qkv, kGridSync, 4096, 0},
                             {0, kGridSync, 4096, attention_ns},
                             {o, kGridSync, 16384, 0},
                             {gate_up, kGridSync, 16384, 0},
                             {down, kGridSync, 16384, 0}};
  };
  const auto two = [&](int attention_ns, int sum_ns) {
    return std::vector<Step>{
        {qkv, kGroupWait, 512, attention_ns},
        {o, kGridSync, 65536, 0},
        {gate_up + down, kClusterReduce, std::min(clusters * kPartialBytes, kXcap), sum_ns}};
  };
  const Script scripts[] = {
      {"streamed, no sync", {{qkv + o + gate_up + down, kNoSync, 0, 0}}},
      {"five grid syncs", five(0)},
      {"five grid syncs, 1.5 us attention", five(1500)},
      {"two syncs + group wait + reduce", two(0, 0)},
      {"the same, 1.5 us attention, 0.3 us sum", two(1500, 300)},
  };
  std::printf(
      "\nlayer scripts: %d blocks (clusters of %d), a ring of %d stages, %d layers of %d + %d + "
      "%d + %d stages (q/k/v, o, gate_up, down)\n",
      blocks, kCluster, ring, kLayers, qkv, o, gate_up, down);
  std::printf("script                                   | stream |      us | lost a layer us\n");
  double bound = 0;
  for (int stream : {1, 0}) {
    for (const Script& sc : scripts) {
      ScriptParams p{};
      p.weights = weights;
      p.chunks = chunks;
      p.x = x;
      p.out = out;
      p.counters = counters;
      p.n_steps = static_cast<int>(sc.steps.size());
      for (int s = 0; s < p.n_steps; ++s) p.steps[s] = sc.steps[static_cast<size_t>(s)];
      p.layers = kLayers;
      p.stages = ring;
      p.xcap = kXcap;
      p.cluster = kCluster;
      p.stream = stream;
      const double us = median_launch_us(config, script_kernel, p, counters,
                                         (1 + 2 * kGroups) * sizeof(uint32_t), iters);
      if (sc.steps[0].kind == kNoSync) bound = us;
      std::printf("%-40s | %6s | %7.1f | %15.2f\n", sc.name, stream ? "yes" : "idle", us,
                  (us - bound) / kLayers);
    }
  }
  cudaFree(counters);
  cudaFree(out);
}

struct Row {
  const char* name;
  int mode;
  int cluster;
  int period;
  int x_bytes;
};

const char* mode_name(int mode) {
  switch (mode) {
    case kStream:
      return "stream";
    case kCount:
      return "count";
    case kRelay:
      return "relay";
    default:
      return "mcast";
  }
}

}  // namespace

int main(int argc, char** argv) {
  int stages_per_block = 1024, stages = 8, iters = 10;
  bool quick = false, script = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--stages-per-block") == 0 && i + 1 < argc) {
      stages_per_block = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--stages") == 0 && i + 1 < argc) {
      stages = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
      iters = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--script") == 0) {
      script = true;
    } else {
      std::fprintf(stderr, "sync_stream_bench: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (stages < 2 || stages > kMaxStages || stages_per_block < stages) {
    std::fprintf(stderr, "sync_stream_bench: --stages in [2, %d], --stages-per-block >= stages\n",
                 kMaxStages);
    return 2;
  }
  int device = 0, sms = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "SM count");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "device properties");

  constexpr int64_t kWeightBytes = int64_t{1} << 30;
  const int64_t chunks = kWeightBytes / kStageBytes;
  unsigned char *weights = nullptr, *x = nullptr;
  uint32_t* counter = nullptr;
  check(cudaMalloc(&weights, kWeightBytes), "cudaMalloc weights");
  check(cudaMemset(weights, 0x3c, kWeightBytes), "fill weights");
  check(cudaMalloc(&x, kMaxXBytes), "cudaMalloc x");
  check(cudaMemset(x, 0x11, kMaxXBytes), "fill x");
  check(cudaMalloc(&counter, sizeof(uint32_t)), "cudaMalloc counter");
  if (script) {
    std::printf("sync_stream_bench: %s, %d SMs\n", prop.name, sms);
    run_scripts(weights, chunks, x, iters);
    return 0;
  }
  check(cudaFuncSetAttribute(sync_stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kMaxSmemBytes),
        "opt in to shared memory");
  check(cudaFuncSetAttribute(sync_stream_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1),
        "non-portable clusters");

  const int max_epochs = stages_per_block;  // period >= 1
  long long *t_arrive = nullptr, *t_ready = nullptr, *t_seen = nullptr;
  const size_t stamps = size_t{static_cast<size_t>(sms)} * max_epochs;
  check(cudaMalloc(&t_arrive, stamps * sizeof(long long)), "cudaMalloc stamps");
  check(cudaMalloc(&t_ready, stamps * sizeof(long long)), "cudaMalloc stamps");
  check(cudaMalloc(&t_seen, stamps * sizeof(long long)), "cudaMalloc stamps");

  std::printf(
      "sync_stream_bench: %s, %d SMs, L2 %d MB; %d stages of %d KB a block, %d stages "
      "streamed a block, %d launches a row (median)\n",
      prop.name, sms, prop.l2CacheSize >> 20, stages, kStageBytes / 1024, stages_per_block, iters);
  std::printf(
      "mode   |  C | ring | period | x bytes | stream | blocks | streamers |      us |   GB/s | "
      "syncs | "
      "signal mean us | slowest us | arrival spread us | rank 0 sees us\n");

  std::vector<Row> rows = {{"stream", kStream, 1, 0, 0}};
  const std::vector<int> periods = quick ? std::vector<int>{12} : std::vector<int>{4, 12, 32};
  for (int period : periods) {
    rows.push_back({"count", kCount, 1, period, 0});
    rows.push_back({"count", kCount, 1, period, 4096});
  }
  // Larger inputs after the count (partial sums read back from the L2): a row's ring
  // shrinks to fit them (128 KB leaves 6 stages).
  for (int kb : {16, 64, 128}) rows.push_back({"count", kCount, 1, 12, kb * 1024});
  for (int c : quick ? std::vector<int>{8} : std::vector<int>{2, 4, 8, 16}) {
    rows.push_back({"relay", kRelay, c, 12, 0});
    rows.push_back({"relay", kRelay, c, 12, 4096});
    rows.push_back({"mcast", kMcast, c, 12, 4096});
  }
  // A relay's streamers alone (no sync in the launch): the bound of its rows.
  for (int c : quick ? std::vector<int>{8} : std::vector<int>{2, 8}) {
    rows.push_back({"relay", kRelay, c, stages_per_block + 1, 0});
  }
  if (!quick) {
    rows.push_back({"relay", kRelay, 8, 4, 4096});
    rows.push_back({"relay", kRelay, 8, 32, 4096});
  }

  for (const Row& row : rows) {
    for (int stream : {1, 0}) {
      if (row.mode == kStream && stream == 0) continue;
      cudaLaunchConfig_t config{};
      cudaLaunchAttribute attr{};
      config.blockDim = dim3(kThreads);
      // The ring, the input, the barriers; a large input leaves fewer stages.
      const int x_pad = (row.x_bytes + 127) / 128 * 128;
      const int barrier_bytes = (2 * kMaxStages + 2) * 8;
      const int ring = std::min(stages, (kMaxSmemBytes - x_pad - barrier_bytes) / kStageBytes);
      config.dynamicSmemBytes = static_cast<size_t>(ring) * kStageBytes + x_pad + barrier_bytes;
      int blocks = sms;
      if (row.cluster > 1) {
        attr.id = cudaLaunchAttributeClusterDimension;
        attr.val.clusterDim.x = static_cast<unsigned>(row.cluster);
        attr.val.clusterDim.y = 1;
        attr.val.clusterDim.z = 1;
        config.attrs = &attr;
        config.numAttrs = 1;
        config.gridDim = dim3(static_cast<unsigned>(row.cluster));
        int clusters = 0;
        const cudaError_t e =
            cudaOccupancyMaxActiveClusters(&clusters, sync_stream_kernel, &config);
        if (e != cudaSuccess || clusters == 0) {
          std::printf("%-6s | %2d | clusters of %d do not fit (%s)\n", row.name, row.cluster,
                      row.cluster, cudaGetErrorString(e));
          (void)cudaGetLastError();
          continue;
        }
        blocks = clusters * row.cluster;
      }
      config.gridDim = dim3(static_cast<unsigned>(blocks));
      const int streamers = row.cluster > 1 ? blocks / row.cluster * (row.cluster - 1) : blocks;
      Params p{};
      p.weights = weights;
      p.chunks = chunks;
      p.x = x;
      p.counter = counter;
      p.t_arrive = t_arrive;
      p.t_ready = t_ready;
      p.t_seen = t_seen;
      p.stages = ring;
      p.stages_per_block = stages_per_block;
      p.period = row.period;
      p.epochs = row.period > 0 ? stages_per_block / row.period : 0;
      p.x_bytes = row.x_bytes;
      p.mode = row.mode;
      p.cluster = row.cluster;
      p.stream = stream;
      const double us =
          median_launch_us(config, sync_stream_kernel, p, counter, sizeof(uint32_t), iters);
      const double bytes =
          stream ? double{kStageBytes} * stages_per_block * static_cast<double>(streamers) : 0.0;

      // The signal's latency, from the last block in to each block's input, per sync.
      double mean = 0, slowest = 0, seen = 0, skew = 0;
      if (p.epochs > 0) {
        std::vector<long long> arrive(static_cast<size_t>(streamers) * p.epochs);
        std::vector<long long> ready(arrive.size());
        std::vector<long long> leader(static_cast<size_t>(blocks) * p.epochs);
        check(cudaMemcpy(arrive.data(), t_arrive, arrive.size() * sizeof(long long),
                         cudaMemcpyDeviceToHost),
              "stamps");
        check(cudaMemcpy(ready.data(), t_ready, ready.size() * sizeof(long long),
                         cudaMemcpyDeviceToHost),
              "stamps");
        check(cudaMemcpy(leader.data(), t_seen, leader.size() * sizeof(long long),
                         cudaMemcpyDeviceToHost),
              "stamps");
        for (int e = 0; e < p.epochs; ++e) {
          long long last = 0, first = arrive[static_cast<size_t>(e)];
          for (int b = 0; b < streamers; ++b) {
            last = std::max(last, arrive[static_cast<size_t>(b) * p.epochs + e]);
            first = std::min(first, arrive[static_cast<size_t>(b) * p.epochs + e]);
          }
          skew += 1e-3 * static_cast<double>(last - first);
          double worst = 0;
          for (int b = 0; b < streamers; ++b) {
            const double lat =
                1e-3 * static_cast<double>(ready[static_cast<size_t>(b) * p.epochs + e] - last);
            mean += lat;
            worst = std::max(worst, lat);
          }
          slowest += worst;
          if (row.cluster > 1) {
            double leaders = 0;
            for (int c = 0; c < blocks; c += row.cluster) {
              leaders +=
                  1e-3 * static_cast<double>(leader[static_cast<size_t>(c) * p.epochs + e] - last);
            }
            seen += leaders / (blocks / row.cluster);
          }
        }
        mean /= static_cast<double>(p.epochs) * streamers;
        slowest /= p.epochs;
        skew /= p.epochs;
        seen /= p.epochs;
      }
      std::printf(
          "%-6s | %2d | %4d | %6d | %7d | %6s | %6d | %9d | %7.1f | %6.0f | %5d | %14.2f | %10.2f "
          "| ",
          mode_name(row.mode), row.cluster, ring, row.period, row.x_bytes, stream ? "yes" : "idle",
          blocks, streamers, us, stream ? bytes / us * 1e-3 : 0.0, p.epochs, mean, slowest);
      std::printf("%17.2f | ", skew);
      if (row.cluster > 1) {
        std::printf("%14.2f\n", seen);
      } else {
        std::printf("%14s\n", "-");
      }
    }
  }
  return 0;
}
