#!/usr/bin/python3
"""PyTorch CPU reference for `cohort bench train`: the same models (parameter names and
shapes as cohort's), the same batch sizes, the same full train step (zero_grad, forward,
backward, AdamW) on one thread, printing the same figures.

Run with the system python (python3-torch): /usr/bin/python3 tools/bench_vs_torch.py
--model gpt [--steps N] [--batch B] [--json]. Data is synthetic (random inputs / tokens
from a fixed seed), cycled over 8 batches; MLP labels come from a fixed
random linear teacher, exactly like cohort's benchmark.
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, inp=784, hidden=(256, 128), classes=10):
        super().__init__()
        layers, fan_in = [], inp
        for h in hidden:
            layers += [nn.Linear(fan_in, h), nn.ReLU()]
            fan_in = h
        layers.append(nn.Linear(fan_in, classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x, y):
        return F.cross_entropy(self.net(x), y)


class CausalSelfAttention(nn.Module):
    def __init__(self, d, nh, ctx):
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.nh = nh
        self.register_buffer("mask", torch.tril(torch.ones(ctx, ctx)).view(1, 1, ctx, ctx))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q = q.view(b, t, self.nh, c // self.nh).transpose(1, 2)
        k = k.view(b, t, self.nh, c // self.nh).transpose(1, 2)
        v = v.view(b, t, self.nh, c // self.nh).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.c_proj(y)


class MLPBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d)
        self.c_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, d, nh, ctx):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, nh, ctx)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = MLPBlock(d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT with an untied lm_head, as cohort's gpt."""

    def __init__(self, vocab, ctx, n_layer, nh, d):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, d),
            wpe=nn.Embedding(ctx, d),
            h=nn.ModuleList([Block(d, nh, ctx) for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(d)))
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets):
        b, t = idx.shape
        pos = torch.arange(t, dtype=torch.long)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for blk in self.transformer.h:
            x = blk(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["mlp", "gpt"], default="mlp")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=80)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: torch.autocast('cpu', dtype=torch.bfloat16) around forward "
                         "(PyTorch's mixed precision on the CPU, the peer of train.precision: bf16)")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    g = torch.Generator().manual_seed(1)
    if a.model == "mlp":
        batch = a.batch or 128
        tokens = batch
        model = MLP()
        # Labels from a fixed random linear teacher, as cohort's benchmark does.
        teacher = torch.randn(10, 784, generator=g)
        data = []
        for _ in range(8):
            x = torch.rand(batch, 784, generator=g)
            data.append((x, ((x - 0.5) @ teacher.t()).argmax(dim=1)))
    else:
        batch = a.batch or 16
        tokens = batch * a.context
        model = GPT(a.vocab, a.context, a.n_layer, a.n_head, a.d_model)
        data = []
        for _ in range(8):
            s = torch.randint(0, a.vocab, (batch, a.context + 1), generator=g)
            data.append((s[:, :-1].contiguous(), s[:, 1:].contiguous()))
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)

    def step(i):
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = model(*data[i % len(data)])
        loss.backward()
        opt.step()
        return loss.item()

    for i in range(a.warmup):
        step(i)
    best, first, last = float("inf"), None, None
    c0 = time.process_time()
    t0 = time.perf_counter()
    for i in range(a.steps):
        s0 = time.perf_counter()
        last = step(a.warmup + i)
        best = min(best, time.perf_counter() - s0)
        first = last if first is None else first
    secs = time.perf_counter() - t0
    cpu = time.process_time() - c0
    res = {
        "impl": "torch", "torch": torch.__version__, "model": a.model, "batch": batch,
        "precision": a.precision,
        "tokens_per_step": tokens, "steps": a.steps, "threads": a.threads,
        "params": sum(p.numel() for p in model.parameters()), "seconds": secs,
        "ms_per_step": 1e3 * secs / a.steps, "best_ms": 1e3 * best,
        "cpu_ms_per_step": 1e3 * cpu / a.steps,
        "samples_per_s": batch * a.steps / secs,
        "tokens_per_s": tokens * a.steps / secs if a.model == "gpt" else 0.0,
        "first_loss": first, "last_loss": last,
    }
    if a.json:
        print(json.dumps(res))
    else:
        unit = (f"{res['tokens_per_s']:.0f} tokens/s" if a.model == "gpt"
                else f"{res['samples_per_s']:.0f} samples/s")
        print(f"torch {a.model} {a.precision} batch {batch}: {res['ms_per_step']:.3f} ms/step "
              f"(best {res['best_ms']:.3f}, cpu {res['cpu_ms_per_step']:.3f}), {unit}, params {res['params']}, "
              f"loss {first:.4f} -> {last:.4f}")


if __name__ == "__main__":
    main()
