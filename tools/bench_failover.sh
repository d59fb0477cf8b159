#!/usr/bin/env bash
# Coordinator failover (docs/benchmarks.md, "Coordinator failover"): configs/quickstart_ha.yaml
# (bitwise, a leader and 2 standbys, etcd started by launch) with the leader SIGKILLed K
# times in one run (`kill coordinator at step=N`, evenly spaced), once with the etcd tuned
# for one machine (ha.etcd_heartbeat_ms 10, ha.etcd_election_ms 100: the config's) and once
# with etcd's own defaults (100, 1000). Prints each failover's time from the old leader's
# end (its fired record, written just before its SIGKILL) to the new leader's first
# committed step, their median, and whether the run ended on `cohort train`'s hash.
#
#   tools/bench_failover.sh [--kills K] [--steps S] [--modes "tuned defaults"] [--json DIR]
#
# Needs build/cohort (tools/setup.sh), etcd-server and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
kills=10 steps=4690 modes="tuned defaults" json=""
while (($#)); do
  case "$1" in
    --kills) kills=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    -h|--help) sed -n 2,12p "$0"; exit 0 ;;
    *) echo "bench_failover.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$kills" =~ ^[1-9][0-9]*$ && "$steps" =~ ^[1-9][0-9]*$ ]] ||
  { echo "bench_failover.sh: --kills and --steps want whole numbers >= 1" >&2; exit 2; }
((steps > kills + 1)) || { echo "bench_failover.sh: --steps must exceed --kills + 1" >&2; exit 2; }
bin=build/cohort
[[ -x $bin ]] || { echo "bench_failover.sh: $bin not found: run tools/setup.sh first" >&2; exit 2; }
dir=$(mktemp -d /tmp/cohort-failover-XXXXXX)
trap 'rm -rf "$dir"' EXIT
[[ -n $json ]] && mkdir -p "$json"
common=(--set train.steps="$steps" --set fault_tolerance.checkpoint_dir="$dir/ckpt")
"$bin" train configs/quickstart_ha.yaml -q "${common[@]}" --summary "$dir/ref.json" >/dev/null 2>&1
inject=()
for ((i = 1; i <= kills; i++)); do
  inject+=(--inject "kill coordinator at step=$((i * steps / (kills + 1)))")
done
for mode in $modes; do
  case $mode in
    tuned) set_mode=() ;;
    defaults) set_mode=(--set ha.etcd_heartbeat_ms=100 --set ha.etcd_election_ms=1000) ;;
    *) echo "bench_failover.sh: unknown mode '$mode' (tuned, defaults)" >&2; exit 2 ;;
  esac
  out=$dir/$mode.json
  start=$(date +%s.%N)
  "$bin" launch configs/quickstart_ha.yaml -q --insecure "${common[@]}" "${set_mode[@]}" \
    "${inject[@]}" --summary "$out" >"$dir/$mode.log" 2>&1 || { tail -40 "$dir/$mode.log" >&2; exit 1; }
  wall=$(python3 -c "import time,sys; print(f'{time.time()-float(sys.argv[1]):.1f}')" "$start")
  [[ -n $json ]] && cp "$out" "$json/failover_$mode.json"
  python3 - "$out" "$dir/ref.json" "$mode" "$wall" <<'PY'
import json, statistics, sys
j, ref = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
ms = sorted(j["coordinator"]["failover_recover_ms"])
same = j["params_sha256"] == ref["params_sha256"]
print(f"{sys.argv[3]:<9} failovers {len(ms):2d}  median {statistics.median(ms):7.0f} ms  "
      f"min {ms[0]:6.0f}  max {ms[-1]:6.0f}  wall {sys.argv[4]} s  "
      f"hash {'= cohort train' if same else 'DIFFERS'}  accuracy {j['eval']['accuracy']:.4f}")
print("          each (ms):", " ".join(f"{x:.0f}" for x in ms))
sys.exit(0 if same else 1)
PY
done
