// Weight re-encoding for quantize-on-load (`--weights`) and for handing block-format
// weights to an executor that reads elements: the CPU layer's weight quantizers
// (src/cpu/quant/weight_quant.h) behind a public seam, so the engine uses them
// without reaching into the CPU executor's internals. Types are ggml's (GgmlType):
// F32, F16, BF16 elements, or the block types the CPU kernels run (Q8_0, Q4_0,
// Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K).
//
// Thread-safety: pure functions over caller-owned memory.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cellm/dtype.h"
#include "cellm/status.h"

namespace cellm {

// Whether the CPU layer reads and writes weights of `type` (the list above).
bool cpu_weight_type_supported(GgmlType type);

// Bytes of a [rows, cols] weight held as `type`. InvalidArgument naming the type
// and its block size when cols is not a whole number of its blocks, or when the
// CPU layer does not write `type`.
Result<size_t> weight_bytes(GgmlType type, int64_t rows, int64_t cols);

// The [rows, cols] weight at `src`, stored as `src_type`, re-encoded row by row as
// `type` into dst (weight_bytes(type, rows, cols) bytes), spread over up to
// `threads` threads (0: the machine's hardware threads). Block types go through the
// weight quantizers (K-quants with a searched scale per sub-block); F32/F16/BF16
// round to nearest. InvalidArgument when either type is unsupported or cols is not
// whole blocks of either.
Status reencode_weight(GgmlType src_type, const void* src, int64_t rows, int64_t cols,
                       GgmlType type, void* dst, int threads = 0);

}  // namespace cellm
