#include "cuda/logit_adjuster.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>

#include "cuda/cuda_check.h"

namespace cellm::cuda {
namespace {

constexpr size_t kAlign = 256;
size_t aligned(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

// Where each array sits in the uploaded block (the same offsets on host and device).
struct BlockLayout {
  size_t rows = 0, masks = 0, edits = 0, bytes = 0;
  explicit BlockLayout(const PackedAdjustments& p) {
    masks = aligned(p.rows.size() * sizeof(LogitAdjustRow));
    edits = masks + aligned(p.masks.size() * sizeof(uint64_t));
    bytes = edits + aligned(p.edits.size() * sizeof(DeviceLogitEdit));
  }
};

}  // namespace

void pack_adjustments(std::span<const RowAdjustments> rows, int64_t vocab, PackedAdjustments& out,
                      std::vector<uint32_t>& seen) {
  out.rows.clear();
  out.masks.clear();
  out.edits.clear();
  // `seen` is all zero between calls: each row clears the marks it set.
  if (seen.size() != static_cast<size_t>(vocab)) seen.assign(static_cast<size_t>(vocab), 0);
  const auto max_words = static_cast<size_t>((vocab + 63) / 64);
  for (const RowAdjustments& r : rows) {
    if (r.adjustments == nullptr || r.adjustments->empty()) continue;
    const LogitAdjustments& a = *r.adjustments;
    LogitAdjustRow row;
    row.logits_row = r.row;
    row.first_word = static_cast<int64_t>(out.masks.size());
    row.first_edit = static_cast<int64_t>(out.edits.size());
    const size_t words = std::min(a.allowed.size(), max_words);
    out.masks.insert(out.masks.end(), a.allowed.begin(),
                     a.allowed.begin() + static_cast<std::ptrdiff_t>(words));
    row.mask_words = static_cast<int32_t>(words);
    for (const LogitEdit& e : a.edits) {
      if (e.token < 0 || e.token >= vocab) continue;
      uint32_t& s = seen[static_cast<size_t>(e.token)];
      if (s != 0) row.in_order = 1;
      s = 1;
      out.edits.push_back(DeviceLogitEdit{e.token, e.scale, e.bias});
    }
    row.n_edits = static_cast<int32_t>(out.edits.size() - static_cast<size_t>(row.first_edit));
    for (size_t i = static_cast<size_t>(row.first_edit); i < out.edits.size(); ++i) {
      seen[static_cast<size_t>(out.edits[i].token)] = 0;
    }
    // Left out: a row whose only edits were of tokens outside the vocabulary.
    if (row.mask_words == 0 && row.n_edits == 0) continue;
    out.rows.push_back(row);
  }
}

Status LogitAdjuster::apply(std::span<const RowAdjustments> rows, float* logits, int64_t n_rows,
                            cudaStream_t stream) {
  last_rows_ = 0;
  for (const RowAdjustments& r : rows) {
    if (r.row < 0 || r.row >= n_rows) {
      return InvalidArgument("logit adjustments for row " + std::to_string(r.row) +
                             " of a step of " + std::to_string(n_rows) + " rows");
    }
  }
  pack_adjustments(rows, vocab_, packed_, seen_);
  if (packed_.rows.empty()) return Status::Ok();
  const BlockLayout layout(packed_);
  if (layout.bytes > host_.bytes()) {
    // The old staging may still be read by a copy in flight.
    CELLM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "growing the logit staging");
    const size_t grown = std::max(layout.bytes, 2 * host_.bytes());
    host_.reset();
    device_.reset();
    CELLM_ASSIGN_OR_RETURN(host_, PinnedBuffer::allocate(grown));
    CELLM_ASSIGN_OR_RETURN(device_, DeviceBuffer::allocate(grown));
  }
  auto* h = static_cast<unsigned char*>(host_.get());
  std::memcpy(h + layout.rows, packed_.rows.data(), packed_.rows.size() * sizeof(LogitAdjustRow));
  std::memcpy(h + layout.masks, packed_.masks.data(), packed_.masks.size() * sizeof(uint64_t));
  std::memcpy(h + layout.edits, packed_.edits.data(),
              packed_.edits.size() * sizeof(DeviceLogitEdit));
  CELLM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(device_.get(), h, layout.bytes, cudaMemcpyHostToDevice, stream),
      "copying the logit adjustments");
  auto* d = device_.as<unsigned char>();
  CELLM_CUDA_RETURN_IF_ERROR(
      launch_logit_adjust(logits, n_rows, vocab_,
                          reinterpret_cast<const LogitAdjustRow*>(d + layout.rows),
                          static_cast<int32_t>(packed_.rows.size()),
                          reinterpret_cast<const uint64_t*>(d + layout.masks),
                          reinterpret_cast<const DeviceLogitEdit*>(d + layout.edits), stream),
      "adjusting the logits");
  last_rows_ = static_cast<int32_t>(packed_.rows.size());
  return Status::Ok();
}

}  // namespace cellm::cuda
