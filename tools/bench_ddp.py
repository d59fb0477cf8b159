#!/usr/bin/python3
"""PyTorch DDP reference for tools/bench_one_host.sh: the Fashion-MNIST MLP of
configs/fashion_mlp_dp4.yaml (784-256-128-10, AdamW lr 1e-3, weight decay 1e-4, global batch
128 split evenly over the ranks), data-parallel over Gloo, one compute thread per process.

Run under torchrun with the system python (python3-torch; --redirects 1 --tee 1 because
Debian's torch 1.13 on Python 3.11 cannot parse the default 0):
  /usr/bin/python3 -m torch.distributed.run --standalone --redirects 1 --tee 1 \
      --nproc_per_node N \
      tools/bench_ddp.py [--steps S] [--global-batch B] [--data DIR] [--json]
Rank 0 prints samples/s over the training loop (from a barrier before the first step to one
after the last), the same span cohort's summary measures (first step opened to last commit).
"""
import argparse
import gzip
import json
import os
import struct
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_vs_torch import MLP  # noqa: E402  (the same model as `cohort bench train`'s)


def load_images(path):
    with gzip.open(path, "rb") as f:
        magic, n, rows, cols = struct.unpack(">IIII", f.read(16))
        if magic != 2051:
            raise SystemExit(f"{path}: not an IDX image file (magic {magic})")
        raw = f.read(n * rows * cols)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(n, rows * cols)


def load_labels(path):
    with gzip.open(path, "rb") as f:
        magic, n = struct.unpack(">II", f.read(8))
        if magic != 2049:
            raise SystemExit(f"{path}: not an IDX label file (magic {magic})")
        raw = f.read(n)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--global-batch", type=int, default=128)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if a.global_batch % world:
        raise SystemExit(f"--global-batch {a.global_batch} does not split over {world} ranks")
    per_rank = a.global_batch // world
    images = load_images(os.path.join(a.data, "train-images-idx3-ubyte.gz")).float() / 255.0
    labels = load_labels(os.path.join(a.data, "train-labels-idx1-ubyte.gz"))

    torch.manual_seed(1)  # the same initial parameters on every rank (DDP broadcasts rank 0's)
    model = DDP(MLP())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    n = images.shape[0]
    order = torch.randperm(n, generator=torch.Generator().manual_seed(1))

    dist.barrier()
    t0 = time.perf_counter()
    for step in range(a.steps):
        at = (step * a.global_batch + rank * per_rank) % (n - per_rank)
        idx = order[at:at + per_rank]
        opt.zero_grad(set_to_none=False)
        loss = model(images[idx], labels[idx])  # MLP.forward returns the cross-entropy
        loss.backward()
        opt.step()
    dist.barrier()
    secs = time.perf_counter() - t0
    if rank == 0:
        res = {"impl": "torch ddp gloo", "torch": torch.__version__, "world": world,
               "steps": a.steps, "global_batch": a.global_batch, "seconds": secs,
               "samples_per_s": a.global_batch * a.steps / secs, "last_loss": loss.item()}
        print(json.dumps(res) if a.json else
              f"torch DDP/Gloo, {world} ranks: {res['samples_per_s']:.0f} samples/s "
              f"({a.steps} steps in {secs:.2f} s, last loss {res['last_loss']:.4f})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
