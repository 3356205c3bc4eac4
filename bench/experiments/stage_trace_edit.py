#!/usr/bin/env python3
"""Adds the stage trace to a copy of src/cuda/kernels/decode_layers.cu (in place).

   python3 bench/experiments/stage_trace_edit.py PATH/TO/decode_layers.cu

Never run on the checkout: bench/experiments/stage_trace.sh runs it on a copy of the tree.
The traced kernel stamps %globaltimer as the blocks of layer 8 leave each stage's wait
(first and last block) and finish it (last block), and counts the cycles each block
waits, by product: the producer for a free ring stage, consumer warp 0 for a landed one.
The last block out of launch 100 prints "dltrace" and "dlwait" lines. Each edit anchors
on the kernel's text; an anchor that is gone stops the script with its text, so the
kernel's next change says which edit to update.
"""
import sys

from anchored_edit import Source

path = sys.argv[1]
source = Source(path, "stage_trace_edit.py")
edit = source.edit


edit("#include <cmath>\n", "#include <cmath>\n#include <cstdio>\n")
edit("// The consumer warps' barrier (the producer warp never joins it).", """\
__device__ unsigned long long dl_ts[5][3];
__device__ unsigned dl_launch;
__device__ unsigned long long dl_wait[2][4];  // [producer, consumer warp 0][product] cycles
// Thread 0's cycles: [0] in run_product, [1] of them computing its units; by product.
__device__ unsigned long long dl_busy[2][4];
// Thread 0's cycles in stage_wait and stage_done, by stage (5 a layer).
__device__ unsigned long long dl_sync[2][5];
__device__ __forceinline__ unsigned long long dl_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void dl_mark(int32_t l, int k, int what) {
  if (l != 8 || threadIdx.x != 0) return;
  const unsigned long long t = dl_now();
  if (what == 0) {
    atomicMin(&dl_ts[k][0], t);
    atomicMax(&dl_ts[k][1], t);
  } else {
    atomicMax(&dl_ts[k][2], t);
  }
}
// The consumer warps' barrier (the producer warp never joins it).""")
# Stage starts and ends.
edit("    if (stage > 0) stage_wait(count, stage * blocks);\n",
     "    if (stage > 0) stage_wait(count, stage * blocks);\n    dl_mark(l, 0, 0);\n")
for product, k in (("kQkv", 0), ("kO", 2), ("kGateUp", 3), ("kDown", 4)):
    edit(f"    run_product<{product}>(a, layer, m, at);\n    stage_done(count);",
         f"    run_product<{product}>(a, layer, m, at);\n    consumer_sync();\n"
         f"    dl_mark(l, {k}, 1);\n    stage_done(count);")
edit("    stage_wait(count, ++stage * blocks);\n    for (int32_t h = h0;",
     "    stage_wait(count, ++stage * blocks);\n    dl_mark(l, 1, 0);\n    for (int32_t h = h0;")
src = source.text
at = src.index("dl_mark(l, 1, 0);")
end = src.index("    stage_done(count);", at)
source.text = src[:end] + "    consumer_sync();\n    dl_mark(l, 1, 1);\n" + src[end:]
edit("    stage_wait(count, ++stage * blocks);\n    stage_row(p.attn",
     "    stage_wait(count, ++stage * blocks);\n    dl_mark(l, 2, 0);\n    stage_row(p.attn")
edit("    stage_wait(count, ++stage * blocks);\n    add_and_norm(layer.post_norm);",
     "    stage_wait(count, ++stage * blocks);\n    dl_mark(l, 3, 0);\n    add_and_norm(layer.post_norm);")
edit("    stage_wait(count, ++stage * blocks);\n    stage_row(p.act, p.ff, m.act);",
     "    stage_wait(count, ++stage * blocks);\n    dl_mark(l, 4, 0);\n    stage_row(p.act, p.ff, m.act);")
# Consumer warp 0's waits for landed stages.
edit("""  Chunk ch = first_chunk(s, sh);
  for (int32_t c = 0; c < sh.chunks; ++c, next_chunk(s, sh, ch), at.advance(stages)) {
    const uint32_t st = at.st;
    detail::barrier_wait(&m.full[st], at.lap & 1u);""", """\
  Chunk ch = first_chunk(s, sh);
  long long waited = 0;
  for (int32_t c = 0; c < sh.chunks; ++c, next_chunk(s, sh, ch), at.advance(stages)) {
    const uint32_t st = at.st;
    const long long w0 = clock64();
    detail::barrier_wait(&m.full[st], at.lap & 1u);
    waited += clock64() - w0;""")
edit("""    __syncwarp();
    if (lane == 0) detail::barrier_arrive(&m.empty[st]);
  }
}""", """\
    __syncwarp();
    if (lane == 0) detail::barrier_arrive(&m.empty[st]);
  }
  if (threadIdx.x == 0 && dl_launch == 100) {
    atomicAdd(&dl_wait[1][kProduct], static_cast<unsigned long long>(waited));
  }
}""")
# The producer's waits for free stages.
edit("""      Chunk ch = first_chunk(s, sh);
      for (int32_t c = 0; c < sh.chunks; ++c, next_chunk(s, sh, ch), at.advance(stages)) {
        const uint32_t st = at.st;
        if (at.lap > 0) detail::barrier_wait(&m.empty[st], (at.lap - 1) & 1u);""", """\
      Chunk ch = first_chunk(s, sh);
      long long waited = 0;
      for (int32_t c = 0; c < sh.chunks; ++c, next_chunk(s, sh, ch), at.advance(stages)) {
        const uint32_t st = at.st;
        const long long t0 = clock64();
        if (at.lap > 0) detail::barrier_wait(&m.empty[st], (at.lap - 1) & 1u);
        waited += clock64() - t0;""")
edit("""        if (s.mats == 2) detail::bulk_copy(stage + bytes, w1 + off, bytes, &m.full[st]);
      }
""", """\
        if (s.mats == 2) detail::bulk_copy(stage + bytes, w1 + off, bytes, &m.full[st]);
      }
      if (dl_launch == 100) {
        atomicAdd(&dl_wait[0][product], static_cast<unsigned long long>(waited));
      }
""")
# The report, by the last block out of launch 100; then the stamps reset.
edit("""    if (atomicAdd(&count[1], 1u) == blocks - 1) {
""", """\
    if (atomicAdd(&count[1], 1u) == blocks - 1) {
      if (dl_launch == 100) {
        const unsigned long long t0 = dl_ts[0][0];
        for (int k = 0; k < 5; ++k) {
          printf("dltrace stage %d: first start %.2f us, last start %.2f us, last done %.2f us\\n",
                 k, (dl_ts[k][0] - t0) * 1e-3, (dl_ts[k][1] - t0) * 1e-3,
                 (dl_ts[k][2] - t0) * 1e-3);
        }
        const double per = 1.0 / (static_cast<double>(blocks) * a.p.n_layers);
        for (int k = 0; k < 4; ++k) {
          printf("dlwait product %d: producer waits %.0f cycles a block a layer for free stages, "
                 "consumer warp 0 %.0f for landed ones\\n",
                 k, dl_wait[0][k] * per, dl_wait[1][k] * per);
        }
      }
      if (dl_launch == 100) {
        const double per = 1.0 / (static_cast<double>(blocks) * a.p.n_layers);
        for (int k = 0; k < 4; ++k) {
          printf("dlbusy product %d: thread 0 %.0f cycles a block a layer in the product, %.0f of "
                 "them computing its rows\\n", k, dl_busy[0][k] * per, dl_busy[1][k] * per);
        }
        for (int k = 0; k < 5; ++k) {
          printf("dlsync stage %d: thread 0 %.0f cycles a block a layer in its count wait, %.0f in "
                 "its count\\n", k, dl_sync[0][k] * per, dl_sync[1][k] * per);
        }
      }
      ++dl_launch;
      for (int k = 0; k < 5; ++k) {
        dl_ts[k][0] = ~0ull;
        dl_ts[k][1] = 0;
        dl_ts[k][2] = 0;
      }
""")
# Thread 0's cycles in the counts (stage_wait's target names the stage: target / blocks;
# stage_done is told it, since a load of the count would lengthen the chain it times).
edit("""__device__ __forceinline__ void stage_done(uint32_t* count) {
  consumer_sync();""", """\
__device__ __forceinline__ void stage_done(uint32_t* count, uint32_t dl_stage) {
  const long long dl_t0 = clock64();
  consumer_sync();""")
edit("""    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count) : "memory");
  }
}""", """\
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count) : "memory");
    if (dl_launch == 100) {
      atomicAdd(&dl_sync[1][dl_stage], static_cast<unsigned long long>(clock64() - dl_t0));
    }
  }
}""")
# The kernel's stage_done calls name their stage: 0-4 in the order they are written.
src = source.text
body = src.index("decode_layers_kernel(const KernelArgs a) {")
head, calls = src[:body], src[body:].split("    stage_done(count);")
if len(calls) != 6:
    sys.exit(f"stage_trace_edit.py: {len(calls) - 1} stage_done calls in the kernel, not 5")
source.text = head + "".join(f"{c}    stage_done(count, {k});" for k, c in enumerate(calls[:-1])) + calls[-1]
edit("""__device__ __forceinline__ void stage_wait(const uint32_t* count, uint32_t target) {
  if (threadIdx.x == 0) {""", """\
__device__ __forceinline__ void stage_wait(const uint32_t* count, uint32_t target) {
  const long long dl_t0 = clock64();
  if (threadIdx.x == 0) {""")
src = source.text
at = src.index("__device__ __forceinline__ void stage_wait(")
end = src.index("  consumer_sync();\n}", at)
source.text = src[:end] + """  consumer_sync();
  if (threadIdx.x == 0 && dl_launch == 100) {
    atomicAdd(&dl_sync[0][(target / gridDim.x) % 5], static_cast<unsigned long long>(clock64() - dl_t0));
  }
}""" + src[end + len("  consumer_sync();\n}"):]
# Thread 0's cycles in each product, and computing its units.
edit("""  Chunk ch = first_chunk(s, sh);
  long long waited = 0;""", """\
  Chunk ch = first_chunk(s, sh);
  long long waited = 0;
  long long busy = 0;
  const long long dl_in = clock64();""")
edit("""    if (first < ch.u0 + ch.nrows) {
      const bf16* stage = m.ring""", """\
    const long long dl_b0 = clock64();
    if (first < ch.u0 + ch.nrows) {
      const bf16* stage = m.ring""")
edit("""    __syncwarp();
    if (lane == 0) detail::barrier_arrive(&m.empty[st]);
  }
  if (threadIdx.x == 0 && dl_launch == 100) {""", """\
    busy += clock64() - dl_b0;
    __syncwarp();
    if (lane == 0) detail::barrier_arrive(&m.empty[st]);
  }
  if (threadIdx.x == 0 && dl_launch == 100) {
    atomicAdd(&dl_busy[0][kProduct], static_cast<unsigned long long>(clock64() - dl_in));
    atomicAdd(&dl_busy[1][kProduct], static_cast<unsigned long long>(busy));""")
source.save()
