#!/usr/bin/env bash
# Run an MPI job with its clients on several "hosts" of this machine: mpiexec.mpich's stand-in.
#
#   scripts/multihost.sh [-H HOSTS] [-p block|cyclic] MPIEXEC-ARGUMENTS...
#   e.g. scripts/multihost.sh -H 2 -p block -n 4 build/tests/mpi/mpi_coll_mpi
#   scripts/multihost.sh --check     (can hosts be made here? exit 0, or 77 and the reason)
#
# Each host is a Linux network namespace with its own address (10.77.0.K/24 on eth0, a veth
# pair into a bridge) together with its own UTS namespace (hostname hK) and IPC namespace, so
# that neither MPICH nor UCX can take shared memory between two hosts: clients of one host
# share memory as on one machine, clients of different hosts talk over TCP. The bridge and
# the launcher (mpiexec.mpich, which listens on 10.77.0.254) sit in one more namespace; the
# machine's own network is never touched. Every namespace is made for this run (named after
# its process id) and removed when it ends, also on failure or interrupt.
#
# Clients are placed on the hosts by MPICH's launcher, started into them through
# scripts/multihost-exec.sh (-launcher ssh -launcher-exec): -p cyclic (default) puts client i
# on host i mod HOSTS, -p block puts consecutive clients on one host (as many per host as
# MPICH's -n divided by HOSTS, rounded up). HOSTS defaults to DTENSOR_MULTIHOST_HOSTS or 2,
# the placement to DTENSOR_MULTIHOST_PLACE.
#
# Environment given to every client (the README's "Running on several hosts" explains why):
# UCX_NET_DEVICES=eth0 (UCX's TCP on the hosts' network, never on the loopback device), unless
# set already.
#
# Where hosts cannot be made (not root, no ip or unshare, namespaces, bridges or veth pairs
# forbidden), prints the reason and exits 77 (meson's skip); with DTENSOR_MULTIHOST_TAP=1 it
# prints a TAP plan that skips ("1..0 # SKIP reason") and exits 0 instead, for tests run with
# protocol 'tap'.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)

hosts=${DTENSOR_MULTIHOST_HOSTS:-2}
place=${DTENSOR_MULTIHOST_PLACE:-cyclic}
check=0
while [ $# -gt 0 ]; do
    case "$1" in
    -H) hosts=$2; shift 2 ;;
    -p) place=$2; shift 2 ;;
    --check) check=1; shift ;; # only whether hosts can be made here: 0, or 77 and the reason
    *) break ;;
    esac
done
case "$hosts" in [1-9]) ;; *) echo "multihost: -H takes 1 to 9 hosts, not '$hosts'" >&2; exit 2 ;; esac
case "$place" in block|cyclic) ;; *) echo "multihost: -p is block or cyclic, not '$place'" >&2; exit 2 ;; esac
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
[ $# -gt 0 ] || [ $check = 1 ] || { usage; exit 2; }

skip() {
    if [ "${DTENSOR_MULTIHOST_TAP:-0}" = 1 ]; then
        echo "1..0 # SKIP no namespace hosts: $*"
        exit 0
    fi
    echo "multihost: skipped: no namespace hosts: $*" >&2
    exit 77
}

[ "$(id -u)" = 0 ] || skip "network namespaces need root"
command -v ip >/dev/null || skip "ip (iproute2) is not installed"
command -v unshare >/dev/null || skip "unshare (util-linux) is not installed"
command -v mpiexec.mpich >/dev/null || skip "mpiexec.mpich is not installed"

prefix="dtmh$$"
sw="${prefix}s"
made=()
launcher=""
drop() { # a namespace of this harness: its processes, then its name
    ip netns pids "$1" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "$1" 2>/dev/null
}
cleanup() {
    local rc=$?
    trap - EXIT INT TERM HUP
    if [ -n "$launcher" ]; then # the launcher ends its clients; give it 3 s
        kill "$launcher" 2>/dev/null
        for _ in $(seq 30); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$launcher" 2>/dev/null
    fi
    for ns in "${made[@]}"; do drop "$ns"; done
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# namespaces of an earlier run that was killed outright (SIGKILL leaves no time to clean up)
for ns in $(ip netns list 2>/dev/null | grep -o '^dtmh[0-9]*[sh][0-9]*'); do
    pid=${ns#dtmh}
    kill -0 "${pid%%[sh]*}" 2>/dev/null || drop "$ns"
done

newns() {
    ip netns add "$1" 2>/dev/null || return 1
    made+=("$1")
    ip -n "$1" link set lo up
}
newns "$sw" || skip "cannot make a network namespace (ip netns add: $(ip netns add "$sw" 2>&1))"
ip -n "$sw" link add br0 type bridge 2>/dev/null &&
    ip -n "$sw" addr add 10.77.0.254/24 dev br0 &&
    ip -n "$sw" link set br0 up || skip "cannot make a bridge (ip link add type bridge)"
for i in $(seq 1 "$hosts"); do
    ns="${prefix}h$i"
    newns "$ns" &&
        ip -n "$sw" link add "v$i" type veth peer name eth0 netns "$ns" &&
        ip -n "$sw" link set "v$i" master br0 up &&
        ip -n "$ns" addr add "10.77.0.$i/24" dev eth0 &&
        ip -n "$ns" link set eth0 up || skip "cannot connect host h$i (ip link add type veth)"
done
# unshare must work inside the namespaces too (a sandbox may forbid new UTS/IPC namespaces)
ip netns exec "${prefix}h1" unshare --uts --ipc true 2>/dev/null ||
    skip "unshare --uts --ipc is not permitted"
[ $check = 0 ] || exit 0

# hosts h1..hN, each with the slots of its placement: cyclic gives one slot per host (MPICH's
# launcher then deals clients out one host after another), block as many as it takes
n=0
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do # every -n of the command line (MPMD: A : B)
    case "${args[$i]}" in -n | -np) n=$((n + ${args[$((i + 1))]:-1})) ;; esac
done
per=1
[ "$place" = block ] && per=$(((n + hosts - 1) / hosts))
list=""
for i in $(seq 1 "$hosts"); do list+="${list:+,}h$i:$per"; done

export DTENSOR_MULTIHOST_PREFIX=$prefix
export UCX_NET_DEVICES=${UCX_NET_DEVICES:-eth0}
ip netns exec "$sw" mpiexec.mpich -localhost 10.77.0.254 -launcher ssh \
    -launcher-exec "$here/multihost-exec.sh" -hosts "$list" "$@" &
launcher=$!
wait "$launcher"
rc=$?
launcher=""
exit $rc
