#!/usr/bin/env bash
# The flake hunt of issue #12: the whole test suite RUNS times in a row (default 20) while a
# parallel build of cohort in a scratch folder keeps both cores busy, as on a loaded CI
# machine. Every failing test of every run is listed at the end with its run number; the
# logs stay in the output folder. Exit 0 only when all runs passed.
#
#   tools/flake_hunt.sh [--runs N] [--build DIR] [--out DIR] [--resume] [--no-load | --load CMD]
#                       [-- CTEST_ARGS...]
#
# --build: the build folder whose tests run (default build/, made by tools/setup.sh);
# --out: where the per-run logs go (default a new folder under /tmp);
# --resume: go on with the hunt recorded in --out (its runs count), which must have run on the
#   same commit with a clean tree: a hunt that outlives one sitting (a reboot, a session's end)
#   is finished later on the very code it started on;
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
resume=0
ctest_args=()
while (($#)); do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --resume) resume=1; shift ;;
    --no-load) load=0; shift ;;
    --load) load_cmd="$2"; shift 2 ;;
    --) shift; ctest_args=("$@"); break ;;
    -h|--help) sed -n 2,16p "$0"; exit 0 ;;
    *) echo "flake_hunt: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "flake_hunt: --runs wants a whole number >= 1" >&2; exit 2; }
[[ -f "$build/CTestTestfile.cmake" ]] || {
  echo "flake_hunt: no test build in '$build' (run tools/setup.sh first)" >&2; exit 2; }
out="${out:-$(mktemp -d /tmp/cohort-flake.XXXXXX)}"
mkdir -p "$out"

# The code under test: the commit, and whether the tree differs from it. A resumed hunt must
# find the same commit and a clean tree, or its earlier runs tested other code.
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
dirty=$(git status --porcelain --untracked-files=no 2>/dev/null | head -1)
first=1
if ((resume)); then
  [[ -f "$out/commit" && -f "$out/runs.txt" ]] || {
    echo "flake_hunt: --resume: no hunt recorded in '$out' (no commit or runs.txt)" >&2; exit 2; }
  [[ "$(cat "$out/commit")" == "$commit" && -z "$dirty" ]] || {
    echo "flake_hunt: --resume: '$out' hunted commit $(cat "$out/commit"), this tree is $commit${dirty:+ with local changes}; start a new hunt" >&2
    exit 2; }
  first=$(($(wc -l <"$out/runs.txt") + 1))
  echo "flake_hunt: resuming at run $first/$runs (commit $commit)"
else
  [[ -z "$dirty" ]] || echo "flake_hunt: warning: the tree has local changes; this hunt cannot be resumed" >&2
  echo "$commit" >"$out/commit"
  : >"$out/runs.txt"
  : >"$out/failures.txt"
fi

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

for ((i = first; i <= runs; i++)); do
  start=$(date +%s)
  if ctest --test-dir "$build" -j2 --output-on-failure "${ctest_args[@]}" >"$out/run-$i.log" 2>&1; then
    status=passed
  else
    status=FAILED
    grep -E '^\s*[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess aborted|Exception|Not Run)' \
      "$out/run-$i.log" | sed "s/^/run $i: /" >>"$out/failures.txt" || true
  fi
  summary=$(grep -E 'tests passed, [0-9]+ tests failed out of' "$out/run-$i.log" || echo "no summary")
  line="run $i/$runs: $status in $(($(date +%s) - start)) s ($summary; load $(cut -d' ' -f1 /proc/loadavg); $(date -u +%FT%TZ))"
  echo "$line" | tee -a "$out/runs.txt"
done
done_runs=$(wc -l <"$out/runs.txt")
failed_runs=$(grep -c ': FAILED in' "$out/runs.txt" || true)
echo "flake_hunt: $((done_runs - failed_runs)) of $done_runs runs passed on commit $commit; logs in $out"

if ((failed_runs)); then
  echo "failing tests:"
  sort "$out/failures.txt" | sed 's/^/  /'
  exit 1
fi
