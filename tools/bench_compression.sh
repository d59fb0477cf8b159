#!/usr/bin/env bash
# Compressed communication across slow links (docs/benchmarks.md, "Compressed
# communication"): a bed of emulated hosts (tools/netns.sh), the coordinator on host 1
# and four workers on hosts 2-5 (one each; --per-host 2: two on each of hosts 2 and 3,
# registered blocked, ranks 0, 1 | 2, 3), every worker host's link shaped (default 100mbit
# and 5ms each way). The Fashion-MNIST MLP data-parallel (configs/fashion_mlp_dp4.yaml,
# fast mode) runs once per mode and per comm.hierarchy of --hierarchies (default auto):
#   adamw   plain float sums (the reference)
#   onebit  train.optimizer: onebit_adam (train.onebit.freeze_step: --freeze)
#   fp8     comm.compression: fp8 with error feedback
#   bf16    comm.compression: bf16
# and prints per mode: wall time, final accuracy, bytes sent per step (before and after
# 1-bit Adam's freeze), and the seconds from the coordinator's start to the first held-out
# evaluation at or above --target accuracy (evaluations every --eval-every steps, timed as
# the rank-0 worker prints them), the median step time of the run's second half, with each
# run's ratio to the first adamw run.
#
#   tools/bench_compression.sh [--steps S] [--eval-every E] [--freeze F] [--target A]
#                              [--rate RATE] [--delay D] [--modes "adamw onebit fp8"]
#                              [--per-host 1|2] [--hierarchies "flat hierarchical"]
#                              [--set KEY=VALUE]...
#
# Needs root, build/cohort (tools/setup.sh) and python3. --delay needs the kernel's netem
# (tools/netns.sh says when it is missing); --delay "" shapes the rate alone.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=1407 eval_every=67 freeze=200 target=0.88 rate=100mbit delay=5ms modes="adamw onebit fp8"
per_host=1 hierarchies=auto
extra=()
while (($#)); do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --eval-every) eval_every=$2; shift 2 ;;
    --freeze) freeze=$2; shift 2 ;;
    --target) target=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --per-host) per_host=$2; shift 2 ;;
    --hierarchies) hierarchies=$2; shift 2 ;;
    --set) extra+=(--set "$2"); shift 2 ;;
    -h|--help) sed -n 2,24p "$0"; exit 0 ;;
    *) echo "bench_compression.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
me=bench_compression.sh
[[ $per_host == 1 || $per_host == 2 ]] ||
  { echo "$me: --per-host must be 1 or 2 (four workers in all), not '$per_host'" >&2; exit 2; }
worker_hosts=($(seq 2 $((1 + 4 / per_host))))
. tools/bench_bed.sh
bed_require
bed_up bc compression $((1 + ${#worker_hosts[@]})) "$rate" "$delay" "${worker_hosts[@]}"

# Prefixes each line of standard input with the wall clock (seconds since the epoch).
stamp() { while IFS= read -r line; do printf '%s %s\n' "$(date +%s.%N)" "$line"; done; }

# One run of MODE with comm.hierarchy HIERARCHY; prints one JSON line with its figures.
run_once() {
  local mode=$1 hierarchy=$2 run="$dir/$1-$2"
  mkdir -p "$run"
  local sets=(--set comm.hierarchy="$hierarchy")
  case $mode in
    adamw) ;;
    onebit) sets+=(--set train.optimizer=onebit_adam --set train.onebit.freeze_step="$freeze") ;;
    fp8) sets+=(--set comm.compression=fp8 --set comm.error_feedback=true) ;;
    bf16) sets+=(--set comm.compression=bf16) ;;
    *) echo "bench_compression.sh: unknown mode '$mode' (adamw, onebit, fp8, bf16)" >&2; return 2 ;;
  esac
  "$bin" keygen "$run/keys" >/dev/null
  local t0
  t0=$(date +%s.%N)
  (cd "$run" && on 1 "$bin" coordinator --config "$OLDPWD/configs/fashion_mlp_dp4.yaml" -q \
     --bind tcp://10.77.0.1:0 --keys "$run/keys" --summary "$run/summary.json" \
     --set cluster.workers=4 --set train.steps="$steps" --set train.determinism=fast \
     --set train.eval_every="$eval_every" --set fault_tolerance.checkpoint_every=0 \
     --set fault_tolerance.checkpoint_dir="$run/ckpt" "${sets[@]}" "${extra[@]}" \
     >"$run/coord.out" 2>"$run/coord.err") &
  local coord=$!
  local ep
  ep=$(coordinator_endpoint "$run") || return 1
  local pids=()
  local h i
  for h in "${worker_hosts[@]}"; do
    for ((i = 0; i < per_host; i++)); do
      # The worker that joins first is rank 0: it evaluates and prints the accuracy. One
      # after the other, so the ranks follow the hosts (blocked).
      on "$h" "$bin" worker --join "$ep" --keys "$run/keys" --name "w-h$h-$i" \
        > "$run/w$h-$i.out" 2> >(stamp > "$run/w$h-$i.err") &
      pids+=($!)
      wait_rank "$run/w$h-$i.err" "$run/w$h-$i.out"
    done
  done
  local rc=0
  wait "$coord" || rc=$?
  for p in "${pids[@]}"; do wait "$p" || true; done
  sleep 0.2  # the stamping readers finish their last lines
  if ((rc != 0)) || [[ ! -s $run/summary.json ]]; then
    echo "bench_compression.sh: $mode/$hierarchy run failed (exit $rc)" >&2
    tail -5 "$run/coord.err" >&2
    return 1
  fi
  python3 - "$mode/$hierarchy" "$t0" "$target" "$run" <<'EOF'
import glob, json, re, statistics, sys
mode, t0, target, run = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
s = json.load(open(run + "/summary.json"))
reached = None
evals = []
for path in glob.glob(run + "/w*.err"):
    for line in open(path):
        m = re.match(r"(\S+) eval at step (\d+): loss (\S+), accuracy (\S+)", line)
        if m:
            evals.append((float(m.group(1)) - t0, int(m.group(2)), float(m.group(4))))
evals.sort()
for t, step, acc in evals:
    if acc >= target:
        reached = (t, step)
        break
c = s.get("communication", {})
late = [c["step_s"] for c in s["curve"][len(s["curve"]) // 2:]]
print(json.dumps({"mode": mode, "wall_s": s["wall_s"], "accuracy": s["eval"]["accuracy"],
                  "step_ms": 1000 * statistics.median(late) if late else None,
                  "samples_per_s": s["throughput"]["samples_per_s"],
                  "bytes_per_step": c.get("bytes_sent_per_step"),
                  "uncompressed_bytes_per_step": c.get("uncompressed_bytes_per_step"),
                  "compressed_bytes_per_step": c.get("compressed_bytes_per_step"),
                  "reach_s": reached[0] if reached else None,
                  "reach_step": reached[1] if reached else None}))
EOF
}

echo "bench_compression: ${#worker_hosts[@]} hosts x $per_host worker(s), links ${shape[*]}," \
     "MLP fast, $steps steps, eval every $eval_every, target accuracy $target"
results=()
for mode in $modes; do
  for hierarchy in $hierarchies; do
    line=$(run_once "$mode" "$hierarchy")
    echo "$line"
    results+=("$line")
  done
done
python3 - "${results[@]}" <<'EOF'
import json, sys
rows = [json.loads(a) for a in sys.argv[1:]]
ref = next((r for r in rows if r["mode"].startswith("adamw/")), None)
print(f"{'mode':22s} {'wall s':>8s} {'acc':>7s} {'B/step':>10s} {'step ms':>8s} {'reach s':>8s} "
      f"{'step':>6s} {'bytes fewer':>11s} {'reach faster':>12s}")
for r in rows:
    fewer = faster = ""
    if ref:
        mine = r["compressed_bytes_per_step"] or r["bytes_per_step"]
        if mine:
            fewer = f"{ref['bytes_per_step'] / mine:.1f}x"
        if r["reach_s"] and ref["reach_s"]:
            faster = f"{ref['reach_s'] / r['reach_s']:.2f}x"
    reach = f"{r['reach_s']:.1f}" if r["reach_s"] else "never"
    step = str(r["reach_step"]) if r["reach_step"] else "-"
    bps = r["compressed_bytes_per_step"] or r["bytes_per_step"]
    ms = f"{r['step_ms']:.1f}" if r["step_ms"] else "-"
    print(f"{r['mode']:22s} {r['wall_s']:8.1f} {r['accuracy']:7.4f} {bps:10.0f} {ms:>8s} "
          f"{reach:>8s} {step:>6s} {fewer:>11s} {faster:>12s}")
EOF
