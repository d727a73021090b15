#!/usr/bin/env bash
# Test hosts with addresses of their own, for the cluster tests: each host is a network
# namespace on this machine (ty-n1 … for the Slurm test cluster's nodes, ty-r1 … for the Ray
# test cluster's), joined to this machine by a veth pair on one bridge. Traffic goes only
# between these namespaces and this machine: their addresses exist only on these veths, the
# namespaces have no default route, and this machine does not forward.
#
#   this machine   tybr0 10.213.0.1/24 ─┬─ tyv-n1 ══ ty0 10.213.0.11/24   namespace ty-n1
#                                       ├─ tyv-n2 ══ ty0 10.213.0.12/24   namespace ty-n2
#                                       ├─ …
#                                       └─ tyv-r1 ══ ty0 10.213.0.111/24  namespace ty-r1 …
#                  tys-n1 10.214.1.1/30 ════════════ eth0 10.214.1.2/30   (each host's second
#                  tys-r1 10.214.101.1/30 ══════════ eth0 10.214.101.2/30  link: this machine
#                                                                           reaches it, no other
#                                                                           host does)
#
# A host nK has 10.213.0.(10+K) and rK has 10.213.0.(110+K), K from 1 to 99. Every host also
# has a second interface, `eth0`, on a link of its own to this machine that no other host can
# reach: a run must not pick it (the address every host shares is on `ty0`).
#
#   scripts/netns-env.sh [up [HOST...]]  make what is missing (default hosts: n1-n4, r1-r4)
#   scripts/netns-env.sh use [HOST...]   what a cluster's set-up calls: `up`, unless
#                                        TRAINYARD_NETNS_SKIP says why not (see below)
#   scripts/netns-env.sh status          the layout and each namespace's addresses
#   scripts/netns-env.sh down            remove every namespace and link made here (refused
#                                        while a process runs in one of them)
#
# `up` is idempotent (~0.1 s when everything is there). On success the last line on stdout is
# the layout file, one line a host: `NAME NAMESPACE ADDRESS HOST_LINK` (the first line is this
# machine: `host - 10.213.0.1 tybr0`), which the tests read. Exit codes (as the other
# environment scripts):
#   0  ready
#   3  SKIP: namespaces cannot be made here (not root, no `ip`, the kernel refuses, the
#      subnets are in use)
#   1  any other failure
#
# The clusters use these hosts unless TRAINYARD_NETNS_SKIP says why they cannot (they are then
# single-stack: every node on this machine's own addresses); under CI=true a missing namespace
# without that reason fails the set-up. `use` is that rule, for every cluster's set-up
# (scripts/slurm-env.sh, the Ray test cluster of crates/runtime-ray): exit 0 and the layout as
# `up`; exit 3 for a single-stack cluster (TRAINYARD_NETNS_SKIP says why, or, outside CI, no
# namespace can be made here: `SKIP:` and why); exit 1 under CI=true when none can be made and
# TRAINYARD_NETNS_SKIP does not say why.

set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
NAME="netns-env"
# shellcheck source=messages.sh
. "$HERE/messages.sh"

ACTION="${1:-up}"
[ "$#" -gt 0 ] && shift
BRIDGE=tybr0
SHARED=10.213.0
SIDE=10.214
LAYOUT_DIR=/run/trainyard-netns
LAYOUT="$LAYOUT_DIR/hosts"
DEFAULT_HOSTS=(n1 n2 n3 n4 r1 r2 r3 r4)

# The host's index (nK: K, rK: 100 + K), or a failure for a name that is no host.
index() {
  case "$1" in
    n[1-9] | n[1-9][0-9]) printf '%s\n' "${1#n}" ;;
    r[1-9] | r[1-9][0-9]) printf '%s\n' "$((100 + ${1#r}))" ;;
    *) die "a host is nK or rK with K from 1 to 99, got '$1'" ;;
  esac
}

address() { printf '%s.%s\n' "$SHARED" "$(($(index "$1") + 10))"; }

# Whether this machine routes SUBNET (or a network that holds it) through anything but the
# default route and the links made here.
in_use() {
  ip -4 route show match "$1" | awk '$1 != "default" {print $3}' \
    | grep -vE "^($BRIDGE|tys-[nr][0-9]+)$" | grep -q .
}

ensure_bridge() {
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    in_use "$SHARED.0/24" && skip "this machine already routes $SHARED.0/24: the test hosts need it to themselves"
    in_use "$SIDE.0.0/16" && skip "this machine already routes $SIDE.0.0/16: the test hosts need it to themselves"
    ip link add "$BRIDGE" type bridge 2>/dev/null || skip "the kernel cannot make a bridge here"
  fi
  ip addr replace "$SHARED.1/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
}

# Makes what host HOST lacks: its namespace, its side link (made first, so that it comes first
# in the namespace's interface list) and its link to the bridge, addresses, and links up.
ensure_host() {
  local host="$1" ns="ty-$1" i side
  i="$(index "$host")"
  side="$SIDE.$i"
  if [ ! -e "/run/netns/$ns" ]; then
    ip netns add "$ns" 2>/dev/null || skip "cannot make network namespace $ns (ip netns add)"
  fi
  # A pair whose namespace end went with an earlier namespace goes away asynchronously.
  local tries
  for tries in $(seq 1 50); do
    { ip link show "tys-$host" >/dev/null 2>&1 && ! ip -n "$ns" link show eth0 >/dev/null 2>&1; } \
      || { ip link show "tyv-$host" >/dev/null 2>&1 && ! ip -n "$ns" link show ty0 >/dev/null 2>&1; } \
      || break
    sleep 0.1
  done
  if ! ip -n "$ns" link show eth0 >/dev/null 2>&1; then
    ip link del "tys-$host" 2>/dev/null || true
    ip link add "tys-$host" type veth peer name eth0 netns "$ns" 2>/dev/null \
      || skip "the kernel cannot make a veth pair here"
  fi
  if ! ip -n "$ns" link show ty0 >/dev/null 2>&1; then
    ip link del "tyv-$host" 2>/dev/null || true
    ip link add "tyv-$host" type veth peer name ty0 netns "$ns"
  fi
  ip addr replace "$side.1/30" dev "tys-$host"
  ip link set "tys-$host" up
  ip link set "tyv-$host" master "$BRIDGE" up
  ip -n "$ns" addr replace "$side.2/30" dev eth0
  ip -n "$ns" addr replace "$(address "$host")/24" dev ty0
  ip -n "$ns" link set lo up
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set ty0 up
}

write_layout() {
  local file ns host
  mkdir -p "$LAYOUT_DIR"
  file="$(mktemp "$LAYOUT_DIR/.hosts.XXXXXX")"
  printf 'host - %s.1 %s\n' "$SHARED" "$BRIDGE" >"$file"
  for ns in /run/netns/ty-*; do
    [ -e "$ns" ] || continue
    host="${ns##*/ty-}"
    printf '%s %s %s tyv-%s\n' "$host" "ty-$host" "$(address "$host")" "$host" >>"$file"
  done
  chmod 0644 "$file"
  mv "$file" "$LAYOUT"
}

down() {
  local ns host pids
  for ns in /run/netns/ty-*; do
    [ -e "$ns" ] || continue
    pids="$(ip netns pids "${ns##*/}" 2>/dev/null | tr '\n' ' ')"
    [ -z "${pids// /}" ] || die "processes still run in ${ns##*/} (pids $pids): stop them first (scripts/slurm-env.sh down, or the test that started them)"
  done
  for ns in /run/netns/ty-*; do
    [ -e "$ns" ] || continue
    host="${ns##*/ty-}"
    ip netns del "ty-$host"
    ip link del "tyv-$host" 2>/dev/null || true
    ip link del "tys-$host" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  rm -f "$LAYOUT"
}

# `use`: the rule above, before anything that needs root.
if [ "$ACTION" = use ]; then
  if [ -n "${TRAINYARD_NETNS_SKIP:-}" ]; then
    log "single-stack hosts: $TRAINYARD_NETNS_SKIP (TRAINYARD_NETNS_SKIP)"
    exit 3
  fi
  status=0
  bash "${BASH_SOURCE[0]}" up "$@" || status=$?
  case "$status" in
    0) exit 0 ;;
    3)
      [ "${CI:-}" = true ] \
        && die "the test hosts ${*:-(default)} cannot have network namespaces of their own (see above) and TRAINYARD_NETNS_SKIP does not say why"
      log "SKIP: single-stack hosts: namespaces cannot be made here (see above)"
      exit 3
      ;;
    *) die "scripts/netns-env.sh up failed (exit $status)" ;;
  esac
fi

[ "$(id -u)" = 0 ] || skip "network namespaces need root"
command -v ip >/dev/null || skip "there is no \`ip\` (iproute2) to make network namespaces with"
mkdir -p /run/lock
exec 9>/run/lock/trainyard-netns-env.lock
flock 9

case "$ACTION" in
  up)
    hosts=("$@")
    [ "${#hosts[@]}" -gt 0 ] || hosts=("${DEFAULT_HOSTS[@]}")
    for host in "${hosts[@]}"; do index "$host" >/dev/null; done
    ensure_bridge
    for host in "${hosts[@]}"; do ensure_host "$host"; done
    write_layout
    log "ready: ${hosts[*]} on $SHARED.0/24 (this machine: $SHARED.1 on $BRIDGE)"
    printf '%s\n' "$LAYOUT"
    ;;
  status)
    [ -e "$LAYOUT" ] && cat "$LAYOUT"
    for ns in /run/netns/ty-*; do
      [ -e "$ns" ] || continue
      printf '%s:\n' "${ns##*/}"
      ip -n "${ns##*/}" -br addr
    done
    ;;
  down) down ;;
  *) die "usage: $0 [up [HOST...]|use [HOST...]|status|down]" ;;
esac
