#!/usr/bin/env bash
# Hierarchical against flat allreduce across emulated hosts (docs/benchmarks.md, "Across
# hosts"): a bed of three hosts (tools/netns.sh), the coordinator on host 1, two workers on
# each of hosts 2 and 3, the links of hosts 2 and 3 shaped (default 1gbit; --delay needs
# the kernel's netem). The Fashion-MNIST MLP data-parallel (configs/fashion_mlp_dp4.yaml,
# fast mode) runs with comm.hierarchy flat and hierarchical, alternately, ROUNDS times
# each, in two join orders: "blocked" (h2, h2, h3, h3: ranks 0,1 on one host, so a flat
# ring crosses each link once per step) and "interleaved" (h2, h3, h2, h3: every hop of a
# flat ring crosses). Prints each run's samples/s from its summary and, per order, the
# median ratio hierarchical / flat.
#
#   tools/bench_hier.sh [--rounds R] [--steps S] [--rate RATE] [--delay D]
#                       [--orders "blocked interleaved"] [--set KEY=VALUE]...
#
# Needs root, build/cohort (tools/setup.sh) and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=2 steps=300 rate=1gbit delay="" orders="blocked interleaved"
extra=()
while (($#)); do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    --orders) orders=$2; shift 2 ;;
    --set) extra+=(--set "$2"); shift 2 ;;
    -h|--help) sed -n 2,15p "$0"; exit 0 ;;
    *) echo "bench_hier.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
me=bench_hier.sh
. tools/bench_bed.sh
bed_require
bed_up bh hier 3 "$rate" "$delay" 2 3

# One run: prints samples/s (or fails). $1 = flat|hierarchical, $2 = blocked|interleaved.
run_once() {
  local hierarchy=$1 order=$2 run="$dir/$1-$2-$RANDOM"
  mkdir -p "$run"
  # An address the other hosts reach: the control plane speaks CURVE with the run's keys.
  "$bin" keygen "$run/keys" >/dev/null
  (cd "$run" && on 1 "$bin" coordinator --config "$OLDPWD/configs/fashion_mlp_dp4.yaml" -q \
     --bind tcp://10.77.0.1:0 --keys "$run/keys" --summary "$run/summary.json" \
     --set cluster.workers=4 --set train.steps="$steps" --set train.determinism=fast \
     --set train.eval_every=0 --set fault_tolerance.checkpoint_every=0 \
     --set fault_tolerance.checkpoint_dir="$run/ckpt" --set comm.hierarchy="$hierarchy" \
     "${extra[@]}" >"$run/coord.out" 2>"$run/coord.err") &
  local coord=$!
  local ep
  ep=$(coordinator_endpoint "$run") || return 1
  local hosts=(2 2 3 3)
  [[ $order == interleaved ]] && hosts=(2 3 2 3)
  local pids=()
  for i in 0 1 2 3; do
    # One after the other, so the ranks follow this order.
    on "${hosts[$i]}" "$bin" worker --join "$ep" --keys "$run/keys" --name "w$i-h${hosts[$i]}" \
      >"$run/w$i.out" 2>"$run/w$i.err" &
    pids+=($!)
    wait_rank "$run/w$i.err" "$run/w$i.out"
  done
  local rc=0
  wait "$coord" || rc=$?
  for p in "${pids[@]}"; do wait "$p" || true; done
  if ((rc != 0)) || [[ ! -s $run/summary.json ]]; then
    echo "bench_hier.sh: $hierarchy/$order run failed (exit $rc)" >&2
    tail -5 "$run/coord.err" >&2
    return 1
  fi
  grep -h 'dp group: generation' "$run"/w*.err | tail -1 >&2 || true
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["throughput"]["samples_per_s"])' \
    "$run/summary.json"
}

echo "bench_hier: 2 hosts x 2 workers, links ${shape[*]}, MLP fast, $steps steps, $rounds rounds"
for order in $orders; do
  flat=() hier=()
  for ((r = 1; r <= rounds; r++)); do
    f=$(run_once flat "$order")
    h=$(run_once hierarchical "$order")
    printf '%-12s round %d: flat %8.0f samples/s   hierarchical %8.0f samples/s   ratio %.2f\n' \
      "$order" "$r" "$f" "$h" "$(python3 -c "print($h/$f)")"
    flat+=("$f") hier+=("$h")
  done
  python3 - "$order" "${flat[*]}" "${hier[*]}" <<'EOF'
import statistics, sys
order, flat, hier = sys.argv[1], [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
ratios = [h / f for f, h in zip(flat, hier)]
print(f"{order:12s} median: flat {statistics.median(flat):.0f}  hierarchical "
      f"{statistics.median(hier):.0f} samples/s  hierarchical/flat {statistics.median(ratios):.2f}")
EOF
done
