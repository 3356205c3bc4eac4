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

void add_bias(int64_t m, int64_t n, TypedPtr bias, float* y) {
  if (bias.data == nullptr) return;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) y[i * n + j] += load_as_f32(bias.data, bias.dtype, j);
  }
}

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

void quantize_activations(const float* x, int64_t k, ActFormat format, void* out) {
  auto* bytes = static_cast<uint8_t*>(out);
  if (format == ActFormat::kBlock32Sums) {
    for (int64_t b = 0; b < k / kBlock32; ++b) {
      ActBlock32Sums blk;
      blk.d = quantize_block(x + b * kBlock32, kBlock32, blk.qs);
      int sum = 0;
      for (const int8_t q : blk.qs) sum += q;
      blk.sum = sum;
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
  const QuantProduct product{w, bias, y};
  quant_matmul_shared(pool, x, m, std::span<const QuantProduct>(&product, 1), isa);
}

void quant_matmul_shared(ThreadPool& pool, const float* x, int64_t m,
                         std::span<const QuantProduct> products) {
  quant_matmul_shared(pool, x, m, products, best_isa());
}

void quant_matmul_shared(ThreadPool& pool, const float* x, int64_t m,
                         std::span<const QuantProduct> products, QuantIsa isa) {
  // REQUIRES: weight types and shapes the kernels take, a path this CPU runs.
  CELLM_CHECK(m >= 0);
  CELLM_CHECK_MSG(isa_supported(isa), "quant_matmul: the CPU lacks this instruction set");
  // The block-type products, each with its kernel and activation format; at most one
  // buffer of quantized rows per format (kBlock32 or kBlock32Sums, and kBlockK).
  struct Block {
    const QuantProduct* p;
    QuantKernel run;
    int act;  // index into acts
    int64_t first_group;
  };
  struct Act {
    ActFormat format;
    int64_t row_bytes;
    uint8_t* data;
  };
  constexpr int kMaxActs = 3;  // ActFormat's values
  // The calling thread's; the pool's threads only read them during this call.
  thread_local std::vector<uint8_t> act_buffers[kMaxActs];
  thread_local std::vector<Block> this_threads_blocks;
  // By reference: inside a chunk run by a pool thread, the thread_local would name that
  // thread's.
  std::vector<Block>& blocks = this_threads_blocks;
  blocks.clear();
  Act acts[kMaxActs];
  int n_acts = 0;
  int64_t cols = -1, groups = 0, macs = 0;
  for (const QuantProduct& p : products) {
    const QuantWeights& w = p.w;
    CELLM_CHECK(w.rows >= 0);
    CELLM_CHECK_MSG(check_weights(w.type, w.cols).ok(), "quant_matmul: bad weight shape or type");
    CELLM_CHECK_MSG(cols < 0 || w.cols == cols, "quant_matmul_shared: products of different x");
    cols = w.cols;
    if (w.type == QuantType::kBF16 && isa == QuantIsa::kAvx512Vnni && bf16_dot_supported()) {
      bf16_dot_matmul(pool, x, m, w.cols, static_cast<const uint16_t*>(w.data), w.rows, p.y);
      add_bias(m, w.rows, p.bias, p.y);
      continue;
    }
    if (is_float_type(w.type)) {
      matmul(pool, x, m, w.cols, TypedPtr{w.data, float_dtype(w.type)}, w.rows, p.bias, p.y);
      continue;
    }
    if (m == 0 || w.rows == 0) continue;
    CELLM_CHECK(x != nullptr && p.y != nullptr && w.data != nullptr);
    const ActFormat format =
        isa == QuantIsa::kAvx512Vnni && act_format(w.type) == ActFormat::kBlock32
            ? ActFormat::kBlock32Sums
            : act_format(w.type);
    int act = 0;
    while (act < n_acts && acts[act].format != format) ++act;
    if (act == n_acts) acts[n_acts++] = Act{format, act_row_bytes(format, cols), nullptr};
    const QuantKernel run = kernel(w.type, isa);
    CELLM_CHECK(run != nullptr);
    blocks.push_back(Block{&p, run, act, groups});
    groups += (w.rows + kRowsPerGroup - 1) / kRowsPerGroup;
    macs += m * w.rows * w.cols;
  }
  if (blocks.empty()) return;

  for (int t = 0; t < n_acts; ++t) {
    std::vector<uint8_t>& buffer = act_buffers[t];
    buffer.resize(static_cast<size_t>(m * acts[t].row_bytes));
    // By pointer: inside a chunk run by a pool thread, `buffer` would name that thread's.
    acts[t].data = buffer.data();
  }
  const auto quantize_rows = [&](int64_t i0, int64_t i1) {
    for (int t = 0; t < n_acts; ++t) {
      const Act& act = acts[t];
      for (int64_t i = i0; i < i1; ++i) {
        if (isa == QuantIsa::kAvx512Vnni) {
          quantize_activations_avx512(x + i * cols, cols, act.format, act.data + i * act.row_bytes);
        } else {
          quantize_activations(x + i * cols, cols, act.format, act.data + i * act.row_bytes);
        }
      }
    }
  };
  if (m * cols * n_acts >= (int64_t{1} << 15)) {
    pool.parallel_for(m, quantize_rows);
  } else {
    quantize_rows(0, m);
  }

  // Bands are whole groups of kRowsPerGroup rows of the products laid end to end; each
  // thread takes a contiguous run (crossing from one product into the next).
  const auto band = [&](int64_t g0, int64_t g1) {
    for (const Block& blk : blocks) {
      const QuantWeights& w = blk.p->w;
      const int64_t first = blk.first_group;
      const int64_t last = first + (w.rows + kRowsPerGroup - 1) / kRowsPerGroup;
      const int64_t lo = std::max(g0, first), hi = std::min(g1, last);
      if (lo >= hi) continue;
      QuantGemmArgs args;
      args.act = acts[blk.act].data;
      args.act_row_bytes = acts[blk.act].row_bytes;
      args.m = m;
      args.w = static_cast<const uint8_t*>(w.data);
      args.w_row_bytes = row_bytes(w.type, w.cols).value();
      args.k_blocks = w.cols / type_info(w.type).block_weights;
      args.y = blk.p->y;
      args.ldy = w.rows;
      blk.run(args, (lo - first) * kRowsPerGroup, std::min(w.rows, (hi - first) * kRowsPerGroup));
    }
  };
  // Below ~64k multiply-adds a second thread costs more than it saves.
  if (macs < (int64_t{1} << 16)) {
    band(0, groups);
  } else {
    pool.parallel_for(groups, band);
  }
  for (const Block& blk : blocks) add_bias(m, blk.p->w.rows, blk.p->bias, blk.p->y);
}

}  // namespace cellm::cpu::quant
