#!/usr/bin/env bash
# What tracing costs (docs/observability.md, "What it costs"): configs/quickstart.yaml (4
# workers, bitwise, no faults) for S steps, R times without --trace and R times with it,
# alternating so that both see the same machine. Per run: the median step time of the
# summary's curve (open to commit, the first 50 steps left out) and the wall time; then the
# medians over the runs and the ratio traced / plain, measured in the same invocation, with
# the CPU seconds all the run's processes used (GNU time: less noisy than wall time on a
# shared machine). The
# traced runs also give the clock alignment: every worker's offset estimate (on one host the
# true offset is 0, one CLOCK_MONOTONIC) and its bound (half the best probe's round trip).
#
#   tools/bench_trace.sh [--runs R] [--steps S]
#
# Needs build/cohort (tools/setup.sh) and python3. Run it on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=5 steps=1000
while (($#)); do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    -h|--help) sed -n 2,12p "$0"; exit 0 ;;
    *) echo "bench_trace.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "bench_trace.sh: --runs wants a whole number >= 1" >&2; exit 2; }
[[ "$steps" =~ ^[1-9][0-9]*$ ]] && ((steps > 100)) ||
  { echo "bench_trace.sh: --steps wants a whole number > 100" >&2; exit 2; }
bin=build/cohort
[[ -x $bin ]] || { echo "bench_trace.sh: $bin not found: run tools/setup.sh first" >&2; exit 2; }
dir=$(mktemp -d /tmp/cohort-trace-XXXXXX)
trap 'rm -rf "$dir"' EXIT

run_once() {  # MODE INDEX
  local out="$dir/$1-$2"
  mkdir -p "$out"
  local extra=()
  [[ $1 == traced ]] && extra=(--trace "$out/trace.json")
  # GNU time's user + system seconds: the CPU of launch and every process it started.
  /usr/bin/time -f "%U %S" -o "$out/cpu.txt" \
    "$bin" launch configs/quickstart.yaml -q --summary "$out/summary.json" "${extra[@]}" \
    --set train.steps="$steps" --set 'faults=[]' --set train.eval_every=0 \
    --set fault_tolerance.checkpoint_dir="$out/ckpt" >"$out/out.txt" 2>&1 ||
    { echo "bench_trace.sh: $1 run $2 failed:" >&2; tail -5 "$out/out.txt" >&2; exit 1; }
}

echo "bench_trace: quickstart, $steps steps, $runs runs each way, alternating"
for ((i = 0; i < runs; ++i)); do
  run_once plain "$i"
  run_once traced "$i"
done
"$bin" bench trace --json > "$dir/per_span.json"
python3 - "$dir" "$runs" "$steps" <<'EOF'
import json, os, statistics, sys
d, runs, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def figures(mode, i):
    s = json.load(open(os.path.join(d, f"{mode}-{i}", "summary.json")))
    steps = [p["step_s"] for p in s["curve"][50:]]
    u, sy = open(os.path.join(d, f"{mode}-{i}", "cpu.txt")).read().split()[-2:]
    return statistics.median(steps), s["wall_s"], float(u) + float(sy)
rows = {m: [figures(m, i) for i in range(runs)] for m in ("plain", "traced")}
med = {m: [statistics.median(r[k] for r in rows[m]) for k in range(3)] for m in rows}
print(f"{'mode':8s} {'step ms':>9s} {'wall s':>8s} {'cpu s':>7s}   step ms / cpu s of each run")
for m in ("plain", "traced"):
    each = " ".join(f"{1e3 * r[0]:.2f}/{r[2]:.1f}" for r in rows[m])
    print(f"{m:8s} {1e3 * med[m][0]:9.3f} {med[m][1]:8.2f} {med[m][2]:7.2f}   {each}")
print(f"traced / plain (medians): step {med['traced'][0] / med['plain'][0]:.4f}, "
      f"wall {med['traced'][1] / med['plain'][1]:.4f}, cpu {med['traced'][2] / med['plain'][2]:.4f}")
errs, offs = [], []
for i in range(runs):
    t = json.load(open(os.path.join(d, f"traced-{i}", "trace.json")))
    clocks = t["otherData"]["worker_clocks"]
    errs += [c["error_ns"] / 1e3 for c in clocks.values()]
    o = [c["offset_ns"] / 1e3 for c in clocks.values()]
    offs.append(max(o) - min(o))
# The cost the run-to-run spread hides: spans recorded per step (per worker, and in all),
# times what one span costs on each leg (cohort bench trace), against the step's time and
# the CPU the plain runs used per step.
per = json.load(open(os.path.join(d, "per_span.json")))
t = json.load(open(os.path.join(d, "traced-0", "trace.json")))
ev = [e for e in t["traceEvents"] if e["ph"] != "M"]
workers = {e["pid"] for e in ev if e["pid"] != 0}
worker_spans = sum(1 for e in ev if e["pid"] != 0) / steps
all_spans = len(ev) / steps
step_ns = med["plain"][0] * 1e9
cpu_ns = med["plain"][2] / steps * 1e9
on_path = worker_spans / len(workers) * per["record_ns"]
total = worker_spans * (per["record_ns"] + per["telemetry_ns"]) + all_spans * per["write_ns"]
print(f"per span: record {per['record_ns']:.0f} ns, telemetry {per['telemetry_ns']:.0f} ns, "
      f"trace file {per['write_ns']:.0f} ns; {worker_spans / len(workers):.1f} spans per worker "
      f"per step, {all_spans:.1f} in all")
print(f"tracing's cost: {on_path / 1e3:.2f} us of a worker's step ({100 * on_path / step_ns:.3f}% "
      f"of {step_ns / 1e6:.2f} ms); {total / 1e3:.1f} us of CPU per step over every process "
      f"({100 * total / cpu_ns:.3f}% of the {cpu_ns / 1e6:.1f} ms the plain runs used)")
print(f"clock alignment over {runs} traced runs: offset estimates (true 0) differ between "
      f"workers by at most {max(offs):.1f} us (median {statistics.median(offs):.1f} us); "
      f"error bounds {min(errs):.1f}-{max(errs):.1f} us")
EOF
