# Sourced by the benches that run cohort on a bed of emulated hosts (tools/netns.sh):
# tools/bench_hier.sh and tools/bench_compression.sh. The caller sets `me` (its name, for
# messages) and runs from the repository root.

# Checks build/cohort and the netns capability (exit 2 / 77 with the reason); sets `bin`.
bed_require() {
  bin=$PWD/build/cohort
  [[ -x $bin ]] || { echo "$me: $bin not found: run tools/setup.sh first" >&2; exit 2; }
  tools/netns.sh check >/dev/null || { tools/netns.sh check; exit 77; }
}

# bed_up NAME TAG HOSTS RATE DELAY SHAPED...: a bed of HOSTS hosts named NAME<pid> (`bed`)
# and a scratch folder /tmp/cohort-TAG-* (`dir`), both gone on exit (the folder kept when
# KEEP is set); the links of the SHAPED hosts shaped to RATE, and DELAY when not empty
# (netem); `shape` holds those netns.sh options.
bed_up() {
  local name=$1 tag=$2 hosts=$3 rate=$4 delay=$5
  shift 5
  bed="$name$$"
  dir=$(mktemp -d "/tmp/cohort-$tag-XXXXXX")
  trap bed_down EXIT
  shape=(--rate "$rate")
  [[ -n $delay ]] && shape+=(--delay "$delay")
  tools/netns.sh up "$bed" "$hosts"
  local h
  for h in "$@"; do tools/netns.sh shape "$bed" "$h" "${shape[@]}"; done
}

bed_down() {
  tools/netns.sh down "$bed" >/dev/null 2>&1 || true
  [[ -n ${KEEP:-} ]] || rm -rf "$dir"
}

# on HOST CMD...: CMD inside emulated host HOST.
on() {
  local h=$1
  shift
  ip netns exec "$bed-h$h" "$@"
}

# coordinator_endpoint RUN: the endpoint of the coordinator that logs to RUN/coord.out and
# RUN/coord.err, once it says it listens (up to 30 s); otherwise its output and failure.
coordinator_endpoint() {
  local run=$1 ep=""
  for _ in $(seq 300); do
    ep=$(grep -o 'coordinator listening on tcp://[0-9.:]*' "$run/coord.out" "$run/coord.err" \
           2>/dev/null | head -1 | sed 's/.*listening on //') || true
    [[ -n $ep ]] && { echo "$ep"; return 0; }
    sleep 0.1
  done
  echo "$me: the coordinator did not start" >&2
  cat "$run"/coord.* >&2
  return 1
}

# wait_rank LOG...: until a worker's logs say its rank (up to 5 s), so that the next worker
# joins after it and the ranks follow the order of the joins.
wait_rank() {
  for _ in $(seq 100); do
    grep -q ', rank ' "$@" 2>/dev/null && return 0
    sleep 0.05
  done
}
