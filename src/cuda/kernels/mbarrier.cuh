// Shared-memory transaction barriers and the Hopper bulk copy (sm_90; PTX ISA: "mbarrier",
// "cp.async.bulk"), for the kernels whose copies land asynchronously (skinny_gemm.cu's TMA
// ring): a barrier's phase completes when its expected arrivals have arrived and every byte
// announced with barrier_arrive_expect has landed.
#pragma once

#include <cstdint>

#include "cuda/kernels/mma.cuh"

namespace cellm::cuda::detail {

// Before any copy completes on it: barrier_init by one thread, then fence_barrier_init,
// then a barrier (block or warp) among the threads that use it.
__device__ __forceinline__ void barrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
}
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// Arrives once and adds `bytes` to the transactions the current phase waits for.
__device__ __forceinline__ void barrier_arrive_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void barrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
// Waits until the phase of parity `parity` has completed. A wait that outlasts ~2^26
// tries (seconds; a copy lands in microseconds) traps: a broken pipeline becomes a
// launch error the caller sees, not a hung process.
__device__ __forceinline__ void barrier_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  for (uint32_t tries = 0; !done; ++tries) {
    if (tries == (1u << 26)) __trap();
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  }
}
// Orders this thread's earlier shared-memory accesses before later bulk copies (the async
// proxy) into the same bytes.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global `src` to shared
// `dst`, completing on `bar`.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

}  // namespace cellm::cuda::detail
