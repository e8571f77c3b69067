#!/bin/sh
# kill -9 in the middle of a save: a checkpoint A is saved; a save of B over the same path is
# started and one client kills itself with SIGKILL after the second tensor is written; A must
# still load whole, and a later save over the leftover .tmp must work. At -n 2 (client 1
# dies), at -n 4 with 2 devices each... kept to what 2 cores run quickly, and for a single
# client without a launcher. TAP on stdout. Usage: ckpt_kill.sh MPIEXEC CKPT_PROGRAM
mpiexec=$1
exe=$2
dir=$(mktemp -d /tmp/dtensor-kill-XXXXXX) || exit 1
trap 'rm -rf "$dir"' EXIT
n=0
fail=0
step() {
    desc=$1
    shift
    n=$((n + 1))
    if "$@" >"$dir/log" 2>&1; then
        echo "ok $n - $desc"
    else
        echo "not ok $n - $desc"
        sed 's/^/# /' "$dir/log"
        fail=1
    fi
}
dies() { # the command must fail (a client was killed)
    if "$@"; then return 1; fi
    return 0
}
f=$dir/ckpt.h5
for run in "2 1 2" "4 3 1" "1 0 4"; do
    set -- $run
    clients=$1
    victim=$2
    devices=$3
    if [ "$clients" = 1 ]; then launch=""; else launch="$mpiexec -n $clients"; fi
    rm -f "$f" "$f.tmp"
    step "[$clients clients] save A" env DTENSOR_CPU_DEVICES=$devices $launch "$exe" save "$f" 1
    step "[$clients clients] client $victim killed (SIGKILL) while saving B over it" \
        dies env DTENSOR_CPU_DEVICES=$devices DTENSOR_TEST_KILL_AFTER=1 \
        DTENSOR_TEST_KILL_RANK=$victim $launch "$exe" save "$f" 2
    step "[$clients clients] the save left its .tmp, not the checkpoint" test -f "$f.tmp"
    step "[$clients clients] A loads whole" env DTENSOR_CPU_DEVICES=$devices $launch "$exe" restore "$f" 1
    step "[$clients clients] a new save over the leftover .tmp, then it loads" sh -c \
        "DTENSOR_CPU_DEVICES=$devices $launch '$exe' save '$f' 3 && DTENSOR_CPU_DEVICES=$devices $launch '$exe' restore '$f' 3 && test ! -f '$f.tmp'"
done
echo "1..$n"
exit $fail
