#!/bin/sh
# The launcher of scripts/multihost.sh: MPICH's launcher calls it as it would call ssh,
#   multihost-exec.sh [ssh options] HOST COMMAND...
# and it runs COMMAND (MPICH's proxy, which starts the host's clients) on HOST: inside that
# host's network namespace, in new UTS and IPC namespaces named after the host.
while [ "${1#-}" != "$1" ]; do shift; done # ssh's options (-x)
host=$1
shift
case "$host" in h[1-9]) ;; *) echo "multihost-exec: unknown host '$host'" >&2; exit 1 ;; esac
# like ssh, the command line is one string for a shell
exec ip netns exec "${DTENSOR_MULTIHOST_PREFIX:?}$host" unshare --uts --ipc \
    sh -c "hostname $host && exec $*"
