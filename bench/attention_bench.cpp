// attention_bench: microseconds per cuda::launch_attention, timed with CUDA events.
//
//   attention_bench [--iters N] [--no-pdl] [--target-blocks B] [--min-blocks B]
//                   [--block-warps W] [--fresh-positions F] [--sequential-cells]
//                   [--no-cluster-fold] [--shapes ROWSxCONTEXT,...] [--budget POSITIONS]
//
// Llama-8B decode shapes (32 query heads over 8 kv heads, head_dim 128, bf16) at
// rows 1, 16, 64 and 256, every row at context 192, 1024 or 8192 (8192 for up to 64
// rows; max_context 8192 sizes the split), each row's cells scattered through a
// shuffled table. For the
// tensor-core kernel and the CUDA-core kernel (AttentionPath::kCudaCores), prints
// the time of one launch replayed from a CUDA graph (the GPU's time, as a captured
// decode step pays it) and the K/V read bandwidth, rows x context x 2 x kv_heads x
// head_dim x 2 bytes / time. The 20 launches of a graph follow one another with
// programmatic dependent launch unless --no-pdl. --target-blocks sets the blocks the
// split count aims for (AttentionParams::target_blocks; default kAttentionTargetBlocks),
// --min-blocks the blocks a launch keeps at least for rows above 256 positions
// (AttentionParams::min_blocks; default kAttentionMinBlocks; at or above the target, every
// such row takes the full split count),
// --block-warps the tensor-core kernel's warps per block (2, 4, 8; default 0, the
// launcher's choice), --fresh-positions AttentionParams::fresh_positions (default 1,
// as a decode step: older K/V loads before the wait; 0 loads nothing before it).
// --no-cluster-fold keeps a few rows' splits folding through the workspace
// (AttentionParams::cluster_fold off).
// --sequential-cells gives each row consecutive cells (as a prefill places them) instead of
// scattered ones; --shapes runs only the listed rows x context (up to 256 rows, 8,192
// positions; e.g. 128x1152, the long B = 128 row's average); --budget sets max_context,
// the session budget the split count is sized for (default 8,192; `cellm bench -npp 1024
// -ntg 256` runs at 1,280).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "cuda/kernels/attention.h"
#include "cuda/launch_control.h"

namespace {

using cellm::cuda::attention_workspace_bytes;
using cellm::cuda::AttentionParams;
using cellm::cuda::AttentionPath;
using cellm::cuda::launch_attention;
using Bf16 = __nv_bfloat16;

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
}

constexpr int64_t kHeads = 32, kKvHeads = 8, kHeadDim = 128;
constexpr int64_t kMaxRows = 256;
constexpr int32_t kMaxContext = 8192;                 // the table's row width
constexpr int64_t kCells = int64_t{kMaxRows} * 2048;  // rows x context <= kCells: distinct
constexpr int kLaunchesPerGraph = 20;

template <typename T>
T* device_alloc(size_t count) {
  void* p = nullptr;
  check(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)), "cudaMalloc");
  return static_cast<T*>(p);
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 20;
  int64_t target_blocks = cellm::cuda::kAttentionTargetBlocks;
  int64_t min_blocks = cellm::cuda::kAttentionMinBlocks;
  int32_t block_warps = 0;      // the launcher's choice
  int32_t fresh_positions = 1;  // decode rows: older K/V may load before the wait
  bool sequential_cells = false;
  bool cluster_fold = true;
  int32_t budget = kMaxContext;
  std::vector<std::pair<int64_t, int32_t>> shapes;  // empty: every default shape
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
      iters = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--target-blocks") == 0 && i + 1 < argc) {
      target_blocks =
          std::clamp<int64_t>(std::atoll(argv[++i]), 1, cellm::cuda::kAttentionWorkspaceCounters);
    } else if (std::strcmp(argv[i], "--min-blocks") == 0 && i + 1 < argc) {
      min_blocks = std::max<int64_t>(1, std::atoll(argv[++i]));
    } else if (std::strcmp(argv[i], "--block-warps") == 0 && i + 1 < argc) {
      block_warps = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--fresh-positions") == 0 && i + 1 < argc) {
      fresh_positions = std::max(0, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--no-pdl") == 0) {
      cellm::cuda::set_programmatic_launch(false);
    } else if (std::strcmp(argv[i], "--no-cluster-fold") == 0) {
      cluster_fold = false;
    } else if (std::strcmp(argv[i], "--sequential-cells") == 0) {
      sequential_cells = true;
    } else if (std::strcmp(argv[i], "--budget") == 0 && i + 1 < argc) {
      budget = std::clamp(std::atoi(argv[++i]), 1, kMaxContext);
    } else if (std::strcmp(argv[i], "--shapes") == 0 && i + 1 < argc) {
      for (const char* c = argv[++i]; *c != '\0';) {
        char* end = nullptr;
        const long rows = std::strtol(c, &end, 10);
        if (end == c || *end != 'x') {
          std::fprintf(stderr, "--shapes: expected ROWSxCONTEXT[,...], got \"%s\"\n", c);
          return 2;
        }
        c = end + 1;
        const long context = std::strtol(c, &end, 10);
        if (end == c || rows < 1 || rows > kMaxRows || context < 1 || context > kMaxContext) {
          std::fprintf(stderr, "--shapes: rows in [1, %ld], context in [1, %d]\n",
                       static_cast<long>(kMaxRows), kMaxContext);
          return 2;
        }
        shapes.emplace_back(rows, static_cast<int32_t>(context));
        c = *end == ',' ? end + 1 : end;
      }
    } else {
      std::fprintf(stderr, "attention_bench: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (shapes.empty()) {
    for (const int32_t context : {192, 1024, 8192}) {
      for (const int64_t rows : {1, 16, 64, 256}) shapes.emplace_back(rows, context);
    }
  }
  constexpr int64_t kv_dim = kKvHeads * kHeadDim;
  constexpr int64_t q_dim = kHeads * kHeadDim;
  constexpr int64_t row_stride = 2 * kv_dim + q_dim;

  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(0.05f, 1.f);
  // K/V pools of random values (2 x 512k cells x 1024 bf16 = 2 GiB), filled on the host
  // one cell pattern repeated: the bench measures traffic, not values.
  std::vector<Bf16> pattern(static_cast<size_t>(kv_dim * 64));
  for (Bf16& x : pattern) x = __float2bfloat16(dist(rng));
  Bf16* k_pool = device_alloc<Bf16>(static_cast<size_t>(kCells * kv_dim));
  Bf16* v_pool = device_alloc<Bf16>(static_cast<size_t>(kCells * kv_dim));
  for (int64_t c = 0; c < kCells; c += 64) {
    const size_t off = static_cast<size_t>(c * kv_dim);
    check(cudaMemcpy(k_pool + off, pattern.data(), pattern.size() * sizeof(Bf16),
                     cudaMemcpyHostToDevice),
          "upload k");
    check(cudaMemcpy(v_pool + off, pattern.data(), pattern.size() * sizeof(Bf16),
                     cudaMemcpyHostToDevice),
          "upload v");
  }
  std::vector<Bf16> qkv_host(static_cast<size_t>(kMaxRows * row_stride));
  for (Bf16& x : qkv_host) x = __float2bfloat16(dist(rng));
  Bf16* qkv = device_alloc<Bf16>(qkv_host.size());
  check(cudaMemcpy(qkv, qkv_host.data(), qkv_host.size() * sizeof(Bf16), cudaMemcpyHostToDevice),
        "upload qkv");
  // Table row s at context c: the slice [s c, s c + c) of a shuffle of all cells, so
  // consecutive positions are far apart and no two rows share a cell (rows x c <= kCells).
  std::vector<int32_t> order(static_cast<size_t>(kCells));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int32_t> table_host(static_cast<size_t>(kMaxRows * kMaxContext));
  int32_t* table = device_alloc<int32_t>(table_host.size());
  std::vector<int32_t> seqs(kMaxRows);
  std::iota(seqs.begin(), seqs.end(), 0);
  int32_t* row_seq = device_alloc<int32_t>(kMaxRows);
  check(cudaMemcpy(row_seq, seqs.data(), seqs.size() * sizeof(int32_t), cudaMemcpyHostToDevice),
        "upload row_seq");
  int32_t* positions = device_alloc<int32_t>(kMaxRows);
  Bf16* out = device_alloc<Bf16>(static_cast<size_t>(kMaxRows * q_dim));
  const size_t ws_bytes = attention_workspace_bytes(kMaxRows, kHeads, kKvHeads, kHeadDim, budget,
                                                    target_blocks, min_blocks);
  float* workspace = device_alloc<float>(ws_bytes / sizeof(float));
  // The split counters start at zero; every launch leaves them so.
  check(cudaMemset(workspace, 0, ws_bytes), "clear workspace");

  cudaStream_t stream = nullptr;
  check(cudaStreamCreate(&stream), "stream");
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");

  std::printf(
      "Llama-8B decode attention (32/8 heads, head_dim 128, bf16), graph replay, %s, target "
      "blocks %ld, min blocks %ld, block warps %d (0: chosen), fresh positions %d, %s cells, "
      "budget %d, cluster fold %s\n",
      cellm::cuda::programmatic_launch_enabled() ? "PDL" : "no PDL",
      static_cast<long>(target_blocks), static_cast<long>(min_blocks), block_warps, fresh_positions,
      sequential_cells ? "sequential" : "scattered", budget, cluster_fold ? "allowed" : "off");
  std::printf("rows context splits | tensor cores us   GB/s | cuda cores us   GB/s | speedup\n");
  int32_t table_context = 0;  // the context the table holds
  for (const auto& [rows, context] : shapes) {
    if (rows * context > kCells) continue;
    if (context != table_context) {
      table_context = context;
      const std::vector<int32_t> pos(kMaxRows, context - 1);
      check(cudaMemcpy(positions, pos.data(), pos.size() * sizeof(int32_t), cudaMemcpyHostToDevice),
            "upload positions");
      for (int64_t s = 0; s < kMaxRows; ++s) {
        for (int32_t j = 0; j < context; ++j) {
          const auto k = static_cast<size_t>((s * context + j) % kCells);
          table_host[static_cast<size_t>(s * kMaxContext + j)] =
              sequential_cells ? static_cast<int32_t>(k) : order[k];
        }
      }
      check(cudaMemcpy(table, table_host.data(), table_host.size() * sizeof(int32_t),
                       cudaMemcpyHostToDevice),
            "upload table");
    }
    double us[2] = {0, 0};
    for (int path = 0; path < 2; ++path) {
      AttentionParams<Bf16> p;
      p.qkv = qkv;
      p.row_stride = row_stride;
      p.q_offset = 2 * kv_dim;
      p.n_rows = rows;
      p.n_heads = kHeads;
      p.n_kv_heads = kKvHeads;
      p.head_dim = kHeadDim;
      p.k_pool = k_pool;
      p.v_pool = v_pool;
      p.table = table;
      p.table_stride = kMaxContext;
      p.row_seq = row_seq;
      p.positions = positions;
      p.scale = 0.08838834764831845f;
      p.max_context = budget;
      p.workspace = workspace;
      p.out = out;
      p.path = path == 0 ? AttentionPath::kAuto : AttentionPath::kCudaCores;
      p.target_blocks = target_blocks;
      p.min_blocks = min_blocks;
      p.block_warps = block_warps;
      p.fresh_positions = fresh_positions;
      p.cluster_fold = cluster_fold;
      check(launch_attention(p, stream), "warm-up launch");
      cudaGraph_t graph = nullptr;
      check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
      for (int i = 0; i < kLaunchesPerGraph; ++i) check(launch_attention(p, stream), "launch");
      check(cudaStreamEndCapture(stream, &graph), "end capture");
      cudaGraphExec_t exec = nullptr;
      check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
      check(cudaGraphLaunch(exec, stream), "warm-up replay");
      check(cudaEventRecord(start, stream), "record");
      for (int i = 0; i < iters; ++i) check(cudaGraphLaunch(exec, stream), "replay");
      check(cudaEventRecord(stop, stream), "record");
      check(cudaEventSynchronize(stop), "sync");
      float ms = 0.f;
      check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
      us[path] = 1e3 * ms / (iters * kLaunchesPerGraph);
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
    }
    const double kv_bytes = static_cast<double>(rows) * context * 2 * kv_dim * sizeof(Bf16);
    std::printf("%4ld %7d %6d | %15.2f %6.0f | %13.2f %6.0f | %6.2fx\n", static_cast<long>(rows),
                context,
                cellm::cuda::attention_num_splits(rows, kHeads, kKvHeads, budget, target_blocks,
                                                  min_blocks),
                us[0], kv_bytes / (us[0] * 1e3), us[1], kv_bytes / (us[1] * 1e3), us[1] / us[0]);
  }
  check(cudaStreamSynchronize(stream), "final sync");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  for (void* ptr :
       {static_cast<void*>(k_pool), static_cast<void*>(v_pool), static_cast<void*>(qkv),
        static_cast<void*>(table), static_cast<void*>(row_seq), static_cast<void*>(positions),
        static_cast<void*>(out), static_cast<void*>(workspace)}) {
    cudaFree(ptr);
  }
  return 0;
}
