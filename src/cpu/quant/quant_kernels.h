// The quantized matmul's internals shared by its dispatcher (quant_matmul.cpp)
// and its per-instruction-set kernels (quant_matmul_scalar.cpp, _avx2.cpp,
// _avx512.cpp): the 8-bit activation blocks, the kernel signature and each
// instruction set's kernel table.
//
// Activations are quantized once per call, per row, in blocks that line up with
// the weights' blocks: ActBlock32 (32 values, for Q4_0 .. Q8_0 weights),
// ActBlock32Sums (the same with two sums of each block, for the 512-bit kernels) or
// BlockQ8_K (256 values with per-16 sums, for the K-quants). A kernel computes
// integer dot products of weight quants and activation quants per (sub-)block and
// scales them to f32 once per block.
// Thread-safety: kernels are pure over their arguments; concurrent calls on
// disjoint output columns are safe.
#pragma once

#include <cstdint>

#include "cpu/quant/block_formats.h"

namespace cellm::cpu::quant {

// 32 activations: x[l] ~ d * qs[l], |qs| <= 127.
struct ActBlock32 {
  float d;
  int8_t qs[32];
};
static_assert(sizeof(ActBlock32) == 36);

// One 32-value block as the 512-bit kernels read it: the quants, the scale, sum(qs)
// (a weight format's offset is folded into the integer sum as -offset * sum) and
// d * sum(qs) rounded once to f32 (for the formats with a min).
struct ActBlock32Sums {
  int8_t qs[32];
  float d;
  int32_t sum;
  float dsum;
};
static_assert(sizeof(ActBlock32Sums) == 44);

// Which activation blocks weight type `t` pairs with: kBlock32 or kBlockK (the
// 512-bit kernels of the 32-weight formats take kBlock32Sums instead).
enum class ActFormat { kBlock32, kBlockK, kBlock32Sums };
inline ActFormat act_format(QuantType t) {
  return type_info(t).block_weights == kBlockK ? ActFormat::kBlockK : ActFormat::kBlock32;
}

// One row of k activations (k a multiple of the format's block) into blocks at
// out: round to nearest (ties to even) on a per-block scale d = max |x| / 127.
void quantize_activations(const float* x, int64_t k, ActFormat format, void* out);
// The same bytes, 16 values per instruction. REQUIRES: AVX-512 F/BW/VL/VNNI.
void quantize_activations_avx512(const float* x, int64_t k, ActFormat format, void* out);
// Bytes of one quantized activation row of k values.
int64_t act_row_bytes(ActFormat format, int64_t k);

// What every kernel reads: m activation rows (act, act_row_bytes apart), the
// weight rows (w, w_row_bytes apart, k_blocks blocks each) and y [m, ldy].
struct QuantGemmArgs {
  const uint8_t* act = nullptr;
  int64_t act_row_bytes = 0;
  int64_t m = 0;
  const uint8_t* w = nullptr;
  int64_t w_row_bytes = 0;
  int64_t k_blocks = 0;  // weight blocks per row (= activation blocks per row)
  float* y = nullptr;
  int64_t ldy = 0;
};

// y[i, j] = dot(activation row i, weight row j) for i in [0, m), j in [j0, j1).
using QuantKernel = void (*)(const QuantGemmArgs& args, int64_t j0, int64_t j1);

// Each instruction set's kernel for a block type; nullptr for the float types
// (F32, F16, BF16 go through cpu::matmul) and Q8_K.
QuantKernel scalar_kernel(QuantType t);
QuantKernel avx2_kernel(QuantType t);         // REQUIRES: the CPU has AVX2, FMA, F16C
QuantKernel avx512_vnni_kernel(QuantType t);  // REQUIRES: AVX-512 F/BW/VL/VNNI too

}  // namespace cellm::cpu::quant
