#!/usr/bin/env bash
# What CurveZMQ costs training (docs/benchmarks.md, "CURVE"): `cohort launch` of each config
# with the job's keys (the default) and with --insecure (plain ZeroMQ), alternating, ROUNDS
# times. A data-parallel job's control plane carries heartbeats and votes only; a pipeline
# job's p2p channels carry every activation and gradient between stages, encrypted. Prints
# each run's throughput and, per config, the median ratio keys / insecure (target >= 0.97).
#
#   tools/bench_curve.sh [--rounds R] [--steps S] [--configs "A.yaml B.yaml"] [--set K=V]...
#
# Needs build/cohort (tools/setup.sh) and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=3 steps=300 configs="configs/fashion_mlp_dp4.yaml configs/kjv_gpt_pp2.yaml"
extra=()
while (($#)); do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --configs) configs=$2; shift 2 ;;
    --set) extra+=(--set "$2"); shift 2 ;;
    -h|--help) sed -n 2,10p "$0"; exit 0 ;;
    *) echo "bench_curve.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
bin=$PWD/build/cohort
[[ -x $bin ]] || { echo "bench_curve.sh: $bin not found: run tools/setup.sh first" >&2; exit 2; }
dir=$(mktemp -d /tmp/cohort-curve-XXXXXX)
trap 'rm -rf "$dir"' EXIT
common=(--set train.steps="$steps" --set train.warmup_steps=0 --set train.eval_every=0
        --set fault_tolerance.checkpoint_every=0 --set fault_tolerance.checkpoint_dir="$dir/ckpt"
        "${extra[@]}")

# Prints the summary's throughput (samples/s, or tokens/s for a language model).
rate() {
  python3 -c 'import json,sys; t=json.load(open(sys.argv[1]))["throughput"]; print(t.get("tokens_per_s") or t["samples_per_s"])' "$1"
}

echo "bench_curve: $steps steps, $rounds rounds, keys vs --insecure, alternating"
results="$dir/results"
: >"$results"
for ((r = 1; r <= rounds; r++)); do
  for cfg in $configs; do
    # Odd rounds run keys first, even rounds insecure first: a drift in the machine's load
    # (a neighbour, a build) then does not always hit the same side.
    modes="keys insecure"
    ((r % 2 == 0)) && modes="insecure keys"
    for mode in $modes; do
      flag=()
      [[ $mode == insecure ]] && flag=(--insecure)
      "$bin" launch "$cfg" -q "${common[@]}" "${flag[@]}" --summary "$dir/s.json" \
        >"$dir/out" 2>"$dir/err" || { tail -5 "$dir/err" >&2; exit 1; }
      v=$(rate "$dir/s.json")
      printf 'round %d  %-32s %-9s %10.0f /s\n' "$r" "$cfg" "$mode" "$v"
      echo "$cfg $mode $r $v" >>"$results"
    done
  done
done
python3 - "$results" <<'PY'
import sys, statistics
rows = [l.split() for l in open(sys.argv[1])]
for cfg in dict.fromkeys(r[0] for r in rows):
    by = {}
    for c, mode, rnd, v in rows:
        if c == cfg:
            by.setdefault(rnd, {})[mode] = float(v)
    ratios = [d["keys"] / d["insecure"] for d in by.values() if "keys" in d and "insecure" in d]
    print(f"{cfg}: keys / insecure per round {', '.join(f'{x:.3f}' for x in ratios)}; "
          f"median {statistics.median(ratios):.3f} (target >= 0.97)")
PY
