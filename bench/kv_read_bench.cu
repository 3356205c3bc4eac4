// kv_read_bench: how the memory system sees the decode attention's K/V gather, without
// the attention's math.
//
//   kv_read_bench [--rows N] [--context C] [--iters N]
//
// The tensor-core attention (src/cuda/kernels/attention_mma.cu) gathers, for one kv head,
// each key's 256-byte K and V rows (head_dim 128, bf16) from cells 2 KB apart (8 kv
// heads a cell), with cp.async: a half-warp a row, so one instruction copies two keys'
// rows. Under ncu the L2 is asked for 1.5 sectors for each sector the DRAM delivers
// (docs/PERFORMANCE.md, session 14). Five read kernels over the same scattered cells
// (a shuffle, as bench/attention_bench places them), each block one (row, kv head) or
// (row, kv-head pair), 4-warp blocks of 68 KB of shared memory (3 an SM, as the attention
// at 128 rows):
//   tile   the attention's copies: cp.async 16 bytes a lane, a half-warp a key's row,
//          two stages of 16 keys a warp;
//   pair   cp.async with a half-warp a kv head: two adjacent kv heads of one key, 512
//          contiguous bytes an instruction (2-warp blocks, the same bytes in flight);
//   ldg    the attention's lane map with 16-byte loads into registers;
//   bulk   tile's blocks and stages, each key's K or V row one 256-byte Hopper bulk copy
//          (cp.async.bulk, a lane a row) landing on the stage's mbarrier;
//   bulkef bulk with the L2 told to evict its lines first;
//   cells  a block per (row, eighth of its keys) copying each key's whole K and V cells
//          (every kv head: 2 KB contiguous each) with one bulk copy apiece;
//   heads  another layout: K (and V) stored head-major, [kv head, cell, head_dim], so one
//          kv head's rows of consecutive cells are contiguous. bulk's blocks and stages;
//          a tile of 16 consecutive cells is one 4 KB bulk copy for K and one for V, any
//          other tile 256-byte copies as bulk's.
//   runsN  the head-major layout with longer runs: one warp a (row, kv head) block, a ring of
//          stages of N keys (N = 16, 64), each a single K and a single V bulk copy when its
//          cells are consecutive (else 256-byte copies), the next stages in flight while
//          the warp reads one: how fast whole runs of one kv head's rows stream.
// --placement says where each row's keys lie: `shuffled` (default; a shuffle of every
// cell), `contiguous` (row r's keys in cells [r C, (r + 1) C)), or `decode:P` (as cellm
// bench leaves them: each row's first P keys contiguous, the later ones interleaved with
// the other rows', one cell a row a step).
// Each prints its time and read rate; run it under
//   ncu --clock-control none -k regex:read_ --metrics
//     lts__t_sectors_op_read.sum,dram__bytes_read.sum,gpu__time_duration.sum
// to see whether the extra L2 sectors come with the lane map (tile against pair) or with
// every read of this pattern (the L2 itself).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "cuda/kernels/mbarrier.cuh"  // the bulk copy and its barriers
#include "cuda/kernels/mma.cuh"       // the attention's cp.async helpers

namespace {

using cellm::cuda::detail::barrier_arrive_expect;
using cellm::cuda::detail::barrier_init;
using cellm::cuda::detail::barrier_wait;
using cellm::cuda::detail::bulk_copy;
using cellm::cuda::detail::cp_async16;
using cellm::cuda::detail::cp_async_commit;
using cellm::cuda::detail::cp_async_wait;
using cellm::cuda::detail::fence_barrier_init;
using cellm::cuda::detail::fence_proxy_async_shared;
using cellm::cuda::detail::smem_addr;

constexpr int kKvHeads = 8;
constexpr int kHeadDim = 128;
constexpr int kRowBytes = kHeadDim * 2;          // one kv head's K (or V) row of a cell
constexpr int kCellElems = kKvHeads * kHeadDim;  // bf16 a cell holds of K (and of V)
constexpr int kTileKeys = 16;
constexpr int kRowPad = 8;  // bf16, as the attention pads its rows
constexpr int kRowElems = kHeadDim + kRowPad;
constexpr int kStageElems = 2 * kTileKeys * kRowElems;  // K and V of one tile
constexpr int kSmemBytes = 4 * 2 * kStageElems * 2;     // 4 warps x 2 stages: 68 KB
constexpr int64_t kCells = 512 * 1024;                  // 1 GiB of K and 1 GiB of V
constexpr int64_t kHeadPlane = kCells * kHeadDim;       // bf16 of one kv head (head-major)

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "kv_read_bench: %s: %s\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
}

// Commits the tile just issued, waits for the one before it (in `previous`, the warp's
// other stage) and reads an element of it, so its copies have a consumer.
__device__ __forceinline__ float land_previous(const __nv_bfloat16* previous, int lane) {
  cp_async_commit();
  cp_async_wait<1>();
  __syncwarp();
  const float x = __bfloat162float(previous[lane]);
  __syncwarp();  // read before the next tile refills the stage
  return x;
}

// One block per (row, kv head) = (blockIdx.x, blockIdx.y); warp w copies tiles w, w + 4,
// ... of the row's `context` keys into its two stages, as the attention does.
__global__ void __launch_bounds__(128, 3)
    read_tile(const __nv_bfloat16* k_pool, const __nv_bfloat16* v_pool, const int32_t* table,
              int32_t context, float* out) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t* cells = table + int64_t{blockIdx.x} * context;
  const int64_t head_off = int64_t{blockIdx.y} * kHeadDim;
  __nv_bfloat16* stages = reinterpret_cast<__nv_bfloat16*>(smem) + warp * 2 * kStageElems;
  const int row_in_pass = lane / 16, col = (lane % 16) * 8;
  const int n_tiles = context / kTileKeys;
  float acc = 0.f;
  int s = 0;
  for (int t = warp; t < n_tiles; t += 4, s ^= 1) {
    __nv_bfloat16* ks = stages + s * kStageElems;
    __nv_bfloat16* vs = ks + kTileKeys * kRowElems;
    const int32_t cell_lane = cells[t * kTileKeys + lane % 16];
#pragma unroll
    for (int pass = 0; pass < kTileKeys / 2; ++pass) {
      const int key = 2 * pass + row_in_pass;
      const int64_t off =
          int64_t{__shfl_sync(0xffffffffu, cell_lane, key)} * kCellElems + head_off + col;
      cp_async16(ks + key * kRowElems + col, k_pool + off, true);
      cp_async16(vs + key * kRowElems + col, v_pool + off, true);
    }
    acc += land_previous(stages + (s ^ 1) * kStageElems, lane);
  }
  cp_async_wait<0>();
  if (lane == 0) out[(int64_t{blockIdx.x} * gridDim.y + blockIdx.y) * 4 + warp] = acc;
}

// One block per (row, kv-head pair); lanes 0-15 copy head 2p's row of a key, lanes 16-31
// head 2p + 1's: 512 contiguous bytes an instruction. 2 warps, each stage twice a tile's.
__global__ void __launch_bounds__(64, 3)
    read_pair(const __nv_bfloat16* k_pool, const __nv_bfloat16* v_pool, const int32_t* table,
              int32_t context, float* out) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t* cells = table + int64_t{blockIdx.x} * context;
  const int64_t pair_off = int64_t{blockIdx.y} * 2 * kHeadDim;
  __nv_bfloat16* stages = reinterpret_cast<__nv_bfloat16*>(smem) + warp * 4 * kStageElems;
  const int col = lane * 8;  // 0..255 over the pair's two rows
  const int n_tiles = context / kTileKeys;
  float acc = 0.f;
  int s = 0;
  for (int t = warp; t < n_tiles; t += 2, s ^= 1) {
    __nv_bfloat16* ks = stages + s * 2 * kStageElems;
    __nv_bfloat16* vs = ks + kTileKeys * 2 * kRowElems;
    const int32_t cell_lane = cells[t * kTileKeys + lane % 16];
#pragma unroll
    for (int key = 0; key < kTileKeys; ++key) {
      const int64_t off =
          int64_t{__shfl_sync(0xffffffffu, cell_lane, key)} * kCellElems + pair_off + col;
      cp_async16(ks + key * 2 * kRowElems + col + (lane / 16) * kRowPad, k_pool + off, true);
      cp_async16(vs + key * 2 * kRowElems + col + (lane / 16) * kRowPad, v_pool + off, true);
    }
    acc += land_previous(stages + (s ^ 1) * 2 * kStageElems, lane);
  }
  cp_async_wait<0>();
  if (lane == 0) out[(int64_t{blockIdx.x} * gridDim.y + blockIdx.y) * 4 + warp] = acc;
}

// read_tile's blocks and lane map, with 16-byte loads into registers (its 68 KB of shared
// memory only hold it to 3 blocks an SM).
__global__ void __launch_bounds__(128, 3)
    read_ldg(const __nv_bfloat16* k_pool, const __nv_bfloat16* v_pool, const int32_t* table,
             int32_t context, float* out) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t* cells = table + int64_t{blockIdx.x} * context;
  const int64_t head_off = int64_t{blockIdx.y} * kHeadDim;
  const int row_in_pass = lane / 16, col = (lane % 16) * 8;
  const int n_tiles = context / kTileKeys;
  uint32_t acc = 0;
  for (int t = warp; t < n_tiles; t += 4) {
    const int32_t cell_lane = cells[t * kTileKeys + lane % 16];
    uint4 k[kTileKeys / 2], v[kTileKeys / 2];
#pragma unroll
    for (int pass = 0; pass < kTileKeys / 2; ++pass) {
      const int key = 2 * pass + row_in_pass;
      const int64_t off =
          int64_t{__shfl_sync(0xffffffffu, cell_lane, key)} * kCellElems + head_off + col;
      k[pass] = __ldcs(reinterpret_cast<const uint4*>(k_pool + off));
      v[pass] = __ldcs(reinterpret_cast<const uint4*>(v_pool + off));
    }
#pragma unroll
    for (int pass = 0; pass < kTileKeys / 2; ++pass) acc ^= k[pass].x ^ v[pass].w;
  }
  if (lane == 0) {
    out[(int64_t{blockIdx.x} * gridDim.y + blockIdx.y) * 4 + warp] = static_cast<float>(acc);
  }
}

// --- the Hopper bulk copy (the barriers and the plain copy in mbarrier.cuh) ---

// `bytes` contiguous bytes from global `src` to shared `dst`, completing on `bar`; with
// kEvictFirst the L2 is told to drop them first.
template <bool kEvictFirst>
__device__ __forceinline__ void bulk_read(void* dst, const void* src, uint32_t bytes,
                                          uint64_t* bar) {
  if constexpr (kEvictFirst) {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1], %2, [%3], %4;" ::"r"(smem_addr(dst)),
        "l"(src), "r"(bytes), "r"(smem_addr(bar)), "l"(policy)
        : "memory");
  } else {
    bulk_copy(dst, src, bytes, bar);
  }
}

// read_tile's blocks and stages, each key's K and V rows one 256-byte bulk copy (lane l
// copies key l % 16's K row for l < 16, its V row otherwise), a tile landing on its
// stage's mbarrier. kHeadMajor reads the head-major layout (kv head h's row of cell c at
// (h kCells + c) kHeadDim) into unpadded stage rows, a tile whose 16 cells are consecutive
// as one 4 KB bulk copy of K (lane 0) and one of V (lane 16).
template <bool kEvictFirst, bool kHeadMajor>
__device__ __forceinline__ void bulk_tiles(const __nv_bfloat16* k_pool, const __nv_bfloat16* v_pool,
                                           const int32_t* table, int32_t context, float* out) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ alignas(8) uint64_t full[4][2];
  constexpr int kStageRow = kHeadMajor ? kHeadDim : kRowElems;  // bf16 between a stage's rows
  constexpr int64_t kCellStride = kHeadMajor ? kHeadDim : kCellElems;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t* cells = table + int64_t{blockIdx.x} * context;
  const int64_t head_off = int64_t{blockIdx.y} * (kHeadMajor ? kHeadPlane : kHeadDim);
  __nv_bfloat16* stages = reinterpret_cast<__nv_bfloat16*>(smem) + warp * 2 * kStageElems;
  if (lane < 2) {
    barrier_init(&full[warp][lane], 1);
    fence_barrier_init();
  }
  __syncwarp();
  const int n_tiles = context / kTileKeys;
  const int key = lane % 16;
  const __nv_bfloat16* pool = lane < 16 ? k_pool : v_pool;
  uint32_t parity[2] = {0, 0};
  float acc = 0.f;
  int s = 0;
  bool previous = false;
  for (int t = warp; t < n_tiles; t += 4, s ^= 1) {
    __nv_bfloat16* dst = stages + s * kStageElems + (lane / 16) * kTileKeys * kStageRow;
    if (lane == 0) barrier_arrive_expect(&full[warp][s], 2 * kTileKeys * kRowBytes);
    fence_proxy_async_shared();
    __syncwarp();
    const int32_t cell = cells[t * kTileKeys + key];
    const __nv_bfloat16* src = pool + head_off + cell * kCellStride;
    bool run = false;
    if constexpr (kHeadMajor) {
      run = __all_sync(0xffffffffu, cell == __shfl_sync(0xffffffffu, cell, 0) + key);
    }
    if (!run) {
      bulk_read<kEvictFirst>(dst + key * kStageRow, src, kRowBytes, &full[warp][s]);
    } else if (key == 0) {
      bulk_read<kEvictFirst>(dst, src, kTileKeys * kRowBytes, &full[warp][s]);
    }
    if (previous) {
      barrier_wait(&full[warp][s ^ 1], parity[s ^ 1]);
      parity[s ^ 1] ^= 1;
      acc += __bfloat162float(stages[(s ^ 1) * kStageElems + lane]);
      __syncwarp();
    }
    previous = true;
  }
  if (previous) barrier_wait(&full[warp][s ^ 1], parity[s ^ 1]);
  if (lane == 0) out[(int64_t{blockIdx.x} * gridDim.y + blockIdx.y) * 4 + warp] = acc;
}
__global__ void __launch_bounds__(128, 3)
    read_bulk(const __nv_bfloat16* k_pool, const __nv_bfloat16* v_pool, const int32_t* table,
              int32_t context, float* out) {
  bulk_tiles<false, false>(k_pool, v_pool, table, context, out);
}
__global__ void __launch_bounds__(128, 3)
    read_efbulk(const __nv_bfloat16* k_pool, const __nv_bfloat16* v_pool, const int32_t* table,
                int32_t context, float* out) {
  bulk_tiles<true, false>(k_pool, v_pool, table, context, out);
}
__global__ void __launch_bounds__(128, 3)
    read_heads(const __nv_bfloat16* k_pool, const __nv_bfloat16* v_pool, const int32_t* table,
               int32_t context, float* out) {
  bulk_tiles<false, true>(k_pool, v_pool, table, context, out);
}

// The other layout a kernel could read: every kv head of a key at once, each cell's 2 KB of
// K and 2 KB of V one bulk copy. A block per (row, eighth of its keys): as many blocks and
// bytes as the others. Warp w walks tiles of 2 keys (w, w + 4, ...), two 8 KB stages;
// lanes 0-1 copy the keys' K cells, lanes 2-3 their V cells.
__global__ void __launch_bounds__(128, 3)
    read_cells(const __nv_bfloat16* k_pool, const __nv_bfloat16* v_pool, const int32_t* table,
               int32_t context, float* out) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ alignas(8) uint64_t full[4][2];
  constexpr int kKeys = 2;
  constexpr int kCellBytes = kCellElems * 2;
  constexpr int kStage = 2 * kKeys * kCellElems;  // bf16: K and V of kKeys cells
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int per_block = context / static_cast<int>(gridDim.y);
  const int32_t* cells = table + int64_t{blockIdx.x} * context + blockIdx.y * per_block;
  __nv_bfloat16* stages = reinterpret_cast<__nv_bfloat16*>(smem) + warp * 2 * kStage;
  if (lane < 2) {
    barrier_init(&full[warp][lane], 1);
    fence_barrier_init();
  }
  __syncwarp();
  const int n_tiles = per_block / kKeys;
  uint32_t parity[2] = {0, 0};
  float acc = 0.f;
  int s = 0;
  bool previous = false;
  for (int t = warp; t < n_tiles; t += 4, s ^= 1) {
    if (lane == 0) barrier_arrive_expect(&full[warp][s], 2 * kKeys * kCellBytes);
    fence_proxy_async_shared();
    __syncwarp();
    if (lane < 2 * kKeys) {
      const int key = lane % kKeys;
      const __nv_bfloat16* pool = lane < kKeys ? k_pool : v_pool;
      const int64_t cell = cells[t * kKeys + key];
      bulk_copy(stages + s * kStage + lane * kCellElems, pool + cell * kCellElems, kCellBytes,
                &full[warp][s]);
    }
    if (previous) {
      barrier_wait(&full[warp][s ^ 1], parity[s ^ 1]);
      parity[s ^ 1] ^= 1;
      acc += __bfloat162float(stages[(s ^ 1) * kStage + lane]);
      __syncwarp();
    }
    previous = true;
  }
  if (previous) barrier_wait(&full[warp][s ^ 1], parity[s ^ 1]);
  if (lane == 0) out[(int64_t{blockIdx.x} * gridDim.y + blockIdx.y) * 4 + warp] = acc;
}

// The head-major layout read in runs of kKeys consecutive cells: one warp a (row, kv head),
// a ring of kStages stages (K then V of kKeys keys each), kStages - 1 in flight while the
// warp reads the oldest.
template <int kKeys, int kStages>
__global__ void __launch_bounds__(32)
    read_runs(const __nv_bfloat16* k_pool, const __nv_bfloat16* v_pool, const int32_t* table,
              int32_t context, float* out) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ alignas(8) uint64_t full[kStages];
  constexpr int kTileElems = kKeys * kHeadDim;
  const int lane = threadIdx.x;
  const int32_t* cells = table + int64_t{blockIdx.x} * context;
  const int64_t head_base = int64_t{blockIdx.y} * kHeadPlane;
  __nv_bfloat16* stages = reinterpret_cast<__nv_bfloat16*>(smem);
  if (lane < kStages) barrier_init(&full[lane], 1);
  fence_barrier_init();
  __syncwarp();
  const int n_tiles = context / kKeys;
  const auto issue = [&](int t) {
    const int slot = t % kStages;
    __nv_bfloat16* dst = stages + slot * 2 * kTileElems;
    if (lane == 0) barrier_arrive_expect(&full[slot], 2 * kKeys * kRowBytes);
    fence_proxy_async_shared();
    __syncwarp();
    bool run = true;
    for (int i = lane; i < kKeys; i += 32) {
      run = run && cells[t * kKeys + i] == cells[t * kKeys] + i;
    }
    run = __all_sync(0xffffffffu, run);
    const int64_t first = cells[t * kKeys];
    if (run) {
      if (lane < 2) {
        bulk_copy(dst + lane * kTileElems,
                  (lane == 0 ? k_pool : v_pool) + head_base + first * kHeadDim, kKeys * kRowBytes,
                  &full[slot]);
      }
    } else {
      for (int i = lane; i < 2 * kKeys; i += 32) {
        const int key = i % kKeys;
        bulk_copy(
            dst + (i / kKeys) * kTileElems + key * kHeadDim,
            (i < kKeys ? k_pool : v_pool) + head_base + int64_t{cells[t * kKeys + key]} * kHeadDim,
            kRowBytes, &full[slot]);
      }
    }
  };
  for (int t = 0; t < min(kStages - 1, n_tiles); ++t) issue(t);
  float acc = 0.f;
  for (int t = 0; t < n_tiles; ++t) {
    if (t + kStages - 1 < n_tiles) issue(t + kStages - 1);
    const int slot = t % kStages;
    barrier_wait(&full[slot], (t / kStages) & 1);
    acc += __bfloat162float(stages[slot * 2 * kTileElems + lane]);
    __syncwarp();
  }
  if (lane == 0) out[(int64_t{blockIdx.x} * gridDim.y + blockIdx.y) * 4] = acc;
}

}  // namespace

int main(int argc, char** argv) {
  int rows = 128, context = 1152, iters = 20;
  const char* placement = "shuffled";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--rows") == 0 && i + 1 < argc) {
      rows = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--context") == 0 && i + 1 < argc) {
      context = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
      iters = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--placement") == 0 && i + 1 < argc) {
      placement = argv[++i];
    } else {
      std::fprintf(stderr, "kv_read_bench: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (rows < 1 || context < kTileKeys || context % kTileKeys != 0 ||
      int64_t{rows} * context > kCells) {
    std::fprintf(stderr,
                 "kv_read_bench: --rows >= 1 and --context a multiple of %d, rows x context <= "
                 "%ld; got %d x %d\n",
                 kTileKeys, static_cast<long>(kCells), rows, context);
    return 2;
  }
  __nv_bfloat16 *k_pool = nullptr, *v_pool = nullptr;
  check(cudaMalloc(&k_pool, kCells * kCellElems * sizeof(__nv_bfloat16)), "cudaMalloc k");
  check(cudaMalloc(&v_pool, kCells * kCellElems * sizeof(__nv_bfloat16)), "cudaMalloc v");
  check(cudaMemset(k_pool, 0x3c, kCells * kCellElems * sizeof(__nv_bfloat16)), "fill k");
  check(cudaMemset(v_pool, 0x3c, kCells * kCellElems * sizeof(__nv_bfloat16)), "fill v");
  // Row r's keys (table[r context + i]), placed as --placement says.
  std::vector<int32_t> order(static_cast<size_t>(rows) * context);
  if (std::strcmp(placement, "shuffled") == 0) {
    std::vector<int32_t> all(kCells);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), std::mt19937(1));
    std::copy_n(all.begin(), order.size(), order.begin());
  } else if (std::strcmp(placement, "contiguous") == 0) {
    std::iota(order.begin(), order.end(), 0);
  } else if (std::strncmp(placement, "decode:", 7) == 0 && std::atoi(placement + 7) >= 0 &&
             std::atoi(placement + 7) <= context) {
    const int prefix = std::atoi(placement + 7);
    for (int r = 0; r < rows; ++r) {
      for (int i = 0; i < context; ++i) {
        order[static_cast<size_t>(r) * context + i] =
            i < prefix ? r * prefix + i : rows * prefix + (i - prefix) * rows + r;
      }
    }
  } else {
    std::fprintf(stderr,
                 "kv_read_bench: --placement is shuffled, contiguous or decode:P (0 <= P <= "
                 "context); got %s\n",
                 placement);
    return 2;
  }
  int32_t* table = nullptr;
  check(cudaMalloc(&table, sizeof(int32_t) * rows * context), "cudaMalloc table");
  check(cudaMemcpy(table, order.data(), sizeof(int32_t) * order.size(), cudaMemcpyHostToDevice),
        "upload table");
  float* out = nullptr;
  check(cudaMalloc(&out, sizeof(float) * rows * kKvHeads * 4), "cudaMalloc out");
  for (auto kernel :
       {read_tile, read_pair, read_ldg, read_bulk, read_efbulk, read_cells, read_heads}) {
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes),
          "opt in to shared memory");
  }
  // The runs kernels' rings: 4 stages of 16 keys (32 KB) and 3 of 64 keys (96 KB; 2 blocks an SM).
  constexpr int kRuns16Smem = 4 * 2 * 16 * kRowBytes, kRuns64Smem = 3 * 2 * 64 * kRowBytes;
  check(cudaFuncSetAttribute(read_runs<16, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kRuns16Smem),
        "opt in to shared memory");
  check(cudaFuncSetAttribute(read_runs<64, 3>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kRuns64Smem),
        "opt in to shared memory");

  const double bytes = 2.0 * rows * context * kKvHeads * kRowBytes;
  std::printf(
      "kv_read_bench: %d rows x %d keys (%s), %d kv heads of %d bytes, K and V: %.1f MB a "
      "launch, %d launches\n",
      rows, context, placement, kKvHeads, kRowBytes, bytes / 1e6, iters);
  std::printf("kernel |     us |   GB/s\n");
  struct Case {
    const char* name;
    void (*kernel)(const __nv_bfloat16*, const __nv_bfloat16*, const int32_t*, int32_t, float*);
    dim3 grid;
    int threads;
    int smem = kSmemBytes;
  };
  const Case cases[] = {{"tile", read_tile, dim3(rows, kKvHeads), 128},
                        {"pair", read_pair, dim3(rows, kKvHeads / 2), 64},
                        {"ldg", read_ldg, dim3(rows, kKvHeads), 128},
                        {"bulk", read_bulk, dim3(rows, kKvHeads), 128},
                        {"bulkef", read_efbulk, dim3(rows, kKvHeads), 128},
                        {"cells", read_cells, dim3(rows, kKvHeads), 128},
                        {"heads", read_heads, dim3(rows, kKvHeads), 128},
                        {"runs16", read_runs<16, 4>, dim3(rows, kKvHeads), 32, kRuns16Smem},
                        {"runs64", read_runs<64, 3>, dim3(rows, kKvHeads), 32, kRuns64Smem}};
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  for (const Case& c : cases) {
    if (std::strcmp(c.name, "runs64") == 0 && context % 64 != 0) continue;  // whole runs only
    const auto launch = [&] {
      c.kernel<<<c.grid, c.threads, c.smem>>>(k_pool, v_pool, table, context, out);
    };
    launch();  // warm-up
    check(cudaDeviceSynchronize(), c.name);
    check(cudaEventRecord(start), "record");
    for (int i = 0; i < iters; ++i) launch();
    check(cudaEventRecord(stop), "record");
    check(cudaEventSynchronize(stop), c.name);
    float ms = 0.f;
    check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    const double us = 1e3 * ms / iters;
    std::printf("%-6s | %6.2f | %6.0f\n", c.name, us, bytes / (us * 1e3));
  }
  return 0;
}
