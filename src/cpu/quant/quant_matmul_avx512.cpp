// The quantized matmul's kernels for AVX-512 VNNI (vpdpbusd, vpdpwssd on 256-bit vectors), 4
// activation rows per tile (32 vector registers). The body is quant_matmul_simd.inc; the dispatcher
// calls in only where cpu_features() says the CPU has these instructions.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cpu/quant/isa_target.h"
#include "cpu/quant/quant_kernels.h"

#if defined(__x86_64__) || defined(__i386__)
// GCC 12's AVX-512 headers trip its own -Wuninitialized on _mm512_undefined_*
// (GCC bug 105593); the diagnostics point into the header, so silence them there.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif

namespace cellm::cpu::quant {
namespace {

CELLM_TARGET_BEGIN(CELLM_ISA_AVX512)

#define CELLM_QUANT_VNNI 1
constexpr int kMr = 4;
#include "cpu/quant/quant_matmul_simd.inc"
#undef CELLM_QUANT_VNNI

CELLM_TARGET_END

}  // namespace

QuantKernel avx512_vnni_kernel(QuantType t) {
  return kernel_for(t);
}

}  // namespace cellm::cpu::quant

#else

namespace cellm::cpu::quant {
QuantKernel avx512_vnni_kernel(QuantType) {
  return nullptr;
}
}  // namespace cellm::cpu::quant

#endif
