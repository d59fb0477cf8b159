#!/usr/bin/env bash
# The flake hunt of issue #12: the whole test suite RUNS times in a row (default 20) while a
# parallel build of cohort in a scratch folder keeps both cores busy, as on a loaded CI
# machine. Every failing test of every run is listed at the end with its run number; the
# logs stay in the output folder. Exit 0 only when all runs passed.
#
#   tools/flake_hunt.sh [--runs N] [--build DIR] [--out DIR] [--no-load | --load CMD]
#                       [-- CTEST_ARGS...]
#
# --build: the build folder whose tests run (default build/, made by tools/setup.sh);
# --out: where the per-run logs go (default a new folder under /tmp);
# --no-load: run the suite on an otherwise idle machine;
# --load CMD: the load is CMD (a shell command) run again and again instead of the build;
# CTEST_ARGS go to every ctest call (e.g. -L mp, or -R spare).
set -euo pipefail
cd "$(dirname "$0")/.."

runs=20
build=build
out=""
load=1
load_cmd=""
ctest_args=()
while (($#)); do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --no-load) load=0; shift ;;
    --load) load_cmd="$2"; shift 2 ;;
    --) shift; ctest_args=("$@"); break ;;
    -h|--help) sed -n 2,13p "$0"; exit 0 ;;
    *) echo "flake_hunt: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "flake_hunt: --runs wants a whole number >= 1" >&2; exit 2; }
[[ -f "$build/CTestTestfile.cmake" ]] || {
  echo "flake_hunt: no test build in '$build' (run tools/setup.sh first)" >&2; exit 2; }
out="${out:-$(mktemp -d /tmp/cohort-flake.XXXXXX)}"
mkdir -p "$out"

loader=""
stop_load() {
  if [[ -n "$loader" ]]; then kill -- -"$loader" 2>/dev/null || true; wait "$loader" 2>/dev/null || true; fi
}
trap stop_load EXIT
if ((load)); then
  # A build of the whole tree with -j2, cleaned and started again for as long as the hunt
  # runs: the load a developer's parallel build puts on a 2-core CI machine.
  scratch="$out/load-build"
  set -m
  (
    if [[ -n "$load_cmd" ]]; then
      while true; do bash -c "$load_cmd" >>"$out/load.log" 2>&1 || true; done
    fi
    cmake -S . -B "$scratch" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCOHORT_GPU=OFF >/dev/null
    while true; do
      cmake --build "$scratch" -j2 >/dev/null 2>&1 || true
      cmake --build "$scratch" --target clean >/dev/null 2>&1 || true
    done
  ) &
  loader=$!
  set +m
  echo "flake_hunt: load build in $scratch (pid $loader)"
fi

failed_runs=0
: >"$out/failures.txt"
for ((i = 1; i <= runs; i++)); do
  start=$(date +%s)
  if ctest --test-dir "$build" -j2 --output-on-failure "${ctest_args[@]}" >"$out/run-$i.log" 2>&1; then
    status=passed
  else
    status=FAILED
    failed_runs=$((failed_runs + 1))
    grep -E '^\s*[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess aborted|Exception|Not Run)' \
      "$out/run-$i.log" | sed "s/^/run $i: /" >>"$out/failures.txt" || true
  fi
  summary=$(grep -E 'tests passed, [0-9]+ tests failed out of' "$out/run-$i.log" || echo "no summary")
  echo "run $i/$runs: $status in $(($(date +%s) - start)) s ($summary; load $(cut -d' ' -f1 /proc/loadavg))"
done
echo "flake_hunt: $((runs - failed_runs)) of $runs runs passed; logs in $out"
if ((failed_runs)); then
  echo "failing tests:"
  sort "$out/failures.txt" | sed 's/^/  /'
  exit 1
fi
