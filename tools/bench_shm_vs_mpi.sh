#!/usr/bin/env bash
# Shared-memory allreduce against its references (docs/benchmarks.md, "Shared memory inside a
# host"): `cohort bench allreduce --ranks 2 --transport shm` (whose JSON also holds raw Gloo
# over TCP loopback, measured in the same process) and Open MPI's allreduce over its
# shared-memory transport (tools/bench_mpi_allreduce.py under mpirun, btl self,vader),
# alternating, ROUNDS times. Prints each run and, per size, the medians of cohort's busbw,
# its ratio to raw Gloo's and to Open MPI's, and cohort's time (targets of the data-plane
# issue: 64 MiB >= 10x raw Gloo and >= 6x Open MPI; 4 KiB p50 <= 20 us).
#
#   tools/bench_shm_vs_mpi.sh [--rounds R] [--sizes 4K,1M,16M,64M]
#
# Needs build/cohort (tools/setup.sh), openmpi-bin and python3-mpi4py
# (COHORT_BENCH_DEPS=1 tools/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=3 sizes=4K,1M,16M,64M
while (($#)); do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    -h|--help) sed -n 2,14p "$0"; exit 0 ;;
    *) echo "bench_shm_vs_mpi.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
bin=$PWD/build/cohort
[[ -x $bin ]] || { echo "bench_shm_vs_mpi.sh: $bin not found: run tools/setup.sh first" >&2; exit 2; }
if ! command -v mpirun >/dev/null || ! /usr/bin/python3 -c 'import mpi4py' 2>/dev/null; then
  echo "bench_shm_vs_mpi.sh: needs openmpi-bin and python3-mpi4py: COHORT_BENCH_DEPS=1 tools/setup.sh" >&2
  exit 2
fi
dir=$(mktemp -d /tmp/cohort-shm-mpi-XXXXXX)
trap 'rm -rf "$dir"' EXIT
mpi=(mpirun -n 2 --mca btl self,vader --bind-to none)
((EUID == 0)) && mpi+=(--allow-run-as-root)

echo "bench_shm_vs_mpi: 2 ranks, sizes $sizes, $rounds rounds, cohort shm and Open MPI alternating"
for ((r = 1; r <= rounds; r++)); do
  # Odd rounds run cohort first, even rounds Open MPI first.
  order="cohort mpi"
  ((r % 2 == 0)) && order="mpi cohort"
  for who in $order; do
    if [[ $who == cohort ]]; then
      "$bin" bench allreduce --ranks 2 --transport shm --sizes "$sizes" --json \
        >"$dir/cohort.$r.json" 2>"$dir/err" || { tail -5 "$dir/err" >&2; exit 1; }
    else
      "${mpi[@]}" /usr/bin/python3 tools/bench_mpi_allreduce.py --sizes "$sizes" --json \
        >"$dir/mpi.$r.json" 2>"$dir/err" || { tail -5 "$dir/err" >&2; exit 1; }
    fi
  done
done
python3 - "$dir" "$rounds" <<'EOF'
import json, statistics, sys
d, rounds = sys.argv[1], int(sys.argv[2])
by_size = {}
for r in range(1, rounds + 1):
    c = json.load(open(f"{d}/cohort.{r}.json"))
    m = {row["bytes"]: row for row in json.load(open(f"{d}/mpi.{r}.json"))["rows"]}
    for row in c["rows"]:
        b = row["bytes"]
        shm, raw, ompi = row["cohort"], row["raw_gloo"], m[b]
        print(f"round {r}: {b:>10} B  cohort shm {shm['time_us']:9.1f} us {shm['busbw_gbps']:6.3f} GB/s"
              f" | raw Gloo {raw['busbw_gbps']:6.3f} | Open MPI {ompi['time_us']:9.1f} us"
              f" {ompi['busbw_gbps']:6.3f} GB/s")
        by_size.setdefault(b, []).append((shm["time_us"], shm["busbw_gbps"],
                                          shm["busbw_gbps"] / raw["busbw_gbps"],
                                          shm["busbw_gbps"] / ompi["busbw_gbps"]))
for b, v in sorted(by_size.items()):
    med = lambda i: statistics.median(x[i] for x in v)
    print(f"median: {b:>10} B  cohort shm {med(0):9.1f} us, busbw {med(1):.3f} GB/s, "
          f"{med(2):.2f}x raw Gloo, {med(3):.2f}x Open MPI")
EOF
