// Compiles the functions between CELLM_TARGET_BEGIN(isa) and CELLM_TARGET_END
// for an instruction set the build does not assume, so one binary carries every
// path and picks one at run time (cpu/quant/cpu_features.h). Headers go above the
// BEGIN: everything they define stays generic; only the functions of the region,
// which must have internal linkage, use the extra instructions.
#pragma once

#define CELLM_PRAGMA(x) _Pragma(#x)
#if defined(__clang__)
#define CELLM_TARGET_BEGIN(isa) \
  CELLM_PRAGMA(clang attribute push(__attribute__((target(isa))), apply_to = function))
#define CELLM_TARGET_END CELLM_PRAGMA(clang attribute pop)
#else
#define CELLM_TARGET_BEGIN(isa) CELLM_PRAGMA(GCC push_options) CELLM_PRAGMA(GCC target(isa))
#define CELLM_TARGET_END CELLM_PRAGMA(GCC pop_options)
#endif

// The instruction sets of the two vector paths.
#define CELLM_ISA_AVX2 "avx2,fma,f16c"
#define CELLM_ISA_AVX512 "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16"
