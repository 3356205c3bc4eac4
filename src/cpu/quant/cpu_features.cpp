#include "cpu/quant/cpu_features.h"

namespace cellm::cpu {
namespace {

CpuFeatures detect() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  f.avx512_vnni = f.avx2 && __builtin_cpu_supports("avx512f") &&
                  __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                  __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni");
  f.avx512_bf16 = f.avx512_vnni && __builtin_cpu_supports("avx512bf16");
#endif
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

}  // namespace cellm::cpu
