#!/usr/bin/env bash
# Every GPU check in one call. On the GPU machine, from the project's root, with .device/ carried
# (scripts/gpu_prepare.sh fills it here):
#   DEADLINE=540 bash scripts/gpu_check.sh build cuda suite sanitize bench
# builds build-gpu/ (-Dcuda=enabled -Dwerror=true, sm_90 only: GPU_ARCHS) and runs the steps named:
#     build     configure (once) and build; always done first
#     cuda      the GPU suites (tests/cuda: the differential test on GPU meshes, random numbers,
#               transfers, the allocator, NCCL with one rank per communicator after a long
#               producer, bf16 rounded once, the fused attention against the CPU's, fused
#               elementwise chains bitwise the unfused), each test alone (ONLY: a regex of
#               suite/test names)
#     suite     in the background while the steps after it run: every other meson suite, then
#               the Python suite (bindings/python/tests, GPU meshes and DLPack with PyTorch on
#               the GPU included) in a venv over the system's numpy, PyTorch, pytest, ml_dtypes
#               and h5py (and the wheels of .device/wheels, where that folder exists)
#     sanitize  compute-sanitizer memcheck and racecheck over every GPU test (the diff test's
#               every mesh included), SAN_JOBS at a time (SAN_ONLY: a regex of the tests)
#     bench     benchmarks/gpu.sh: the kernels against their targets (all-reduce between two
#               logical GPUs >= 0.45 of a device copy, Philox fill >= 0.8), and the bf16 GPT
#               against PyTorch eager
#     gpt2      benchmarks/gpt2_gpu.sh: GPT-2 small in bf16 on one GPU (examples/gpt2 --device
#               gpu) beside PyTorch eager with scaled_dot_product_attention (the system's
#               PyTorch, h5py from the Python suite's venv when it has one), tokens/s and MFU
#     cmd C     any command, in this environment, after the build
# A step that would start past DEADLINE (seconds since the start) is skipped and says so; T_CUDA,
# T_SUITE, T_SAN, T_BENCH, T_GPT2, T_CMD cap each. Logs go to build-gpu/check/ and are packed into
# $OUT/check.tgz; the summary (one line per step and per failing test) ends the output and is
# also $OUT/summary.txt.
#
# Without a GPU (here): GPU_CHECK_EMULATE=1 runs the same steps on GPUs emulated on the host
# (DTENSOR_EMULATE_CUDA=1, build-gpu-emu/, this machine's packages, no .device/): the script's
# logic, the GPU suites' emulated runs and the Python suite; sanitize and bench say they need a
# GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
emulate=${GPU_CHECK_EMULATE:-0}
if [ "$emulate" = 1 ]; then
    build=build-gpu-emu
    export DTENSOR_EMULATE_CUDA=1 OPENBLAS_NUM_THREADS=1
else
    build=build-gpu
    source scripts/gpu_env.sh
    # the libraries HDF5 loads only where this system has no library of that name (a Debian
    # copy must not shadow Ubuntu's)
    if [ ! -f /opt/deb/.extra ]; then
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
fi
export HWLOC_PLUGINS_BLACKLIST=hwloc_pci
log=$build/check
rm -rf "$log"
mkdir -p "$log"
summary=$log/summary.txt
: >"$summary"
t_start=$SECONDS
finish() {
    wait
    {
        echo "== summary ($(( SECONDS - t_start )) s)"
        cat "$summary"
    } | tee "$log/summary.final"
    if [ -n "${OUT:-}" ]; then
        cp "$log/summary.final" "$OUT/summary.txt"
        tar czf "$OUT/check.tgz" -C "$build" check
    fi
}
trap finish EXIT
note() { printf '%s\n' "$*" | tee -a "$summary"; }
left() { echo $(( ${DEADLINE:-100000} - (SECONDS - t_start) )); }
# step NAME SECONDS COMMAND...: run under a cap, log, one summary line (PASS, FAIL rc, SKIP)
step() {
    local name=$1 t=$2 s0=$SECONDS rc l
    shift 2
    l=$(left)
    past_deadline=0
    if ((l < 10)); then
        note "$(printf '%-44s SKIP  past DEADLINE' "$name")"
        past_deadline=1
        return 0
    fi
    ((t > l)) && t=$l
    timeout -k 5 "$t" "$@" >"$log/$name.log" 2>&1
    rc=$?
    local what=PASS
    ((rc == 124 || rc == 137)) && what="TIMEOUT after ${t}s"
    ((rc != 0 && rc != 124 && rc != 137)) && what="FAIL rc=$rc"
    note "$(printf '%-44s %-5s %4ss  %s' "$name" "${what%% *}" $((SECONDS - s0)) \
        "$( ((rc)) && grep -E 'Synthesis|^Ok:|^Fail:|error|Error|not ok|FAIL' "$log/$name.log" |
            tail -2 | tr '\n' ' ' | cut -c1-140)")"
    return $rc
}

if [ "$emulate" = 1 ]; then
    note "device: none (GPU_CHECK_EMULATE=1: GPUs emulated on the host)"
else
    note "device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader)"
fi

# ---- build ------------------------------------------------------------------------------------
s0=$SECONDS
if [ ! -f $build/build.ninja ]; then
    if [ "$emulate" = 1 ]; then
        opts=(-Dcuda=disabled -Dwerror=true)
    else
        # the C suites only: the machine has an interpreter without its headers (Python.h)
        opts=(-Dcuda=enabled -Dwerror=true -Dgpu_archs=${GPU_ARCHS:-90} -Dpython=disabled)
    fi
    meson setup $build "${opts[@]}" ${MESON_ARGS:-} >"$log/setup.log" 2>&1 ||
        { note "build                                        FAIL  (meson setup: setup.log)"; tail -30 "$log/setup.log"; exit 1; }
fi
grep -A3 Features "$log/setup.log" 2>/dev/null | tail -2
if ! ninja -C $build >"$log/build.log" 2>&1; then
    note "build                                        FAIL  with -Dwerror=true (build.log); retried without it"
    grep -E 'error|warning' "$log/build.log" | head -20 | tee -a "$summary"
    meson configure $build -Dwerror=false >/dev/null && ninja -C $build >"$log/build2.log" 2>&1 ||
        { tail -40 "$log/build2.log"; exit 1; }
else
    note "$(printf '%-44s %-5s %4ss' build PASS $((SECONDS - s0)))"
fi

# ---- the GPU tests, each alone ----------------------------------------------------------------
gpu_tests() { # every suite/test of the GPU executables, as "exe suite/test"
    for exe in $build/tests/cuda/cuda_test_*; do
        [ -x "$exe" ] || continue
        "$exe" --list 2>/dev/null | awk -v e="$exe" '/^[a-z_0-9]+:/{s=$1; sub(":","",s)}
            /──|├|└/{print e, s "/" $NF}'
    done
}
cuda_step() {
    local ok=0 bad=0 skipped=0
    while read -r exe t; do
        [[ -z "${ONLY:-}" || "$t" =~ $ONLY ]] || continue
        if step "cuda.${t//\//.}" "${T_CUDA:-150}" "$exe" -j1 --verbose --filter "$t"; then
            if ((past_deadline)); then # not run: no verdict
                skipped=$((skipped + 1))
            elif grep -q "Synthesis: Tested: 0 " "$log/cuda.${t//\//.}.log"; then # cr_skip_test
                skipped=$((skipped + 1))
            else
                ok=$((ok + 1))
            fi
        else
            bad=$((bad + 1))
        fi
    done < <(gpu_tests)
    note "cuda: $ok passed, $bad failed, $skipped skipped"
}

# ---- the other suites and the Python suite ------------------------------------------------------
python_suite() {
    local py=python3 venv=${PYENV:-$build/pyenv}
    if ! ls $build/bindings/python/dtensor/_dtensor*.so >/dev/null 2>&1; then
        echo "SKIP: the Python extension was not built (no Python headers on this machine)"
        return 0
    fi
    if [ ! -x $venv/bin/python ]; then
        $py -m venv --system-site-packages $venv || { echo "SKIP: no venv"; return 0; }
        if [ -d .device/wheels ]; then
            $venv/bin/pip install -q --no-index --find-links .device/wheels pytest ml_dtypes h5py ||
                $venv/bin/pip install -q --no-index --find-links .device/wheels pytest ml_dtypes
        fi
    fi
    $venv/bin/python -c "import pytest, ml_dtypes, numpy" ||
        { echo "SKIP: pytest, ml_dtypes or numpy missing in $venv"; return 0; }
    local ignore=()
    $venv/bin/python -c "import h5py" 2>/dev/null ||
        ignore=(--ignore=bindings/python/tests/test_checkpoint.py)
    export PYTHONPATH=$root/$build/bindings/python
    $venv/bin/python -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" || true
    echo "== one client"
    $venv/bin/python -m pytest -q -p no:cacheprovider bindings/python/tests "${ignore[@]}" -rs || return 1
    echo "== two clients"
    # rank 0 prints to the inherited output (reopening /dev/stdout would truncate the step's log)
    mpiexec.mpich -n 2 sh -c '[ "${PMI_RANK:-0}" = 0 ] || exec >/dev/null; exec 2>&1;
        exec '"$venv"'/bin/python -m pytest -q -p no:cacheprovider bindings/python/tests '"${ignore[*]}"' -rs'
}
suite_step() {
    step suite "${T_SUITE:-360}" bash -c "meson test -C $build --no-suite cuda --num-processes ${SUITE_JOBS:-12} \
        --print-errorlogs; r=\$?; cp $build/meson-logs/testlog.txt $log/suite-testlog.txt; exit \$r"
    grep -E '^(Ok|Fail|Skipped|Timeout):' "$log/suite.log" | tr '\n' ' ' | sed 's/^/suite: /' >>"$summary"
    echo >>"$summary"
    export -f python_suite
    step python "${T_SUITE:-360}" bash -c "build=$build root=$root PYENV=${PYENV:-} python_suite"
    grep -E '[0-9]+ (passed|failed|skipped)' "$log/python.log" | tail -2 | sed 's/^/python: /' >>"$summary"
}

# ---- compute-sanitizer --------------------------------------------------------------------------
sanitize_step() {
    local san=${SANITIZER:-compute-sanitizer}
    command -v $san >/dev/null || san=/usr/local/cuda/bin/compute-sanitizer
    if [ "$emulate" = 1 ] || ! [ -x "$san" ] && ! command -v "$san" >/dev/null; then
        note "sanitize                                     SKIP  needs a GPU and compute-sanitizer"
        return 0
    fi
    local list=$log/san.list
    gpu_tests | while read -r exe t; do
        [[ -z "${SAN_ONLY:-}" || "$t" =~ $SAN_ONLY ]] || continue
        for tool in memcheck racecheck; do echo "$tool $exe $t"; done
    done >"$list"
    # SAN_JOBS runs at a time; each writes its log and one result line
    export san log
    xargs -P "${SAN_JOBS:-4}" -L 1 bash -c '
        tool=$0 exe=$1 t=$2 name=san.$0.${2//\//.}
        timeout -k 5 '"${T_SAN:-300}"' $san --tool $tool --error-exitcode 9 "$exe" -j1 --filter "$t" \
            >"$log/$name.log" 2>&1
        rc=$?
        err=$(grep -Eo "ERROR SUMMARY: [0-9]+ errors|RACECHECK SUMMARY: [0-9]+ hazards[^\n]*" "$log/$name.log" | tail -1)
        printf "%-60s rc=%-3s %s\n" "$name" "$rc" "$err" >"$log/$name.result"' <"$list"
    local bad=0 ok=0
    for f in "$log"/san.*.result; do
        [ -f "$f" ] || continue
        if grep -q "rc=0 " "$f"; then ok=$((ok + 1)); else bad=$((bad + 1)); cat "$f" >>"$summary"; fi
    done
    note "sanitize (memcheck + racecheck): $ok clean, $bad with errors or failing"
}

# ---- benchmarks ---------------------------------------------------------------------------------
bench_step() {
    if [ "$emulate" = 1 ]; then
        note "bench                                        SKIP  needs a GPU"
        return 0
    fi
    step bench "${T_BENCH:-240}" env BUILD=$build OUT="$log/bench" benchmarks/gpu.sh
    [ -f "$log/bench/targets.txt" ] && cat "$log/bench/targets.txt" >>"$summary"
    grep -h "gpt bf16" "$log/bench.log" >>"$summary" 2>/dev/null
}

# ---- GPT-2 small on one GPU beside PyTorch ------------------------------------------------------
gpt2_step() {
    if [ "$emulate" = 1 ]; then
        note "gpt2                                         SKIP  needs a GPU"
        return 0
    fi
    local py=python3
    [ -x "${PYENV:-$build/pyenv}/bin/python" ] && py=${PYENV:-$build/pyenv}/bin/python
    "$py" -c "import h5py" 2>/dev/null || py=python3
    step gpt2 "${T_GPT2:-300}" env BUILD=$build OUT="$log/gpt2" PYTHON="$py" benchmarks/gpt2_gpu.sh
    grep -h "^gpt2 gpu" "$log/gpt2.log" >>"$summary" 2>/dev/null
}

while (($#)); do
    case "$1" in
    build) ;;
    cuda) cuda_step ;;
    suite) suite_step & ;;
    sanitize) sanitize_step ;;
    bench) bench_step ;;
    gpt2) gpt2_step ;;
    cmd) step cmd "${T_CMD:-300}" bash -c "$2"; shift; tail -40 "$log/cmd.log" ;;
    *) echo "unknown step $1"; exit 2 ;;
    esac
    shift
done
