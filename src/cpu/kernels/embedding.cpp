#include "cpu/kernels/embedding.h"

#include <cstring>
#include <vector>

#include "cellm/status.h"
#include "cpu/kernels/matmul.h"
#include "cpu/kernels/simd.h"

namespace cellm::cpu {

void embedding_gather(TypedPtr table, int64_t vocab, int64_t d, std::span<const int32_t> tokens,
                      float* out) {
  // REQUIRES: a table and in-range token ids.
  CELLM_CHECK(d > 0 && vocab > 0 && table.data != nullptr);
  const auto* bytes = static_cast<const unsigned char*>(table.data);
  const int64_t row_bytes = d * dtype_bytes(table.dtype);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t t = tokens[i];
    CELLM_CHECK_MSG(t >= 0 && t < vocab, "embedding_gather: token id out of range");
    simd::widen(bytes + t * row_bytes, table.dtype, d, out + static_cast<int64_t>(i) * d);
  }
}

void logits(ThreadPool& pool, const float* hidden, int64_t m, int64_t d,
            std::span<const int32_t> rows, TypedPtr lm_head, int64_t vocab, float* out) {
  // REQUIRES: selected rows within the hidden states.
  CELLM_CHECK(m >= 0 && d > 0 && vocab > 0);
  if (rows.empty()) return;
  const auto s = static_cast<int64_t>(rows.size());
  std::vector<float> selected(static_cast<size_t>(s * d));
  for (int64_t i = 0; i < s; ++i) {
    const int32_t r = rows[static_cast<size_t>(i)];
    CELLM_CHECK_MSG(r >= 0 && r < m, "logits: selected row out of range");
    std::memcpy(selected.data() + i * d, hidden + r * d, static_cast<size_t>(d) * sizeof(float));
  }
  matmul(pool, selected.data(), s, d, lm_head, vocab, TypedPtr{}, out);
}

}  // namespace cellm::cpu
