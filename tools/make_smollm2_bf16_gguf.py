#!/usr/bin/env python3
"""Writes SmolLM2-135M-Instruct as a bf16 GGUF from the PyPI Q4_1 file, with only the
`gguf` package (no llama.cpp, no torch), for the parity tests (tests/cpu/
smollm2_parity_test.cpp) and the perplexity rows.

Every tensor is dequantized (gguf.quants.dequantize: Q8_0 embeddings, Q4_1 matrices,
F32 norms) and rounded to bf16 (round to nearest even). The matrices are stored as BF16;
the 1-D norms as F32 holding those bf16 values. That is exactly what the Hugging Face
path gives: transformers loading the Q4_1 file with GgufConfig(dequantize=True) in
bfloat16 and saving the folder (tools/make_smollm2_hf.py), then llama.cpp's
convert_hf_to_gguf.py --outtype bf16 of that folder (checked tensor for tensor: the same
bytes). Tensor names and layout stay the GGUF's own (q/k rows in the file's order), and
the metadata is the Q4_1 file's (tokenizer, chat template, hyper-parameters) with
general.file_type set to bf16.

Usage: python3 tools/make_smollm2_bf16_gguf.py Q4_1.gguf OUT.gguf
Needs: pip install gguf numpy
"""
import os
import sys

import numpy as np

import gguf
from gguf.quants import dequantize, quantize

T = gguf.GGMLQuantizationType
V = gguf.GGUFValueType
FILE_TYPE_BF16 = 32  # llama.cpp's LLAMA_FTYPE_MOSTLY_BF16


def field_value(field):
    """The value of a reader field in the form GGUFWriter.add_key_value takes."""
    if field.types[0] == V.ARRAY:
        return field.contents(), V.ARRAY, field.types[1]
    return field.contents(), field.types[0], None


def to_bf16_values(x):
    """f32 -> the nearest bf16 values, as f32."""
    return dequantize(quantize(np.ascontiguousarray(x, dtype=np.float32), T.BF16), T.BF16)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: make_smollm2_bf16_gguf.py Q4_1.gguf OUT.gguf")
    src, out = sys.argv[1:]
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    tmp = out + ".part"
    w = gguf.GGUFWriter(tmp, arch)
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue  # the writer's own header fields
        if key == "general.file_type":
            w.add_file_type(FILE_TYPE_BF16)
            continue
        val, vtype, sub = field_value(field)
        w.add_key_value(key, val, vtype, sub)
    for t in r.tensors:
        x = dequantize(t.data, t.tensor_type)  # f32, shape in numpy order
        if len(t.shape) == 1:
            w.add_tensor(t.name, to_bf16_values(x).astype(np.float32))
        else:
            blocks = quantize(np.ascontiguousarray(x, dtype=np.float32), T.BF16)
            w.add_tensor(t.name, blocks, raw_dtype=T.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, out)
    print(f"make_smollm2_bf16_gguf: {out}")


if __name__ == "__main__":
    main()
