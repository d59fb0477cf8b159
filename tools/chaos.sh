#!/usr/bin/env bash
# Soak test for failure recovery: trains a small bitwise-deterministic job once without
# faults (`cohort train`, the reference) and then again with `cohort launch` on N workers
# while random kills hit it, and checks that the final parameter hash is the same.
#
#   tools/chaos.sh [--workers N] [--steps S] [--mtbf M] [--seed X] [--rounds R] [--duration T]
#
# Each round uses seed X+round, so R rounds replay R different fault schedules; with
# --duration T (seconds) rounds go on until T has passed (at least one). Prints the
# kills, their detection and recovery times, and PASS / FAIL per round; exits 1 on any
# FAIL. Needs build/cohort (tools/setup.sh) and python3 for the summary arithmetic.
set -euo pipefail
cd "$(dirname "$0")/.."
workers=4 steps=600 mtbf=40 seed=1 rounds=1 duration=0
while (($#)); do
  case "$1" in
    --workers) workers=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --mtbf) mtbf=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --duration) duration=$2; rounds=1000000; shift 2 ;;
    -h|--help) sed -n 2,12p "$0"; exit 0 ;;
    *) echo "chaos.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
bin=build/cohort
[[ -x $bin ]] || { echo "chaos.sh: $bin not found: run tools/setup.sh first" >&2; exit 2; }
dir=$(mktemp -d /tmp/cohort-chaos-XXXXXX)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/cfg.yaml" <<YAML
# A small MLP on Fashion-MNIST, bitwise deterministic: any worker count, any failure
# history must end on the same parameters.
model:
  kind: mlp
  hidden: [64]
train:
  steps: $steps
  global_batch: 64
  micro_batch: 8
  lr: 0.01
  warmup_steps: 0
  determinism: bitwise
  eval_every: 0
fault_tolerance:
  heartbeat_ms: 100
  timeout_ms: 500
  checkpoint_every: 0
  checkpoint_dir: $dir/ckpt
YAML
"$bin" train "$dir/cfg.yaml" -q --summary "$dir/ref.json" > /dev/null 2>&1
fail=0
start=$SECONDS
for ((r = 0; r < rounds; r++)); do
  if ((duration > 0 && r > 0 && SECONDS - start >= duration)); then break; fi
  s=$((seed + r))
  spec="random kill mtbf=${mtbf}steps seed=$s"
  ((duration > 0)) && total="${duration}s" || total=$rounds
  echo "chaos: round $((r + 1))/$total: $workers workers, $steps steps, '$spec'"
  if ! "$bin" launch "$dir/cfg.yaml" -q --set cluster.workers="$workers" \
      --inject "$spec" --summary "$dir/run.json" > "$dir/run.log" 2>&1; then
    echo "chaos: FAIL: launch exited non-zero (log: $dir/run.log)"; tail -20 "$dir/run.log"
    trap - EXIT; exit 1
  fi
  if python3 - "$dir/ref.json" "$dir/run.json" <<'PY'
import json, statistics, sys
ref, run = (json.load(open(p)) for p in sys.argv[1:3])
kills = [e for e in run["events"] if e["kind"] == "kill"]
rec = sorted(e["recover_ms"] for e in kills if e["recover_ms"] is not None)
det = sorted(e["detect_ms"] for e in kills if e["detect_ms"] is not None)
if rec:
    p95 = rec[min(len(rec) - 1, int(round(0.95 * (len(rec) - 1))))]
    print(f"chaos: {len(kills)} kills, {run['aborted_steps']} aborted steps; detect median "
          f"{statistics.median(det):.0f} ms; recover median {statistics.median(rec):.0f} ms, "
          f"p95 {p95:.0f} ms, max {rec[-1]:.0f} ms")
else:
    print(f"chaos: no kill fired (raise --steps or lower --mtbf)")
same = run["params_sha256"] == ref["params_sha256"] and run["params_consistent"]
print("chaos: PASS: params_sha256 equals the fault-free run" if same else
      f"chaos: FAIL: {run['params_sha256']} != {ref['params_sha256']}")
sys.exit(0 if same else 1)
PY
  then :; else fail=1; fi
done
exit $fail
