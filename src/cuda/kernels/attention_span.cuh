// How the attention kernels cut a row's context into chunks (included by the
// attention*.cu files only): the split kernels (CUDA-core and tensor-core) and the
// fold that merges their partials must agree on which partials exist, so they share
// this one cut.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cellm::cuda::detail {

// A row's chunk length is a multiple of this by default: 4 warps times 16-key tiles,
// so each warp of a block has a tile (with 16, a short row's blocks each held one
// tile and three of their four warps idled). The tensor-core kernel passes its own
// warps times 16.
inline constexpr int32_t kAttentionChunkAlign = 64;
// A row of at most this many positions is one chunk whatever the split count: its
// blocks then write the output directly, and the fold's extra round trip through the
// workspace costs more than splitting saves (one row of 192 keys over 8 kv heads: 4.8 us
// unsplit, 5.5-6.2 us in 3 chunks).
inline constexpr int64_t kAttentionUnsplitPositions = 256;
// A longer row takes at least the launch's min_chunks chunks, and one more per this many
// positions, up to the split count: chunks of ~1,000 keys pay for their fold.
inline constexpr int64_t kAttentionPositionsPerChunk = 1024;
inline constexpr float kLog2e = 1.4426950408889634f;

// The positions a row attends, [lo, hi), and how they are cut: `active` chunks of
// `chunk` positions (a multiple of `align`; the last may be shorter): one chunk up to
// kAttentionUnsplitPositions, else min(n_splits, max(min_chunks, len /
// kAttentionPositionsPerChunk)) before the rounding, so that the row's length, not the
// session budget, sets the work and the number of blocks. Computed on the device from
// the row's position: a graph captured once cuts every replay's rows by their current
// lengths.
struct RowSpan {
  int64_t lo, hi;
  int32_t chunk, active;
};

__device__ __forceinline__ RowSpan row_span(int32_t pos, int32_t window, int32_t n_splits,
                                            int32_t min_chunks,
                                            int32_t align = kAttentionChunkAlign) {
  RowSpan s;
  s.hi = int64_t{pos} + 1;
  s.lo = window > 0 ? max(int64_t{0}, s.hi - window) : 0;
  const int64_t len = s.hi - s.lo;
  const int64_t chunks =
      len <= kAttentionUnsplitPositions
          ? 1
          : min(int64_t{n_splits}, max(int64_t{min_chunks}, len / kAttentionPositionsPerChunk));
  const int64_t per_split = (len + chunks - 1) / chunks;
  s.chunk = static_cast<int32_t>((per_split + align - 1) / align * align);
  s.active = static_cast<int32_t>((len + s.chunk - 1) / s.chunk);
  return s;
}

}  // namespace cellm::cuda::detail
