#!/usr/bin/env bash
# A real Slurm cluster on this machine for the Slurm runtime's tests (crates/runtime-slurm):
# Debian's packages (slurmctld, slurmd, slurm-client, munge), one controller and several fake
# nodes (slurmd -N n1 ... nN on one host, which Debian's build allows), each with every CPU of
# this machine and a share of its memory; cgroup v1 memory and CPU enforcement where the host
# allows it, else Slurm's RSS polling (OverMemoryKill). No systemd: the daemons are started
# here and found again through their pid files. Use it as:
#
#   scripts/slurm-env.sh [up]     install what is missing, configure, start, wait for idle nodes
#   scripts/slurm-env.sh status   the daemons and `sinfo`
#   scripts/slurm-env.sh down     cancel every job, stop the daemons this script started
#
# `up` is idempotent and quick once installed (~0.2 s when running, ~5 s from nothing). On
# success the last line on stdout is the cluster's node list (`n[1-4]`); progress goes to
# stderr. Exit codes (as the other environment scripts):
#   0  ready
#   3  SKIP: Slurm cannot be set up here (not root, or the package registry cannot be reached)
#   1  any other failure
#
# Each node runs in a network namespace of its own (scripts/netns-env.sh: node nK at
# 10.213.0.(10+K) on `ty0`, this machine and the controller at 10.213.0.1), so the driver, each
# node and each rank have addresses of their own. TRAINYARD_NETNS_SKIP=REASON keeps every node on
# this machine's own addresses (a single-stack cluster: NodeAddr=127.0.0.1), saying why; so does a
# machine where namespaces cannot be made, except under CI=true, where that fails unless
# TRAINYARD_NETNS_SKIP says why.
#
# Knobs: TRAINYARD_SLURM_NODES (default 4), TRAINYARD_SLURM_NODE_MEM_MB (default 4096, at most
# this machine's memory over the nodes), TRAINYARD_SLURM_CGROUP=auto|yes|no (default auto),
# TRAINYARD_NETNS_SKIP.

set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
NAME="slurm-env"
# shellcheck source=messages.sh
. "$HERE/messages.sh"

ACTION="${1:-up}"
NODES="${TRAINYARD_SLURM_NODES:-4}"
CGROUP="${TRAINYARD_SLURM_CGROUP:-auto}"
CPUS="$(nproc)"
HOST_MB=$(($(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024))
NODE_MB="${TRAINYARD_SLURM_NODE_MEM_MB:-4096}"
[ "$NODE_MB" -le "$HOST_MB" ] || NODE_MB="$HOST_MB"
NODE_LIST="n[1-${NODES}]"

CONF_DIR=/etc/slurm
RUN_DIR=/run/trainyard-slurm
STATE_DIR=/var/spool/trainyard-slurm
LOG_DIR=/var/log/trainyard-slurm
MARK="# written by trainyard's scripts/slurm-env.sh"

case "$NODES" in '' | *[!0-9]* | 0) die "TRAINYARD_SLURM_NODES must be a positive number, got '$NODES'" ;; esac

nodes() { seq -f 'n%g' 1 "$NODES"; }

# Sets NETNS: 1 when the nodes get namespaces of their own (made here when missing), 0 for a
# single-stack cluster (`netns-env.sh use` applies TRAINYARD_NETNS_SKIP and the CI=true rule).
choose_hosts() {
  NETNS=0
  local status=0
  # shellcheck disable=SC2046
  bash "$HERE/netns-env.sh" use $(nodes) >/dev/null || status=$?
  case "$status" in
    0) NETNS=1 ;;
    3) ;;
    *) exit "$status" ;;
  esac
}

# A node's address: its namespace's (netns-env.sh's layout), or loopback on a single stack.
node_addr() {
  if [ "$NETNS" = 1 ]; then
    awk -v node="$1" '$1 == node {print $3}' /run/trainyard-netns/hosts
  else
    printf '127.0.0.1\n'
  fi
}

# Whether the pid file names a live process running `comm`.
alive() {
  local pid
  [ -s "$1" ] || return 1
  pid="$(cat "$1" 2>/dev/null)" || return 1
  [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ]
}

# Stops the process of a pid file (only when it runs `comm`): SIGTERM, 10 s, SIGKILL.
stop() {
  local pid i
  if alive "$1" "$2"; then
    pid="$(cat "$1")"
    kill "$pid" 2>/dev/null || true
    for i in $(seq 1 50); do [ -d "/proc/$pid" ] || break; sleep 0.2; done
    if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ]; then
      log "$2 (pid $pid) did not stop in 10 s: SIGKILL"
      kill -9 "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$1"
}

install_packages() {
  local wanted=(slurmctld slurmd slurm-client munge) missing=() package
  for package in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' \
      || missing+=("$package")
  done
  [ "${#missing[@]}" -eq 0 ] && return 0
  command -v apt-get >/dev/null || skip "Slurm is not installed and there is no apt-get to install it"
  log "installing ${missing[*]} (Debian's packages, no recommends)"
  export DEBIAN_FRONTEND=noninteractive
  local apt_log=/tmp/trainyard-slurm-apt.log
  if ! apt-get install -y -q --no-install-recommends "${missing[@]}" >"$apt_log" 2>&1; then
    apt-get update -q >>"$apt_log" 2>&1 || skip "the package registry cannot be reached: cannot install ${missing[*]}"
    if ! apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$apt_log" 2>&1; then
      tail -n 20 "$apt_log" >&2
      grep -qiE 'temporary failure|could not resolve|unable to fetch' "$apt_log" \
        && skip "the package registry cannot be reached: cannot install ${missing[*]}"
      die "apt-get install ${missing[*]} failed (log: $apt_log)"
    fi
  fi
}

# cgroup v1 controllers that root can write: Slurm's cgroup/v1 plugin enforces memory and
# CPUs per step there.
cgroup_v1() {
  [ "$(stat -fc %T /sys/fs/cgroup 2>/dev/null)" != cgroup2fs ] || return 1
  local controller probe
  for controller in memory cpuset freezer devices; do
    [ "$(stat -fc %T "/sys/fs/cgroup/$controller" 2>/dev/null)" = cgroupfs ] || return 1
  done
  probe="/sys/fs/cgroup/memory/trainyard-slurm-probe-$$"
  mkdir "$probe" 2>/dev/null || return 1
  rmdir "$probe"
}

# Writes slurm.conf and cgroup.conf; CHANGED=1 when either differs from what was there.
configure() {
  local use_cgroup=0 proctrack task extra=""
  case "$CGROUP" in
    yes) use_cgroup=1 ;;
    no) use_cgroup=0 ;;
    auto) cgroup_v1 && use_cgroup=1 ;;
    *) die "TRAINYARD_SLURM_CGROUP must be auto, yes or no, got '$CGROUP'" ;;
  esac
  if [ "$use_cgroup" = 1 ]; then
    proctrack=proctrack/cgroup
    task=task/cgroup,task/affinity
  else
    # No cgroups: memory is enforced by polling each step's RSS every second.
    proctrack=proctrack/linuxproc
    task=task/none
    extra="JobAcctGatherParams=OverMemoryKill"
  fi
  if [ -f "$CONF_DIR/slurm.conf" ] && ! grep -q "^$MARK" "$CONF_DIR/slurm.conf"; then
    die "$CONF_DIR/slurm.conf was not written by this script: not replacing it"
  fi
  mkdir -p "$CONF_DIR"
  local conf cgconf controller=localhost node_lines="" node port=17000
  # In namespaces, the nodes reach the controller at this machine's address on their bridge.
  [ "$NETNS" = 1 ] && controller="$(hostname -s)($(awk '$1 == "host" {print $3}' /run/trainyard-netns/hosts))"
  for node in $(nodes); do
    port=$((port + 1))
    node_lines+="NodeName=$node NodeHostname=$(hostname -s) NodeAddr=$(node_addr "$node") Port=$port CPUs=$CPUS RealMemory=$NODE_MB State=UNKNOWN"$'\n'
  done
  node_lines="${node_lines%$'\n'}"
  conf="$(mktemp)"
  cgconf="$(mktemp)"
  cat >"$conf" <<EOF
$MARK
ClusterName=trainyard
SlurmctldHost=$controller
SlurmUser=slurm
AuthType=auth/munge
StateSaveLocation=$STATE_DIR/ctld
SlurmdSpoolDir=$STATE_DIR/d.%n
SlurmctldPidFile=$RUN_DIR/slurmctld.pid
SlurmdPidFile=$RUN_DIR/slurmd.%n.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.%n.log
ProctrackType=$proctrack
TaskPlugin=$task
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=1
$extra
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# A job without --mem would otherwise take a whole node's memory.
DefMemPerCPU=256
# A request no node can hold fails at once instead of pending forever.
EnforcePartLimits=ALL
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
# Under a loaded machine a killed step's processes can take long to be reaped: drain a node
# only after 3 minutes (the default 60 s drained nodes with "Kill task failed" under load).
UnkillableStepTimeout=180
# Ended jobs stay visible (there is no accounting database) long enough to read their end.
MinJobAge=300
$node_lines
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
  if [ "$use_cgroup" = 1 ]; then
    printf '%s\nCgroupPlugin=cgroup/v1\nCgroupAutomount=no\nConstrainCores=yes\nConstrainRAMSpace=yes\nConstrainSwapSpace=yes\nAllowedSwapSpace=0\n' "$MARK" >"$cgconf"
  else
    printf '%s\nIgnoreSystemd=yes\n' "$MARK" >"$cgconf"
  fi
  CHANGED=0
  if ! cmp -s "$conf" "$CONF_DIR/slurm.conf" || ! cmp -s "$cgconf" "$CONF_DIR/cgroup.conf"; then
    CHANGED=1
  fi
  install -m 0644 "$conf" "$CONF_DIR/slurm.conf"
  install -m 0644 "$cgconf" "$CONF_DIR/cgroup.conf"
  rm -f "$conf" "$cgconf"
  log "$NODES nodes of $CPUS CPUs and $NODE_MB MB (cgroup enforcement: $use_cgroup; $([ "$NETNS" = 1 ] && echo "each in its namespace, ty-n1 at $(node_addr n1) …" || echo "single-stack"))"
}

prepare() {
  mkdir -p "$STATE_DIR/ctld" "$LOG_DIR" "$RUN_DIR" /run/munge
  chown slurm:slurm "$STATE_DIR/ctld" "$LOG_DIR"
  chown munge:munge /run/munge
  local node
  for node in $(nodes); do mkdir -p "$STATE_DIR/d.$node"; done
  if [ ! -s /etc/munge/munge.key ]; then
    mungekey --create --keyfile=/etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key
    chmod 0600 /etc/munge/munge.key
  fi
}

# The daemons are started with fd 9 (this script's lock) closed, so none of them holds it.
start() {
  local i node
  if ! { alive /run/munge/munged.pid munged && munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }; then
    runuser -u munge -- /usr/sbin/munged 9>&-
    for i in $(seq 1 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  fi
  if ! alive "$RUN_DIR/slurmctld.pid" slurmctld; then
    /usr/sbin/slurmctld -i 9>&- || die "slurmctld did not start (log: $LOG_DIR/slurmctld.log)"
  fi
  for i in $(seq 1 100); do scontrol ping 2>/dev/null | grep -q 'is UP' && break; sleep 0.1; done
  scontrol ping 2>/dev/null | grep -q 'is UP' || die "slurmctld does not answer (log: $LOG_DIR/slurmctld.log)"
  for node in $(nodes); do
    alive "$RUN_DIR/slurmd.$node.pid" slurmd && continue
    # Only the network namespace is entered (`ip netns exec` would remount /sys, hiding the
    # cgroup hierarchies Slurm's cgroup plugin uses).
    if [ "$NETNS" = 1 ]; then
      nsenter --net="/run/netns/ty-$node" /usr/sbin/slurmd -N "$node" 9>&- || die "slurmd $node did not start in namespace ty-$node (log: $LOG_DIR/slurmd.$node.log)"
    else
      /usr/sbin/slurmd -N "$node" 9>&- || die "slurmd $node did not start (log: $LOG_DIR/slurmd.$node.log)"
    fi
  done
}

# Waits up to 60 s for every node to take jobs, resuming any left drained or down.
wait_idle() {
  local i states ready down node
  for i in $(seq 1 300); do
    states="$(sinfo -h -N -o '%N %T' 2>/dev/null | sort -u || true)"
    ready="$(grep -cE ' (idle|mixed|allocated)$' <<<"$states" || true)"
    [ "$ready" -eq "$NODES" ] && return 0
    if [ $((i % 10)) -eq 0 ]; then
      down="$(awk '$2 ~ /drain|down/ {print $1}' <<<"$states")"
      for node in $down; do scontrol update nodename="$node" state=resume 2>/dev/null || true; done
    fi
    sleep 0.2
  done
  sinfo -N -l >&2 || true
  die "the nodes did not become idle within 60 s"
}

down() {
  local jobs i file
  if alive "$RUN_DIR/slurmctld.pid" slurmctld; then
    jobs="$(squeue -h -o %A 2>/dev/null | sort -u | tr '\n' ' ' || true)"
    if [ -n "${jobs// /}" ]; then
      # shellcheck disable=SC2086
      scancel $jobs 2>/dev/null || true
      for i in $(seq 1 75); do [ -z "$(squeue -h -o %A 2>/dev/null)" ] && break; sleep 0.2; done
    fi
  fi
  for file in "$RUN_DIR"/slurmd.*.pid; do [ -e "$file" ] && stop "$file" slurmd; done
  stop "$RUN_DIR/slurmctld.pid" slurmctld
  stop /run/munge/munged.pid munged
}

[ "$(id -u)" = 0 ] || skip "setting up Slurm needs root (it installs packages and starts daemons)"
mkdir -p /run/lock
exec 9>/run/lock/trainyard-slurm-env.lock
flock 9

case "$ACTION" in
  up)
    install_packages
    choose_hosts
    configure
    prepare
    if [ "$CHANGED" = 1 ]; then
      for file in "$RUN_DIR"/slurmd.*.pid; do [ -e "$file" ] && stop "$file" slurmd; done
      stop "$RUN_DIR/slurmctld.pid" slurmctld
    fi
    start
    wait_idle
    log "ready: $(sinfo -h -o '%P %D %c %m' | head -n1) (partition, nodes, CPUs, MB)"
    printf '%s\n' "$NODE_LIST"
    ;;
  status)
    for file in /run/munge/munged.pid "$RUN_DIR"/*.pid; do
      [ -e "$file" ] && printf '%s: pid %s\n' "$(basename "$file")" "$(cat "$file")"
    done
    sinfo -N -l || true
    ;;
  down) down ;;
  *) die "usage: $0 [up|status|down]" ;;
esac
