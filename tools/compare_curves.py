#!/usr/bin/env python3
"""Compares the loss curves of two `cohort train --summary` files (their "curve": one point a
step). tools/gpu_check.sh uses it for the device runs against the CPU run; it only reads the
files, it runs nothing.

  compare_curves.py close RUN REF --rtol R   last-step loss of RUN within R of REF's (relative);
                                             RUN may hold REF's last steps only (a resumed run)
  compare_curves.py same A B                 are the two curves bit-identical?

Prints one line of figures. Exit: 0 yes, 1 no, 2 a file is missing or not a summary.
"""
import argparse
import json
import math
import sys


def fail(msg):
    print(f"compare_curves: {msg}", file=sys.stderr)
    sys.exit(2)


def curve(path):
    try:
        with open(path) as f:
            points = json.load(f)["curve"]
        losses = [(int(p["step"]), float(p["loss"])) for p in points]
    except (OSError, ValueError, KeyError, TypeError) as e:
        fail(f"{path}: not a cohort train --summary file ({e})")
    if not losses:
        fail(f"{path}: the curve is empty (the run did no step)")
    return losses


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def close(run_path, ref_path, rtol):
    run, ref = curve(run_path), curve(ref_path)
    # A resumed run's curve starts where it resumed: compare on the steps it has, which must
    # be the reference's last ones.
    ref_steps = [s for s, _ in ref]
    if [s for s, _ in run] != ref_steps[len(ref_steps) - len(run):]:
        print(f"steps differ: {len(run)} points (last {run[-1][0]}) against {len(ref)} "
              f"(last {ref[-1][0]})")
        return 1
    ref = ref[len(ref) - len(run):]
    (step, a), (_, b) = run[-1], ref[-1]
    worst = max(range(len(run)), key=lambda i: rel(run[i][1], ref[i][1]))
    d = rel(a, b)
    ok = math.isfinite(a) and d <= rtol
    print(f"loss at step {step} {a:.6f} vs {b:.6f}: rel diff {d:.2e} "
          f"({'within' if ok else 'OUTSIDE'} {rtol:g}); largest on the curve "
          f"{rel(run[worst][1], ref[worst][1]):.2e} at step {run[worst][0]}")
    return 0 if ok else 1


def same(a_path, b_path):
    a, b = curve(a_path), curve(b_path)
    for (sa, la), (sb, lb) in zip(a, b):
        if sa != sb or la != lb:
            print(f"not bit-identical: first difference at step {sa}: {la!r} vs {lb!r} "
                  f"(rel {rel(la, lb):.2e}); at the last step {rel(a[-1][1], b[-1][1]):.2e}")
            return 1
    if len(a) != len(b):
        print(f"not bit-identical: {len(a)} points against {len(b)}")
        return 1
    print(f"bit-identical over {len(a)} steps (last loss {a[-1][1]!r})")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    c = sub.add_parser("close", help="last-step loss within a relative tolerance")
    c.add_argument("run")
    c.add_argument("ref")
    c.add_argument("--rtol", type=float, required=True)
    s = sub.add_parser("same", help="bit-identical curves")
    s.add_argument("a")
    s.add_argument("b")
    a = p.parse_args()
    return close(a.run, a.ref, a.rtol) if a.what == "close" else same(a.a, a.b)


if __name__ == "__main__":
    sys.exit(main())
