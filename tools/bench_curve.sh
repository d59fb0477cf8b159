#!/usr/bin/env bash
# What the job's keys cost training (docs/benchmarks.md, "What CurveZMQ costs"): `cohort
# launch` of each config in each mode, alternating, ROUNDS times: insecure (--insecure, plain
# ZeroMQ), authenticate (the job's keys, the default: CurveZMQ on the control plane, p2p
# channels authenticated once per connection) and encrypt (keys and comm.p2p_security:
# encrypt, CurveZMQ on every activation and gradient between stages). A data-parallel job's
# control plane carries heartbeats and votes only (its two keyed modes are the same job); a
# pipeline job's p2p channels carry every activation and gradient. Prints each run's
# throughput and, per config and keyed mode, the median ratio to insecure (target >= 0.97).
#
#   tools/bench_curve.sh [--rounds R] [--steps S] [--configs "A.yaml B.yaml"]
#                        [--modes "insecure authenticate encrypt"] [--set K=V]...
#
# Needs build/cohort (tools/setup.sh) and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=3 steps=300 configs="configs/fashion_mlp_dp4.yaml configs/kjv_gpt_pp2.yaml"
modes="insecure authenticate encrypt"
extra=()
while (($#)); do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --configs) configs=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --set) extra+=(--set "$2"); shift 2 ;;
    -h|--help) sed -n 2,14p "$0"; exit 0 ;;
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

for m in $modes; do
  [[ $m == insecure || $m == authenticate || $m == encrypt ]] ||
    { echo "bench_curve.sh: --modes: '$m' is not insecure, authenticate or encrypt" >&2; exit 2; }
done
[[ " $modes " == *" insecure "* ]] || { echo "bench_curve.sh: --modes must include insecure (the reference)" >&2; exit 2; }
echo "bench_curve: $steps steps, $rounds rounds, modes $modes, alternating"
results="$dir/results"
: >"$results"
for ((r = 1; r <= rounds; r++)); do
  for cfg in $configs; do
    # Odd rounds run the modes in the order given, even rounds reversed: a drift in the
    # machine's load (a neighbour, a build) then does not always hit the same side.
    order=$modes
    ((r % 2 == 0)) && order=$(echo "$modes" | tr ' ' '\n' | tac | tr '\n' ' ')
    for mode in $order; do
      flag=()
      [[ $mode == insecure ]] && flag=(--insecure)
      [[ $mode == encrypt ]] && flag=(--set comm.p2p_security=encrypt)
      "$bin" launch "$cfg" -q "${common[@]}" "${flag[@]}" --summary "$dir/s.json" \
        >"$dir/out" 2>"$dir/err" || { tail -5 "$dir/err" >&2; exit 1; }
      v=$(rate "$dir/s.json")
      printf 'round %d  %-32s %-12s %10.0f /s\n' "$r" "$cfg" "$mode" "$v"
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
    keyed = [m for m in dict.fromkeys(r[1] for r in rows) if m != "insecure"]
    for mode in keyed:
        ratios = [d[mode] / d["insecure"] for d in by.values() if mode in d and "insecure" in d]
        print(f"{cfg}: {mode} / insecure per round {', '.join(f'{x:.3f}' for x in ratios)}; "
              f"median {statistics.median(ratios):.3f} (target >= 0.97)")
PY
