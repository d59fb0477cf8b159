#!/usr/bin/env bash
# Pipeline benchmark (docs/benchmarks.md, "Pipeline"): the KJV GPT of configs/kjv_gpt.yaml
# cut into P stages, M = 4P micro-batches a step, under gpipe and 1f1b. Prints per run the
# measured bubble fraction (1 - compute / makespan, averaged over stages) next to the
# theoretical (P-1)/(M+P-1) (equal stages) and to the simulation with the stages' own
# measured forward / backward times (train::simulate; what these unequal stages allow), and per stage the activation memory allocated for
# micro-batches in flight and the most held at once; then `cohort bench p2p` for the
# activation message size, whose ratio to the Gloo allreduce busbw is measured in that run.
#
#   tools/bench_pipeline.sh [--stages "2 4"] [--steps S] [--json DIR]
#
# On a machine with fewer cores than P workers the stages share cores, which stretches
# the measured bubble; compare P <= cores. Needs build/cohort (tools/setup.sh) and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
stages="2 4" steps=30 json=""
while (($#)); do
  case "$1" in
    --stages) stages=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    -h|--help) sed -n 2,12p "$0"; exit 0 ;;
    *) echo "bench_pipeline.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
bin=build/cohort
[[ -x $bin ]] || { echo "bench_pipeline.sh: $bin not found: run tools/setup.sh first" >&2; exit 2; }
dir=$(mktemp -d /tmp/cohort-pipe-XXXXXX)
trap 'rm -rf "$dir"' EXIT
[[ -n $json ]] && mkdir -p "$json"
printf "%-3s %-6s %3s %9s %8s %8s %9s %8s  %s\n" P sched M measured theory "meas/th" simulated "meas/sim" "per stage: activation MB allocated (held at most)"
for P in $stages; do
  M=$((4 * P))
  for sched in gpipe 1f1b; do
    out=$dir/p${P}_${sched}.json
    "$bin" launch configs/kjv_gpt.yaml -q --summary "$out" \
      --set cluster.workers="$P" --set parallel.pp="$P" --set parallel.schedule="$sched" \
      --set train.micro_batch=2 --set train.global_batch=$((2 * M)) --set train.steps="$steps" \
      --set train.warmup_steps=5 --set train.eval_every=0 --set train.eval_tokens=4096 \
      --set fault_tolerance.checkpoint_every=0 \
      --set fault_tolerance.checkpoint_dir="$dir/ckpt" > "$dir/log" 2>&1 ||
      { cat "$dir/log" >&2; exit 1; }
    [[ -n $json ]] && cp "$out" "$json/"
    python3 - "$out" "$P" "$sched" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["pipeline"]
per = ", ".join(f"s{s['stage']} {s['activation_bytes'] / 1e6:.1f} ({s['peak_held_micro_batches']})"
                for s in j["stages"])
m, t, s = j["bubble_fraction"], j["theoretical_bubble"], j.get("simulated_bubble", float("nan"))
print(f"{sys.argv[2]:<3} {sys.argv[3]:<6} {j['micro_batches']:>3} {m:>9.3f} {t:>8.3f} {m / t:>8.2f} {s:>9.3f} {m / s:>8.2f}  {per}")
PY
  done
done
# One activation of a micro-batch: 2 sequences x 128 positions x d_model 128 x 4 bytes.
"$bin" bench p2p --sizes 128KiB,1MiB,4MiB ${json:+--json "$json/p2p.json"}
