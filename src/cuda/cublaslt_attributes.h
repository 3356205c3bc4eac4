// Typed setters for cuBLASLt matmul descriptor and preference attributes: the value's own
// size goes with its address, so a call cannot pass a mismatched size. Shared by Gemm
// (bf16/f32 products) and Fp8Gemm (e4m3 products).
#pragma once

#include <cublasLt.h>

namespace cellm::cuda {

template <typename V>
cublasStatus_t set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                        const V& value) {
  return cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value));
}

template <typename V>
cublasStatus_t set_pref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
                        const V& value) {
  return cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value));
}

}  // namespace cellm::cuda
