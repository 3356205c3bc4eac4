// Attention of a step's query rows over their sequences' KV cells, gathered
// through the cell table (DESIGN.md §4, §9.1): one launcher for decode (one query
// per sequence, many sequences) and prefill (many queries of one sequence).
//
// Semantics (CPU twin: cpu::attention in src/cpu/kernels/attention.h). Query row r
// sits at position q = positions[r] of sequence s = row_seq[r] and attends the cells
// of s at positions [lo, q], lo = max(0, q - window + 1) for window > 0, else 0.
// Head h reads kv head h / (n_heads / n_kv_heads) (grouped-query):
//   out[r, h] = softmax_j(scale * q[r, h] · k[j]) · v[j],  all math in f32.
// The row's own K/V (and table entry) must already be written (launch_kv_write).
//
// Layouts:
//   qkv      [n_rows, row_stride] of T: query head h of row r is the head_dim values at
//            qkv + r * row_stride + q_offset + h * head_dim.
//   k_pool, v_pool  [max_cells, n_kv_heads, head_dim] of T (one layer).
//   table    int32 [n_table_rows, table_stride], shared by all layers:
//            table[s * table_stride + p] = the cell of position p of sequence s.
//   row_seq, positions  int32 [n_rows].
//   out      [n_rows, n_heads * head_dim] of T; must not overlap the inputs.
//   workspace  attention_workspace_bytes() bytes (may be 0 bytes, then nullptr is fine):
//            the splits' arrival counters and partial results (layout below). Zero every
//            byte once, when it is allocated (cudaMemset); every completed launch leaves
//            the counters zero again, so the next launch or graph replay needs no reset.
//            After a launch that failed to run to completion, zero it again.
//
// Flash-decoding split: attention_num_splits() blocks along each row's context,
// a function of the launch's shape only (rows, heads, the session budget
// max_context), so a captured CUDA graph stays valid while tables and positions
// change. The cut is made on the device from the row's current length: its
// positions [lo, q] are divided into at most that many chunks of equal length (a
// multiple of 64), so a short row at a large budget still spreads over many
// blocks, and one block per (row, chunk, kv head, tile of up to 8 query heads of
// that kv head) folds its chunk with an online softmax. A row with one chunk is
// written directly. Otherwise each block writes its chunk's partial (max, sum, acc)
// to the workspace and counts itself in on its (row, kv head, head tile) counter;
// the block that arrives last merges the row's partials of its heads into `out` and
// zeroes the counter (attention_fold.cuh): one kernel, no combine launch.
//
// Two split kernels. bf16 with head_dim 64 or 128, at most 16 query heads per kv
// head and 16-byte aligned rows (attention_uses_tensor_cores) run on tensor cores:
// one block per (row, chunk, kv head) holds all the kv head's query heads as the
// 16 rows of an mma.m16n8k16 and folds 16 keys per step (attention_mma.cu). Other
// shapes run on CUDA cores (attention.cu). Both write the same partials, in the same
// workspace layout, and end with the same fold. The tensor-core kernel, for a launch
// of a few rows (each block an SM of its own) on sm_90, may instead make each (row,
// kv head)'s blocks one thread-block cluster of at most 8 splits whose blocks merge
// each other's partials from shared memory (AttentionParams::cluster_fold), the same
// operations in the same order: no workspace traffic, fence or counter.
//
// A prefill's rows (AttentionParams::row_runs: a launch whose rows come in runs of
// consecutive rows of one sequence, cut by attention_row_ranges) run on tensor cores,
// where the split kernel would, as one block per 64 / group consecutive rows and kv head
// (attention_prefill.cu): the block gathers each key of its rows' sequence once for all
// of them, and its MMAs' 16 rows are the query heads of 16 / group rows (the split
// kernel's hold one row's heads). No split, no workspace.
//
// The launcher enqueues one kernel on `stream` with programmatic dependent launch
// (kernels/launch.cuh: it waits for the stream's earlier work before touching any
// buffer); it never allocates or synchronizes and may be captured in a CUDA graph (a
// replay reads the current contents of every buffer). Returns cudaErrorInvalidValue
// for a malformed call, else the launch's error. Thread-safety: reentrant; concurrent
// launches need distinct workspaces.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace cellm::cuda {

inline constexpr int64_t kMaxAttentionHeadDimCuda = 256;

// Blocks a launch's split count aims for by default (AttentionParams::target_blocks):
// the most blocks a launch has, reached by rows long enough (kernels/attention_span.cuh).
inline constexpr int64_t kAttentionTargetBlocks = 512;
// Blocks a launch keeps at least while its rows are longer than 256 positions, by
// default (AttentionParams::min_blocks); a row adds a chunk per 1,024 positions beyond
// that, up to the split count. A fold costs more than the parallelism it adds past ~128
// blocks until chunks reach ~1,000 keys: 16 rows of 8 kv heads at 1,024 keys take 27.5 us
// unsplit and 30.3 in 4 splits, at 8,192 keys 185 unsplit and 162 in 4; one row at 1,024
// keys 7.0 us in 16 chunks, 8.7 in 64.
inline constexpr int64_t kAttentionMinBlocks = 128;

// int32 arrival counters at the start of the workspace: one per (row, kv head, head
// tile) of a launch that splits, which has fewer blocks per split than its target
// blocks; so the target is at most this.
inline constexpr int64_t kAttentionWorkspaceCounters = 4096;

// Which split kernel a launch may use. kCudaCores is for tests and benchmarks that
// compare the two paths; production leaves kAuto.
enum class AttentionPath { kAuto, kCudaCores };

template <typename T>
struct AttentionParams {
  const T* qkv = nullptr;  // [n_rows, row_stride]; queries at columns [q_offset, +n_heads*head_dim)
  int64_t row_stride = 0;  // elements between consecutive rows of qkv
  int64_t q_offset = 0;    // column of query head 0
  int64_t n_rows = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;          // divides n_heads
  int64_t head_dim = 0;            // in [1, kMaxAttentionHeadDimCuda]
  const T* k_pool = nullptr;       // [max_cells, n_kv_heads, head_dim]
  const T* v_pool = nullptr;       // [max_cells, n_kv_heads, head_dim]
  const int32_t* table = nullptr;  // [n_table_rows, table_stride] cell of (sequence, position)
  int64_t table_stride = 0;
  const int32_t* row_seq = nullptr;    // [n_rows] table row of each query row
  const int32_t* positions = nullptr;  // [n_rows] absolute position of each query row
  int32_t window = 0;                  // sliding window in tokens; 0 = full history
  float scale = 0.f;                   // score scale, usually 1/sqrt(head_dim)
  int32_t max_context = 0;             // > every positions[r]: the session budget; sizes the split
  float* workspace = nullptr;          // attention_workspace_bytes(>= n_rows, ...), zeroed once
  T* out = nullptr;                    // [n_rows, n_heads * head_dim]
  AttentionPath path = AttentionPath::kAuto;
  // Blocks the split count aims for, in [1, kAttentionWorkspaceCounters]; 0 =
  // kAttentionTargetBlocks. The workspace must be sized with the same value.
  int64_t target_blocks = 0;
  // Blocks the launch keeps at least while a row is longer than 256 positions (see
  // attention_min_chunks), >= 0; 0 = kAttentionMinBlocks. At or above target_blocks every
  // such row is cut into the full split count (tests set it to reach every chunk count).
  // The workspace must be sized with the same value.
  int64_t min_blocks = 0;
  // How many of each row's newest positions the launch's step may have written (their
  // K/V or table entry) in kernels ahead of this one on the stream: 1 for a decode step
  // (one row per sequence, at its newest position), the launch's rows for a prefill.
  // The tensor-core kernel reads the cells and K/V of older positions before it waits
  // for those kernels (programmatic launch), so they load while the K/V write runs.
  // 0 = unknown: nothing is read before the wait. REQUIRES: every cell a row attends at
  // a position below positions[r] + 1 - fresh_positions, and its table entry, were
  // written before the kernel ahead of this launch began.
  int32_t fresh_positions = 0;
  // Warps per block of the tensor-core kernel: 2, 4 or 8, or 0 to choose by the launch's
  // blocks and the device's SMs. Other values are invalid. Tests and benchmarks set it.
  int32_t block_warps = 0;
  // Whether the tensor-core kernel may fold a row's chunks inside a thread-block cluster
  // (sm_90): when each (row, kv head)'s blocks fit one portable cluster of at most 8
  // and every block has an SM of its own (a few rows), its splits come down to 8, and
  // the chunks' partials merge through distributed shared memory instead of the
  // workspace's fence, counter and L2 round trips. Tests and benchmarks turn it off.
  bool cluster_fold = true;
  // Whether the rows come in runs of consecutive rows of one sequence (a prefill chunk:
  // the `runs` ranges of attention_row_ranges). Where the tensor-core kernels serve the
  // launch and the kv heads hold 1, 2, 4, 8 or 16 query heads, the prefill kernel then
  // takes it (above). Any rows stay correct either way; the prefill kernel is slower for
  // rows of many sequences (each block takes its rows' sequences one after another) and
  // never splits a row, so a few rows of a long context want the split kernel.
  bool row_runs = false;
};

// A range of a step's rows, [begin, end), for one launch_attention: `runs` when its rows
// come in runs of at least kAttentionMinRunRows rows of one sequence.
struct AttentionRowRange {
  int64_t begin = 0;
  int64_t end = 0;
  bool runs = false;
};
inline constexpr int64_t kAttentionMinRunRows = 16;

// Cuts rows [0, row_seq.size()) into ranges whose launches (attention_rows, with
// row_runs = the range's `runs`) together compute the step's attention: maximal runs of
// consecutive rows of one sequence that are at least min_run long (a prefill chunk)
// form `runs` ranges, the rows between them (decode rows, short chunks) the others;
// neighbouring ranges of one kind merge. Empty for no rows.
std::vector<AttentionRowRange> attention_row_ranges(std::span<const int32_t> row_seq,
                                                    int64_t min_run = kAttentionMinRunRows);

// p restricted to its rows [begin, end): the same launch over fewer rows (qkv, row_seq,
// positions and out advanced to row `begin`). REQUIRES: 0 <= begin <= end <= p.n_rows.
template <typename T>
AttentionParams<T> attention_rows(const AttentionParams<T>& p, int64_t begin, int64_t end) {
  AttentionParams<T> sub = p;
  sub.n_rows = end - begin;
  sub.qkv = p.qkv + begin * p.row_stride;
  sub.row_seq = p.row_seq + begin;
  sub.positions = p.positions + begin;
  sub.out = p.out + begin * p.n_heads * p.head_dim;
  return sub;
}

// Blocks along each row's context (>= 1): enough for ~target_blocks blocks in all
// (splitting only while a split has fewer blocks than that), at most one per 32
// positions of the budget, at most 64, and no more than a row of the budget can use:
// max(the chunks of ~min_blocks blocks, max_context / 1024) (see attention_min_chunks).
// A function of the shape only.
int32_t attention_num_splits(int64_t n_rows, int64_t n_heads, int64_t n_kv_heads,
                             int32_t max_context, int64_t target_blocks = kAttentionTargetBlocks,
                             int64_t min_blocks = kAttentionMinBlocks);

// How a launch cuts a row of len positions (on the device, from each row's length):
// into one chunk while len <= 256; else into
// min(n_splits, max(min_chunks, len / 1024)) chunks of a multiple of 64 keys (the count
// may drop by the rounding), where min_chunks, this function, is the chunks that give
// the launch ~min_blocks blocks, within [1, n_splits]. A function of the shape only.
int32_t attention_min_chunks(int64_t n_rows, int64_t n_heads, int64_t n_kv_heads, int32_t n_splits,
                             int64_t min_blocks = kAttentionMinBlocks);

// Bytes of workspace enough for every launch of up to `max_rows` rows with these
// heads and budget; 0 when none of them splits. Layout of a launch of n rows with S
// splits: int32 counters [kAttentionWorkspaceCounters] (fixed, whatever n and S), then
// f32 acc [n, n_heads, S, head_dim], then f32 max and sum, each [n, n_heads, S] (max
// in log2 units). Counter (r, kv head k, head tile t) is at r * n_kv_heads * T + k * T
// + t, T the split kernel's blocks per kv head (1 on tensor cores).
size_t attention_workspace_bytes(int64_t max_rows, int64_t n_heads, int64_t n_kv_heads,
                                 int64_t head_dim, int32_t max_context,
                                 int64_t target_blocks = kAttentionTargetBlocks,
                                 int64_t min_blocks = kAttentionMinBlocks);

// Whether launch_attention(p) runs the tensor-core split kernel: T is bf16, path is
// kAuto, head_dim is 64 or 128, n_heads / n_kv_heads <= 16, and qkv, k_pool, v_pool,
// row_stride and q_offset are 16-byte aligned. A function of p's shape and pointers.
template <typename T>
bool attention_uses_tensor_cores(const AttentionParams<T>& p);

// REQUIRES: the shapes above; 0 <= positions[r] < table_stride; table rows hold a cell
// in [0, max_cells) for every position the row attends. positions[r] < max_context is
// the budget the split count is sized for; a position past it is still correct.
template <typename T>
cudaError_t launch_attention(const AttentionParams<T>& p, cudaStream_t stream);

}  // namespace cellm::cuda
