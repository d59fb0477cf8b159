#!/usr/bin/env bash
# Emulated hosts on one machine, for multi-host tests and benchmarks: N network namespaces
# ("hosts") NAME-h1..NAME-hN, each with one interface eth0 at 10.77.0.<i>/24, cabled by veth
# pairs to a bridge inside its own namespace NAME-sw (so nothing touches the machine's own
# network, and several beds can exist at once). Each host's link can be shaped with tc
# netem (rate, delay, loss; both directions), taken down and brought back.
#
#   tools/netns.sh check                         exit 0 if this machine can do it, else
#                                                print why and exit 77
#   tools/netns.sh up NAME N [--rate R] [--delay D] [--loss L]
#                                                create the bed (R like 1gbit, D like 0.5ms,
#                                                L like 1%); replaces an older bed NAME
#   tools/netns.sh shape NAME I [--rate R] [--delay D] [--loss L]
#                                                (re)shape host I's link
#   tools/netns.sh link NAME I down|up           cut host I off / cable it back
#   tools/netns.sh exec NAME I CMD...            run CMD on host I
#   tools/netns.sh down NAME                     remove every namespace of the bed
#
# Needs root and iproute2 (tools/setup.sh installs it); --delay and --loss need the
# kernel's netem qdisc, a rate alone falls back to tbf. Host I's address is 10.77.0.I; hosts share the kernel, /dev/shm and the files.
set -euo pipefail

die() { echo "netns: $*" >&2; exit 2; }

check() {
  if [[ $(id -u) -ne 0 ]]; then echo "netns: needs root (network namespaces)"; return 77; fi
  if ! command -v ip >/dev/null; then echo "netns: 'ip' not found (install iproute2)"; return 77; fi
  local probe="cohort-probe-$$"
  if ! ip netns add "$probe" 2>/dev/null; then
    echo "netns: cannot create a network namespace here (no CAP_SYS_ADMIN, or a container that forbids it)"
    return 77
  fi
  if ! ip -n "$probe" link add a0 type veth peer name b0 2>/dev/null; then
    ip netns del "$probe" 2>/dev/null || true
    echo "netns: cannot create veth pairs here"
    return 77
  fi
  ip netns del "$probe"
  return 0
}

# Parses --rate/--delay/--loss into RATE, DELAY, LOSS.
parse_shape() {
  RATE="" DELAY="" LOSS=""
  while (($#)); do
    case "$1" in
      --rate) RATE="$2"; shift 2 ;;
      --delay) DELAY="$2"; shift 2 ;;
      --loss) LOSS="$2"; shift 2 ;;
      *) die "unknown option '$1'" ;;
    esac
  done
}

# Shapes both directions of host I's cable: eth0 in the host, p<I> in the switch. netem
# when the kernel has it; a rate alone also works with tbf (some kernels lack sch_netem).
shape() {
  local name="$1" i="$2"; shift 2
  parse_shape "$@"
  for side in "$name-h$i eth0" "$name-sw p$i"; do
    set -- $side
    tc -n "$1" qdisc del dev "$2" root 2>/dev/null || true
    [[ -z "$RATE$DELAY$LOSS" ]] && continue
    local a=()
    [[ -n "$DELAY" ]] && a+=(delay "$DELAY")
    [[ -n "$LOSS" ]] && a+=(loss "$LOSS")
    [[ -n "$RATE" ]] && a+=(rate "$RATE")
    if tc -n "$1" qdisc add dev "$2" root netem "${a[@]}" 2>/dev/null; then continue; fi
    [[ -z "$DELAY$LOSS" ]] ||
      die "tc netem is not available in this kernel (sch_netem): --delay and --loss need it"
    tc -n "$1" qdisc add dev "$2" root tbf rate "$RATE" burst 256kb latency 100ms ||
      die "tc could not shape $1/$2 to $RATE (neither netem nor tbf)"
  done
}

down() {
  local name="$1"
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^$name-(sw|h[0-9]+)$" || true); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns"
  done
}

up() {
  local name="$1" n="$2"; shift 2
  [[ "$n" =~ ^[1-9][0-9]*$ && "$n" -le 250 ]] || die "N must be 1..250"
  [[ ${#name} -le 20 && "$name" =~ ^[a-zA-Z0-9_-]+$ ]] || die "NAME must be 1-20 of [a-zA-Z0-9_-]"
  down "$name"
  ip netns add "$name-sw"
  ip -n "$name-sw" link add br0 type bridge
  ip -n "$name-sw" link set br0 up
  ip -n "$name-sw" link set lo up
  for ((i = 1; i <= n; i++)); do
    local h="$name-h$i"
    ip netns add "$h"
    ip link add eth0 netns "$h" type veth peer name "p$i" netns "$name-sw"
    ip -n "$name-sw" link set "p$i" master br0 up
    ip -n "$h" addr add "10.77.0.$i/24" dev eth0
    ip -n "$h" link set eth0 up
    ip -n "$h" link set lo up
    if (($#)); then shape "$name" "$i" "$@"; fi
  done
}

link() {
  local name="$1" i="$2" state="$3"
  [[ "$state" == up || "$state" == down ]] || die "link state is up or down"
  ip -n "$name-sw" link set "p$i" "$state"
}

cmd="${1:-}"
shift || true
case "$cmd" in
  check) check; exit $? ;;
  up) (($# >= 2)) || die "usage: up NAME N [--rate R] [--delay D] [--loss L]"; up "$@" ;;
  shape) (($# >= 2)) || die "usage: shape NAME I [--rate R] [--delay D] [--loss L]"; shape "$@" ;;
  link) (($# == 3)) || die "usage: link NAME I down|up"; link "$@" ;;
  exec) (($# >= 3)) || die "usage: exec NAME I CMD..."; name="$1" i="$2"; shift 2
        exec ip netns exec "$name-h$i" "$@" ;;
  down) (($# == 1)) || die "usage: down NAME"; down "$1" ;;
  -h|--help|"") sed -n 2,19p "$0"; exit 0 ;;
  *) die "unknown command '$cmd' (see --help)" ;;
esac
