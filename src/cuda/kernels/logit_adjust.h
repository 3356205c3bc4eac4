// Logit adjustments on the device: the twin of cellm::apply_logit_adjustments
// (include/cellm/logits_processor.h, src/core/logits_processor.cpp) for some rows of a
// [n_rows, vocab] block of logits, so that a LogitsProcessor's allowed-token mask and
// sparse edits reach the device sampler (cuda/logit_adjuster.h packs them).
//
// For each adjusted row, element for element what the host function gives: first each
// edit of a token in [0, vocab), x -> (x > 0 ? x / scale : x * scale) + bias (IEEE
// single-precision division, multiplication and addition, each rounded on its own: no
// fused multiply-add, as the host computes it), then, with a mask of mask_words > 0
// words, every token t with t / 64 >= mask_words or bit t % 64 of word t / 64 clear
// becomes -inf. A mask of 0 words allows every token.
//
// How: one launch, a grid of (chunks of the row, adjusted rows). The mask blocks write
// -inf over the forbidden tokens of their chunk; the first block of a row applies its
// edits, skipping forbidden tokens (they end at -inf whatever an edit would make of
// them), so no two blocks write one logit. Distinct edit tokens are applied in
// parallel; a row whose edits repeat a token (in_order) has them applied one at a
// time, in order, as the host does.
//
// The launcher enqueues on `stream`, never allocates or synchronises.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cellm::cuda {

// One edit, laid out as cellm::LogitEdit (token, scale, bias).
struct DeviceLogitEdit {
  int32_t token = 0;
  float scale = 1.0f;
  float bias = 0.0f;
};
static_assert(sizeof(DeviceLogitEdit) == 12, "DeviceLogitEdit is uploaded as raw bytes");

// One adjusted row: which row of the logits, where its mask words and edits lie in the
// launch's arrays.
struct LogitAdjustRow {
  int64_t logits_row = 0;  // in [0, n_rows)
  int64_t first_word = 0;  // its mask: masks[first_word, first_word + mask_words)
  int64_t first_edit = 0;  // its edits: edits[first_edit, first_edit + n_edits)
  int32_t mask_words = 0;  // 0: no mask; else at most ceil(vocab / 64)
  int32_t n_edits = 0;
  int32_t in_order = 0;  // nonzero: some token has several edits; apply them one at a time
  int32_t pad = 0;
};
static_assert(sizeof(LogitAdjustRow) == 40, "LogitAdjustRow is uploaded as raw bytes");

// Tokens of a row one block of the launch covers.
inline constexpr int64_t kAdjustChunkTokens = 8192;

// Applies rows[0, n_adjusted) to `logits` in place.
//   logits [n_rows, vocab] f32 device; rows [n_adjusted], masks, edits: device.
// A row whose logits_row lies outside [0, n_rows) is skipped.
// Returns cudaErrorInvalidValue (launching nothing) for vocab < 1, n_rows < 0,
// n_adjusted < 0, or a null logits or rows pointer while n_adjusted > 0; cudaSuccess
// with no launch when n_adjusted == 0; else the launch's error.
cudaError_t launch_logit_adjust(float* logits, int64_t n_rows, int64_t vocab,
                                const LogitAdjustRow* rows, int32_t n_adjusted,
                                const uint64_t* masks, const DeviceLogitEdit* edits,
                                cudaStream_t stream);

}  // namespace cellm::cuda
