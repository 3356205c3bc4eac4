#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets, tests/fuzz/corpus/<target>/, from
the committed fixtures and a few hand-written inputs. Seeds are small (each under
64 KiB); libFuzzer mutates them. Files whose names start with `crash-` are
reproducers of fixed bugs and are kept. Run from anywhere:
    python3 tests/fuzz/make_corpus.py
"""
import json
import os
import struct
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")
MAX_SEED = 64 * 1024


def write(target, name, data):
    if isinstance(data, str):
        data = data.encode("utf-8")
    if len(data) > MAX_SEED:
        return
    folder = os.path.join(CORPUS, target)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


def clear(target):
    folder = os.path.join(CORPUS, target)
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(folder):
        if not name.startswith("crash-"):
            os.remove(os.path.join(folder, name))


def fixture(*parts):
    with open(os.path.join(ROOT, "tests", "fixtures", *parts), encoding="utf-8") as f:
        return json.load(f)


def completions():
    clear("request_completions")
    bodies = {
        "text": {"model": "kjv-small", "prompt": "In the beginning", "max_tokens": 16},
        "tokens": {"prompt": [1, 2, 3, 500], "max_tokens": 8, "temperature": 0},
        "batch_of_one": {"prompt": ["Hello"], "n": 2, "best_of": 2, "seed": 7},
        "sampling": {"prompt": "x", "temperature": 0.7, "top_p": 0.9, "top_k": -1,
                     "min_p": 0.05, "stop": ["\n", "END"], "logprobs": 3, "user": "u"},
        "stream": {"prompt": "x", "stream": True, "stream_options": {"include_usage": True},
                   "echo": True, "ignore_eos": True},
        "refused": {"prompt": "x", "presence_penalty": 0.5, "logit_bias": {"1": 2},
                    "suffix": "y"},
        "edges": {"prompt": [0, 511, 512, -1, 18446744073709551615], "max_tokens": 2147483647,
                  "seed": -9223372036854775808, "n": 0},
    }
    for name, body in bodies.items():
        write("request_completions", name + ".json", json.dumps(body))


def chat():
    clear("request_chat")
    bodies = {
        "basic": {"model": "kjv-small", "messages": [{"role": "user", "content": "Hello!"}]},
        "turns": {"messages": [{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": "Hi"},
                               {"role": "assistant", "content": None},
                               {"role": "user", "content": [{"type": "text", "text": "a"},
                                                            {"type": "text", "text": "b"}]}],
                  "max_completion_tokens": 32, "logprobs": True, "top_logprobs": 2},
        "bad_parts": {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        "bad_role": {"messages": [{"role": "", "content": "x"}, 5]},
        "stream": {"messages": [{"role": "user", "content": "x"}], "stream": True,
                   "stop": "\n", "n": 2, "temperature": 2.0, "seed": 3},
    }
    for name, body in bodies.items():
        write("request_chat", name + ".json", json.dumps(body))


def safetensors_file(tensors, metadata=True, pad_to=8):
    header = {}
    if metadata:
        header["__metadata__"] = {"format": "pt"}
    data = b""
    sizes = {"F32": 4, "F16": 2, "BF16": 2}
    for name, dtype, shape in tensors:
        n = sizes[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + n]}
        data += bytes((i * 37) & 0xFF for i in range(n))
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % pad_to)
    return struct.pack("<Q", len(text)) + text + data


def safetensors():
    clear("safetensors")
    write("safetensors", "empty.safetensors", safetensors_file([], metadata=False))
    write("safetensors", "one.safetensors", safetensors_file([("w", "F32", [2, 3])]))
    write("safetensors", "mixed.safetensors", safetensors_file(
        [("model.embed_tokens.weight", "BF16", [8, 4]), ("model.norm.weight", "F16", [4]),
         ("lm_head.weight", "F32", [8, 4]), ("scalar", "F32", []), ("empty", "F16", [0, 3])]))
    # The header of a real fixture, its data section cut short (the first tensors only).
    with open(os.path.join(ROOT, "tests", "fixtures", "models", "llama3-tiny",
                           "model.safetensors"), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    kept = {"__metadata__": header.get("__metadata__", {})}
    for name, entry in sorted(header.items(), key=lambda kv: kv[1].get("data_offsets", [0])[0]
                              if isinstance(kv[1], dict) else 0):
        if name != "__metadata__" and entry["data_offsets"][1] <= 4096:
            kept[name] = entry
    text = json.dumps(kept).encode()
    end = max([e["data_offsets"][1] for k, e in kept.items() if k != "__metadata__"] + [0])
    write("safetensors", "llama3_tiny_head.safetensors",
          struct.pack("<Q", len(text)) + text + bytes(end))


def model_config():
    clear("model_config")
    for model in sorted(os.listdir(os.path.join(ROOT, "tests", "fixtures", "models"))):
        path = os.path.join(ROOT, "tests", "fixtures", "models", model, "config.json")
        if os.path.exists(path):
            with open(path, "rb") as f:
                write("model_config", model + ".json", f.read())
    with open(os.path.join(ROOT, "models", "kjv-small", "config.json"), "rb") as f:
        write("model_config", "kjv-small.json", f.read())
    write("model_config", "llama31_rope.json", json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
        "vocab_size": 256, "max_position_embeddings": 1024, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
        "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        "bos_token_id": 1, "eos_token_id": [2, 3], "tie_word_embeddings": True}))
    write("model_config", "qwen2_windows.json", json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 1, "intermediate_size": 128,
        "vocab_size": 256, "max_position_embeddings": 1024, "rms_norm_eps": 1e-6,
        "use_sliding_window": True, "sliding_window": 32, "max_window_layers": 2,
        "layer_types": ["full_attention", "full_attention", "sliding_attention",
                        "sliding_attention"], "torch_dtype": "bfloat16"}))


def tokenizer():
    clear("tokenizer")
    for variant in fixture("tokenizer", "synthetic.json")["variants"]:
        cases = variant.get("cases", [])
        text = max((c["text"] for c in cases), key=len, default="Hello, world!")[:200]
        write("tokenizer", variant["name"] + ".bin",
              json.dumps(variant["tokenizer"]).encode() + b"\0" + text.encode())
    with open(os.path.join(ROOT, "models", "kjv-small", "tokenizer.json"), "rb") as f:
        kjv = f.read()
    # The bundled model's tokenizer is too large for a seed; its components are not.
    j = json.loads(kjv)
    j["model"]["vocab"] = {k: v for k, v in j["model"]["vocab"].items() if v < 300}
    j["model"]["merges"] = [m for m in j["model"]["merges"][:40]]
    write("tokenizer", "kjv_small_cut.bin", json.dumps(j).encode() + b"\0In the beginning God")


def chat_template():
    clear("chat_template")
    conversation = ["system", "Be brief.", "user", "Hello!", "assistant", "Hi.", "user", "Bye"]
    tail = "\0" + "\0".join(conversation)
    for name in ("llama3", "qwen3"):
        write("chat_template", name + ".jinja", fixture("chat_templates", name + ".json")["template"])
    for entry in fixture("chat_templates", "synthetic.json")["templates"]:
        write("chat_template", entry["name"] + ".jinja", entry["template"] + tail)
    with open(os.path.join(ROOT, "models", "kjv-small", "tokenizer_config.json")) as f:
        kjv = json.load(f).get("chat_template")
    if kjv:
        write("chat_template", "kjv_small.jinja", kjv)


def main():
    completions()
    chat()
    safetensors()
    model_config()
    tokenizer()
    chat_template()
    total = 0
    for target in sorted(os.listdir(CORPUS)):
        files = os.listdir(os.path.join(CORPUS, target))
        size = sum(os.path.getsize(os.path.join(CORPUS, target, f)) for f in files)
        total += size
        print(f"{target}: {len(files)} seeds, {size} bytes")
    print(f"total {total} bytes")


if __name__ == "__main__":
    sys.exit(main())
