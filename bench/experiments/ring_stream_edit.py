#!/usr/bin/env python3
"""Cuts a copy of src/cuda/kernels/decode_layers.cu down to its weight stream (in place).

   python3 bench/experiments/ring_stream_edit.py PATH/TO/decode_layers.cu MODE [STAGE_BYTES [STAGES]]

MODE 1: the consumers only walk the ring (wait for each stage to land, free it): no norm,
attention, grid-wide count or dot product; what the producer's ring streams alone.
MODE 2: as 1 with the products' dot products (and their stores).
MODE 3: nothing streamed (the launch alone): the rest of the step, to subtract.
STAGE_BYTES: the ring stage's size (default the kernel's 16,384); the stage count is then
whatever fits in shared memory, at most STAGES (default CELLM_DL_STAGES's 12).
MODE 0 keeps the kernel whole (a control with other STAGE_BYTES / STAGES).
The step's logits are meaningless; only its time is. Never run on the checkout:
bench/experiments/ring_stream.sh runs it on a copy of the tree.
"""
import sys

from anchored_edit import Source

path, mode = sys.argv[1], int(sys.argv[2])
stage_bytes = int(sys.argv[3]) if len(sys.argv) > 3 else 16384
stages = int(sys.argv[4]) if len(sys.argv) > 4 else 12
source = Source(path, "ring_stream_edit.py")
edit = source.edit

edit("constexpr int kStageBytes = 16384;", f"constexpr int kStageBytes = {stage_bytes};")
edit("#define CELLM_DL_STAGES 12", f"#define CELLM_DL_STAGES {stages}")
if mode == 0:
    source.save()
    sys.exit(0)
if mode == 1:
    edit("      acc0 += dot_lane(stage + row_at, x, s.kc, lane);",
         "      acc0 += static_cast<float>(row_at + (x != nullptr) + (stage != nullptr));")
    edit("        acc1 += dot_lane(stage + static_cast<size_t>(ch.nrows) * s.kc + row_at, x, s.kc, lane);",
         "        acc1 += 1.0f;")
layers = "0" if mode == 3 else "p.n_layers"
if mode == 3:
    edit("""  RingPos at;
  for (int32_t l = 0; l < p.n_layers; ++l) {
    const DecodeLayer<bf16>& layer = p.layers[l];""", """\
  RingPos at;
  for (int32_t l = 0; l < 0; ++l) {
    const DecodeLayer<bf16>& layer = p.layers[l];""")
edit("""  for (int32_t l = 0; l < p.n_layers; ++l) {
    const DecodeLayer<bf16> layer = p.layers[l];
    // 1. input norm, q/k/v.""", f"""\
  for (int32_t l = 0; l < {layers}; ++l) {{
    const DecodeLayer<bf16> layer = p.layers[l];
    run_product<kQkv>(a, layer, m, at);
    run_product<kO>(a, layer, m, at);
    run_product<kGateUp>(a, layer, m, at);
    run_product<kDown>(a, layer, m, at);
  }}
  for (int32_t l = 0; l < 0; ++l) {{
    const DecodeLayer<bf16> layer = p.layers[l];
    // 1. input norm, q/k/v.""")
source.save()
