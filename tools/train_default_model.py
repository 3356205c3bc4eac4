#!/usr/bin/env python3
"""Train cellm's bundled default model (models/kjv-small) and write its reference fixture.

Run from the repository root, after `python3 tools/prepare_kjv.py` (which writes build/kjv/):

    python3 tools/train_default_model.py --device cuda --out models/kjv-small     # the real run
    python3 tools/train_default_model.py --smoke --out /tmp/kjv-smoke             # CPU, < 1 minute

Needs: torch (a CUDA build for the real run), numpy, safetensors, tokenizers, and
transformers for the cross-check at the end (--skip-transformers-check skips it).
No network.

The model: a Llama-architecture decoder (RMSNorm, RoPE theta 10000 in the HF
rotate_half convention, causal grouped-query attention, SwiGLU MLP, LM head tied
to the embedding): hidden 384, 8 layers, 6 query heads and 2 KV heads of 64, MLP
1024, vocab 4096, context 256; 14,162,304 parameters, 28.3 MB in bf16. The
forward below is this file's own (no transformers) and is the reference that
cellm's C++ CPU executor is compared against.

Training: AdamW (betas 0.9/0.95, weight decay 0.1 on matrices), linear warmup
then cosine decay to 10% of the peak rate, bf16 autocast on CUDA, gradient
clipping at 1, dropout 0.2 (training only), batches of 128 random 256-token
windows of the training token stream, torch.compile when on CUDA (--compile
auto|on|off; a compile failure falls back to eager). Seeded (--seed). Every
--eval-interval steps it scores the validation split (which picks the
checkpoint: the weights kept are those of the evaluation with the lowest
validation loss) and, for the record only, the held-out split.
--time-budget-seconds (default 300) bounds the training loop: once the step time
is known, a plan that would not fit is re-planned so the cosine schedule ends
inside the budget, and the loop stops at the budget regardless.

Time on one H200 (measured with torch 2.11 on a synthetic corpus of the same
size; the real run prints its own numbers): ~90 MFLOP per training token;
compiled, 1.85M tokens/s (~21% of the 790 TFLOP/s bf16 peak; 30-40% would be
2.6-3.5M tokens/s, which a model 384 wide does not reach), after a ~30 s compile;
eager, ~0.9M tokens/s. The default plan, 1,200 steps of 32,768 tokens (39M
tokens, ~43 passes over the 911k training tokens), trains in about 65 s
including compilation and evaluations, and the whole script ends in about 2
minutes. More steps would not help: the corpus, not the GPU, bounds this model
(a 14M-parameter model can memorise 911k tokens), which is why the validation
split picks the checkpoint. If the validation minimum comes early in the plan the
script says so and suggests a shorter --steps, so the cosine decay ends there.

What it writes:
    <out>/config.json, generation_config.json    LlamaForCausalLM, tied embeddings
    <out>/model.safetensors                       bf16, HF names, no lm_head (tied)
    <out>/tokenizer.json, tokenizer_config.json   copied from build/kjv
    <out>/training_log.json                       plan, loss curve, held-out ppl, timing
    <fixture>                                     default tests/fixtures/kjv_reference.json
                                                  (--smoke: <out>/kjv_reference.json)

After training it evaluates held-out perplexity, writes the HF folder, reloads the
bf16 weights into this file's forward in float32 on the CPU, and writes the
fixture from that reload: held-out snippets with their ids and the f32 logits at
the last position (all vocab ids), one short snippet with the logits at every
position, and 32-token greedy continuations of "In the beginning" and "And the
LORD said unto Moses" (with <|bos|>). Finally it loads the folder with
transformers' LlamaForCausalLM in float32 and prints the max relative error of
its logits against this forward (fails above 1e-4).
"""

import argparse
import dataclasses
import json
import math
import os
import shutil
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BOS_ID = 0
EOS_ID = 1


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 4096
    hidden_size: int = 384
    num_layers: int = 8
    num_heads: int = 6
    num_kv_heads: int = 2
    intermediate_size: int = 1024
    context_tokens: int = 256
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5

    @property
    def head_dim(self):
        return self.hidden_size // self.num_heads


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    steps: int = 1200
    batch_windows: int = 128
    peak_lr: float = 1.5e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    dropout: float = 0.2
    grad_clip: float = 1.0
    eval_interval: int = 50
    eval_max_tokens: int = 0       # per evaluation during training; 0 = the whole stream


FULL_MODEL = ModelConfig()
FULL_TRAIN = TrainConfig()
SMOKE_MODEL = ModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                          intermediate_size=128, context_tokens=64)
SMOKE_TRAIN = TrainConfig(steps=100, batch_windows=8, peak_lr=3e-3, warmup_steps=6,
                          dropout=0.0, eval_interval=25, eval_max_tokens=4096)


# ----------------------------------------------------------------------------
# The model. Module names are the Hugging Face Llama names, so state_dict() keys
# are the checkpoint keys (model.layers.N.self_attn.q_proj.weight, ...).

class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # x * rsqrt(mean(x^2) + eps) * w, in float32 whatever the input dtype.
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()
        return y.to(x.dtype)


def rope_cos_sin(positions, head_dim, theta):
    """cos, sin: [T, head_dim] float32, HF layout (the half-size table repeated twice)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32,
                                             device=positions.device) / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x, cos, sin):
    """x: [B, heads, T, head_dim]; rotation computed in float32."""
    xf = x.float()
    return (xf * cos + rotate_half(xf) * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        d, hd = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(d, cfg.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, cfg.num_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, cfg.num_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * hd, d, bias=False)

    def forward(self, x, cos, sin, dropout):
        cfg = self.cfg
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, cfg.num_heads, cfg.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # GQA: KV head j serves query heads [j * group, (j + 1) * group), as HF repeat_kv.
        group = cfg.num_heads // cfg.num_kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, cfg.num_heads * cfg.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, dropout):
        h = self.self_attn(self.input_layernorm(x), cos, sin, dropout)
        x = x + F.dropout(h, dropout, self.training)
        h = self.mlp(self.post_attention_layernorm(x))
        return x + F.dropout(h, dropout, self.training)


class LlamaBody(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class KjvLlama(nn.Module):
    """ids [B, T] (positions 0..T-1) -> logits [B, T, vocab]. LM head = embedding."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = LlamaBody(cfg)
        self.dropout = 0.0
        self.reset_parameters()

    def reset_parameters(self):
        residual_std = 0.02 / math.sqrt(2 * self.cfg.num_layers)
        for name, p in self.named_parameters():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                nn.init.ones_(p)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, std=residual_std)
            else:
                nn.init.normal_(p, std=0.02)

    def forward(self, ids):
        t = ids.shape[1]
        cos, sin = rope_cos_sin(torch.arange(t, device=ids.device), self.cfg.head_dim, self.cfg.rope_theta)
        dropout = self.dropout if self.training else 0.0
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin, dropout)
        x = self.model.norm(x)
        return F.linear(x, self.model.embed_tokens.weight)


def count_parameters(model):
    return sum(p.numel() for p in model.parameters())


def flops_per_token(cfg):
    """Training FLOPs per token: 6 x matmul parameters (incl. the tied head) + causal attention."""
    matmul_params = count_parameters_of_config(cfg)  # the embedding counts once, as the head's matmul
    attention = 6 * cfg.num_layers * cfg.context_tokens * cfg.num_heads * cfg.head_dim  # QK^T + AV, causal half
    return 6 * matmul_params + attention


def count_parameters_of_config(cfg):
    d, hd = cfg.hidden_size, cfg.head_dim
    attn = d * cfg.num_heads * hd * 2 + d * cfg.num_kv_heads * hd * 2
    mlp = 3 * d * cfg.intermediate_size
    return cfg.vocab_size * d + cfg.num_layers * (attn + mlp + 2 * d) + d


# ----------------------------------------------------------------------------
# Data.

def load_stream(path):
    if not os.path.exists(path):
        sys.exit(f"train_default_model: {path} is missing; run `python3 tools/prepare_kjv.py` first")
    return torch.from_numpy(np.fromfile(path, dtype=np.uint16).astype(np.int64))


def sample_batch(stream, batch_windows, context_tokens, generator):
    """Random windows of the stream: inputs, targets [batch_windows, context_tokens]."""
    starts = torch.randint(0, stream.numel() - context_tokens - 1, (batch_windows,),
                           generator=generator, device=stream.device)
    idx = starts[:, None] + torch.arange(context_tokens + 1, device=stream.device)[None, :]
    windows = stream[idx]
    return windows[:, :-1], windows[:, 1:]


@torch.no_grad()
def heldout_nll(model, stream, context_tokens, device, autocast, max_tokens=0, windows_per_batch=64):
    """Mean NLL (nats) of the held-out stream and the number of tokens scored.

    Windows of context_tokens with stride context_tokens/2; each token is scored once,
    with at least half a window of context (except at the start). Targets that are
    <|bos|> (always right after <|eos|>: a separator, not text) are not scored.
    """
    if max_tokens:
        stream = stream[:max_tokens + 1]
    stride = context_tokens // 2
    n = stream.numel()
    starts = list(range(0, max(n - context_tokens - 1, 0) + 1, stride))
    if starts[-1] + context_tokens + 1 < n:
        starts.append(n - context_tokens - 1)
    was_training = model.training
    model.eval()
    total_nll, total_tokens, scored_until = 0.0, 0, 0  # scored_until: stream index of the next unscored target
    stream = stream.to(device)
    for i in range(0, len(starts), windows_per_batch):
        chunk = starts[i:i + windows_per_batch]
        idx = torch.tensor(chunk, device=device)[:, None] + torch.arange(context_tokens + 1, device=device)[None, :]
        windows = stream[idx]
        with autocast():
            logits = model(windows[:, :-1])
        nll = F.cross_entropy(logits.float().transpose(1, 2), windows[:, 1:], reduction="none")
        for row, start in enumerate(chunk):
            first = max(scored_until - start - 1, 0)  # target j predicts stream[start + 1 + j]
            targets = windows[row, 1 + first:]
            keep = targets != BOS_ID
            total_nll += nll[row, first:][keep].sum().item()
            total_tokens += int(keep.sum().item())
            scored_until = start + context_tokens + 1
    model.train(was_training)
    return total_nll / total_tokens, total_tokens


# ----------------------------------------------------------------------------
# Training.

def lr_at(step, total_steps, tc):
    if step < tc.warmup_steps:
        return tc.peak_lr * (step + 1) / tc.warmup_steps
    progress = min((step - tc.warmup_steps) / max(total_steps - tc.warmup_steps, 1), 1.0)
    return tc.peak_lr * (tc.min_lr_ratio + (1 - tc.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def make_optimizer(model, tc, device):
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": tc.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    kwargs = {"fused": True} if device.type == "cuda" else {}
    return torch.optim.AdamW(groups, lr=tc.peak_lr, betas=(0.9, 0.95), eps=1e-8, **kwargs)


def train(model, streams, mc, tc, args, device, log):
    """Trains in place; leaves the model at the step with the lowest validation loss."""
    autocast = make_autocast(device)
    optimizer = make_optimizer(model, tc, device)
    generator = torch.Generator(device=device)
    generator.manual_seed(args.seed)
    train_stream = streams["train"].to(device)

    step_fn = model
    compiled = False
    if args.compile == "on" or (args.compile == "auto" and device.type == "cuda"):
        try:
            step_fn = torch.compile(model)
            compiled = True
        except Exception as e:  # noqa: BLE001 - any failure means "run eager"
            print(f"train: torch.compile unavailable ({type(e).__name__}: {e}); running eager")

    def loss_of(x, y):
        with autocast():
            logits = step_fn(x)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1))

    total_steps = tc.steps
    tokens_per_step = tc.batch_windows * mc.context_tokens
    curve = []
    ema = None
    t0 = time.time()
    timing_from = None   # (step, training seconds) after which step time is measured (compile excluded)
    eval_seconds = 0.0   # spent in evaluations; excluded from the measured training rate
    best = {"validation_loss": math.inf, "step": 0, "state": None}
    stopped_by_budget = False
    replanned = None
    model.train()
    step = 0
    while step < total_steps:
        lr = lr_at(step, total_steps, tc)
        for g in optimizer.param_groups:
            g["lr"] = lr
        x, y = sample_batch(train_stream, tc.batch_windows, mc.context_tokens, generator)
        try:
            loss = loss_of(x, y)
        except Exception as e:  # noqa: BLE001 - a compile failure surfaces on the first call
            if not compiled or step > 0:
                raise
            print(f"train: torch.compile failed ({type(e).__name__}: {str(e)[:200]}); running eager")
            step_fn, compiled = model, False
            loss = loss_of(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        optimizer.step()
        step += 1

        if step == 1 or step % 10 == 0 or step == total_steps:
            loss_value = loss.item()   # syncs
            ema = loss_value if ema is None else 0.9 * ema + 0.1 * loss_value
            elapsed = time.time() - t0
            if timing_from is None and step >= min(20, total_steps):
                timing_from = (step, elapsed - eval_seconds)
            # Re-plan once the step time is known, so the cosine schedule ends inside the budget.
            if (replanned is None and timing_from is not None and step >= timing_from[0] + 20
                    and args.time_budget_seconds > 0):
                step_seconds = (elapsed - eval_seconds - timing_from[1]) / (step - timing_from[0])
                eval_share = eval_seconds / elapsed   # evaluations keep costing their share of the time left
                fit = int(step + (args.time_budget_seconds * 0.97 - elapsed) * (1 - eval_share) / step_seconds)
                replanned = {"at_step": step, "step_seconds": step_seconds, "from_steps": total_steps}
                if fit < total_steps:
                    total_steps = max(fit, step + 1)
                    print(f"train: {step_seconds * 1000:.1f} ms/step; {tc.steps} steps do not fit in "
                          f"{args.time_budget_seconds:.0f} s; re-planned to {total_steps} steps")
                replanned["to_steps"] = total_steps
            if elapsed > args.time_budget_seconds > 0:
                stopped_by_budget = True
        if step % tc.eval_interval == 0 or step == total_steps or stopped_by_budget or step == 1:
            eval_start = time.time()
            vl, _ = heldout_nll(model, streams["validation"], mc.context_tokens, device, autocast, tc.eval_max_tokens)
            # Held-out loss is logged for the record only; nothing is chosen by it.
            hl, _ = heldout_nll(model, streams["heldout"], mc.context_tokens, device, autocast, tc.eval_max_tokens)
            mark = ""
            if vl < best["validation_loss"]:
                best.update(validation_loss=vl, step=step,
                            state={k: v.detach().clone() for k, v in model.state_dict().items()})
                mark = " *"
            eval_seconds += time.time() - eval_start
            elapsed = time.time() - t0
            rate = ""
            if timing_from is not None and step > timing_from[0]:
                tok_s = (step - timing_from[0]) * tokens_per_step / (elapsed - eval_seconds - timing_from[1])
                rate = f"  {tok_s / 1e3:,.0f}k tok/s"
            print(f"step {step:5d}/{total_steps}  {elapsed:6.1f} s  lr {lr:.2e}  loss {loss.item():.4f} "
                  f"(ema {ema:.4f})  val {vl:.4f}  held-out {hl:.4f} (ppl {math.exp(hl):6.2f})  "
                  f"|g| {grad_norm.item():.2f}{rate}{mark}", flush=True)
            curve.append({"step": step, "elapsed_s": round(elapsed, 2), "epochs": round(step * tokens_per_step /
                          train_stream.numel(), 2), "lr": lr, "train_loss": round(loss.item(), 4),
                          "train_loss_ema": round(ema, 4), "validation_loss": round(vl, 4),
                          "heldout_loss": round(hl, 4)})
        if stopped_by_budget:
            print(f"train: time budget of {args.time_budget_seconds:.0f} s reached at step {step}; stopping")
            break

    train_seconds = time.time() - t0
    measured = None
    if timing_from is not None and step > timing_from[0]:
        measured = (step - timing_from[0]) * tokens_per_step / (train_seconds - eval_seconds - timing_from[1])
    model.load_state_dict(best["state"])
    print(f"train: {step} steps in {train_seconds:.1f} s ({eval_seconds:.1f} s evaluating); keeping step "
          f"{best['step']} (lowest validation loss, {best['validation_loss']:.4f})")
    if best["step"] < 0.6 * step:
        print(f"train: validation loss bottomed at step {best['step']} of {step} and rose after (overfitting); "
              f"--steps {max(int(best['step'] * 1.25), tc.warmup_steps + 1)} would end the cosine decay near there")
    log.update({
        "steps_planned": tc.steps, "steps_done": step, "replanned": replanned,
        "stopped_by_time_budget": stopped_by_budget, "compiled": compiled,
        "tokens_per_step": tokens_per_step, "tokens_seen": step * tokens_per_step,
        "epochs": round(step * tokens_per_step / train_stream.numel(), 2),
        "kept_step": best["step"], "kept_validation_loss": round(best["validation_loss"], 5),
        "kept_epochs": round(best["step"] * tokens_per_step / train_stream.numel(), 2),
        "train_seconds": round(train_seconds, 2), "eval_seconds": round(eval_seconds, 2),
        "tokens_per_second_after_warmup": round(measured) if measured else None,
        "curve": curve,
    })
    return measured


def make_autocast(device):
    if device.type == "cuda":
        return lambda: torch.autocast("cuda", dtype=torch.bfloat16)
    return lambda: torch.autocast("cpu", enabled=False)


# ----------------------------------------------------------------------------
# Export: the HF folder.

def hf_config(mc):
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": mc.vocab_size,
        "hidden_size": mc.hidden_size,
        "intermediate_size": mc.intermediate_size,
        "num_hidden_layers": mc.num_layers,
        "num_attention_heads": mc.num_heads,
        "num_key_value_heads": mc.num_kv_heads,
        "head_dim": mc.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": mc.context_tokens,
        "rms_norm_eps": mc.rms_norm_eps,
        "rope_theta": mc.rope_theta,
        "rope_scaling": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": mc.rope_theta},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": True,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "use_cache": True,
        "torch_dtype": "bfloat16",
    }


def generation_config():
    return {
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "do_sample": True,
        "temperature": 0.8,
        "top_p": 0.95,
        "max_length": 256,
    }


def write_hf_folder(model, mc, out_dir, tokenizer_dir):
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    tensors = {name: p.detach().to("cpu", torch.bfloat16).contiguous() for name, p in model.state_dict().items()}
    assert "lm_head.weight" not in tensors
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(hf_config(mc), f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(generation_config(), f, indent=2)
        f.write("\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        src = os.path.join(tokenizer_dir, name)
        if os.path.abspath(src) != os.path.abspath(os.path.join(out_dir, name)):
            shutil.copyfile(src, os.path.join(out_dir, name))
    return os.path.getsize(os.path.join(out_dir, "model.safetensors"))


def load_reference_model(mc, out_dir):
    """The saved bf16 weights, widened to float32, in this file's forward, on the CPU."""
    from safetensors.torch import load_file

    tensors = load_file(os.path.join(out_dir, "model.safetensors"))
    model = KjvLlama(mc)
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=False)
    if missing or unexpected:
        sys.exit(f"train_default_model: reload mismatch: missing {missing}, unexpected {unexpected}")
    return model.eval()


# ----------------------------------------------------------------------------
# Reference fixture.

def f32_list(t):
    # Nine significant digits round-trip a float32 exactly (strtof gives the same bits back).
    return [float(f"{v:.9g}") for v in t.to(torch.float32).flatten().tolist()]


@torch.no_grad()
def greedy(model, prompt_ids, new_tokens):
    """Greedy continuation by full recompute; also the top-1 minus top-2 logit gap per step."""
    ids = list(prompt_ids)
    margins = []
    for _ in range(new_tokens):
        logits = model(torch.tensor([ids[-model.cfg.context_tokens:]]))[0, -1]
        top = torch.topk(logits, 2)
        ids.append(int(torch.argmax(logits)))  # the first maximal index on ties
        margins.append(float(top.values[0] - top.values[1]))
    return ids[len(prompt_ids):], margins


def heldout_snippets(build_dir, count):
    """The first verse of held-out chapters spread over the book, and one short phrase."""
    chapters = []
    with open(os.path.join(build_dir, "heldout.txt"), encoding="ascii") as f:
        chapters = [c.split("\n") for c in f.read().strip("\n").split("\n\n")]
    picks = [chapters[int(i * (len(chapters) - 1) / max(count - 1, 1))][0] for i in range(count)]
    return picks


@torch.no_grad()
def write_fixture(ref_model, tokenizer, mc, build_dir, path, snippet_count=4):
    snippets = heldout_snippets(build_dir, snippet_count)
    entries = []
    for text in snippets:
        ids = tokenizer.encode(text).ids[:mc.context_tokens]
        logits = ref_model(torch.tensor([ids]))[0]
        entries.append({"text": text, "ids": ids, "last_logits": f32_list(logits[-1])})
    short_ids = tokenizer.encode(snippets[0]).ids[:8]
    short_text = tokenizer.decode(short_ids[1:], skip_special_tokens=False)
    short_logits = ref_model(torch.tensor([short_ids]))[0]
    continuations = []
    for prompt in ("In the beginning", "And the LORD said unto Moses"):
        ids = tokenizer.encode(prompt).ids
        new_ids, margins = greedy(ref_model, ids, 32)
        continuations.append({"prompt": prompt, "prompt_ids": ids, "new_ids": new_ids,
                              "text": tokenizer.decode(new_ids, skip_special_tokens=False),
                              "top2_margins": [round(m, 5) for m in margins]})
    fixture = {
        "about": ("Reference outputs of models/kjv-small (bf16 weights widened to float32) from "
                  "tools/train_default_model.py's own float32 forward on the CPU. Ids include the "
                  "leading <|bos|> (0). Logits are float32 over all vocab ids. Greedy continuations "
                  "recompute the whole prefix each step, take argmax (lowest id on ties), and do not "
                  "stop at <|eos|>; top2_margins is the top-1 minus top-2 logit at each step."),
        "model_dir": "models/kjv-small",
        "vocab_size": mc.vocab_size,
        "snippets": entries,
        "all_positions": {"text": short_text, "ids": short_ids,
                          "logits": [f32_list(row) for row in short_logits]},
        "greedy": continuations,
    }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(fixture, f, separators=(",", ":"))
        f.write("\n")
    return fixture


@torch.no_grad()
def cross_check_transformers(ref_model, out_dir, fixture):
    """Max relative error of transformers' LlamaForCausalLM (f32) against this forward."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(out_dir, dtype=torch.float32, attn_implementation="eager").eval()
    hf_tok = AutoTokenizer.from_pretrained(out_dir)
    worst_rel, worst_abs = 0.0, 0.0
    sequences = [s["ids"] for s in fixture["snippets"]] + [fixture["all_positions"]["ids"]]
    sequences += [g["prompt_ids"] + g["new_ids"] for g in fixture["greedy"]]
    for ids in sequences:
        x = torch.tensor([ids])
        ours = ref_model(x)[0]
        theirs = hf(x).logits[0]
        err = (ours - theirs).abs().max().item()
        worst_abs = max(worst_abs, err)
        worst_rel = max(worst_rel, err / theirs.abs().max().item())
    token_mismatch = [s["text"] for s in fixture["snippets"] if hf_tok(s["text"]).input_ids != s["ids"]]
    return worst_rel, worst_abs, token_mismatch


# ----------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default=os.path.join(REPO_ROOT, "models", "kjv-small"))
    parser.add_argument("--data", default=os.path.join(REPO_ROOT, "build", "kjv"),
                        help="prepare_kjv.py's build folder")
    parser.add_argument("--fixture", default=None,
                        help="default tests/fixtures/kjv_reference.json (--smoke: <out>/kjv_reference.json)")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--batch-windows", type=int, default=None, help="windows of context_tokens per step")
    parser.add_argument("--lr", type=float, default=None, help="peak learning rate")
    parser.add_argument("--dropout", type=float, default=None)
    parser.add_argument("--eval-interval", type=int, default=None)
    parser.add_argument("--time-budget-seconds", type=float, default=300.0, help="0 = unlimited")
    parser.add_argument("--compile", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--seed", type=int, default=1611)
    parser.add_argument("--smoke", action="store_true", help="tiny config, few steps, CPU")
    parser.add_argument("--skip-transformers-check", action="store_true")
    args = parser.parse_args()

    mc, tc = (SMOKE_MODEL, SMOKE_TRAIN) if args.smoke else (FULL_MODEL, FULL_TRAIN)
    overrides = {"steps": args.steps, "batch_windows": args.batch_windows, "peak_lr": args.lr,
                 "dropout": args.dropout, "eval_interval": args.eval_interval}
    tc = dataclasses.replace(tc, **{k: v for k, v in overrides.items() if v is not None})
    tc = dataclasses.replace(tc, warmup_steps=min(tc.warmup_steps, max(tc.steps // 10, 1)))
    if args.smoke:
        args.device = "cpu"
    fixture_path = args.fixture or (os.path.join(args.out, "kjv_reference.json") if args.smoke
                                    else os.path.join(REPO_ROOT, "tests", "fixtures", "kjv_reference.json"))
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_file(os.path.join(args.data, "tokenizer.json"))
    if tokenizer.get_vocab_size() != mc.vocab_size:
        sys.exit(f"train_default_model: tokenizer has {tokenizer.get_vocab_size()} ids, model expects {mc.vocab_size}")
    streams = {name: load_stream(os.path.join(args.data, f"{name}.bin")) for name in ("train", "validation", "heldout")}
    train_stream, heldout_stream = streams["train"], streams["heldout"]

    model = KjvLlama(mc).to(device)
    model.dropout = tc.dropout
    n_params = count_parameters(model)
    assert n_params == count_parameters_of_config(mc)
    fpt = flops_per_token(mc)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"train: {device_name}, torch {torch.__version__}; {n_params:,} parameters "
          f"({n_params * 2 / 1e6:.1f} MB bf16); {fpt / 1e6:.0f} MFLOP per training token")
    print(f"train: {train_stream.numel():,} training, {streams['validation'].numel():,} validation, "
          f"{heldout_stream.numel():,} held-out tokens; "
          f"{tc.steps} steps x {tc.batch_windows} x {mc.context_tokens} tokens = "
          f"{tc.steps * tc.batch_windows * mc.context_tokens / train_stream.numel():.1f} epochs; "
          f"time budget {args.time_budget_seconds:.0f} s")
    if device.type == "cuda":
        for mfu in (0.3, 0.4):
            print(f"train: at {mfu:.0%} of 790 TFLOP/s: {790e12 * mfu / fpt / 1e6:.1f}M tok/s, "
                  f"{tc.steps * tc.batch_windows * mc.context_tokens * fpt / (790e12 * mfu):.0f} s for the plan")

    log = {"model": dataclasses.asdict(mc), "train": dataclasses.asdict(tc), "parameters": n_params,
           "seed": args.seed, "device": device_name, "torch": torch.__version__,
           "flops_per_token": fpt, "argv": sys.argv[1:]}
    t_start = time.time()
    measured = train(model, streams, mc, tc, args, device, log)
    if measured and device.type == "cuda":
        print(f"train: measured {measured / 1e6:.2f}M tok/s = {measured * fpt / 1e12:.0f} TFLOP/s "
              f"({measured * fpt / 790e12:.1%} of 790 TFLOP/s)")

    model.eval()
    model.dropout = 0.0
    autocast = make_autocast(device)
    final_eval_tokens = tc.eval_max_tokens if args.smoke else 0   # the whole held-out stream
    loss, tokens = heldout_nll(model, heldout_stream, mc.context_tokens, device, autocast, final_eval_tokens)
    print(f"held-out ({'bf16 autocast' if device.type == 'cuda' else 'f32'}): {tokens:,} tokens, "
          f"loss {loss:.4f}, ppl {math.exp(loss):.3f}")

    size_bytes = write_hf_folder(model, mc, args.out, args.data)
    print(f"export: {args.out} (model.safetensors {size_bytes / 1e6:.1f} MB)")

    ref_model = load_reference_model(mc, args.out)
    ref_loss, ref_tokens = heldout_nll(ref_model, heldout_stream, mc.context_tokens, torch.device("cpu"),
                                       make_autocast(torch.device("cpu")), final_eval_tokens)
    print(f"held-out (bf16 weights, f32 forward, CPU): {ref_tokens:,} tokens, loss {ref_loss:.4f}, "
          f"ppl {math.exp(ref_loss):.3f}")
    fixture = write_fixture(ref_model, tokenizer, mc, args.data, fixture_path)
    print(f"fixture: {fixture_path} ({os.path.getsize(fixture_path) / 1e3:.0f} kB)")
    for g in fixture["greedy"]:
        print(f"greedy: {g['prompt']!r} -> {g['text']!r} (min top-2 margin {min(g['top2_margins']):.4f})")

    log.update({
        "heldout": {"tokens": ref_tokens, "loss": round(ref_loss, 5), "ppl": round(math.exp(ref_loss), 4),
                    "loss_before_export": round(loss, 5),
                    "scoring": "bf16 weights, f32 forward; stride-128 windows of 256, <|bos|> targets skipped"},
        "total_seconds": round(time.time() - t_start, 2),
        "model_safetensors_bytes": size_bytes,
        "greedy": {g["prompt"]: g["text"] for g in fixture["greedy"]},
    })
    if not args.skip_transformers_check:
        import transformers
        rel, abs_err, mismatched = cross_check_transformers(ref_model, args.out, fixture)
        print(f"cross-check: transformers {transformers.__version__} LlamaForCausalLM vs this forward (f32): "
              f"max abs err {abs_err:.3e}, max rel err {rel:.3e}; tokenizer mismatches: {len(mismatched)}")
        log["transformers_check"] = {"transformers": transformers.__version__, "max_abs_err": abs_err,
                                     "max_rel_err": rel, "tokenizer_mismatches": len(mismatched)}
    with open(os.path.join(args.out, "training_log.json"), "w") as f:
        json.dump(log, f, indent=2)
        f.write("\n")
    print(f"wrote {os.path.join(args.out, 'training_log.json')}")
    if not args.skip_transformers_check and (rel > 1e-4 or mismatched):
        sys.exit("train_default_model: transformers disagrees with this forward (naming, layout or tokenizer)")


if __name__ == "__main__":
    main()
