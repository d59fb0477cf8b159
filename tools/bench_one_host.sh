#!/usr/bin/env bash
# Data parallelism on one host against one process (docs/benchmarks.md, "One host"): the
# Fashion-MNIST MLP of configs/fashion_mlp_dp4.yaml in fast mode, `cohort train` (the
# reference) and `cohort launch` with each worker count in --workers, each with commit
# windows of each size in --windows (fault_tolerance.commit_window; 0 = the coordinator
# commits every step). The runs alternate, ROUNDS times; `cohort train` runs at the start
# of each round. Prints each run's samples/s from its summary, its ratio to the round's
# `cohort train`, and per (workers, window) the median ratio and the workers' mean idle and
# communication-wait seconds. With --torch, each round also runs PyTorch DDP over Gloo
# (tools/bench_ddp.py under torchrun) with each worker count, and the summary gives each
# launch's median ratio to DDP at the same world size.
#
#   tools/bench_one_host.sh [--rounds R] [--steps S] [--workers "2 4"] [--windows "0 16"]
#                           [--torch] [--set KEY=VALUE]...
#
# Needs build/cohort (tools/setup.sh) and python3; --torch needs python3-torch
# (COHORT_BENCH_DEPS=1 tools/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=2 steps=1000 workers="2 4" windows="0 16" torch=0
extra=()
while (($#)); do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --windows) windows=$2; shift 2 ;;
    --torch) torch=1; shift ;;
    --set) extra+=(--set "$2"); shift 2 ;;
    -h|--help) sed -n 2,18p "$0"; exit 0 ;;
    *) echo "bench_one_host.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
bin=$PWD/build/cohort
[[ -x $bin ]] || { echo "bench_one_host.sh: $bin not found: run tools/setup.sh first" >&2; exit 2; }
if ((torch)) && ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  echo "bench_one_host.sh: --torch needs python3-torch: COHORT_BENCH_DEPS=1 tools/setup.sh" >&2
  exit 2
fi
dir=$(mktemp -d /tmp/cohort-onehost-XXXXXX)
trap 'rm -rf "$dir"' EXIT
common=(--set train.steps="$steps" --set train.determinism=fast --set train.eval_every=0
        --set fault_tolerance.checkpoint_every=0 --set fault_tolerance.checkpoint_dir="$dir/ckpt"
        "${extra[@]}")

# Prints "samples/s idle_s comm_wait_s" of the summary $1 (worker means; 0 0 for train).
figures() {
  python3 - "$1" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
w = s.get("workers", [])
mean = lambda k: sum(x[k] for x in w) / len(w) if w else 0.0
print(s["throughput"]["samples_per_s"], mean("idle_s"), mean("comm_wait_s"))
EOF
}

echo "bench_one_host: MLP fast, $steps steps, workers: $workers, windows: $windows, $rounds rounds"
results="$dir/results"
: >"$results"
for ((r = 1; r <= rounds; r++)); do
  "$bin" train configs/fashion_mlp_dp4.yaml -q "${common[@]}" --summary "$dir/train.json" \
    >/dev/null 2>"$dir/train.err" || { tail -5 "$dir/train.err" >&2; exit 1; }
  read -r ref _ _ < <(figures "$dir/train.json")
  printf 'round %d: cohort train %8.0f samples/s\n' "$r" "$ref"
  for n in $workers; do
    for w in $windows; do
      "$bin" launch configs/fashion_mlp_dp4.yaml -q "${common[@]}" --set cluster.workers="$n" \
        --set fault_tolerance.commit_window="$w" --summary "$dir/launch.json" \
        >"$dir/launch.out" 2>&1 || { tail -5 "$dir/launch.out" >&2; exit 1; }
      read -r sps idle wait < <(figures "$dir/launch.json")
      ratio=$(python3 -c "print($sps / $ref)")
      printf 'round %d: launch %d workers, window %2d: %8.0f samples/s  %.2fx train  idle %.2f s  comm wait %.2f s\n' \
        "$r" "$n" "$w" "$sps" "$ratio" "$idle" "$wait"
      echo "$r $n $w $ratio $idle $wait $sps" >>"$results"
    done
    if ((torch)); then
      # --redirects 1 --tee 1: Debian's torch 1.13 on Python 3.11 cannot parse the default
      # (0, "none": its Std flag enum no longer lists 0); stdout then comes back prefixed
      # with "[default0]:".
      OMP_NUM_THREADS=1 /usr/bin/python3 -m torch.distributed.run --standalone --redirects 1 \
        --tee 1 --log_dir "$dir/torchrun" --nproc_per_node "$n" tools/bench_ddp.py \
        --steps "$steps" --json >"$dir/ddp.out" 2>"$dir/ddp.err" ||
        { tail -5 "$dir/ddp.err" >&2; exit 1; }
      ddp=$(python3 -c 'import json,sys; print([json.loads(l[l.index("{"):]) for l in open(sys.argv[1]) if "{" in l][0]["samples_per_s"])' "$dir/ddp.out")
      printf 'round %d: torch DDP  %d workers:           %8.0f samples/s  %.2fx train\n' \
        "$r" "$n" "$ddp" "$(python3 -c "print($ddp / $ref)")"
      echo "$n ddp $r $ddp" >>"$dir/ddp"
    fi
  done
done
touch "$dir/ddp"
python3 - "$results" "$dir/ddp" <<'EOF'
import statistics, sys
rows, ddp = {}, {}
for line in open(sys.argv[2]):
    n, _, r, sps = line.split()
    ddp[(int(n), int(r))] = float(sps)
for line in open(sys.argv[1]):
    r, n, w, ratio, idle, wait, sps = line.split()
    vs_ddp = float(sps) / ddp[(int(n), int(r))] if (int(n), int(r)) in ddp else None
    rows.setdefault((int(n), int(w)), []).append((float(ratio), float(idle), float(wait), vs_ddp))
for (n, w), v in sorted(rows.items()):
    line = (f"median: {n} workers, window {w:2d}: {statistics.median(x[0] for x in v):.2f}x train, "
            f"idle {statistics.median(x[1] for x in v):.2f} s, comm wait {statistics.median(x[2] for x in v):.2f} s")
    if all(x[3] is not None for x in v):
        line += f", {statistics.median(x[3] for x in v):.2f}x torch DDP"
    print(line)
EOF
