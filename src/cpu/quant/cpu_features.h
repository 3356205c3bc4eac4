// What the CPU running this process can execute, read once from cpuid (and the
// OS's saved vector state, via the compiler's __builtin_cpu_supports). The
// quantized and bf16 kernels choose their path from it at run time.
// Thread-safety: the answers are computed once, thread-safely, and then constant.
#pragma once

namespace cellm::cpu {

struct CpuFeatures {
  bool avx2 = false;         // AVX2 + FMA + F16C
  bool avx512_vnni = false;  // AVX-512 F/BW/VL/DQ + VNNI (vpdpbusd, vpdpwssd)
  bool avx512_bf16 = false;  // the above + AVX-512 BF16 (vdpbf16ps)
};

const CpuFeatures& cpu_features();

}  // namespace cellm::cpu
