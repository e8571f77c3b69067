#!/usr/bin/env bash
# The CPU comparison in one command: for 1 process x 2 devices and for mpiexec.mpich -n 2
# (1 device each), on mesh x=2, f32:
#   - matmul in three cases (contracting A[U,x] @ B[x,U] -> replicated with its all-reduce,
#     row-sharded A[x,U] @ B[U,U], replicated) at n = 1024, 2048, 4096, beside single-process
#     OpenBLAS sgemm with 2 threads timed in the same run (bench_schemes matmul);
#   - relayouts [x,U] -> [U,x] and [x,U] -> [U,U] of a 4096^2 tensor, beside a 1-thread memcpy
#     of the same bytes timed in the same run (bench_schemes relayout --only);
#   - eager add of two f32[8] tensors, against one process with 1 device and with 2 devices
#     (bench_spmd dispatch);
#   - per matmul and relayout case: minor page faults per run, peak resident set and its excess
#     over the start, and the device allocator's peak above the operands beside the output;
#   - the contracting matmul from Python beside numpy (benchmarks/bench_python.py matmul), when
#     $PY can import numpy (the package is taken from $BUILD/bindings/python).
#
#   benchmarks/cpu.sh             # about 4 minutes on the idle 2-core machine
#   QUICK=1 benchmarks/cpu.sh     # n = 256, 512, relayouts of 1024^2, 2 reps: a smoke run
#
# Environment: BUILD (build), OUT (benchmarks/results/cpu), SIZES ("1024 2048 4096"), NREL
# (4096), REPS (5), PY (build/venv/bin/python; PY= skips Python), PYSIZES ("2048 4096").
# Writes one CSV per run and $OUT/cpu.md (the tables, also printed), via
# benchmarks/cpu_report.py. Timings on a shared
# machine are noisy: read the ratios, each against its baseline of the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
OUT=${OUT:-benchmarks/results/cpu}
PY=${PY-build/venv/bin/python}
if [ -n "${QUICK:-}" ]; then
    SIZES=${SIZES:-"256 512"}
    PYSIZES=${PYSIZES:-"512"}
    NREL=${NREL:-1024}
    REPS=${REPS:-2}
else
    SIZES=${SIZES:-"1024 2048 4096"}
    PYSIZES=${PYSIZES:-"2048 4096"}
    NREL=${NREL:-4096}
    REPS=${REPS:-5}
fi
MPIEXEC=mpiexec.mpich
# OpenBLAS threads are the library's business (one per device here); the baselines ask for 2.
unset OPENBLAS_NUM_THREADS

start=$(date +%s)
say() { echo "[cpu.sh $(($(date +%s) - start))s] $*" >&2; }
mkdir -p "$OUT"
rm -f "$OUT"/*.csv
ninja -C "$BUILD" benchmarks/bench_schemes benchmarks/bench_spmd >/dev/null
B=$BUILD/benchmarks
PAIRS='x,unsharded>unsharded,x;x,unsharded>unsharded,unsharded'

# config name, then the launcher words
configs=("1x2" "n2")
launch() {
    if [ "$1" = 1x2 ]; then
        env DTENSOR_CPU_DEVICES=2 "${@:2}"
    else
        env DTENSOR_CPU_DEVICES=1 $MPIEXEC -n 2 "${@:2}"
    fi
}

for cfg in "${configs[@]}"; do
    for n in $SIZES; do
        say "$cfg: matmul n=$n"
        launch "$cfg" "$B/bench_schemes" matmul --n "$n" --dtype f32 --mesh x=2 --reps "$REPS" \
            --schemes contracting_allreduce,row,replicated --out "$OUT/matmul_${cfg}_$n.csv"
    done
    say "$cfg: relayouts of ${NREL}^2 f32"
    launch "$cfg" "$B/bench_schemes" relayout --n "$NREL" --dtype f32 --mesh x=2 --reps "$REPS" \
        --only "$PAIRS" --out "$OUT/relayout_$cfg.csv"
    say "$cfg: eager dispatch"
    launch "$cfg" "$B/bench_spmd" dispatch >"$OUT/dispatch_$cfg.csv"
done

say "1 process x 1 device: eager dispatch (the baseline of the dispatch rows)"
env DTENSOR_CPU_DEVICES=1 "$B/bench_spmd" dispatch >"$OUT/dispatch_1x1.csv"

if [ -n "$PY" ] && "$PY" -c 'import numpy' 2>/dev/null; then
    for cfg in "${configs[@]}"; do
        say "$cfg: contracting matmul from Python, n = $PYSIZES"
        # shellcheck disable=SC2086 # PYSIZES is a list
        launch "$cfg" env PYTHONPATH="$BUILD/bindings/python" "$PY" benchmarks/bench_python.py \
            matmul $PYSIZES >"$OUT/python_$cfg.csv"
    done
else
    say "Python skipped: PY='$PY' cannot import numpy"
fi

/usr/bin/python3 benchmarks/cpu_report.py "$OUT" | tee "$OUT/cpu.md"
say "done: $OUT/cpu.md"
