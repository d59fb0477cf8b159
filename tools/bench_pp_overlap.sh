#!/usr/bin/env bash
# Pipeline DP overlap (docs/benchmarks.md, "Pipeline DP overlap"): configs/kjv_gpt_pp2.yaml
# (dp 2 x pp 2, four workers) for S steps at each bucket size, and once with one bucket per
# stage (bucket_mb 64: the whole DP sum after the stage's last backward, nothing hidden; the
# reference of the same run). Prints per run the overlap of each stage (averaged over its
# replicas: the share of DP collective time inside the stage's backward window), the DP
# collective and the comm-wait time per step, the step time, and its ratio to the reference.
#
#   tools/bench_pp_overlap.sh [--buckets "0.125 0.25 0.5"] [--steps S] [--json DIR]
#
# Needs build/cohort (tools/setup.sh) and python3. Four workers on a 2-core machine share
# cores: run it on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
buckets="0.125 0.25 0.5" steps=40 json=""
while (($#)); do
  case "$1" in
    --buckets) buckets=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    -h|--help) sed -n 2,12p "$0"; exit 0 ;;
    *) echo "bench_pp_overlap.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || { echo "bench_pp_overlap.sh: --steps wants a whole number >= 1" >&2; exit 2; }
bin=build/cohort
[[ -x $bin ]] || { echo "bench_pp_overlap.sh: $bin not found: run tools/setup.sh first" >&2; exit 2; }
dir=$(mktemp -d /tmp/cohort-ppov-XXXXXX)
trap 'rm -rf "$dir"' EXIT
[[ -n $json ]] && mkdir -p "$json"
run() {  # bucket_mb -> summary path
  local out=$dir/b$1.json
  "$bin" launch configs/kjv_gpt_pp2.yaml -q --summary "$out" --set comm.bucket_mb="$1" \
    --set train.steps="$steps" --set train.warmup_steps=5 --set train.eval_every=0 \
    --set fault_tolerance.checkpoint_every=0 --set fault_tolerance.checkpoint_dir="$dir/ckpt" \
    >"$dir/b$1.log" 2>&1 || { cat "$dir/b$1.log" >&2; exit 1; }
  [[ -n $json ]] && cp "$out" "$json/bucket_$1.json"
  echo "$out"
}
ref=$(run 64)
printf "%-9s %9s %9s %14s %13s %10s %9s\n" bucket_mb "overlap0" "overlap1" "allreduce ms" "comm wait ms" "step ms" "vs 1 bucket"
for b in 64 $buckets; do
  out=$ref
  [[ $b != 64 ]] && out=$(run "$b")
  python3 - "$out" "$ref" "$b" "$steps" <<'PY'
import json, sys
j, r = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
b, steps = sys.argv[3], int(sys.argv[4])
def step_ms(x):  # wall time of the committed steps, from the coordinator's throughput
    tps = x["throughput"]["tokens_per_s"]
    return 1e3 * 16 * 128 / tps
ov = {0: [], 1: []}
for w in j["workers"]:
    ov[w["stage"]].append(w["overlap"])
ar = sum(w["allreduce_s"] for w in j["workers"]) / len(j["workers"]) / steps * 1e3
cw = sum(w["comm_wait_s"] for w in j["workers"]) / len(j["workers"]) / steps * 1e3
avg = lambda v: sum(v) / len(v)
label = b + (" (ref)" if b == "64" else "")
print(f"{label:<9} {avg(ov[0]):9.2f} {avg(ov[1]):9.2f} {ar:14.1f} {cw:13.1f} {step_ms(j):10.1f} {step_ms(j)/step_ms(r):9.2f}")
PY
done
