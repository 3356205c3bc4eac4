#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cellm/model_weights.h"
#include "model/fp8.h"
#include "model/half.h"

namespace cellm {
namespace {

// Runs fn(begin, end) over [0, rows) split across the machine's threads.
template <typename Fn>
void for_rows(int64_t rows, const Fn& fn) {
  if (rows <= 0) return;
  const int64_t threads = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, rows);
  std::vector<std::thread> workers;
  for (int64_t t = 1; t < threads; ++t) {
    workers.emplace_back([&, t] { fn(rows * t / threads, rows * (t + 1) / threads); });
  }
  fn(0, rows / threads);
  for (std::thread& w : workers) w.join();
}

// Row r of a float tensor [rows, cols] widened to f32 into `out`.
void row_as_f32(const TensorView& t, int64_t r, int64_t cols, float* out) {
  const int64_t base = r * cols;
  for (int64_t c = 0; c < cols; ++c) {
    switch (t.dtype) {
      case DType::kF32:
        out[c] = static_cast<const float*>(t.data)[base + c];
        break;
      case DType::kBF16:
        out[c] = bf16_to_f32(static_cast<const uint16_t*>(t.data)[base + c]);
        break;
      case DType::kF16:
        out[c] = f16_to_f32(static_cast<const uint16_t*>(t.data)[base + c]);
        break;
      case DType::kF8E4M3:
        out[c] = e4m3_to_f32(static_cast<const uint8_t*>(t.data)[base + c]) * t.scales[r];
        break;
    }
  }
}

// The float weight `t` [rows, cols] as e4m3 with one scale per row (quantize_row_e4m3).
// InvalidArgument naming the tensor when it holds a non-finite value.
}  // namespace

Result<ConvertedWeight> quantize_to_fp8(const TensorView& t) {
  const int64_t cols = t.shape.back();
  const int64_t rows = t.numel() / cols;
  ConvertedWeight c;
  c.dtype = DType::kF8E4M3;
  c.bytes.resize(static_cast<size_t>(rows * cols));
  c.scales.resize(static_cast<size_t>(rows));
  std::atomic<int64_t> bad_row{-1};
  for_rows(rows, [&](int64_t begin, int64_t end) {
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = begin; r < end; ++r) {
      row_as_f32(t, r, cols, row.data());
      if (!std::all_of(row.begin(), row.end(), [](float v) { return std::isfinite(v); })) {
        bad_row = r;
        continue;
      }
      c.scales[static_cast<size_t>(r)] = quantize_row_e4m3(
          row.data(), cols, reinterpret_cast<uint8_t*>(c.bytes.data()) + r * cols);
    }
  });
  if (bad_row >= 0) {
    return InvalidArgument("quantizing tensor " + t.name + " to fp8: row " +
                           std::to_string(bad_row.load()) + " holds a non-finite value");
  }
  return c;
}

// The FP8 weight `t` [rows, cols] dequantized (code value * row scale) to `dtype`
// (BF16 rounds to nearest even; F32 is exact).
ConvertedWeight dequantize_fp8(const TensorView& t, DType dtype) {
  const int64_t cols = t.shape.back();
  const int64_t rows = t.numel() / cols;
  ConvertedWeight c;
  c.dtype = dtype;
  c.bytes.resize(static_cast<size_t>(rows * cols) * dtype_size_bytes(dtype));
  for_rows(rows, [&](int64_t begin, int64_t end) {
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = begin; r < end; ++r) {
      row_as_f32(t, r, cols, row.data());
      if (dtype == DType::kF32) {
        std::memcpy(c.bytes.data() + r * cols * 4, row.data(), static_cast<size_t>(cols) * 4);
      } else {
        auto* out = reinterpret_cast<uint16_t*>(c.bytes.data()) + r * cols;
        for (int64_t i = 0; i < cols; ++i) out[i] = f32_to_bf16(row[static_cast<size_t>(i)]);
      }
    }
  });
  return c;
}

}  // namespace cellm
