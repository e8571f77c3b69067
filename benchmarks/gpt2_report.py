"""The tables of benchmarks/gpt2.sh from its gpt2.csv: gpt2.json, gpt2.md (also printed) and
gpt2.png (tokens per second per configuration; when matplotlib is importable).

Rows of gpt2.csv: config, side, devices, processes, tokens_per_second, peak_rss_mib (largest
process), state_bytes and step_peak_bytes (dtensor's allocator, busiest device), hidden_share
(dtensor: the share of client 0's communication time in the timed steps hidden behind its
compute, from the ledger), then the loss of every step. Each dtensor configuration is read against its PyTorch counterpart of the same
run; the loss curves against each other (the largest relative difference from the first
row's curve, over the steps every row has).

    python gpt2_report.py benchmarks/results/gpt2
"""
import csv
import json
import os
import sys

COUNTERPARTS = {  # dtensor configuration -> the PyTorch row it is read against
    ("1proc", "dtensor"): [("1proc", "torch-eager"), ("1proc", "torch-compile")],
    ("n2-data", "dtensor"): [("n2-data", "torch-ddp")],
    ("n2-fsdp", "dtensor"): [("n2-fsdp", "torch-fsdp")],
    ("n2-tensor", "dtensor"): [("n2-tensor", "torch-tp")],
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/gpt2"
    rows = []
    with open(os.path.join(out, "gpt2.csv")) as f:
        for r in csv.reader(f):
            rows.append({"config": r[0], "side": r[1], "devices": int(r[2]),
                         "processes": int(r[3]), "tokens_per_second": float(r[4]),
                         "peak_rss_mib": float(r[5]),
                         "state_bytes": int(r[6]) if r[6] else None,
                         "step_peak_bytes": int(r[7]) if r[7] else None,
                         "hidden_share": float(r[8]) if r[8] else None,
                         "losses": [float(x) for x in r[9:]]})
    by = {(r["config"], r["side"]): r for r in rows}
    lines = ["| configuration | dtensor tokens/s | PyTorch | PyTorch tokens/s | ratio | "
             "peak RSS MiB dtensor / PyTorch | communication hidden |",
             "|---|---|---|---|---|---|---|"]
    ratios = []
    for r in rows:
        if r["side"] != "dtensor":
            continue
        pairs = [by[k] for k in COUNTERPARTS.get((r["config"], "dtensor"), []) if k in by]
        hidden = "" if r["hidden_share"] is None else f"{100 * r['hidden_share']:.0f}%"
        if not pairs:
            lines.append(f"| {r['config']} | {r['tokens_per_second']:.1f} | | | | "
                         f"{r['peak_rss_mib']:.0f} | {hidden} |")
        for t in pairs:
            ratio = r["tokens_per_second"] / t["tokens_per_second"]
            ratios.append({"config": r["config"], "against": t["side"], "ratio": ratio})
            lines.append(f"| {r['config']} | {r['tokens_per_second']:.1f} | {t['side']} | "
                         f"{t['tokens_per_second']:.1f} | {ratio:.2f} | "
                         f"{r['peak_rss_mib']:.0f} / {t['peak_rss_mib']:.0f} | {hidden} |")
    best = {}
    for side in ("dtensor", "torch"):
        cand = [r for r in rows if r["side"].startswith(side)]
        if cand:
            b = max(cand, key=lambda r: r["tokens_per_second"])
            best[side] = {"config": b["config"], "side": b["side"],
                          "tokens_per_second": b["tokens_per_second"]}
    if len(best) == 2:
        lines.append(f"\nbest dtensor {best['dtensor']['config']} "
                     f"{best['dtensor']['tokens_per_second']:.1f} tokens/s, best PyTorch "
                     f"{best['torch']['config']} {best['torch']['side']} "
                     f"{best['torch']['tokens_per_second']:.1f}: "
                     f"{best['dtensor']['tokens_per_second'] / best['torch']['tokens_per_second']:.2f}")
    worst = 0.0
    if rows:
        ref = rows[0]["losses"]
        for r in rows[1:]:
            for a, b in zip(r["losses"], ref):
                worst = max(worst, abs(a - b) / abs(b))
        lines.append(f"\nloss curves: the largest relative difference from "
                     f"{rows[0]['config']} {rows[0]['side']}'s over every row and step: "
                     f"{worst:.2e} (target 1e-4: {'yes' if worst <= 1e-4 else 'NO'})")
    fs, dp = by.get(("n2-fsdp", "dtensor")), by.get(("n2-data", "dtensor"))
    if fs and dp and fs["state_bytes"] and dp["state_bytes"]:
        share = fs["state_bytes"] / (dp["state_bytes"] / 2)
        lines.append(f"fully sharded at -n 2: parameters, gradients and optimizer state per "
                     f"client {share:.3f} of data parallel's / 2 (target within 10%)")
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(out, "gpt2.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(out, "gpt2.json"), "w") as f:
        json.dump({"rows": rows, "ratios": ratios, "best": best,
                   "largest_loss_difference": worst}, f, indent=1)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(9, 4))
    labels = [f"{r['config']}\n{r['side']}" for r in rows]
    colors = ["tab:blue" if r["side"] == "dtensor" else "tab:orange" for r in rows]
    ax.bar(range(len(rows)), [r["tokens_per_second"] for r in rows], color=colors)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("tokens / s")
    ax.set_title("GPT-2 training, dtensor (blue) and PyTorch (orange), same run")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "gpt2.png"), dpi=120)


if __name__ == "__main__":
    main()
