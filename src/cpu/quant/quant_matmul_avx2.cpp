// The quantized matmul's kernels for AVX2 (vpmaddubsw, vpmaddwd), 2 activation rows per tile (16
// vector registers). The body is quant_matmul_simd.inc; the dispatcher calls in only where
// cpu_features() says the CPU has these instructions.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cpu/quant/isa_target.h"
#include "cpu/quant/quant_kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

namespace cellm::cpu::quant {
namespace {

CELLM_TARGET_BEGIN(CELLM_ISA_AVX2)

#define CELLM_QUANT_VNNI 0
constexpr int kMr = 2;
#include "cpu/quant/quant_matmul_simd.inc"
#undef CELLM_QUANT_VNNI

CELLM_TARGET_END

}  // namespace

QuantKernel avx2_kernel(QuantType t) {
  return kernel_for(t);
}

}  // namespace cellm::cpu::quant

#else

namespace cellm::cpu::quant {
QuantKernel avx2_kernel(QuantType) {
  return nullptr;
}
}  // namespace cellm::cpu::quant

#endif
