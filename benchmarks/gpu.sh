#!/usr/bin/env bash
# GPU benchmarks beside their baselines (benchmarks/bench_gpu.c has the cases): CSV, JSON and
# a plot (when matplotlib is importable) under $OUT. Needs a build with CUDA and a GPU; on the
# GPU machine it is the bench step of scripts/gpu_check.sh.
#   benchmarks/gpu.sh            # BUILD=build-gpu OUT=benchmarks/results/gpu REPS=10
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-gpu}
OUT=${OUT:-benchmarks/results/gpu}
REPS=${REPS:-10}
mkdir -p "$OUT"
if [ ! -f "$BUILD/build.ninja" ]; then
    meson setup "$BUILD" -Dcuda=enabled
fi
ninja -C "$BUILD" benchmarks/bench_gpu examples/gpt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
"$BUILD/benchmarks/bench_gpu" "$REPS" | tee "$OUT/gpu.csv"
# The kernels' targets, as ratios to a device copy measured in the same run
awk -F, '$1 == "allreduce_2gpu" && $2 == "256 MiB f32" { t["all-reduce between 2 logical GPUs (combine)", 0.45] = $5 }
         $1 == "philox_fill" { t["Philox uniform fill", 0.8] = $5 }
         END { for (k in t) { split(k, p, SUBSEP)
                   printf "target: %s %.3f of a device copy (>= %s): %s\n", p[1], t[k], p[2],
                          t[k] >= p[2] ? "met" : "NOT met" } }' "$OUT/gpu.csv" | tee "$OUT/targets.txt"
# The GPT example in bf16 on 4 logical GPUs of the one GPU (sharding "1" is one device), beside
# the same model in PyTorch eager on that GPU (benchmarks/gpt_torch.py; skipped without it)
DTENSOR_CUDA_DEVICES=4 "$BUILD/examples/gpt" bench 50 bf16 gpu | tee "$OUT/gpt.csv"
if python3 benchmarks/gpt_torch.py --steps 50 --dtype bf16 --device cuda | tee -a "$OUT/gpt.csv"; then
    awk -F, '$1 == "1" { d = $2 } $1 == "pytorch" { p = $2 }
             END { if (p > 0) printf "gpt bf16, one GPU: dtensor %.2f steps/s, PyTorch eager %.2f: %.2f\n", d, p, d / p }' \
        "$OUT/gpt.csv"
fi
python3 - "$OUT" <<'PY'
import csv, json, sys
out = sys.argv[1]
rows = list(csv.DictReader(open(f"{out}/gpu.csv")))
json.dump(rows, open(f"{out}/gpu.json", "w"), indent=1)
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    print("matplotlib not importable: no plot (CSV and JSON written)")
    sys.exit(0)
rated = [r for r in rows if float(r["baseline"]) > 0]
fig, ax = plt.subplots(figsize=(9, 0.4 * len(rated) + 1.5))
ax.barh([f'{r["case"]} {r["param"]}' for r in rated], [float(r["ratio"]) for r in rated])
ax.axvline(1.0, color="k", lw=0.8)
ax.set_xlabel("dtensor / baseline in the same run")
fig.tight_layout()
fig.savefig(f"{out}/gpu.png", dpi=120)
print(f"wrote {out}/gpu.csv, gpu.json, gpu.png")
PY
