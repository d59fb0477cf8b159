#!/usr/bin/python3
"""Open MPI's allreduce as a reference for `cohort bench allreduce` (tools/bench_shm_vs_mpi.sh):
float32 sums of each size, timed per call as the slowest rank's time (max over ranks),
median over calls, busbw by the nccl-tests definition (algbw * 2(n-1)/n).

Run with Debian's openmpi-bin and python3-mpi4py (COHORT_BENCH_DEPS=1 tools/setup.sh), e.g.
shared memory only, as root:
  mpirun --allow-run-as-root -n 2 --mca btl self,vader /usr/bin/python3 \
      tools/bench_mpi_allreduce.py --sizes 4K,1M,16M,64M [--json]
"""
import argparse
import json
import statistics
import time

import numpy as np
from mpi4py import MPI


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4K,1M,16M,64M", help="bytes per rank, K/M/G suffixes")
    ap.add_argument("--iters", type=int, default=0, help="timed calls per size (0: by size)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    rows = []
    for size in [parse_size(s) for s in a.sizes.split(",")]:
        count = max(1, size // 4)
        send = np.full(count, rank + 1, dtype=np.float32)
        recv = np.empty_like(send)
        iters = a.iters or max(10, min(300, (256 << 20) // max(size, 1)))
        for _ in range(a.warmup):
            comm.Allreduce(send, recv, op=MPI.SUM)
        if recv[0] != n * (n + 1) / 2:
            raise SystemExit(f"rank {rank}: wrong sum {recv[0]}")
        times = []
        for _ in range(iters):
            comm.Barrier()
            t0 = time.perf_counter()
            comm.Allreduce(send, recv, op=MPI.SUM)
            times.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
        t = statistics.median(times)
        algbw = count * 4 / t / 1e9
        rows.append({"bytes": count * 4, "iters": iters, "time_us": t * 1e6,
                     "algbw_gbps": algbw, "busbw_gbps": algbw * 2 * (n - 1) / n})
    if rank == 0:
        if a.json:
            print(json.dumps({"bench": "mpi allreduce", "ranks": n, "dtype": "float32",
                              "mpi": MPI.Get_library_version().splitlines()[0], "rows": rows}))
        else:
            print(f"Open MPI allreduce, {n} ranks, float32, median of the slowest rank per call")
            for r in rows:
                print(f"{r['bytes']:>12} B  {r['time_us']:10.1f} us  busbw {r['busbw_gbps']:.3f} GB/s")


if __name__ == "__main__":
    main()
