#include "cpu/quant/quant_matmul.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/kernels/matmul.h"
#include "cpu/quant/bf16_dot_matmul.h"
#include "cpu/quant/cpu_features.h"
#include "cpu/quant/quant_kernels.h"

namespace cellm::cpu::quant {
namespace {

constexpr int64_t kRowsPerGroup = 16;  // the 512-bit 32-weight kernels' weight-row tile

bool is_float_type(QuantType t) {
  return t == QuantType::kF32 || t == QuantType::kF16 || t == QuantType::kBF16;
}

DType float_dtype(QuantType t) {
  return t == QuantType::kF32 ? DType::kF32 : t == QuantType::kF16 ? DType::kF16 : DType::kBF16;
}

// d = max |x| / 127 and q = x / d rounded to nearest even, for n values.
float quantize_block(const float* x, int n, int8_t* q) {
  float amax = 0.0f;
  for (int l = 0; l < n; ++l) amax = std::max(amax, std::fabs(x[l]));
  const float d = amax / 127.0f;
  const float id = d == 0.0f ? 0.0f : 127.0f / amax;
  for (int l = 0; l < n; ++l) q[l] = static_cast<int8_t>(std::nearbyint(x[l] * id));
  return d;
}

void add_bias(int64_t m, int64_t n, TypedPtr bias, float* y) {
  if (bias.data == nullptr) return;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) y[i * n + j] += load_as_f32(bias.data, bias.dtype, j);
  }
}

QuantKernel kernel(QuantType t, QuantIsa isa) {
  switch (isa) {
    case QuantIsa::kAvx512Vnni:
      return avx512_vnni_kernel(t);
    case QuantIsa::kAvx2:
      return avx2_kernel(t);
    case QuantIsa::kScalar:
      return scalar_kernel(t);
  }
  return nullptr;
}

}  // namespace

int64_t act_row_bytes(ActFormat format, int64_t k) {
  switch (format) {
    case ActFormat::kBlockK:
      return k / kBlockK * static_cast<int64_t>(sizeof(BlockQ8_K));
    case ActFormat::kBlock32Sums:
      return k / kBlock32 * static_cast<int64_t>(sizeof(ActBlock32Sums));
    case ActFormat::kBlock32:
      break;
  }
  return k / kBlock32 * static_cast<int64_t>(sizeof(ActBlock32));
}

void quantize_activations(const float* x, int64_t k, ActFormat format, int offset, void* out) {
  auto* bytes = static_cast<uint8_t*>(out);
  if (format == ActFormat::kBlock32Sums) {
    for (int64_t b = 0; b < k / kBlock32; ++b) {
      ActBlock32Sums blk;
      blk.d = quantize_block(x + b * kBlock32, kBlock32, blk.qs);
      int sum = 0;
      for (const int8_t q : blk.qs) sum += q;
      blk.offset = -offset * sum;
      blk.dsum = blk.d * static_cast<float>(sum);
      std::memcpy(bytes + b * static_cast<int64_t>(sizeof(blk)), &blk, sizeof(blk));
    }
    return;
  }
  if (format == ActFormat::kBlock32) {
    for (int64_t b = 0; b < k / kBlock32; ++b) {
      ActBlock32 blk;
      blk.d = quantize_block(x + b * kBlock32, kBlock32, blk.qs);
      std::memcpy(bytes + b * static_cast<int64_t>(sizeof(blk)), &blk, sizeof(blk));
    }
    return;
  }
  for (int64_t b = 0; b < k / kBlockK; ++b) {
    BlockQ8_K blk;
    blk.d = quantize_block(x + b * kBlockK, kBlockK, blk.qs);
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += blk.qs[16 * g + l];
      blk.bsums[g] = static_cast<int16_t>(sum);
    }
    std::memcpy(bytes + b * static_cast<int64_t>(sizeof(blk)), &blk, sizeof(blk));
  }
}

const char* to_string(QuantIsa isa) {
  switch (isa) {
    case QuantIsa::kScalar:
      return "scalar";
    case QuantIsa::kAvx2:
      return "avx2";
    case QuantIsa::kAvx512Vnni:
      return "avx512-vnni";
  }
  return "unknown";
}

bool isa_supported(QuantIsa isa) {
  switch (isa) {
    case QuantIsa::kScalar:
      return true;
    case QuantIsa::kAvx2:
      return cpu_features().avx2;
    case QuantIsa::kAvx512Vnni:
      return cpu_features().avx512_vnni;
  }
  return false;
}

QuantIsa best_isa() {
  if (isa_supported(QuantIsa::kAvx512Vnni)) return QuantIsa::kAvx512Vnni;
  if (isa_supported(QuantIsa::kAvx2)) return QuantIsa::kAvx2;
  return QuantIsa::kScalar;
}

Status check_weights(QuantType type, int64_t cols) {
  if (type == QuantType::kQ8_K) {
    return InvalidArgument("q8_k is an activation format, not a weight type");
  }
  const Result<int64_t> bytes = row_bytes(type, cols);
  return bytes.ok() ? Status::Ok() : bytes.status();
}

void quant_matmul(ThreadPool& pool, const float* x, int64_t m, const QuantWeights& w, TypedPtr bias,
                  float* y) {
  quant_matmul(pool, x, m, w, bias, y, best_isa());
}

void quant_matmul(ThreadPool& pool, const float* x, int64_t m, const QuantWeights& w, TypedPtr bias,
                  float* y, QuantIsa isa) {
  // REQUIRES: a weight type and shape the kernels take, a path this CPU runs.
  CELLM_CHECK(m >= 0 && w.rows >= 0);
  CELLM_CHECK_MSG(check_weights(w.type, w.cols).ok(), "quant_matmul: bad weight shape or type");
  CELLM_CHECK_MSG(isa_supported(isa), "quant_matmul: the CPU lacks this instruction set");
  if (w.type == QuantType::kBF16 && isa == QuantIsa::kAvx512Vnni && bf16_dot_supported()) {
    bf16_dot_matmul(pool, x, m, w.cols, static_cast<const uint16_t*>(w.data), w.rows, y);
    add_bias(m, w.rows, bias, y);
    return;
  }
  if (is_float_type(w.type)) {
    matmul(pool, x, m, w.cols, TypedPtr{w.data, float_dtype(w.type)}, w.rows, bias, y);
    return;
  }
  if (m == 0 || w.rows == 0) return;
  CELLM_CHECK(x != nullptr && y != nullptr && w.data != nullptr);

  const ActFormat format = isa == QuantIsa::kAvx512Vnni && act_format(w.type) == ActFormat::kBlock32
                               ? ActFormat::kBlock32Sums
                               : act_format(w.type);
  const int offset = pair_offset(w.type);
  const int64_t act_bytes = act_row_bytes(format, w.cols);
  // The calling thread's; the pool's threads only read it during this call.
  thread_local std::vector<uint8_t> act;
  act.resize(static_cast<size_t>(m * act_bytes));
  // By pointer: inside a chunk run by a pool thread, `act` would name that thread's.
  uint8_t* const act_data = act.data();
  const auto quantize_rows = [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      if (isa == QuantIsa::kAvx512Vnni) {
        quantize_activations_avx512(x + i * w.cols, w.cols, format, offset,
                                    act_data + i * act_bytes);
      } else {
        quantize_activations(x + i * w.cols, w.cols, format, offset, act_data + i * act_bytes);
      }
    }
  };
  if (m * w.cols >= (int64_t{1} << 15)) {
    pool.parallel_for(m, quantize_rows);
  } else {
    quantize_rows(0, m);
  }

  QuantGemmArgs args;
  args.act = act_data;
  args.act_row_bytes = act_bytes;
  args.m = m;
  args.w = static_cast<const uint8_t*>(w.data);
  args.w_row_bytes = row_bytes(w.type, w.cols).value();
  args.k_blocks = w.cols / type_info(w.type).block_weights;
  args.y = y;
  args.ldy = w.rows;
  const QuantKernel run = kernel(w.type, isa);
  CELLM_CHECK(run != nullptr);
  // Bands are whole groups of kRowsPerGroup rows; each thread takes a contiguous run.
  const int64_t groups = (w.rows + kRowsPerGroup - 1) / kRowsPerGroup;
  const auto band = [&](int64_t g0, int64_t g1) {
    run(args, g0 * kRowsPerGroup, std::min(w.rows, g1 * kRowsPerGroup));
  };
  // Below ~64k multiply-adds a second thread costs more than it saves.
  if (m * w.rows * w.cols < (int64_t{1} << 16)) {
    band(0, groups);
  } else {
    pool.parallel_for(groups, band);
  }
  if (bias.data != nullptr) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < w.rows; ++j)
        y[i * w.rows + j] += load_as_f32(bias.data, bias.dtype, j);
    }
  }
}

}  // namespace cellm::cpu::quant
