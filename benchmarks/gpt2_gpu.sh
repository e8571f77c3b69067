#!/usr/bin/env bash
# GPT-2 small in bf16 on one GPU: dtensor (examples/gpt2 --device gpu, one device, the fused
# CUDA attention and fused elementwise chains) beside PyTorch eager with
# scaled_dot_product_attention on the same GPU (benchmarks/gpt2_torch.py --device cuda --dtype
# bf16), from the same initial weights (dtensor's checkpoint), batches and optimizer. Reports
# tokens/s of both, their ratio, and each side's model FLOPs utilisation:
#   MFU = tokens/s x (6 N + 12 L d T) / PEAK
# with N the parameters (embeddings included, as nanoGPT counts them), L layers, d_model d,
# sequence T (the attention's score and weighted-value products, forward and backward), over
# PEAK = 989e12, the H100 SXM's dense bf16 peak (PEAK_TFLOPS to change it). Needs a build with
# CUDA and a GPU; on the GPU machine it is the gpt2 step of scripts/gpu_check.sh.
#   benchmarks/gpt2_gpu.sh     # BUILD=build-gpu OUT=benchmarks/results/gpt2-gpu
# Environment: PYTHON (a Python with PyTorch and h5py; default python3), WARMUP (3), STEPS (20),
# BATCH (8), SEQ (1024), LAYERS (12). Writes $OUT/gpt2_gpu.csv and prints one summary line
# "gpt2 gpu bf16: ...".
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-gpu}
OUT=${OUT:-benchmarks/results/gpt2-gpu}
PYTHON=${PYTHON:-python3}
WARMUP=${WARMUP:-3}
STEPS=${STEPS:-20}
BATCH=${BATCH:-8}
SEQ=${SEQ:-1024}
LAYERS=${LAYERS:-12}
PEAK_TFLOPS=${PEAK_TFLOPS:-989}
mkdir -p "$OUT"
ninja -C "$BUILD" examples/gpt2 >/dev/null
model=(--layers "$LAYERS" --seq "$SEQ" --batch "$BATCH" --warmup "$WARMUP" --steps "$STEPS")
"$BUILD/examples/gpt2" --preset one --device gpu --dtype bf16 "${model[@]}" \
    --save-init "$OUT/init.h5" | tee "$OUT/dtensor.log"
params=$(sed -n 's/.*, \([0-9]*\) parameters,.*/\1/p' "$OUT/dtensor.log" | head -1)
dt=$(grep '^csv,' "$OUT/dtensor.log" | tail -1 | cut -d, -f5)
pt=0
if "$PYTHON" benchmarks/gpt2_torch.py --init "$OUT/init.h5" --mode eager --device cuda \
    --dtype bf16 "${model[@]}" | tee "$OUT/torch.log"; then
    pt=$(grep '^csv,' "$OUT/torch.log" | tail -1 | cut -d, -f5)
else
    echo "PyTorch side not run (rc $?: 3 is PyTorch or h5py missing): dtensor alone"
fi
d=$(sed -n 's/.*d_model \([0-9]*\),.*/\1/p' "$OUT/dtensor.log" | head -1)
awk -v n="$params" -v l="$LAYERS" -v d="$d" -v t="$SEQ" -v peak="$PEAK_TFLOPS" -v dt="$dt" \
    -v pt="$pt" 'BEGIN {
        f = 6 * n + 12 * l * d * t
        printf "side,tokens_per_second,mfu\n"
        printf "dtensor,%.1f,%.4f\n", dt, dt * f / (peak * 1e12)
        if (pt > 0) printf "pytorch-eager-sdpa,%.1f,%.4f\n", pt, pt * f / (peak * 1e12)
    }' | tee "$OUT/gpt2_gpu.csv"
awk -v n="$params" -v l="$LAYERS" -v d="$d" -v t="$SEQ" -v peak="$PEAK_TFLOPS" -v dt="$dt" \
    -v pt="$pt" -v b="$BATCH" 'BEGIN {
        f = 6 * n + 12 * l * d * t
        printf "gpt2 gpu bf16: %d layers, batch %s x %d tokens, %.0f FLOPs/token: dtensor %.0f tokens/s (MFU %.1f%%)",
               l, b, t, f, dt, 100 * dt * f / (peak * 1e12)
        if (pt > 0)
            printf ", PyTorch eager %.0f tokens/s (MFU %.1f%%): %.2f of PyTorch", pt,
                   100 * pt * f / (peak * 1e12), dt / pt
        else
            printf ", PyTorch not run"
        printf " (peak %s TFLOP/s)\n", peak
    }'
