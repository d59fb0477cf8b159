#!/usr/bin/python3
"""PyTorch reference for `cohort generate` and `cohort serve` (docs/serving.md, "Against
PyTorch"): the same GPT checkpoint (cohort's safetensors, parameter names as nanoGPT's) loaded
into tools/bench_vs_torch.py's GPT, greedy decoding with a KV cache in PyTorch, and

  1. equality: for each prompt, PyTorch's greedy tokens against `cohort generate CKPT --prompt P
     --max-tokens N --temperature 0` (token for token);
  2. speed: one stream's tokens/s, PyTorch's cached decode loop (batch 1, one thread) against
     `cohort serve CKPT --threads 1` answering the same greedy request over HTTP (its KV cache,
     the HTTP round trip included), each the median of --repeats runs, in the same run.

Run with the system python (python3-torch, COHORT_BENCH_DEPS=1 tools/setup.sh):
  /usr/bin/python3 tools/generate_vs_torch.py CKPT [--cohort build/cohort] [--max-tokens 64]
CKPT: a step folder (DIR/step_NNNNNNNN) of a whole-model GPT checkpoint. Exit 1 when a prompt's
tokens differ.
"""
import argparse
import glob
import json
import math
import os
import re
import statistics
import struct
import subprocess
import sys
import time
import urllib.request

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_vs_torch import GPT  # noqa: E402  (the same module the training bench uses)

PROMPTS = ["And God said", "In the beginning", "Jesus wept.", "The LORD is my shepherd",
           "Blessed are the"]


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, t in header.items():
        if t["dtype"] != "F32":
            continue
        a, b = t["data_offsets"]
        tensors[name] = torch.from_numpy(np.frombuffer(data[a:b], dtype=np.float32).copy()).view(t["shape"])
    return tensors, meta


def load_model(ckpt):
    files = sorted(glob.glob(os.path.join(ckpt, "*.safetensors")))
    if len(files) != 1:
        sys.exit(f"{ckpt}: expected one safetensors file (a whole-model checkpoint), found {len(files)}")
    t, meta = load_safetensors(files[0])
    n_layer = len({k.split(".")[2] for k in t if k.startswith("transformer.h.")})
    vocab, d = t["transformer.wte.weight"].shape
    ctx = t["transformer.wpe.weight"].shape[0]
    nh = int(meta["model.n_head"])
    m = GPT(vocab, ctx, n_layer, nh, d)
    state = {k: v for k, v in t.items() if not k.startswith("optim.")}
    missing, unexpected = m.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith(".mask")]
    if missing or unexpected:
        sys.exit(f"checkpoint and model disagree: missing {missing}, unexpected {unexpected}")
    m.eval()
    return m, meta["data.vocab"], ctx, nh


@torch.no_grad()
def greedy(m, nh, ids, n):
    """Greedy decode of N tokens after IDS with a KV cache per layer (prefill, then one token
    at a time), nanoGPT's arithmetic."""
    tr = m.transformer
    cache = [None] * len(tr.h)
    out = []
    x_ids = torch.tensor([ids])
    pos0 = 0
    for _ in range(n):
        t = x_ids.shape[1]
        x = tr.wte(x_ids) + tr.wpe(torch.arange(pos0, pos0 + t))
        for li, blk in enumerate(tr.h):
            h = blk.ln_1(x)
            b, tt, c = h.shape
            q, k, v = blk.attn.c_attn(h).split(c, dim=2)
            q = q.view(b, tt, nh, c // nh).transpose(1, 2)
            k = k.view(b, tt, nh, c // nh).transpose(1, 2)
            v = v.view(b, tt, nh, c // nh).transpose(1, 2)
            if cache[li] is not None:
                k = torch.cat([cache[li][0], k], dim=2)
                v = torch.cat([cache[li][1], v], dim=2)
            cache[li] = (k, v)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            if tt > 1:  # the prompt: causal within it
                mask = torch.tril(torch.ones(tt, k.size(2)), diagonal=k.size(2) - tt)
                att = att.masked_fill(mask == 0, float("-inf"))
            y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).contiguous().view(b, tt, c)
            x = x + blk.attn.c_proj(y)
            x = x + blk.mlp(blk.ln_2(x))
        logits = m.lm_head(tr.ln_f(x[:, -1, :]))
        nxt = int(torch.argmax(logits, dim=-1))
        out.append(nxt)
        pos0 += t
        x_ids = torch.tensor([[nxt]])
    return out


def serve_tokens_per_s(cohort, ckpt, prompt, n, repeats):
    srv = subprocess.Popen([cohort, "serve", ckpt, "--bind", "127.0.0.1:0", "--threads", "1"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = srv.stdout.readline()
        port = int(re.search(r":(\d+)/v1/completions", line).group(1))
        body = json.dumps({"prompt": prompt, "max_tokens": n, "temperature": 0}).encode()
        rates = []
        for _ in range(repeats + 1):  # the first one warms the server up
            t0 = time.perf_counter()
            r = json.load(urllib.request.urlopen(urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/completions", data=body,
                headers={"Content-Type": "application/json"})))
            rates.append(r["usage"]["completion_tokens"] / (time.perf_counter() - t0))
        return statistics.median(rates[1:])
    finally:
        srv.terminate()
        srv.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--cohort", default="build/cohort")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    m, vocab, ctx, nh = load_model(a.checkpoint)
    equal = 0
    rows = []
    for p in PROMPTS:
        if any(ch not in vocab for ch in p) or len(p) + a.max_tokens > ctx:
            sys.exit(f"prompt {p!r}: a byte outside data.vocab, or longer than the context with the tokens")
        mine = "".join(vocab[i] for i in greedy(m, nh, [vocab.index(ch) for ch in p], a.max_tokens))
        theirs = subprocess.run([a.cohort, "generate", a.checkpoint, "--prompt", p, "--max-tokens",
                                 str(a.max_tokens), "--temperature", "0", "-q"],
                                capture_output=True, text=True, check=True).stdout
        theirs = theirs[:-1] if theirs.endswith("\n") else theirs
        same = 0
        while same < min(len(mine), len(theirs)) and mine[same] == theirs[same]:
            same += 1
        equal += mine == theirs
        rows.append({"prompt": p, "equal": mine == theirs, "first_difference": same})
    # Speed: one stream, the longest greedy request the context allows after the first prompt.
    n = ctx - len(PROMPTS[0])
    ids = [vocab.index(ch) for ch in PROMPTS[0]]
    rates = []
    for _ in range(a.repeats + 1):
        t0 = time.perf_counter()
        greedy(m, nh, ids, n)
        rates.append(n / (time.perf_counter() - t0))
    torch_rate = statistics.median(rates[1:])
    cohort_rate = serve_tokens_per_s(a.cohort, a.checkpoint, PROMPTS[0], n, a.repeats)
    result = {"prompts": rows, "equal": equal, "of": len(PROMPTS), "tokens": a.max_tokens,
              "stream_tokens": n, "torch_tokens_per_s": torch_rate,
              "cohort_serve_tokens_per_s": cohort_rate, "ratio": cohort_rate / torch_rate,
              "torch": torch.__version__}
    if a.json:
        print(json.dumps(result, indent=2))
    else:
        for r in rows:
            print(f"  {r['prompt']!r}: {'equal' if r['equal'] else 'differs at character %d' % r['first_difference']}")
        print(f"greedy tokens equal to cohort generate's: {equal} of {len(PROMPTS)} prompts, "
              f"{a.max_tokens} tokens each")
        print(f"one stream, {n} greedy tokens, one thread: PyTorch {torch.__version__} cached decode "
              f"{torch_rate:.0f} tokens/s, cohort serve {cohort_rate:.0f} tokens/s over HTTP: "
              f"{cohort_rate / torch_rate:.2f}x")
    return 0 if equal == len(PROMPTS) else 1


if __name__ == "__main__":
    sys.exit(main())
