// The model's two ends: the embedding gather (token ids -> f32 rows) and the
// logits of selected rows (selected hidden rows · LM headᵀ, through matmul).
// Thread-safety: reentrant; `logits` runs on `pool`.
#pragma once

#include <cstdint>
#include <span>

#include "cpu/kernels/convert.h"
#include "cpu/kernels/thread_pool.h"

namespace cellm::cpu {

// out[i, :] = table[tokens[i], :] widened to f32, for i in [0, tokens.size()).
// table: [vocab, d] in any DType; out: [tokens.size(), d] f32.
// REQUIRES: d > 0, every token in [0, vocab).
void embedding_gather(TypedPtr table, int64_t vocab, int64_t d, std::span<const int32_t> tokens,
                      float* out);

// out[s, :] = hidden[rows[s], :] · lm_headᵀ for s in [0, rows.size()).
// hidden: [m, d] f32; lm_head: [vocab, d] in any DType (the embedding table when
// tied); out: [rows.size(), vocab] f32.
// REQUIRES: every row in [0, m).
void logits(ThreadPool& pool, const float* hidden, int64_t m, int64_t d,
            std::span<const int32_t> rows, TypedPtr lm_head, int64_t vocab, float* out);

}  // namespace cellm::cpu
