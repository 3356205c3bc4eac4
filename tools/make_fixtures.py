#!/usr/bin/env python3
"""Make cellm's reference model fixtures (tiny random HF models + transformers reference outputs).

For each tiny model in MODELS this script

  1. builds the architecture with transformers from a config, initialises every
     weight from a fixed seed (large std so logits are peaky), rounds to bf16 and
     writes a standard Hugging Face folder with `save_pretrained`
     (config.json, model.safetensors or shards + model.safetensors.index.json,
     generation_config.json). The tokenizer files are NOT kept in the fixture
     (they are 2-11 MB each and already live in ../shared/tokenizers): the
     reference.json names the shared tokenizer folder ("tokenizer"), and tests
     that need text assemble a full model folder from both;
  2. reloads the saved bf16 weights as float32 (`dtype=torch.float32`,
     attn_implementation="eager") so the reference sees exactly the stored values,
     and records reference outputs in reference.json (format below);
  3. redraws the seed (seed, seed+1, ...) until every greedy step of every prompt
     has a top-1/top-2 logit margin >= MIN_MARGIN, so exact greedy comparison is stable;
  4. verifies the fixture with an independent pure-numpy twin that reads only
     config.json + the safetensors files (`--verify` runs only this step, no torch).

Usage:
  python3 tools/make_fixtures.py                    # generate all + verify
  python3 tools/make_fixtures.py --out DIR          # other output folder
  python3 tools/make_fixtures.py --only qwen3-tiny  # one model
  python3 tools/make_fixtures.py --verify           # numpy check of existing fixtures only

reference.json format (all logits are float32 values from the fp32 forward pass,
written as the shortest decimal that round-trips the float32):
{
  "format": "cellm-reference-v1",
  "model": "qwen3-tiny",                # folder name
  "tokenizer": "qwen3",                  # ../shared/tokenizers/<this> holds its tokenizer files
  "architecture": "Qwen3ForCausalLM",
  "seed": 1234,                          # torch seed the weights were drawn with
  "versions": {"torch": ..., "transformers": ..., "tokenizers": ..., "numpy": ...},
  "reference": "transformers fp32 eager forward on the bf16 weights upcast to fp32",
  "vocab_size": 151669,                  # config vocab (= logits row length)
  "sampled_ids": [ ... ],                # SAMPLED_IDS sorted distinct ids, fixed seed
  "min_greedy_margin": 0.0123,           # min over all prompts/steps of (top1 - top2) logit
  "prompts": [
    {
      "text": "...",
      "ids": [...],                      # tokenizer.json encode(text, add_special_tokens=True)
      "last": {                          # logits at the last prompt position
        "top_ids": [...],                # TOP_K ids, by descending logit (ties: lower id first)
        "top_logits": [...],
        "sampled_logits": [...],         # logits at "sampled_ids"
        "logsumexp": 12.34,              # log(sum(exp(row))) over the full vocab row
        "argmax": 123
      },
      "all_positions": null | {          # present for exactly one prompt (ALL_POS_PROMPT)
        "sampled_logits": [[...], ...]   # [len(ids)][len(sampled_ids)] logits at every position
      },
      "greedy": {
        "new_ids": [...],                # NEW_TOKENS greedy tokens (model.generate, use_cache,
                                         #  do_sample False, eos never stops generation)
        "margins": [...],                # top1 - top2 logit at each of the NEW_TOKENS steps
        "text": "..."                    # tokenizer decode(new_ids) (informational)
      }
    }, ...
  ]
}
See tests/fixtures/models/README.md for the exact forward formulas (= the numpy twin).
"""

import argparse
import hashlib
import json
import math
import os
import shutil
import struct
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO, "tests", "fixtures", "models")
DEFAULT_TOK = os.path.join(os.path.dirname(REPO), "shared", "tokenizers")
if not os.path.isdir(DEFAULT_TOK):
    DEFAULT_TOK = "/work/shared/tokenizers"

TOP_K = 64
SAMPLED_IDS = 256
NEW_TOKENS = 24
MIN_MARGIN = 1e-3
ALL_POS_PROMPT = 1
BASE_SEED = 1234
STD_LINEAR = 0.5       # std of every Linear / Embedding weight
STD_BIAS = 0.5         # std of q/k/v biases (Qwen2)
STD_NORM = 0.25        # norm weights: 1 + STD_NORM * N(0,1)

PROMPTS = [
    "Hello, world.",
    "The quick brown fox jumps over the lazy dog near the old river bank today.",
    "In 2023, about 8,126,400 people (roughly 61.5%) voted; the rest? Nobody knows! #42 @ 3:15pm",
    "Café crème, naïve façade — 東京は美しい都市です。Привет, мир! 🙂",
    "A long time ago the engineers decided that every kernel must be tested against a simple "
    "reference, because subtle bugs in attention masks, rotary embeddings and normalisation "
    "layers are otherwise very hard to notice.",
]

# Sizes are chosen to keep the committed fixtures small: the embedding table
# (vocab x hidden x 2 bytes) dominates. See README for the size table.
COMMON = dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=512, hidden_act="silu", attention_dropout=0.0)
MODELS = {
    "llama3-tiny": dict(
        arch="LlamaForCausalLM", tok="llama3", shard=None,
        config=dict(COMMON, hidden_size=32, intermediate_size=64, vocab_size=128256,
                    tie_word_embeddings=True, rms_norm_eps=1e-5, attention_bias=False,
                    mlp_bias=False,
                    # head_dim 8 -> 4 rotary bands; wavelengths 6.3, 167, 4.4e3, 1.2e5.
                    # original_max_position_embeddings 256: low_freq_wavelen 256,
                    # high_freq_wavelen 64 -> band 0 kept, band 1 smoothed, bands 2,3 / 8.
                    rope_theta=500000.0,
                    rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                      high_freq_factor=4.0,
                                      original_max_position_embeddings=256),
                    bos_token_id=128000, eos_token_id=128001)),
    "mistral-tiny": dict(
        arch="MistralForCausalLM", tok="llama2", shard="1MB",
        config=dict(COMMON, hidden_size=32, intermediate_size=128, vocab_size=32000,
                    tie_word_embeddings=False, rms_norm_eps=1e-6, sliding_window=8,
                    rope_theta=10000.0, bos_token_id=1, eos_token_id=2)),
    "qwen2-tiny": dict(
        arch="Qwen2ForCausalLM", tok="qwen3", shard=None,
        config=dict(COMMON, hidden_size=16, intermediate_size=64, vocab_size=151669,
                    tie_word_embeddings=True, rms_norm_eps=1e-6, rope_theta=1000000.0,
                    use_sliding_window=False, sliding_window=None,
                    bos_token_id=151643, eos_token_id=151645)),
    "qwen3-tiny": dict(
        arch="Qwen3ForCausalLM", tok="qwen3", shard=None,
        config=dict(COMMON, hidden_size=16, intermediate_size=64, vocab_size=151669,
                    head_dim=16, tie_word_embeddings=True, rms_norm_eps=1e-6,
                    rope_theta=1000000.0, attention_bias=False,
                    use_sliding_window=False, sliding_window=None,
                    bos_token_id=151643, eos_token_id=151645)),
}


def f32(x):
    """float32 value as the Python float with the shortest float32 round-trip decimal."""
    return float(str(np.float32(x)))


def f32list(a):
    return [f32(v) for v in np.asarray(a, dtype=np.float32).ravel()]


def sampled_ids_for(name, vocab):
    seed = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")
    rng = np.random.default_rng(seed)
    return sorted(int(i) for i in rng.choice(vocab, size=SAMPLED_IDS, replace=False))


def top_k(row, k):
    # descending logit, ties by lower id (stable sort on -row)
    order = np.argsort(-row.astype(np.float64), kind="stable")[:k]
    return [int(i) for i in order]


def margin(row):
    two = np.sort(row.astype(np.float64))[-2:]
    return float(two[1] - two[0])


def logsumexp(row):
    r = row.astype(np.float64)
    m = r.max()
    return float(m + np.log(np.exp(r - m).sum()))


# ----------------------------------------------------------------------------
# Generation (torch + transformers)
# ----------------------------------------------------------------------------

def init_weights(model, seed, torch):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda t: t[0]):
            if name.endswith("norm.weight"):
                v = 1.0 + STD_NORM * torch.randn(p.shape, generator=g)
            elif name.endswith(".bias"):
                v = STD_BIAS * torch.randn(p.shape, generator=g)
            else:
                v = STD_LINEAR * torch.randn(p.shape, generator=g)
            p.copy_(v.to(p.dtype))


def build_one(name, spec, out, tokdir, log):
    import torch
    import transformers
    from tokenizers import Tokenizer

    tok_src = os.path.join(tokdir, spec["tok"])
    tk = Tokenizer.from_file(os.path.join(tok_src, "tokenizer.json"))
    cfg_kw = dict(spec["config"])
    assert cfg_kw["vocab_size"] >= tk.get_vocab_size(with_added_tokens=True), name
    prompt_ids = [tk.encode(t, add_special_tokens=True).ids for t in PROMPTS]

    # Cross-check the tokenizer.json ids against transformers' AutoTokenizer on the same files.
    folder = os.path.join(out, name)
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    os.makedirs(folder)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(tok_src, f), os.path.join(folder, f))
    auto = transformers.AutoTokenizer.from_pretrained(folder)
    for t, ids in zip(PROMPTS, prompt_ids):
        a = auto(t, add_special_tokens=True)["input_ids"]
        if list(a) != ids:
            log(f"  NOTE {name}: AutoTokenizer ids differ from tokenizer.json for {t!r}: {a} vs {ids}")

    arch = getattr(transformers, spec["arch"])
    cfg_cls = arch.config_class
    seed = BASE_SEED
    while True:
        torch.manual_seed(seed)
        cfg = cfg_cls(**cfg_kw)
        cfg._attn_implementation = "eager"
        model = arch(cfg)
        init_weights(model, seed, torch)
        model = model.to(torch.bfloat16)
        model.generation_config = transformers.GenerationConfig(
            bos_token_id=cfg_kw["bos_token_id"], eos_token_id=cfg_kw["eos_token_id"])
        tmp = folder + ".tmp"
        if os.path.isdir(tmp):
            shutil.rmtree(tmp)
        kw = {"max_shard_size": spec["shard"]} if spec["shard"] else {}
        model.save_pretrained(tmp, **kw)
        del model
        ref = transformers.AutoModelForCausalLM.from_pretrained(
            tmp, dtype=torch.float32, attn_implementation="eager")
        ref.eval()
        res = reference_outputs(name, spec, ref, prompt_ids, tk, torch, log)
        if res["min_greedy_margin"] >= MIN_MARGIN:
            break
        log(f"  {name}: seed {seed} min margin {res['min_greedy_margin']:.3g} < {MIN_MARGIN}; redraw")
        shutil.rmtree(tmp)
        seed += 1

    for f in os.listdir(tmp):
        shutil.move(os.path.join(tmp, f), os.path.join(folder, f))
    os.rmdir(tmp)
    doc = {
        "format": "cellm-reference-v1",
        "model": name,
        "tokenizer": spec["tok"],
        "architecture": spec["arch"],
        "seed": seed,
        "versions": versions(),
        "reference": "transformers fp32 eager forward on the bf16 weights upcast to fp32",
        "vocab_size": cfg_kw["vocab_size"],
        "sampled_ids": res["sampled_ids"],
        "min_greedy_margin": res["min_greedy_margin"],
        "prompts": res["prompts"],
    }
    with open(os.path.join(folder, "reference.json"), "w") as fh:
        json.dump(doc, fh, ensure_ascii=False, separators=(",", ":"))
        fh.write("\n")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        os.remove(os.path.join(folder, f))
    for f in os.listdir(folder):
        os.chmod(os.path.join(folder, f), 0o644)
    log(f"  {name}: seed {seed}, min greedy margin {res['min_greedy_margin']:.4g}")


def reference_outputs(name, spec, model, prompt_ids, tk, torch, log):
    vocab = model.config.vocab_size
    sids = sampled_ids_for(name, vocab)
    sidx = np.array(sids)
    prompts = []
    min_m = math.inf
    with torch.no_grad():
        for pi, (text, ids) in enumerate(zip(PROMPTS, prompt_ids)):
            inp = torch.tensor([ids])
            logits = model(input_ids=inp, use_cache=False).logits[0].float().numpy()
            last = logits[-1]
            tops = top_k(last, TOP_K)
            entry = {
                "text": text,
                "ids": ids,
                "last": {
                    "top_ids": tops,
                    "top_logits": f32list(last[tops]),
                    "sampled_logits": f32list(last[sidx]),
                    "logsumexp": f32(logsumexp(last)),
                    "argmax": int(np.argmax(last)),
                },
                "all_positions": None,
            }
            if pi == ALL_POS_PROMPT:
                entry["all_positions"] = {
                    "sampled_logits": [f32list(logits[t][sidx]) for t in range(len(ids))]}
            out = model.generate(
                input_ids=inp, attention_mask=torch.ones_like(inp),
                max_new_tokens=NEW_TOKENS, do_sample=False, use_cache=True,
                eos_token_id=None, pad_token_id=0, bos_token_id=None,
                output_logits=True, return_dict_in_generate=True,
                temperature=None, top_p=None, top_k=None)
            new = [int(x) for x in out.sequences[0, len(ids):]]
            assert len(new) == NEW_TOKENS, (name, len(new))
            steps = [s[0].float().numpy() for s in out.logits]
            margins = [margin(s) for s in steps]
            for s, t in zip(steps, new):
                assert int(np.argmax(s)) == t
            # step 0 logits must be the last-position logits of the full forward
            assert np.allclose(steps[0], last, rtol=1e-4, atol=1e-4 * np.abs(last).max())
            # cache vs no-cache: a full forward over prompt+continuation must give the same argmaxes
            full = model(input_ids=out.sequences, use_cache=False).logits[0].float().numpy()
            nocache = [int(np.argmax(full[len(ids) - 1 + i])) for i in range(NEW_TOKENS)]
            if nocache != new:
                log(f"  WARNING {name}: cached greedy differs from no-cache argmax for prompt {pi}")
                margins.append(0.0)
            min_m = min(min_m, min(margins))
            entry["greedy"] = {"new_ids": new, "margins": [f32(m) for m in margins[:NEW_TOKENS]],
                               "text": tk.decode(new, skip_special_tokens=False)}
            prompts.append(entry)
        # The window must really apply for Mistral: compare with sliding_window disabled.
        if getattr(model.config, "sliding_window", None):
            ids = max(prompt_ids, key=len)
            assert len(ids) > model.config.sliding_window
            a = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]
            w = model.config.sliding_window
            model.config.sliding_window = None
            b = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]
            model.config.sliding_window = w
            d = float((a - b).abs().max())
            assert d > 1e-2, f"sliding window has no effect ({d})"
            log(f"  {name}: window on/off max |d logit| on a {len(ids)}-token prompt = {d:.3g}")
    return {"sampled_ids": sids, "min_greedy_margin": f32(min_m), "prompts": prompts}


def versions():
    import tokenizers
    import torch
    import transformers
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__, "numpy": np.__version__}


# ----------------------------------------------------------------------------
# Pure-numpy twin: reads only config.json + safetensors (the C++ CPU contract)
# ----------------------------------------------------------------------------

_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64}


def read_safetensors(path):
    out = {}
    with open(path, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        header = json.loads(fh.read(n))
        data = fh.read()
    for k, v in header.items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        raw = data[b:e]
        if v["dtype"] == "BF16":
            u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = u.view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=_ST_DTYPES[v["dtype"]]).astype(np.float32)
        out[k] = arr.reshape(v["shape"]).astype(np.float64)
    return out


def load_weights(folder):
    idx = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(idx):
        files = sorted(set(json.load(open(idx))["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    w = {}
    for f in files:
        w.update(read_safetensors(os.path.join(folder, f)))
    return w


def rope_inv_freq(cfg, head_dim, ablate=()):
    rp = cfg.get("rope_parameters") or {}
    theta = cfg.get("rope_theta", rp.get("rope_theta", 10000.0))
    scaling = cfg.get("rope_scaling") or (rp if rp.get("rope_type", "default") != "default" else None)
    # torch computes this in float32; mirror that so angles match to the last bit
    inv = (1.0 / (np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)))
           ).astype(np.float32)
    if "llama3_scaling" in ablate:
        scaling = None
    if scaling and scaling.get("rope_type", scaling.get("type")) == "llama3":
        factor = scaling["factor"]
        lo, hi = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        low_wl, high_wl = old / lo, old / hi
        wl = 2 * math.pi / inv.astype(np.float64)
        smooth = (old / wl - lo) / (hi - lo)
        scaled = np.where(wl > low_wl, inv / factor,
                          np.where(wl < high_wl, inv, (1 - smooth) * inv / factor + smooth * inv))
        inv = scaled.astype(np.float32)
    elif scaling and scaling.get("rope_type", scaling.get("type")) not in (None, "default"):
        raise NotImplementedError(scaling)
    return inv


def rmsnorm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rope(x, pos, inv, interleaved=False):
    # x: [T, H, D]; rotate_half convention (first half / second half, NOT interleaved pairs)
    ang = (pos[:, None].astype(np.float32) * inv[None, :]).astype(np.float64)  # [T, D/2]
    cos = np.cos(np.concatenate([ang, ang], -1))[:, None, :]
    sin = np.sin(np.concatenate([ang, ang], -1))[:, None, :]
    h = x.shape[-1] // 2
    if interleaved:   # ablation only: GPT-J / Meta-checkpoint pairing (2i, 2i+1)
        ang2 = np.repeat(ang, 2, -1)
        cos, sin = np.cos(ang2)[:, None, :], np.sin(ang2)[:, None, :]
        rot = np.stack([-x[..., 1::2], x[..., 0::2]], -1).reshape(x.shape)
        return x * cos + rot * sin
    rot = np.concatenate([-x[..., h:], x[..., :h]], -1)
    return x * cos + rot * sin


def numpy_forward(cfg, W, ids, ablate=()):
    """Reference forward in float64. `ablate` switches a feature off (negative controls)."""
    arch = cfg["architectures"][0]
    H, KV, E = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
    D = cfg.get("head_dim") or E // H
    eps = cfg["rms_norm_eps"]
    window = cfg.get("sliding_window") if (arch == "MistralForCausalLM" or cfg.get("use_sliding_window")) else None
    if "window" in ablate:
        window = None
    inv = rope_inv_freq(cfg, D, ablate)
    T = len(ids)
    pos = np.arange(T)
    qi, ki = np.arange(T)[:, None], np.arange(T)[None, :]
    allowed = ki <= qi
    if window and "window_plus_one" in ablate:
        allowed &= ki >= qi - window     # ablation only: the off-by-one convention
    elif window:
        allowed &= ki > qi - window      # query q sees keys q-window+1 .. q (window keys incl. itself)
    x = W["model.embed_tokens.weight"][ids]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rmsnorm(x, W[p + "input_layernorm.weight"], eps)
        q = h @ W[p + "self_attn.q_proj.weight"].T
        k = h @ W[p + "self_attn.k_proj.weight"].T
        v = h @ W[p + "self_attn.v_proj.weight"].T
        if p + "self_attn.q_proj.bias" in W and "bias" not in ablate:
            q = q + W[p + "self_attn.q_proj.bias"]
            k = k + W[p + "self_attn.k_proj.bias"]
            v = v + W[p + "self_attn.v_proj.bias"]
        q, k, v = q.reshape(T, H, D), k.reshape(T, KV, D), v.reshape(T, KV, D)
        if p + "self_attn.q_norm.weight" in W and "qk_norm" not in ablate:        # Qwen3: per-head RMSNorm before RoPE
            q = rmsnorm(q, W[p + "self_attn.q_norm.weight"], eps)
            k = rmsnorm(k, W[p + "self_attn.k_norm.weight"], eps)
        il = "interleaved_rope" in ablate
        q, k = rope(q, pos, inv, il), rope(k, pos, inv, il)
        att = np.empty((T, H, D))
        for hh in range(H):
            kh = hh // (H // KV)
            s = q[:, hh] @ k[:, kh].T / math.sqrt(D)
            s = np.where(allowed, s, -np.inf)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            att[:, hh] = s @ v[:, kh]
        o = att.reshape(T, H * D) @ W[p + "self_attn.o_proj.weight"].T
        if p + "self_attn.o_proj.bias" in W:
            o = o + W[p + "self_attn.o_proj.bias"]
        x = x + o
        h = rmsnorm(x, W[p + "post_attention_layernorm.weight"], eps)
        g = h @ W[p + "mlp.gate_proj.weight"].T
        u = h @ W[p + "mlp.up_proj.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * u) @ W[p + "mlp.down_proj.weight"].T
    x = rmsnorm(x, W["model.norm.weight"], eps)
    head = W.get("lm_head.weight")
    if cfg.get("tie_word_embeddings", False) or head is None:
        assert cfg.get("tie_word_embeddings", False), "lm_head.weight missing but not tied"
        head = W["model.embed_tokens.weight"]
    return x @ head.T


def close(a, b, rtol=1e-4):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = max(1.0, float(np.abs(b).max()))
    return float(np.abs(a - b).max()) <= rtol * scale, float(np.abs(a - b).max() / scale)


def verify_one(folder, log):
    cfg = json.load(open(os.path.join(folder, "config.json")))
    ref = json.load(open(os.path.join(folder, "reference.json")))
    W = load_weights(folder)
    sids = np.array(ref["sampled_ids"])
    ok = True
    worst = 0.0
    for pi, pr in enumerate(ref["prompts"]):
        ids = pr["ids"]
        lg = numpy_forward(cfg, W, ids)
        last = lg[-1]
        checks = [
            close(last[pr["last"]["top_ids"]], pr["last"]["top_logits"]),
            close(last[sids], pr["last"]["sampled_logits"]),
            close([logsumexp(last)], [pr["last"]["logsumexp"]]),
        ]
        if pr["all_positions"]:
            checks.append(close(lg[:, sids], pr["all_positions"]["sampled_logits"]))
        for good, rel in checks:
            worst = max(worst, rel)
            ok &= good
        if int(np.argmax(last)) != pr["last"]["argmax"]:
            ok = False
            log(f"  FAIL prompt {pi}: argmax {int(np.argmax(last))} != {pr['last']['argmax']}")
        if top_k(last, TOP_K) != pr["last"]["top_ids"]:
            log(f"  note {os.path.basename(folder)} prompt {pi}: top-{TOP_K} order differs (near-ties)")
        # greedy by full recompute (no KV cache) must match transformers' cached generate
        seq = list(ids)
        for _ in range(len(pr["greedy"]["new_ids"])):
            seq.append(int(np.argmax(numpy_forward(cfg, W, seq)[-1])))
        if seq[len(ids):] != pr["greedy"]["new_ids"]:
            ok = False
            log(f"  FAIL prompt {pi}: numpy greedy {seq[len(ids):]} != {pr['greedy']['new_ids']}")
    # Negative controls: switching off a feature this model has must move the logits far
    # beyond the tolerance, i.e. the fixture really exercises it.
    feats = ["interleaved_rope"]
    if cfg.get("sliding_window") and cfg["architectures"][0] == "MistralForCausalLM":
        feats += ["window", "window_plus_one"]
    if (cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}).get("rope_type") == "llama3":
        feats.append("llama3_scaling")
    if "model.layers.0.self_attn.q_proj.bias" in W:
        feats.append("bias")
    if "model.layers.0.self_attn.q_norm.weight" in W:
        feats.append("qk_norm")
    for f in feats:
        d = max(close(numpy_forward(cfg, W, pr["ids"], (f,))[-1][sids],
                      pr["last"]["sampled_logits"])[1] for pr in ref["prompts"])
        log(f"  {os.path.basename(folder)}: negative control '{f}': rel diff {d:.2e} (must be >= 1e-2)")
        if d < 1e-2:
            ok = False
            log(f"  FAIL: fixture does not exercise {f}")
    log(f"  {os.path.basename(folder)}: {'OK' if ok else 'FAIL'} "
        f"(max |numpy - transformers| / max(1,|ref|) = {worst:.2e}, tolerance 1e-4)")
    return ok


def main():
    ap = argparse.ArgumentParser(
        description="Generate cellm's tiny reference models + transformers reference outputs "
                    "(tests/fixtures/models/<name>/), then check them with a pure-numpy twin.",
        epilog="Deterministic: same versions -> same bytes. See tests/fixtures/models/README.md.")
    ap.add_argument("--out", default=DEFAULT_OUT, help="output folder (default: %(default)s)")
    ap.add_argument("--tokenizers", default=DEFAULT_TOK,
                    help="folder with llama3/ qwen3/ llama2/ tokenizer files (default: %(default)s)")
    ap.add_argument("--only", action="append", choices=sorted(MODELS),
                    help="only this model (repeatable)")
    ap.add_argument("--verify", action="store_true",
                    help="only run the numpy twin against existing fixtures (needs no torch)")
    ap.add_argument("--no-verify", action="store_true", help="skip the numpy check after generating")
    args = ap.parse_args()
    names = args.only or list(MODELS)

    def log(msg):
        print(msg, flush=True)

    if not args.verify:
        import torch
        torch.set_num_threads(1)
        torch.use_deterministic_algorithms(True)
        import transformers
        transformers.logging.set_verbosity_error()
        os.makedirs(args.out, exist_ok=True)
        for n in names:
            log(f"building {n}")
            build_one(n, MODELS[n], args.out, args.tokenizers, log)
    if args.verify or not args.no_verify:
        ok = True
        for n in names:
            ok &= verify_one(os.path.join(args.out, n), log)
        if not ok:
            sys.exit(1)


if __name__ == "__main__":
    main()
