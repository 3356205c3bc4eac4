// Weight quantizers: what quantize-on-load (`--weights q8_0|q4_k|...`) turns a
// float weight row into, one scalar function per block type.
//
// The 32-weight formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) use the format's own
// scale rule, block_formats.h's quantize_row: the bytes ggml's reference
// quantizer and the `gguf` Python package give (tests compare them byte for byte).
//
// The K-quants search each sub-block's scale (and, for Q4_K/Q5_K, its min) for
// the least squared error instead of taking them from the range:
//   Q4_K, Q5_K  sub-blocks of 32, y = s q - m (q in [0, 15] or [0, 31], m >= 0).
//               For each of 13 candidate steps range / (levels - 2 + k / 2),
//               k = 0..12, the weights are rounded with the range's minimum as
//               offset, then s and m are refit by least squares to those levels
//               (m clamped to >= 0, where the fit would give an offset above
//               zero); the candidate (or the plain range rule) with the smallest
//               error wins. The sub-block scales and mins are then put on the 6-bit
//               grids of the super-block's d = max s / 63 and dmin = max m / 63,
//               and the weights rounded once more against the scales as stored.
//   Q6_K        sub-blocks of 16, y = s (q - 32), q in [0, 63]. Candidate inverse
//               steps map the largest-magnitude weight to -36 .. -24 (steps of 1;
//               past -32 it clips) or to +31; after rounding, s is refit by least
//               squares; the best candidate's s goes onto the int8 grid of
//               d = max |s| / 127.
// Errors are plain (unweighted) squared errors; no importance matrix.
//
// Thread-safety: pure functions over caller-owned memory.
#pragma once

#include <cstdint>

#include "cellm/dtype.h"
#include "cellm/status.h"
#include "cpu/quant/block_formats.h"

namespace cellm::cpu::quant {

// dst = src[0, n) in `type`'s blocks (row_bytes(type, n) bytes): the weight
// quantizer of `type` (above). The float types (F32, F16, BF16) convert.
// REQUIRES: n a whole number of `type`'s blocks; src finite; type != kQ8_K.
void quantize_weight_row(QuantType type, const float* src, int64_t n, void* dst);

// The weight types quantize-on-load produces.
bool is_weight_quant_type(QuantType type);

// A [rows, cols] weight stored as `src_type` (F32, F16, BF16 or a block type) at
// `src`, re-encoded row by row as `type` into dst (rows * row_bytes(type, cols)
// bytes), spread over up to `threads` threads (0: the machine's hardware threads).
// InvalidArgument when cols is not a whole number of either type's blocks.
Status quantize_weight_matrix(QuantType src_type, const void* src, int64_t rows, int64_t cols,
                              QuantType type, void* dst, int threads = 0);

}  // namespace cellm::cpu::quant
