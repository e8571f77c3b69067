#!/usr/bin/env bash
# On the GPU machine, from the project's root, with .device/ carried (scripts/gpu_prepare.sh
# fills it here): builds build-gpu/ with -Dcuda=enabled -Dwerror=true and runs the steps named:
#   bash scripts/gpu_check.sh [build] [cuda] [suite] [sanitize] [bench] [cmd 'COMMAND']
#     build     configure (once) and build; always done first
#     cuda      the GPU suites (tests/cuda), each test alone, with its output (ONLY: a regex of
#               suite/test names)
#     suite     every other suite (meson test), as CI runs them, on this machine, in the
#               background while the steps after it run
#     sanitize  compute-sanitizer memcheck over the GPU suites (SAN_ONLY: a regex of the tests)
#     bench     benchmarks/gpu.sh (CSV, JSON, plot)
#     cmd C     any command, in this environment, after the build
# Logs go to build-gpu/check/, packed at the end into $OUT/check.tgz when $OUT is set (the
# device tool's returned folder); one summary line per step on stdout. T_CUDA, T_SUITE, T_SAN,
# T_BENCH, T_CMD cap a step's seconds (defaults below); DEADLINE=seconds caps the whole run
# (a step that would start past it is skipped, so the logs still come back).
set -uo pipefail
cd "$(dirname "$0")/.."
source .device/env.sh
# HDF5 and jansson into the same sysroot as the shared packages; their libraries' own needs
# only where this system has no library of that name (a Debian copy must not shadow Ubuntu's).
if [ ! -f /opt/deb/.extra ]; then
    for f in .device/extra/*.deb; do dpkg -x "$f" /opt/deb; done
    mkdir -p /opt/debfb/root /opt/debfb/lib
    for f in .device/extra/fb/*.deb; do dpkg -x "$f" /opt/debfb/root; done
    have=$(ldconfig -p)
    for so in $(find /opt/debfb/root -name 'lib*.so.*'); do
        n=$(basename "$so")
        grep -q "^[[:space:]]$n " <<<"$have" || ln -sf "$so" /opt/debfb/lib/"$n"
    done
    touch /opt/deb/.extra
fi
export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/opt/debfb/lib
export HWLOC_PLUGINS_BLACKLIST=hwloc_pci
log=build-gpu/check
rm -rf "$log"
mkdir -p "$log"
trap 'wait; [ -n "${OUT:-}" ] && tar czf "$OUT/check.tgz" -C build-gpu check' EXIT
step() { # step NAME SECONDS COMMAND...: run, log, one summary line
    local name=$1 t=$2 s0=$SECONDS rc left=$((${DEADLINE:-100000} - SECONDS))
    shift 2
    ((left < 10)) && { printf '%-28s skipped: past DEADLINE\n' "$name"; return; }
    ((t > left)) && t=$left
    timeout -k 5 "$t" "$@" >"$log/$name.log" 2>&1
    rc=$?
    printf '%-28s rc=%-3s %4ss  %s\n' "$name" "$rc" $((SECONDS - s0)) \
        "$(grep -E 'Synthesis|^Ok:|^Fail:|error:|Error' "$log/$name.log" | tail -2 | tr '\n' ' ' | cut -c1-150)"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
s0=$SECONDS
if [ ! -f build-gpu/build.ninja ]; then
    meson setup build-gpu -Dcuda=enabled -Dwerror=true -Dpython=disabled ${MESON_ARGS:-} \
        >"$log/setup.log" 2>&1 || { tail -30 "$log/setup.log"; exit 1; }
fi
grep -A2 Features "$log/setup.log" 2>/dev/null | tail -2
if ! ninja -C build-gpu >"$log/build.log" 2>&1; then
    echo "BUILD FAILED with -Dwerror=true (build.log); retrying without it to run the tests"
    grep -E 'error|warning' "$log/build.log" | head -20
    meson configure build-gpu -Dwerror=false >/dev/null && ninja -C build-gpu >"$log/build2.log" 2>&1 ||
        { tail -40 "$log/build2.log"; exit 1; }
fi
echo "build: $((SECONDS - s0)) s"
cuda_tests() { # PREFIX LOGNAME...: each GPU test on its own (one hang costs one test), those
    # whose suite/name matches $ONLY (an extended regex) when it is set
    local pre=$1
    shift
    for exe in build-gpu/tests/cuda/cuda_test_*; do
        [ -x "$exe" ] || continue
        for t in $("$exe" --list 2>/dev/null | awk '/^[a-z_0-9]+:/{s=$1; sub(":","",s)} /──|├|└/{print s "/" $NF}'); do
            [[ -z "${ONLY:-}" || "$t" =~ $ONLY ]] || continue
            step "$pre${t//\//.}" "${T_CUDA:-120}" "$@" "$exe" -j1 --verbose --filter "$t"
        done
    done
}
while (($#)); do
    case "$1" in
    build) ;;
    cuda) cuda_tests "" ;;
    suite) step suite "${T_SUITE:-300}" bash -c 'meson test -C build-gpu --no-suite cuda \
               --num-processes 12 --print-errorlogs; r=$?; cp build-gpu/meson-logs/testlog.txt \
               build-gpu/check/suite-testlog.txt; exit $r' & ;;
    sanitize) ONLY=${SAN_ONLY:-} T_CUDA=${T_SAN:-300} cuda_tests san. compute-sanitizer \
                  --tool memcheck --error-exitcode 9 ;;
    bench) step bench "${T_BENCH:-240}" env BUILD=build-gpu OUT="$log/bench" benchmarks/gpu.sh
           cat "$log/bench/gpu.csv" 2>/dev/null ;;
    cmd) step cmd "${T_CMD:-300}" bash -c "$2"; shift; tail -40 "$log/cmd.log" ;;
    *) echo "unknown step $1"; exit 2 ;;
    esac
    shift
done
