#!/usr/bin/env bash
# GPT-2 trained by dtensor beside PyTorch, in one command and one run: the same model, initial
# weights (dtensor writes them as a checkpoint, benchmarks/gpt2_torch.py reads them with h5py),
# batches and optimizer; tokens per second, the peak resident set of the largest process and
# the loss of every step, for
#   - 1 process, 2 threads: dtensor on one device (OpenBLAS with 2 threads) vs PyTorch eager
#     and torch.compile (2 threads);
#   - mpiexec.mpich -n 2 (1 device, 1 thread each): data parallel vs DDP (gloo), fully sharded
#     vs FSDP2's fully_shard, tensor parallel vs parallelize_module (torchrun, 1 thread each);
#   - 1 process x 2 devices: dtensor's data parallel, fully sharded and tensor parallel presets.
# GPT-2 small (12 layers, d_model 768, vocabulary 50257) at sequence 128 and a global batch of
# 4, 2 warm-up and 5 timed steps; QUICK=1: 2 layers.
#
#   benchmarks/gpt2.sh            # GPT-2 small; several minutes on the idle 2-core machine
#   QUICK=1 benchmarks/gpt2.sh    # 2 layers
#
# Environment: BUILD (build), OUT (benchmarks/results/gpt2), VENV (build/venv-torch: created
# with PyTorch, numpy, h5py and matplotlib from the Python registry when missing; the registry's
# Linux wheel is the CUDA build, which runs on the CPU), WARMUP (2), STEPS (5), LAYERS (12, or 2
# with QUICK), COMPILE (1; 0 skips torch.compile), MODEL (more flags of both sides, e.g.
# "--d-model 64 --heads 4 --vocab 500 --seq 16 --batch 8" for a smoke run). Writes $OUT/gpt2.csv (one row per
# configuration: config, side, processes, tokens_per_second, peak_rss_mib, state_bytes,
# step_peak_bytes, hidden_share (dtensor: the share of communication time hidden behind compute,
# from the ledger's start and end times), then the losses), failed.csv (config,side of each
# configuration that failed), gpt2.json, gpt2.md (the table, also printed) and gpt2.png,
# through benchmarks/gpt2_report.py. Timings on a shared machine are noisy: read the ratios,
# each against its counterpart of the same run, and note the load printed with them.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
OUT=${OUT:-benchmarks/results/gpt2}
VENV=${VENV:-build/venv-torch}
WARMUP=${WARMUP:-2}
STEPS=${STEPS:-5}
LAYERS=${LAYERS:-$([ -n "${QUICK:-}" ] && echo 2 || echo 12)}
COMPILE=${COMPILE:-1}
MPIEXEC=mpiexec.mpich
# OpenBLAS threads are the library's business (the cores per device); PyTorch's are set below.
unset OPENBLAS_NUM_THREADS

start=$(date +%s)
say() { echo "[gpt2.sh $(($(date +%s) - start))s] $*" >&2; }
mkdir -p "$OUT"
rm -f "$OUT"/gpt2.csv "$OUT"/failed.csv "$OUT"/*.log
if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV"
    /usr/bin/python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c 'import torch, h5py, numpy' 2>/dev/null; then
    say "installing PyTorch, numpy, h5py and matplotlib into $VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check torch numpy h5py matplotlib \
        >"$OUT/pip.log" 2>&1
fi
if [ ! -f "$BUILD/build.ninja" ]; then  # a fresh clone: configure it as scripts/build.sh plain
    say "configuring $BUILD"
    meson setup "$BUILD" -Dwerror=true >"$OUT/setup.log"
fi
ninja -C "$BUILD" examples/gpt2 >/dev/null
# shellcheck disable=SC2206 # MODEL is a list of flags
ARGS=(--layers "$LAYERS" --warmup "$WARMUP" --steps "$STEPS" ${MODEL:-})
INIT=$OUT/init.h5
say "load: $(cut -d' ' -f1-3 /proc/loadavg); ${LAYERS} layers, $WARMUP + $STEPS steps"

# config label, side; then the command; its csv line goes to gpt2.csv prefixed by both, or,
# when it fails or prints none, "config,side" to failed.csv (the report names it)
run() {
    local config=$1 side=$2 log
    shift 2
    log="$OUT/$config-$side.log"
    say "$config $side: $*"
    if "$@" >"$log" 2>&1 && grep -q '^csv,' "$log"; then
        grep '^csv,' "$log" | sed "s/^csv,[^,]*,/$config,$side,/" | tail -1 >>"$OUT/gpt2.csv"
        grep '^csv,' "$log" | tail -1 | cut -d, -f2-6 | sed 's/^/    /' >&2
    else
        say "$config $side failed (see $log):"
        tail -3 "$log" >&2
        echo "$config,$side" >>"$OUT/failed.csv"
    fi
}
torchrun() {
    MASTER_ADDR=127.0.0.1 "$VENV/bin/torchrun" --standalone --nproc_per_node "$@"
}
TORCH=(benchmarks/gpt2_torch.py --init "$INIT" "${ARGS[@]}")

# 1 process, 2 threads (dtensor writes the initial parameters here)
run 1proc dtensor env DTENSOR_CPU_DEVICES=1 "$BUILD/examples/gpt2" "${ARGS[@]}" --save-init "$INIT"
run 1proc torch-eager "$VENV/bin/python" "${TORCH[@]}" --mode eager --threads 2
if [ "$COMPILE" = 1 ]; then
    run 1proc torch-compile "$VENV/bin/python" "${TORCH[@]}" --mode compile --threads 2
fi
# two processes of 1 device (1 thread) each
for pair in data:ddp fsdp:fsdp tensor:tp; do
    run "n2-${pair%%:*}" dtensor env DTENSOR_CPU_DEVICES=1 $MPIEXEC -n 2 "$BUILD/examples/gpt2" \
        "${ARGS[@]}" --preset "${pair%%:*}"
    run "n2-${pair%%:*}" "torch-${pair##*:}" torchrun 2 "${TORCH[@]}" --mode "${pair##*:}" \
        --threads 1
done
# 1 process x 2 devices
for preset in data fsdp tensor; do
    run "1x2-$preset" dtensor env DTENSOR_CPU_DEVICES=2 "$BUILD/examples/gpt2" "${ARGS[@]}" \
        --preset "$preset"
done
say "load: $(cut -d' ' -f1-3 /proc/loadavg)"
"$VENV/bin/python" benchmarks/gpt2_report.py "$OUT"
say "done: $OUT/gpt2.csv, gpt2.json, gpt2.md, gpt2.png"
