#!/usr/bin/env bash
# The sharding-scheme comparison in one command: calibration, matmul under every
# scheme beside OpenBLAS and ScaLAPACK, every relayout, collectives against raw MPI, then CSV,
# JSON, plots and the projection (benchmarks/report.py). See benchmarks/README.md.
#
#   benchmarks/run.sh                 # n = 4096 f64 at -n 2, 2-D mesh at -n 2 x 2 devices
#   N=2048 DTYPE=f32 REPS=3 benchmarks/run.sh
#
# Environment: N (4096), N2D (2048: the 2x2 mesh, 4 devices on this 2-core machine), DTYPE
# (f64), REPS (5), WARMUP (1), BUILD (build-bench), OUT (benchmarks/results), VENV
# (build/venv; matplotlib is installed there when missing), COLL_MAX (bytes, 64 MiB).
# Progress goes to stderr; a log of every step to $OUT/run.log.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-4096}
N2D=${N2D:-2048}
NREL=${NREL:-1024}
DTYPE=${DTYPE:-f64}
REPS=${REPS:-5}
WARMUP=${WARMUP:-1}
BUILD=${BUILD:-build-bench}
OUT=${OUT:-benchmarks/results}
VENV=${VENV:-build/venv}
COLL_MAX=${COLL_MAX:-67108864}
MPIEXEC=mpiexec.mpich
# ranks x threads would exceed the cores (docs/ARCHITECTURE.md, toolchain)
export OPENBLAS_NUM_THREADS=1

start=$(date +%s)
say() { echo "[run.sh $(($(date +%s) - start))s] $*" >&2; }
mkdir -p "$OUT"
: >"$OUT/run.log"

if [ ! -f "$BUILD/build.ninja" ]; then
    say "configuring $BUILD"
    meson setup "$BUILD" >>"$OUT/run.log"
fi
say "building"
ninja -C "$BUILD" benchmarks/bench_schemes benchmarks/bench_collectives >>"$OUT/run.log"
B=$BUILD/benchmarks
have_scalapack=0
if ninja -C "$BUILD" benchmarks/bench_scalapack >>"$OUT/run.log" 2>&1 &&
    [ -x "$B/bench_scalapack" ]; then
    have_scalapack=1
fi

common=(--dtype "$DTYPE" --reps "$REPS" --warmup "$WARMUP")
rm -f "$OUT"/*.csv "$OUT"/*.json "$OUT"/*.png

say "calibrating alpha, beta, gamma (-n 2)"
$MPIEXEC -n 2 "$B/bench_schemes" calibrate --out "$OUT/calibration.json"

say "matmul, 1-D mesh x=2 (-n 2), n=$N $DTYPE"
$MPIEXEC -n 2 "$B/bench_schemes" matmul --n "$N" "${common[@]}" --mesh x=2 \
    --out "$OUT/matmul_1d.csv"
if [ $have_scalapack = 1 ]; then
    say "ScaLAPACK baseline, grid 1x2 (-n 2), n=$N"
    $MPIEXEC -n 2 "$B/bench_scalapack" --n "$N" "${common[@]}" --grid 1x2 \
        --out "$OUT/scalapack_1d.csv"
else
    say "no ScaLAPACK (libscalapack-mpich-dev): skipping its baseline"
fi

say "matmul, 2-D mesh x=2,y=2 (-n 2, 2 devices each), n=$N2D $DTYPE"
DTENSOR_CPU_DEVICES=2 $MPIEXEC -n 2 "$B/bench_schemes" matmul --n "$N2D" "${common[@]}" \
    --mesh x=2,y=2 --threads 2 --out "$OUT/matmul_2d.csv"
if [ $have_scalapack = 1 ]; then
    say "ScaLAPACK baseline, grid 2x2 (-n 4, oversubscribed), n=$N2D"
    $MPIEXEC -n 4 "$B/bench_scalapack" --n "$N2D" --dtype "$DTYPE" --reps 3 --warmup 1 \
        --grid 2x2 --out "$OUT/scalapack_2d.csv"
fi

say "relayout, every transition on x=2 (-n 2) and x=2,y=2 (-n 2 x 2 devices), n=$NREL"
$MPIEXEC -n 2 "$B/bench_schemes" relayout --n "$NREL" --dtype "$DTYPE" --reps 3 --mesh x=2 \
    --out "$OUT/relayout_1d.csv"
DTENSOR_CPU_DEVICES=2 $MPIEXEC -n 2 "$B/bench_schemes" relayout --n "$NREL" --dtype "$DTYPE" \
    --reps 3 --mesh x=2,y=2 --out "$OUT/relayout_2d.csv"

say "collectives against raw MPI (-n 2, up to $COLL_MAX bytes)"
$MPIEXEC -n 2 "$B/bench_collectives" sweep "$COLL_MAX" >"$OUT/collectives.csv"

if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV"
    /usr/bin/python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c 'import matplotlib' 2>/dev/null; then
    say "installing matplotlib into $VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check matplotlib >>"$OUT/run.log" 2>&1 ||
        say "matplotlib could not be installed: CSV and JSON only"
fi
say "report: JSON, projection, plots"
"$VENV/bin/python" benchmarks/report.py "$OUT"
say "done in $(($(date +%s) - start)) s: $OUT"
