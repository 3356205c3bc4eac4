#!/usr/bin/env python3
"""Hidden-shaped FP8 accuracy models and probe (issue 44's criterion), in torch.

Makes a Llama model with real hidden sizes and head widths (576 / 64 as
SmolLM2-135M, or any other), 1-2 layers, from a seed, with weights drawn like a
trained model's (normal linear weights of --linear-std, embedding of --embed-std,
norms 1), and writes it as a Hugging Face folder (config.json, model.safetensors in
bf16) with --out; or, with --model, loads an existing folder (SmolLM2-135M-Instruct,
models/kjv-small). Then measures, in float32 on bf16 weights, the per-row (position)
cosine of the logits against the bf16 model's when
  * the linear weights are e4m3 with one scale per row, amax/448 (cellm's --weights fp8),
  * the inputs of every linear layer are e4m3 with one scale per token, amax/448 (the
    CUDA executor's FP8 products quantize activations so),
  * both,
and splits the loss by part (attention or MLP projections) and, with --per-layer, by
layer. --encoding compares other weight encodings (e4m3 per 32-weight block, int8 per
row). Also prints each layer's update over the residual stream (rms ratio): a
residual-dominated model keeps the e4m3 rounding of an update from moving the
logits' direction.

The C++ test tests/model/fp8_accuracy_test.cpp builds the same kind of model in
memory from a seed (no file is committed: a 576-wide model is megabytes); this script
is its torch-side reference and the tool that found where the loss comes from.

  python3 tools/make_hidden_shaped_fixture.py --hidden 576 --heads 9 --kv-heads 3 \
      --ff 1536 --layers 2 --out ~/.cache/cellm/fixtures/hidden-576
  python3 tools/make_hidden_shaped_fixture.py --model /path/to/SmolLM2-135M-Instruct
"""
import argparse
import os

import torch


def quantize_rows(w):
    """e4m3 with one scale per row (amax / 448), dequantized: cellm's --weights fp8."""
    amax = w.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12)
    scale = amax / 448.0
    return (w / scale).to(torch.float8_e4m3fn).to(torch.float32) * scale


def quantize_blocks32(w):
    """e4m3 with one scale per 32 consecutive weights of a row (for comparison)."""
    return quantize_rows(w.reshape(-1, 32)).reshape(w.shape)


def quantize_int8_rows(w):
    """int8 with one scale per row (amax / 127), rounded to nearest (for comparison)."""
    scale = w.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / 127.0
    return (w / scale).round().clamp(-127, 127) * scale


ENCODINGS = {"e4m3-row": quantize_rows, "e4m3-block32": quantize_blocks32,
             "int8-row": quantize_int8_rows}


def make_model(args):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.ff,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads if args.head_dim == 0 else args.head_dim,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=1,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            elif "embed_tokens" in name:
                p.normal_(0.0, args.embed_std)
            else:
                p.normal_(0.0, args.linear_std)
    return model.to(torch.bfloat16).to(torch.float32)


def load_model(path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16)
    return model.to(torch.float32).eval()


PROJ = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def linears(model):
    """(layer, name, module) of every decoder projection."""
    out = []
    for i, layer in enumerate(model.model.layers):
        for n in PROJ:
            parent = layer.self_attn if n in PROJ[:4] else layer.mlp
            out.append((i, n, getattr(parent, n)))
    return out


# The prompts of tests/model/fp8_accuracy_test.cpp's trained models.
TEXTS = [
    "In the beginning God created the heaven and the earth.",
    "And God said, Let there be light: and there was light. And God saw the light, that it "
    "was good: and God divided the light from the darkness.",
    "The LORD is my shepherd; I shall not want. He maketh me to lie down in green pastures: "
    "he leadeth me beside the still waters. He restoreth my soul: he leadeth me in the paths "
    "of righteousness for his name's sake.",
]


def prompts(model, args):
    g = torch.Generator().manual_seed(7)
    vocab = model.config.vocab_size
    if args.text:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.model)
        return [torch.tensor(tok(t).input_ids) for t in TEXTS]
    return [torch.randint(2, min(vocab, 4000), (n,), generator=g) for n in (7, 24, 48)]


def logits(model, ids):
    with torch.no_grad():
        return model(ids[None]).logits[0].float()


def cosines(model, ref, ps):
    rows = []
    for ids, want in zip(ps, ref):
        got = logits(model, ids)
        rows.append(torch.nn.functional.cosine_similarity(got, want, dim=-1))
    c = torch.cat(rows)
    return c.min().item(), c.mean().item()


def measure(model, ps, pick, weights, acts, encode=quantize_rows):
    """Cosines with the picked projections' weights (by `encode`) and/or inputs quantized."""
    ref = [logits(model, ids) for ids in ps]
    saved, hooks = [], []
    for layer, name, m in linears(model):
        if not pick(layer, name):
            continue
        if weights:
            saved.append((m, m.weight.data))
            m.weight.data = encode(m.weight.data)
        if acts:
            hooks.append(m.register_forward_pre_hook(lambda _m, x: (quantize_rows(x[0]),)))
    try:
        return cosines(model, ref, ps)
    finally:
        for m, w in saved:
            m.weight.data = w
        for h in hooks:
            h.remove()


def residual_ratios(model, ps):
    """rms(update) / rms(residual before it), per layer, over the prompts."""
    out = []
    with torch.no_grad():
        hs = model(ps[-1][None], output_hidden_states=True).hidden_states
    for i in range(len(hs) - 1):
        out.append(((hs[i + 1] - hs[i]).pow(2).mean() / hs[i].pow(2).mean()).sqrt().item())
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="a Hugging Face folder to measure instead of a made model")
    ap.add_argument("--out", help="write the made model here (config.json, model.safetensors)")
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=0)
    ap.add_argument("--ff", type=int, default=1536)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--linear-std", type=float, default=0.02)
    ap.add_argument("--embed-std", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=44)
    ap.add_argument("--per-layer", action="store_true", help="each layer's weights alone")
    ap.add_argument("--encoding", choices=sorted(ENCODINGS), default="e4m3-row",
                    help="the weights' encoding (activations are always e4m3 per token)")
    ap.add_argument("--text", action="store_true",
                    help="with --model: the test's KJV prompts through the folder's tokenizer "
                    "(else random ids)")
    args = ap.parse_args()
    torch.set_num_threads(2)

    model = load_model(args.model) if args.model else make_model(args)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        model.to(torch.bfloat16).save_pretrained(args.out, safe_serialization=True)
        model = model.to(torch.float32)
    ps = prompts(model, args)
    name = args.model or f"hidden {args.hidden}, {args.layers} layers"
    print(f"{name}: update / residual rms per layer:",
          " ".join(f"{r:.3f}" for r in residual_ratios(model, ps)))
    every = lambda layer, n: True  # noqa: E731
    for what, pick in [("every projection", every),
                       ("attention only", lambda layer, n: n in PROJ[:4]),
                       ("MLP only", lambda layer, n: n in PROJ[4:])]:
        enc = args.encoding
        for label, w, a in [(f"{enc} weights", True, False), ("e4m3 activations", False, True),
                            (f"{enc} weights + e4m3 activations", True, True)]:
            lo, mean = measure(model, ps, pick, w, a, ENCODINGS[args.encoding])
            print(f"  {what}, {label}: per-row logit cosine min {lo:.6f} mean {mean:.6f}")
    if args.per_layer:
        for i in range(model.config.num_hidden_layers):
            lo, mean = measure(model, ps, lambda layer, n, i=i: layer == i, True, False,
                               ENCODINGS[args.encoding])
            print(f"  layer {i} alone, {args.encoding} weights: min {lo:.6f} mean {mean:.6f}")


if __name__ == "__main__":
    main()
