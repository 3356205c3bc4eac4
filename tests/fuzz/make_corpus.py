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


# GGUF: a minimal reader and writer of the format (little-endian, version 3).
GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B",
                10: "<Q", 11: "<q", 12: "<d"}
GGML_BLOCKS = {0: (1, 4), 1: (1, 2), 30: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22),
               7: (32, 24), 8: (32, 34), 10: (256, 84), 11: (256, 110), 12: (256, 144),
               13: (256, 176), 14: (256, 210)}


class GgufReader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.data, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = self.data[self.pos:self.pos + n]
        self.pos += n
        return s

    def value(self, t):
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.take("<I"), self.take("<Q")
            return (et, [self.value(et) for _ in range(n)])
        return self.take(GGUF_SCALARS[t])


def read_gguf(path):
    with open(path, "rb") as f:
        r = GgufReader(f.read())
    assert r.take("<I") == 0x46554747
    version, n_tensors, n_kv = r.take("<I"), r.take("<Q"), r.take("<Q")
    kv = []
    for _ in range(n_kv):
        key = r.string()
        t = r.take("<I")
        kv.append((key, t, r.value(t)))
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.take("<Q") for _ in range(r.take("<I"))]
        tensors.append((name, dims, r.take("<I"), r.take("<Q")))
    alignment = 32
    data_start = (r.pos + alignment - 1) // alignment * alignment
    return kv, tensors, r.data, data_start


def put_value(t, v):
    if t == 8:
        return struct.pack("<Q", len(v)) + v
    if t == 9:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(put_value(et, x) for x in items)
    return struct.pack(GGUF_SCALARS[t], v)


def write_gguf(kv, tensors, alignment=32, version=3):
    """tensors: (name, dims, type, data bytes); offsets are laid out aligned."""
    out = struct.pack("<IIQQ", 0x46554747, version, len(tensors), len(kv))
    for key, t, v in kv:
        out += struct.pack("<Q", len(key)) + key + struct.pack("<I", t) + put_value(t, v)
    data = b""
    for name, dims, t, payload in tensors:
        data += bytes(-len(data) % alignment)
        out += struct.pack("<Q", len(name)) + name + struct.pack("<I", len(dims))
        out += b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", t, len(data))
        data += payload
    out += bytes(-len(out) % alignment)
    return out + data


def shrink_vocab(kv, keep):
    """Keeps the first `keep` tokens (and their scores, types, and the merges among
    them); drops token-id keys past them."""
    tokens = dict((k, v) for k, t, v in kv).get(b"tokenizer.ggml.tokens")
    kept = set(tokens[1][:keep]) if tokens else set()
    out = []
    for key, t, v in kv:
        if key in (b"tokenizer.ggml.tokens", b"tokenizer.ggml.scores", b"tokenizer.ggml.token_type"):
            v = (v[0], v[1][:keep])
        elif key == b"tokenizer.ggml.merges":
            v = (v[0], [m for m in v[1] if all(p in kept for p in m.split(b" ", 1))
                        and m.replace(b" ", b"", 1) in kept][:64])
        elif key.endswith(b"_token_id") and v >= keep:
            continue
        elif key == b"tokenizer.chat_template":
            v = v[:2048]
        out.append((key, t, v))
    return out


def small_tensor(name, dims, t, data, data_start, offset):
    """The tensor with its rows cut to one (a block wide), its bytes from the file;
    rope_freqs.weight stays whole (the config mapping reads it)."""
    block, nbytes = GGML_BLOCKS[t]
    if name != b"rope_freqs.weight":
        dims = [block] + [1] * (len(dims) - 1)
    n = 1
    for d in dims:
        n *= d
    size = n // block * nbytes
    return (name, dims, t, data[data_start + offset:data_start + offset + size])


def gguf():
    clear("gguf")
    folder = os.path.join(ROOT, "tests", "fixtures", "gguf")
    for name in ("llama-tiny", "qwen2-tiny", "qwen3-tiny", "llama-q-kmix"):
        kv, tensors, data, start = read_gguf(os.path.join(folder, name + ".gguf"))
        small = [small_tensor(n, d, t, data, start, off) for n, d, t, off in tensors]
        write("gguf", name + ".gguf", write_gguf(shrink_vocab(kv, 96), small))
        # Metadata only, and the tokenizer keys alone.
        write("gguf", name + "_no_tensors.gguf", write_gguf(shrink_vocab(kv, 40), []))
        tok = [e for e in shrink_vocab(kv, 300) if e[0].startswith(b"tokenizer.ggml.")]
        write("gguf", name + "_tokenizer.gguf", write_gguf(tok, []))
    # Every value type, nested arrays, an alignment of 64 and version 2.
    every = [(b"u8", 0, 255), (b"i8", 1, -128), (b"u16", 2, 65535), (b"i16", 3, -32768),
             (b"u32", 4, 2**32 - 1), (b"i32", 5, -2**31), (b"f32", 6, 1.5), (b"bool", 7, 1),
             (b"str", 8, "é\0x".encode()), (b"u64", 10, 2**64 - 1), (b"i64", 11, -2**63),
             (b"f64", 12, -0.0), (b"general.alignment", 4, 64),
             (b"arr.str", 9, (8, [b"a", b"", b"bc"])), (b"arr.f64", 9, (12, [1.0, 2.0])),
             (b"arr.arr", 9, (9, [(0, [1, 2]), (9, [(8, [b"deep"])]), (5, [])]))]
    write("gguf", "every_type.gguf", write_gguf(every, [
        (b"a", [4], 0, bytes(16)), (b"b", [32, 2], 8, bytes(68)), (b"c", [2, 2, 2, 2], 30, bytes(32))],
        alignment=64, version=2))
    write("gguf", "header_only.gguf", write_gguf([], []))


def tool_calls():
    clear("tool_calls")
    call = '{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}'
    texts = {
        "hermes": "Let me check.\n<tool_call>\n" + call + "\n</tool_call>\n<tool_call>"
                  '{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call> done',
        "hermes_broken": "<tool_call>{\"name\": 1}</tool_call> <tool_call>{\"name\": \"x\"",
        "llama3": '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "g"}',
        "llama3_tag": 'Sure <|python_tag|>{"name": "f", "parameters": {}}  ',
        "mistral_array": "[TOOL_CALLS] [" + call + ', {"name": "g", "arguments": null}]',
        "mistral_bare": "  [" + call + "] tail",
        "mistral_args": "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]f"
                        "[CALL_ID]abc123XYZ[ARGS]{}",
        "plain": "No tools needed: just [text] with {braces} and <tags>.",
        "deep": "<tool_call>" + "[" * 140 + "]" * 140 + "</tool_call>",
        "utf8": '<tool_call>{"name": "é", "arguments": {"k": "\\ud83d\\ude00 \xff"}}</tool_call>',
    }
    # The controls at the end: no split / three splits, then the id seed.
    for name, text in texts.items():
        data = text.encode("utf-8", "surrogateescape")
        write("tool_calls", name + ".txt", data + b"\x00\x07")
        write("tool_calls", name + "_split.txt", data + b"\x05\x00\x11\x00\x2a\x00\x03\x07")


def reasoning():
    clear("reasoning")
    texts = {
        "block": "<think>\nThe user wants x.\n</think>\n\nThe answer is 4.",
        "open": "  <think>cut off mid-thought\n\n",
        "inside": "I was told to think.\n</think>\nDone.",
        "none": "No block here, </think> is just text.",
        "lookalike": "<thin k><think></think></think></think>",
        "newlines": "\n\n<think>\n\n\n</think>\n\n\n",
    }
    for name, text in texts.items():
        data = text.encode()
        write("reasoning", name + ".txt", data + b"\x00\x00")
        write("reasoning", name + "_inside_split.txt", data + b"\x03\x00\x09\x00\x01\x00\x03\x01")


def grammar():
    clear("grammar")
    walk = bytes((7 + 5 * i) % 256 for i in range(64))  # 64 walk bytes
    folder = os.path.join(ROOT, "tests", "grammar", "schemas")
    for name in sorted(os.listdir(folder)):
        if name.endswith(".json"):
            with open(os.path.join(folder, name), "rb") as f:
                text = f.read()
            if len(text) < 4000:
                write("grammar", "schema_" + name, b"\x00" + text + b"\x00" + walk)
    schemas = {
        "object": {"type": "object", "properties": {"a": {"type": "integer"},
                   "b": {"type": "array", "items": {"type": "string", "maxLength": 3},
                         "maxItems": 2}}, "required": ["a"], "additionalProperties": False},
        "any_of": {"anyOf": [{"type": "number"}, {"const": "x"}, {"enum": [True, None, 1.5]}]},
        "ref": {"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}},
                "$ref": "#/$defs/n"},
    }
    for name, schema in schemas.items():
        write("grammar", "schema_" + name + ".bin", b"\x00" + json.dumps(schema).encode() + b"\x00" + walk)
    regexes = {"date": r"^\d{4}-\d{2}-\d{2}$", "alt": r"(ab|cd)*[^\s,]{1,3}\.?",
               "classes": r"[a-f0-9]+\w\W\x41\u00e9.", "nested": r"((a|b)?(c{2,}|d+))*e"}
    for name, rx in regexes.items():
        write("grammar", "regex_" + name + ".bin", b"\x01" + rx.encode() + b"\x00" + walk)
    gbnfs = {"list": 'root ::= item ("," item)*\nitem ::= [a-z]+ | "(" root ")" | [0-9]{1,2}\n',
             "json_like": 'root ::= obj\nobj ::= "{" ws (str ws ":" ws val)? "}"\n'
                          'str ::= "\\"" [^"\\\\]* "\\""\nval ::= str | [0-9]+ | obj\n'
                          'ws ::= [ \\t\\n]{0,2} # spaces\n',
             "utf8": 'root ::= "é" [€-€] . [^a]?\n'}
    for name, g in gbnfs.items():
        write("grammar", "gbnf_" + name + ".bin", b"\x02" + g.encode() + b"\x00" + walk)
    write("grammar", "choice.bin", b"\x03yes\nno\nmaybe so\n\xc3\xa9\x00" + walk)
    write("grammar", "json_object.bin", b"\x04\x00" + walk)
    # Selectors from 0xE0 compile with the default (serving) limits.
    write("grammar", "serving_schema_object.bin",
          b"\xe1" + json.dumps(schemas["object"]).encode() + b"\x00" + walk)
    write("grammar", "serving_regex_repeat.bin", b"\xe2(a{1,300}b?){2,50}\x00" + walk)
    # An ambiguous grammar whose parse stacks multiply with every byte: it once
    # made one input run past the fuzz timeout; the step work budget stops it.
    write("grammar", "serving_gbnf_ambiguous.bin",
          b"\xe3root ::= x\nx ::= [ -~] x [b-z] | [ -~] x [c-z] | [ -~] x [d-z] | [ -~] x x"
          b" | [ -~] x [e-z] x | [ -~] x [f-z] x x | \"\"\x00" + b"\x04" * 64)


def main():
    completions()
    chat()
    safetensors()
    model_config()
    tokenizer()
    chat_template()
    gguf()
    tool_calls()
    reasoning()
    grammar()
    total = 0
    for target in sorted(os.listdir(CORPUS)):
        files = os.listdir(os.path.join(CORPUS, target))
        size = sum(os.path.getsize(os.path.join(CORPUS, target, f)) for f in files)
        total += size
        print(f"{target}: {len(files)} seeds, {size} bytes")
    print(f"total {total} bytes")


if __name__ == "__main__":
    sys.exit(main())
