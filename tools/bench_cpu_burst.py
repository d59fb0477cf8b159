#!/usr/bin/env python3
"""Takes N bursts of C seconds of CPU (process time, not wall time), one every P seconds.

The control for `cohort bench faults` on a small machine: run it beside a fault-free job
to see what the CPU that N replacement workers take (their start and job load) costs the
job's wall clock without any fault (docs/benchmarks.md, "Where the wall clock's last 5%
goes").  Usage: tools/bench_cpu_burst.py N C P
"""
import sys
import time

if len(sys.argv) != 4:
    sys.exit(__doc__)
n, cpu, period = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
time.sleep(period / 2)
for _ in range(n):
    t0 = time.process_time()
    while time.process_time() - t0 < cpu:
        pass
    time.sleep(period)
